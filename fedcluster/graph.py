"""Graph data for FedSpectral / FedSpectral+: the data layer, no algorithm.

A graph lives in a global node-id space ``0 .. n-1`` known to everybody; a device holds only
its own edge list (``m x 2`` int64). :func:`load_edge_list` reads the SNAP ``u v`` text format,
:func:`canonical_edges` turns any edge list into the undirected simple graph (``u < v``, no
self-loops, no duplicates), :func:`split_edges` deals every undirected edge to ``r`` distinct
random clients (the paper's "overlap": 40 % overlap with 5 clients is ``r = 2``) and
:func:`write_client_edge_files` writes one ``client_XXX.txt`` per client (used by
``fedcluster-split-graph``, :mod:`fedcluster.algorithms.fedspectral.split_tool`). :class:`AdjacencyOperator` gives
products with the 0/1 adjacency without ever forming an ``n x n`` matrix, and
:func:`local_graph` is a device's edge list as one (cached). The device kernels and the
server math are in :mod:`fedcluster.algorithms.fedspectral.model`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from fedcluster.kernel import DeviceData

__all__ = [
    "GraphError",
    "load_edge_list",
    "load_node_labels",
    "canonical_edges",
    "infer_num_nodes",
    "overlap_to_clients",
    "split_edges",
    "write_client_edge_files",
    "AdjacencyOperator",
    "connected_components",
    "local_graph",
]


class GraphError(ValueError):
    """Bad graph data: a missing or malformed edge file, an invalid edge list."""


# --------------------------------------------------------------------------------------------
# Loading and writing edge lists
# --------------------------------------------------------------------------------------------


def load_edge_list(path: str | os.PathLike, num_nodes: int | None = None) -> np.ndarray:
    """Read a whitespace-separated ``u v`` edge list (SNAP format) into an ``(m, 2)`` int64 array.

    Lines are split with ``line.split()``; blank lines and lines whose first non-blank
    character is ``#`` are skipped. Every other line must hold exactly two non-negative
    integers. When ``num_nodes`` is given every id must be below it. The edges are returned
    as written (directed, possibly with duplicates and self-loops); use
    :func:`canonical_edges` for the undirected simple graph.

    Raises
    ------
    GraphError
        naming the file (and the line) for a missing file, a non-integer token, a line
        without exactly two tokens, a negative id or an id ``>= num_nodes``.
    """
    path = Path(path)
    if num_nodes is not None and int(num_nodes) < 0:
        raise GraphError(f"num_nodes must be >= 0, got {num_nodes}")
    if not path.is_file():
        raise GraphError(f"edge list file {str(path)!r} does not exist or is not a file")
    pairs: list[tuple[int, int]] = []
    try:
        with open(path, "r", encoding="utf-8") as handle:
            for line_number, line in enumerate(handle, start=1):
                tokens = line.split()
                if not tokens or tokens[0].startswith("#"):
                    continue
                if len(tokens) != 2:
                    raise GraphError(
                        f"{path}: line {line_number}: expected 2 node ids 'u v', "
                        f"got {len(tokens)} tokens: {line.strip()!r}"
                    )
                try:
                    u, v = int(tokens[0]), int(tokens[1])
                except ValueError:
                    raise GraphError(
                        f"{path}: line {line_number}: node ids must be integers, got {line.strip()!r}"
                    ) from None
                for node in (u, v):
                    if node < 0:
                        raise GraphError(f"{path}: line {line_number}: negative node id {node}")
                    if node >= 2**63:
                        raise GraphError(f"{path}: line {line_number}: node id {node} does not fit a 64-bit integer")
                    if num_nodes is not None and node >= num_nodes:
                        raise GraphError(
                            f"{path}: line {line_number}: node id {node} is out of range "
                            f"for num_nodes={num_nodes} (ids must be < {num_nodes})"
                        )
                pairs.append((u, v))
    except UnicodeDecodeError:
        raise GraphError(f"{path}: not a text edge list (it holds bytes that are not UTF-8 text)") from None
    if not pairs:
        return np.zeros((0, 2), dtype=np.int64)
    return np.asarray(pairs, dtype=np.int64).reshape(-1, 2)


def load_node_labels(path: str | os.PathLike, num_nodes: int | None = None) -> np.ndarray:
    """Read ``node label`` lines (e.g. email-Eu-core departments) into an ``(n,)`` int64 array.

    ``n`` is ``num_nodes`` if given, else the largest node id + 1; nodes without a line get
    label ``-1``. Same parsing and error rules as :func:`load_edge_list` (the label must be a
    non-negative integer; a node listed twice is an error).
    """
    pairs = load_edge_list(path)  # same "two non-negative integers" format
    if pairs.shape[0] == 0:
        return np.full(int(num_nodes or 0), -1, dtype=np.int64)
    n = int(pairs[:, 0].max()) + 1 if num_nodes is None else int(num_nodes)
    if pairs[:, 0].max() >= n:
        bad = int(pairs[pairs[:, 0] >= n, 0][0])
        raise GraphError(f"{path}: node id {bad} is out of range for num_nodes={n}")
    nodes, counts = np.unique(pairs[:, 0], return_counts=True)
    if np.any(counts > 1):
        raise GraphError(f"{path}: node {int(nodes[counts > 1][0])} has more than one label")
    labels = np.full(n, -1, dtype=np.int64)
    labels[pairs[:, 0]] = pairs[:, 1]
    return labels


def _as_edge_array(edges: Any, what: str = "edge list") -> np.ndarray:
    array = np.asarray(edges)
    if array.size == 0:
        return np.zeros((0, 2), dtype=np.int64)
    if array.ndim != 2 or array.shape[1] != 2:
        raise GraphError(f"{what} must have shape (m, 2), got {array.shape}")
    if not np.issubdtype(array.dtype, np.integer):
        if not np.all(np.isfinite(array)) or np.any(array != np.round(array)):
            raise GraphError(f"{what} must hold integer node ids, got dtype {array.dtype}")
    array = array.astype(np.int64, copy=False)
    if array.min() < 0:
        raise GraphError(f"{what} holds a negative node id {int(array.min())}")
    return array


def canonical_edges(edges: Any) -> np.ndarray:
    """The undirected simple graph of ``edges``: rows ``(u, v)`` with ``u < v``, self-loops and
    duplicates (including both directions of one edge) removed, sorted lexicographically.
    Returns an ``(m', 2)`` int64 array."""
    array = _as_edge_array(edges)
    if array.shape[0] == 0:
        return array.copy()
    low = np.minimum(array[:, 0], array[:, 1])
    high = np.maximum(array[:, 0], array[:, 1])
    keep = low != high
    low, high = low[keep], high[keep]
    if low.size == 0:
        return np.zeros((0, 2), dtype=np.int64)
    # Unique pairs through one int64 key when the ids allow it (fast), else np.unique on rows.
    top = int(high.max()) + 1
    if top < (1 << 31):
        key = np.unique(low * top + high)
        return np.stack([key // top, key % top], axis=1).astype(np.int64)
    return np.unique(np.stack([low, high], axis=1), axis=0)


def infer_num_nodes(edges: Any) -> int:
    """Largest node id + 1 (0 for an empty edge list)."""
    array = _as_edge_array(edges)
    return 0 if array.shape[0] == 0 else int(array.max()) + 1


# --------------------------------------------------------------------------------------------
# Splitting a graph over clients
# --------------------------------------------------------------------------------------------


def overlap_to_clients(overlap: float, num_clients: int) -> int:
    """The paper's overlap fraction as a number of clients per edge:
    ``max(1, round(overlap * num_clients))`` (40 % of 5 clients -> 2)."""
    if num_clients < 1:
        raise ValueError(f"num_clients must be >= 1, got {num_clients}")
    if not 0.0 <= overlap <= 1.0:
        raise ValueError(f"overlap must be a fraction in [0, 1], got {overlap}")
    return int(min(num_clients, max(1, int(round(overlap * num_clients)))))


def split_edges(
    edges: Any,
    num_clients: int,
    overlap_clients: int,
    rng: np.random.Generator | int | None = None,
) -> list[np.ndarray]:
    """Deal every undirected edge of ``edges`` to ``overlap_clients`` (r) distinct clients
    chosen uniformly at random out of ``num_clients`` (J), as in the paper's setup.

    The input is first made canonical (:func:`canonical_edges`), so each undirected edge is
    held by exactly ``r`` clients. Returns ``J`` arrays (``m_j x 2`` int64, canonical and
    sorted). ``rng`` is a Generator or a seed.
    """
    if num_clients < 1:
        raise ValueError(f"num_clients must be >= 1, got {num_clients}")
    if not 1 <= overlap_clients <= num_clients:
        raise ValueError(f"overlap_clients must be between 1 and num_clients={num_clients}, got {overlap_clients}")
    rng = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
    graph = canonical_edges(edges)
    m = graph.shape[0]
    # r distinct clients per edge: the first r of a random permutation of the J clients,
    # drawn a block of edges at a time (the same stream as one m x J draw, in bounded memory).
    rows = max(1, 2**20 // num_clients)
    holders = np.concatenate(
        [
            np.argsort(rng.random((min(rows, m - start), num_clients)), axis=1)[:, :overlap_clients]
            for start in range(0, m, rows)
        ]
        or [np.zeros((0, overlap_clients), dtype=np.int64)]
    )
    edge_of = np.argsort(holders.ravel(), kind="stable") // overlap_clients  # each client's edges, in order
    bounds = np.searchsorted(np.sort(holders.ravel()), np.arange(num_clients + 1))
    return [graph[edge_of[bounds[j] : bounds[j + 1]]] for j in range(num_clients)]


def write_client_edge_files(parts: Sequence[np.ndarray], out_dir: str | os.PathLike) -> list[Path]:
    """Write ``parts[j]`` to ``out_dir/client_{j:03d}.txt`` as ``u v`` lines (the directory is
    created). Each file starts with one ``#`` comment line, which :func:`load_edge_list`
    skips. Returns the paths in client order."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for j, part in enumerate(parts):
        array = _as_edge_array(part, what=f"client {j} edge list")
        path = out / f"client_{j:03d}.txt"
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(f"# fedcluster client {j} of {len(parts)}: {array.shape[0]} edges, 'u v' per line\n")
            if array.shape[0]:
                np.savetxt(handle, array, fmt="%d", delimiter=" ")
        paths.append(path)
    return paths


# --------------------------------------------------------------------------------------------
# Sparse products over an edge list (scipy.sparse where installed), and a device's graph
# --------------------------------------------------------------------------------------------


class AdjacencyOperator:
    """Products ``A @ X`` with the 0/1 adjacency of an undirected simple graph.

    Built once from any edge list, made canonical (kept as ``edges``): both directions of
    every edge are sorted by their row (CSR order), giving the neighbour list ``neighbors``
    (``2m`` ids) and the start of every non-empty row. A product is then a gather of the
    neighbours' rows of ``X`` followed by a segmented sum (``np.add.reduceat``). Two tricks
    cut its cost (``bench/spectral_kernel.py`` times it against SciPy's CSR product): the
    columns are taken in pairs as one complex128 number (half the number of reductions,
    which is what ``reduceat`` pays for), and the work is done in the transposed layout
    (one contiguous 1-D gather and reduction per column pair). Memory: ``O(m + n b)``;
    never ``n x n``.

    Where SciPy is installed (a dependency of the package; ``sparse=None``, the default) the
    products go through a ``scipy.sparse`` CSR matrix of the same graph instead, with the
    last scaling ``diag(left) A diag(right)`` kept (a device multiplies by the same
    normalization every round); ``sparse=False`` forces the NumPy path (a device without
    SciPy), ``sparse=True`` requires SciPy. Both paths give the same products to rounding.
    """

    def __init__(self, edges: np.ndarray, num_nodes: int, sparse: bool | None = None):
        edges = canonical_edges(edges)
        n = int(num_nodes)
        if edges.shape[0] and int(edges.max()) >= n:
            raise GraphError(f"node id {int(edges.max())} is out of range for num-nodes={n}")
        self.num_nodes = n
        self.edges = edges
        self.num_edges = int(edges.shape[0])
        rows = np.concatenate([edges[:, 0], edges[:, 1]])
        cols = np.concatenate([edges[:, 1], edges[:, 0]])
        order = np.argsort(rows, kind="stable")
        rows, cols = rows[order], cols[order]
        self.neighbors = cols.astype(np.intp)
        self.degrees = np.bincount(rows, minlength=n).astype(np.float64)
        if rows.size:
            self.starts = np.flatnonzero(np.r_[True, rows[1:] != rows[:-1]]).astype(np.intp)
            self.row_ids = rows[self.starts].astype(np.intp)
        else:
            self.starts = np.zeros(0, dtype=np.intp)
            self.row_ids = np.zeros(0, dtype=np.intp)
        self._csr = _csr_matrix(self.neighbors, self.degrees, n, sparse)
        self._scaled: tuple[np.ndarray | None, np.ndarray | None, Any] | None = None

    @property
    def sparse(self) -> bool:
        """Whether products go through ``scipy.sparse``."""
        return self._csr is not None

    def scaled(self, left: np.ndarray, right: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
        """``X -> diag(left) A diag(right) X`` for ``X`` of shape ``(n, b)``, the scaling
        applied once (for a caller that multiplies by the same matrix many times)."""
        left, right = np.array(left, dtype=np.float64), np.array(right, dtype=np.float64)
        if self._csr is None:
            return lambda X: self.matmat(X, left, right)
        matrix = self._scale(left, right)
        return lambda X: np.asarray(matrix @ np.asarray(X, dtype=np.float64), dtype=np.float64)

    def _scale(self, left: np.ndarray | None, right: np.ndarray | None) -> Any:
        """``diag(left) A diag(right)`` as CSR (float64 ``left``/``right``, None = identity)."""
        matrix = self._csr.copy()
        if left is not None:
            matrix.data *= np.repeat(left, np.diff(matrix.indptr))
        if right is not None:
            matrix.data *= right[matrix.indices]
        return matrix

    def _scaled_csr(self, left: np.ndarray | None, right: np.ndarray | None) -> Any:
        """:meth:`_scale`, the last one kept (``matmat``'s callers repeat their scaling)."""
        if self._scaled is not None:
            kept_left, kept_right, matrix = self._scaled
            if _same(kept_left, left) and _same(kept_right, right):
                return matrix
        left = None if left is None else np.array(left, dtype=np.float64)
        right = None if right is None else np.array(right, dtype=np.float64)
        self._scaled = (left, right, self._scale(left, right))
        return self._scaled[2]

    def matmat(
        self,
        X: np.ndarray,
        left: np.ndarray | None = None,
        right: np.ndarray | None = None,
    ) -> np.ndarray:
        """``diag(left) @ A @ diag(right) @ X`` for ``X`` of shape ``(n,)`` or ``(n, b)``
        (``left``/``right`` default to the identity); float64 of the shape of ``X``."""
        X = np.asarray(X, dtype=np.float64)
        vector = X.ndim == 1
        if vector:
            X = X[:, None]
        if X.ndim != 2 or X.shape[0] != self.num_nodes:
            raise ValueError(f"matrix of shape {X.shape} does not match a graph of {self.num_nodes} nodes")
        n, b = X.shape
        if self._csr is not None:
            out = np.asarray(self._scaled_csr(left, right) @ X, dtype=np.float64)
            return out[:, 0] if vector else out
        pairs = (b + 1) // 2
        out = np.zeros((n, 2 * pairs))
        if self.num_edges and b:
            scaled = X * right[:, None] if right is not None else X
            if b % 2:
                scaled = np.concatenate([scaled, np.zeros((n, 1))], axis=1)
            # (pairs, n) complex, C-contiguous: row c holds columns 2c (real) and 2c+1 (imag).
            columns = np.ascontiguousarray(np.ascontiguousarray(scaled).view(np.complex128).T)
            result = out.view(np.complex128)
            every_row = self.row_ids.size == n
            for c in range(pairs):
                sums = np.add.reduceat(columns[c].take(self.neighbors), self.starts)
                if every_row:
                    result[:, c] = sums
                else:
                    result[self.row_ids, c] = sums
            if left is not None:
                out *= left[:, None]
        if b % 2:
            out = np.ascontiguousarray(out[:, :b])
        return out[:, 0] if vector else out


def connected_components(edges: np.ndarray, num_nodes: int) -> tuple[int, np.ndarray]:
    """Connected components of the undirected graph ``edges`` (m x 2, ids < ``num_nodes``):
    ``(count, component)``, ``component[u]`` in ``0 .. count-1`` numbered by their smallest
    node. NumPy only (a device without SciPy): every pass hooks each edge's larger root onto
    the smaller, then pointer jumping flattens the trees; O(m) per pass, a few passes."""
    edges = np.asarray(edges, dtype=np.intp).reshape(-1, 2)
    u, v = edges[:, 0], edges[:, 1]
    root = np.arange(num_nodes, dtype=np.intp)
    while True:
        ru, rv = root[u], root[v]
        apart = ru != rv
        if not np.any(apart):
            break
        ru, rv = ru[apart], rv[apart]
        np.minimum.at(root, np.maximum(ru, rv), np.minimum(ru, rv))
        while True:  # pointer jumping: every node straight to its root
            jumped = root[root]
            if np.array_equal(jumped, root):
                break
            root = jumped
    _, component = np.unique(root, return_inverse=True)
    return int(component.max(initial=-1)) + 1, component.astype(np.intp)


def _csr_matrix(neighbors: np.ndarray, degrees: np.ndarray, n: int, sparse: bool | None) -> Any:
    """The 0/1 adjacency as ``scipy.sparse.csr_matrix`` (rows sorted, as ``neighbors``), or
    None for the NumPy path (``sparse=False``, or SciPy missing and ``sparse=None``)."""
    if sparse is False:
        return None
    try:
        import scipy.sparse
    except ImportError:
        if sparse:
            raise
        return None
    indptr = np.zeros(n + 1, dtype=np.intp)
    np.cumsum(degrees.astype(np.intp), out=indptr[1:])
    # Each row's neighbours in the NumPy path's order: both paths add in the same order.
    return scipy.sparse.csr_matrix((np.ones(neighbors.size), neighbors, indptr), shape=(n, n))


def _same(kept: np.ndarray | None, given: np.ndarray | None) -> bool:
    if kept is None or given is None:
        return kept is None and given is None
    return kept.shape == np.shape(given) and bool(np.array_equal(kept, given))


@dataclass
class _CachedGraph:
    edges: np.ndarray  # the DeviceData.edges object it was built from (identity check)
    operator: AdjacencyOperator


_CACHE_KEY = "fedcluster.graph.adjacency"


def local_graph(data: DeviceData, num_nodes: int) -> AdjacencyOperator:
    """The device's undirected simple graph as an :class:`AdjacencyOperator`, built once and
    cached in ``data.extra`` (rebuilt if ``data.edges`` is replaced or ``num_nodes`` changes;
    an edge array modified in place is not noticed).

    Raises ``ValueError`` naming the device's data when a node id is ``>= num_nodes``.
    """
    edges = data.require_edges()
    cached = data.extra.get(_CACHE_KEY)
    if isinstance(cached, _CachedGraph) and cached.edges is edges and cached.operator.num_nodes == num_nodes:
        return cached.operator
    array = _as_edge_array(edges, what=f"device edge list ({data.source})")
    if array.shape[0] and int(array.max()) >= num_nodes:
        bad = int(array.max())
        raise GraphError(
            f"device edge list ({data.source}) holds node id {bad}, but num-nodes is "
            f"{num_nodes} (ids must be < {num_nodes})"
        )
    operator = AdjacencyOperator(array, num_nodes)
    data.extra[_CACHE_KEY] = _CachedGraph(edges=edges, operator=operator)
    return operator
