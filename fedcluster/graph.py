"""Graph data and the device kernels of FedSpectral / FedSpectral+ (NumPy only).

Data layer
----------
A graph lives in a global node-id space ``0 .. n-1`` known to everybody; a device holds only
its own edge list (``m x 2`` int64). :func:`load_edge_list` reads the SNAP ``u v`` text format,
:func:`canonical_edges` turns any edge list into the undirected simple graph (``u < v``, no
self-loops, no duplicates), :func:`split_edges` deals every undirected edge to ``r`` distinct
random clients (the paper's "overlap": 40 % overlap with 5 clients is ``r = 2``) and
:func:`write_client_edge_files` writes one ``client_XXX.txt`` per client for a simulation or
a deployment.

Device kernels (registered in :mod:`fedcluster.registry`)
---------------------------------------------------------
Every kernel first turns the device's edge list into its undirected simple local graph G_j
(adjacency A_j, 0/1) and caches a CSR-like structure of it in ``DeviceData.extra``; the
metric ``num-examples`` is the number of undirected local edges. No kernel ever forms an
``n x n`` matrix: products with A_j are a gather over the neighbour list plus a segmented
sum (``np.add.reduceat``).

``graph_degrees``
    config ``{"num-nodes": n, "edge-weight": w (default 1)}`` -> ``{"degrees": w * deg_j}``,
    the (weighted) degree of every node in G_j (each local edge counted once per endpoint).
``power_step``
    config ``{"num-nodes", "iters", "normalization", "edge-weight"}``, arrays ``{"Q": n x b}``
    (+ ``"degrees"`` in global mode) -> ``{"Q": ...}``. Two modes:

    * ``"local"`` (the paper): ``Q <- M_j Q`` applied ``iters`` times with
      ``M_j = (I + D_j^{-1/2} A_j D_j^{-1/2}) / 2`` built from the LOCAL degrees D_j. (A node
      with no local edge has a zero row in the normalized adjacency, so ``M_j`` halves its
      row of ``Q``; that is the formula, and it is what the paper's averaging sees.)
      ``edge-weight`` cancels out of the local normalization and is ignored.
    * ``"global"`` (exact): exactly ONE multiplication (``iters`` must be 1). With D the
      GLOBAL degrees sent by the server (``arrays["degrees"]``, the sum over clients of the
      ``graph_degrees`` replies) and ``w = edge-weight`` the client returns

          P_j = w * D^{-1/2} A_j D^{-1/2} Q .

      With ``w = 1/r`` on every client and every undirected edge held by exactly ``r``
      clients, ``sum_j w A_j = A`` and ``sum_j w deg_j = deg``, so the server gets
      ``sum_j P_j = N Q`` (N = D^{-1/2} A D^{-1/2}) and forms the shifted product itself:
      ``M Q = (Q + sum_j P_j) / 2``
      (:func:`fedcluster.spectral.shifted_global_product`). The shift ``I/2`` and the factor
      ``1/2`` stay on the server because they do not depend on any client's data: a client
      with no edges then contributes exactly zero, and the sum does not depend on how many
      clients happened to reply.
``local_spectral_labels``
    config ``{"num-nodes", "k", "seed"}`` (+ optional ``"block"``, ``"max-iters"``,
    ``"tol"``) -> ``{"labels": (n,) int64}``, ``-1`` for nodes without a local edge. Spectral
    clustering (Ng-Jordan-Weiss) of the local graph in NumPy only: subspace iteration with a
    block of ``k + p`` columns on ``(I + N_j)/2``, Rayleigh-Ritz, row-normalization and
    :func:`fedcluster.lloyd.kmeans`. This is the client of the FedSpectral baseline.

Degree-0 nodes get ``D^{-1/2} = 0`` everywhere: they never produce NaN or inf.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from fedcluster.lloyd import assign, kmeans
from fedcluster.registry import DeviceData, device_task

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
    "inverse_sqrt_degrees",
    "local_graph",
    "graph_degrees",
    "power_step",
    "local_spectral_embedding",
    "local_spectral_labels",
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
                if num_nodes is not None and node >= num_nodes:
                    raise GraphError(
                        f"{path}: line {line_number}: node id {node} is out of range "
                        f"for num_nodes={num_nodes} (ids must be < {num_nodes})"
                    )
            pairs.append((u, v))
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
        raise ValueError(
            f"overlap_clients must be between 1 and num_clients={num_clients}, got {overlap_clients}"
        )
    rng = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
    graph = canonical_edges(edges)
    m = graph.shape[0]
    # r distinct clients per edge: the first r of a random permutation of the J clients.
    holders = np.argsort(rng.random((m, num_clients)), axis=1)[:, :overlap_clients]
    member = np.zeros((m, num_clients), dtype=bool)
    member[np.arange(m)[:, None], holders] = True
    return [graph[member[:, j]] for j in range(num_clients)]


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
# Sparse products over an edge list (NumPy only)
# --------------------------------------------------------------------------------------------


class AdjacencyOperator:
    """Products ``A @ X`` with the 0/1 adjacency of an undirected simple graph, NumPy only.

    Built once from any edge list, made canonical (kept as ``edges``): both directions of
    every edge are sorted by their row (CSR order), giving the neighbour list ``neighbors`` (``2m`` ids) and the start of every
    non-empty row. A product is then a gather of the neighbours' rows of ``X`` followed by a
    segmented sum (``np.add.reduceat``). Two tricks make it fast (about 2x scipy's CSR
    product for 10 columns): the columns are taken in pairs as one complex128 number (half
    the number of reductions, which is what ``reduceat`` pays for), and the work is done in
    the transposed layout (one contiguous 1-D gather and reduction per column pair).
    Memory: ``O(m + n b)``; never ``n x n``.
    """

    def __init__(self, edges: np.ndarray, num_nodes: int):
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


def inverse_sqrt_degrees(degrees: np.ndarray) -> np.ndarray:
    """``d^{-1/2}`` elementwise with 0 where ``d == 0`` (no NaN, no inf)."""
    degrees = np.asarray(degrees, dtype=np.float64)
    out = np.zeros_like(degrees)
    positive = degrees > 0
    out[positive] = 1.0 / np.sqrt(degrees[positive])
    return out


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
    if (
        isinstance(cached, _CachedGraph)
        and cached.edges is edges
        and cached.operator.num_nodes == num_nodes
    ):
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


# --------------------------------------------------------------------------------------------
# Config parsing (values arrive from a Flower ConfigRecord: int, float, str, bool)
# --------------------------------------------------------------------------------------------


def _config_int(config: dict, key: str, default: int | None = None, minimum: int | None = None) -> int:
    if key not in config:
        if default is None:
            raise ValueError(f"config is missing {key!r}")
        return default
    value = config[key]
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"config {key!r} must be an integer, got {value!r}")
    if float(value) != int(value):
        raise ValueError(f"config {key!r} must be an integer, got {value!r}")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"config {key!r} must be >= {minimum}, got {value}")
    return value


def _config_float(config: dict, key: str, default: float) -> float:
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"config {key!r} must be a number, got {value!r}")
    value = float(value)
    if not np.isfinite(value):
        raise ValueError(f"config {key!r} must be finite, got {value}")
    return value


def _edge_weight(config: dict) -> float:
    weight = _config_float(config, "edge-weight", 1.0)
    if weight <= 0:
        raise ValueError(f"config 'edge-weight' must be > 0, got {weight}")
    return weight


def _block(arrays: dict, key: str, num_nodes: int) -> np.ndarray:
    if key not in arrays:
        raise ValueError(f"arrays are missing {key!r}")
    Q = np.asarray(arrays[key], dtype=np.float64)
    if Q.ndim == 1:
        Q = Q[:, None]
    if Q.ndim != 2 or Q.shape[0] != num_nodes:
        raise ValueError(f"{key!r} must have shape (num-nodes={num_nodes}, b), got {Q.shape}")
    if not np.all(np.isfinite(Q)):
        raise ValueError(f"{key!r} contains NaN or inf")
    return Q


# --------------------------------------------------------------------------------------------
# Device kernels
# --------------------------------------------------------------------------------------------


@device_task("graph_degrees")
def graph_degrees(data: DeviceData, arrays: dict, config: dict) -> tuple[dict, dict]:
    """Weighted local degrees ``edge-weight * deg_j`` (``(n,)`` float64) of the local graph.

    Summed over the clients with ``edge-weight = 1/r`` they give the global degrees.
    """
    n = _config_int(config, "num-nodes", minimum=1)
    weight = _edge_weight(config)
    graph = local_graph(data, n)
    return {"degrees": weight * graph.degrees}, {
        "num-examples": graph.num_edges,
        "num-local-nodes": int(np.count_nonzero(graph.degrees)),
    }


@device_task("power_step")
def power_step(data: DeviceData, arrays: dict, config: dict) -> tuple[dict, dict]:
    """One FedSpectral+ client step on the block ``arrays["Q"]`` (n x b).

    ``normalization="local"`` (default, the paper): ``iters`` steps ``Q <- (Q + N_j Q)/2``
    with the local normalized adjacency ``N_j = D_j^{-1/2} A_j D_j^{-1/2}``.
    ``normalization="global"`` (exact): one product ``edge-weight * D^{-1/2} A_j D^{-1/2} Q``
    with the global degrees ``arrays["degrees"]``; the server adds ``Q`` and halves (see the
    module docstring).
    """
    n = _config_int(config, "num-nodes", minimum=1)
    iters = _config_int(config, "iters", default=1, minimum=1)
    normalization = config.get("normalization", "local")
    if normalization not in ("local", "global"):
        raise ValueError(f"config 'normalization' must be 'local' or 'global', got {normalization!r}")
    weight = _edge_weight(config)
    Q = _block(arrays, "Q", n)
    graph = local_graph(data, n)
    metrics = {"num-examples": graph.num_edges}

    if normalization == "local":
        scale = inverse_sqrt_degrees(graph.degrees)
        for _ in range(iters):
            Q = 0.5 * (Q + graph.matmat(Q, scale, scale))
        return {"Q": Q}, metrics

    if iters != 1:
        raise ValueError(
            "normalization 'global' computes exactly one product per round (iters must be 1): "
            "a client cannot multiply by the global matrix twice on its own"
        )
    if "degrees" not in arrays:
        raise ValueError("normalization 'global' needs the global degree vector in arrays['degrees']")
    degrees = np.asarray(arrays["degrees"], dtype=np.float64).reshape(-1)
    if degrees.shape != (n,):
        raise ValueError(f"'degrees' must have shape ({n},), got {degrees.shape}")
    if not np.all(np.isfinite(degrees)) or np.any(degrees < 0):
        raise ValueError("'degrees' must be finite and non-negative")
    missing = (graph.degrees > 0) & (degrees <= 0)
    if np.any(missing):
        node = int(np.flatnonzero(missing)[0])
        raise ValueError(
            f"global degree of node {node} is 0 but the node has local edges: "
            "the degree vector does not match the data"
        )
    scale = inverse_sqrt_degrees(degrees)
    product = graph.matmat(Q, weight * scale, scale)
    return {"Q": product}, metrics


def _orthonormal_columns(X: np.ndarray) -> np.ndarray:
    Q, R = np.linalg.qr(X)
    signs = np.sign(np.diag(R))
    signs[signs == 0] = 1.0
    return Q * signs


def local_spectral_embedding(
    graph: AdjacencyOperator,
    k: int,
    rng: np.random.Generator,
    block: int | None = None,
    max_iters: int = 1000,
    tol: float = 1e-6,
) -> tuple[np.ndarray, np.ndarray, int, float]:
    """Top-``k`` eigenpairs of ``(I + N)/2`` of ``graph`` by subspace iteration, NumPy only.

    Iterates a block of ``block`` columns (default ``2k``, at least ``k + 5``, at most n),
    orthonormalizing every step; every 5 steps a Rayleigh-Ritz check stops when the largest
    residual ``||M v - theta v||`` of the top-``k`` Ritz pairs is below ``tol``.
    Returns ``(values, vectors, iterations, residual)``, values descending.
    """
    n = graph.num_nodes
    k = min(k, n)
    b = min(n, block if block is not None else max(2 * k, k + 5))
    b = max(b, k)
    scale = inverse_sqrt_degrees(graph.degrees)

    def apply(X: np.ndarray) -> np.ndarray:
        return 0.5 * (X + graph.matmat(X, scale, scale))

    Q = _orthonormal_columns(rng.standard_normal((n, b)))
    values = vectors = None
    residual = np.inf
    iteration = 0
    for iteration in range(1, max_iters + 1):
        MQ = apply(Q)
        if iteration % 5 == 0 or iteration == max_iters:
            H = Q.T @ MQ
            theta, V = np.linalg.eigh(0.5 * (H + H.T))
            top = np.argsort(theta)[::-1][:k]
            values, vectors = theta[top], Q @ V[:, top]
            R = MQ @ V[:, top] - vectors * values
            residual = float(np.max(np.linalg.norm(R, axis=0)))
            if residual < tol:
                break
        Q = _orthonormal_columns(MQ)
    return values, vectors, iteration, residual


@device_task("local_spectral_labels")
def local_spectral_labels(data: DeviceData, arrays: dict, config: dict) -> tuple[dict, dict]:
    """FedSpectral client: spectral clustering of the local graph (NumPy only).

    Nodes with at least one local edge are relabelled ``0..n_j-1``; the top-``k``
    eigenvectors of the local ``(I + N_j)/2`` (:func:`local_spectral_embedding`) are
    row-normalized (Ng-Jordan-Weiss) and clustered by :func:`fedcluster.lloyd.kmeans`
    (``n_init=10``) seeded by ``seed``. Nodes without local edges get label ``-1``. When the
    local graph has at most ``k`` nodes every node is its own cluster.
    """
    n = _config_int(config, "num-nodes", minimum=1)
    k = _config_int(config, "k", minimum=1)
    seed = _config_int(config, "seed", default=0)
    block = _config_int(config, "block", default=0, minimum=0) or None
    max_iters = _config_int(config, "max-iters", default=1000, minimum=1)
    tol = _config_float(config, "tol", 1e-6)
    graph = local_graph(data, n)
    labels = np.full(n, -1, dtype=np.int64)
    present = np.flatnonzero(graph.degrees > 0)
    metrics: dict[str, float] = {"num-examples": graph.num_edges, "num-local-nodes": int(present.size)}
    if present.size == 0:
        return {"labels": labels}, metrics
    if present.size <= k:
        labels[present] = np.arange(present.size)
        return {"labels": labels}, metrics
    # The local graph on its own nodes only: absent nodes would add spurious eigenvalues 1/2.
    relabel = np.full(n, -1, dtype=np.int64)
    relabel[present] = np.arange(present.size)
    compact = AdjacencyOperator(relabel[graph.edges], present.size)
    rng = np.random.default_rng(seed)
    _, vectors, iterations, residual = local_spectral_embedding(
        compact, k, rng, block=block, max_iters=max_iters, tol=tol
    )
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    embedding = np.divide(vectors, norms, out=np.zeros_like(vectors), where=norms > 0)
    centers, _ = kmeans(embedding, k, rng, n_init=10)
    labels[present] = assign(embedding, centers)[0]
    metrics.update({"iterations": iterations, "ritz-residual": residual})
    return {"labels": labels}, metrics
