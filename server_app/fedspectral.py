"""FedSpectral and FedSpectral+: federated spectral clustering of a graph split over clients.

Paper: "FedSpectral+: Spectral Clustering using Federated Learning" (2023); working
specification: ALGORITHMS.md section 5 (it wins over the paper where they differ).

A global graph on ``num-nodes`` nodes (ids ``0 .. n-1``, known to everybody) has its edges
spread over J clients, each edge possibly held by several of them; a client holds only its
own edge list. The device kernels (:mod:`fedcluster.graph`, NumPy only) are
``graph_degrees``, ``power_step`` and ``local_spectral_labels``; the server-side algebra is
in :mod:`fedcluster.spectral` and here. Spectral clustering everywhere is Ng-Jordan-Weiss on
``M = (I + N)/2``, ``N = D^{-1/2} A D^{-1/2}``: top-``k`` eigenvectors, rows normalized to
unit length, k-means (scikit-learn, ``n_init=10``, ``random_state=seed``) on the server.

:class:`FedSpectral` (the paper's baseline, ``algorithm="fedspectral"``)
    One round: every client clusters its local graph (``local_spectral_labels``; -1 for
    nodes it does not hold) and sends the labels; the server builds the co-association
    similarity (``coassociation``: ``"both-present"`` = fraction of the clients holding both
    nodes that put them together, ``"all-clients"`` = fraction of all J clients) and
    clusters it spectrally. The paper's formula (its eq. 1) was lost in extraction; both
    readings are offered.

:class:`FedSpectralPlus` (``algorithm="fedspectral-plus"``), ``mode``:

``"paper"``
    As the paper describes: the server sends a random orthonormal ``Q`` (n x k); every
    client applies ``iters`` local power steps ``Q <- (I + N_j) Q / 2`` with its LOCAL
    normalized adjacency and returns the result; the server averages the client iterates
    and re-orthonormalizes with ``numpy.linalg.qr``. ``num-rounds`` such rounds; the
    embedding is the last ``Q``. This is not power iteration on any fixed matrix (each
    client normalizes by its own degrees, QR is nonlinear), so it does not converge to
    the global embedding in general.

``"exact"`` (default)
    Block methods on the GLOBAL ``M`` with one product per round, so that the federated
    run computes exactly what a central eigensolver computes:

    * every round the server sends a block ``X`` (n x b, ``b = k + oversample``; the
      default ``oversample = -1`` means ``max(k, 10)``, so b = 2k for k >= 10) and the
      global degree vector; client j returns ``P_j = w D^{-1/2} A_j D^{-1/2} X``
      (``power_step``, ``normalization="global"``, ``w = 1/edge-copies``); the server
      forms ``M X = (X + sum_j P_j) / 2``. With every edge on the same number of clients
      ``sum_j w A_j`` is the global adjacency (up to a common factor, which cancels in
      ``N``); with unequal copies it is the multigraph in which an edge weighs its number
      of copies times ``w``.
    * Round 1 also delivers the global degrees: the server sends ``[1, G]`` (a column of
      ones and a random Gaussian ``G``, ``default_rng(seed)``) with unit "degrees", so the
      clients return ``w A_j [1, G]``; the first column sums to the (weighted) degrees D
      and, with ``X_0 = D^{1/2} G`` (zero on degree-0 rows, see
      :func:`degree_scaled_start`), the rest gives ``N X_0 = D^{-1/2} A G`` without
      knowing D beforehand. The degrees thus cost no round of their own: ``num-rounds``
      products = ``num-rounds`` communication rounds.
    * ``acceleration="none"``: plain block subspace iteration
      ``Q_{t+1} = qr(M Q_t)`` from ``Q_0 = qr(X_0)``; the embedding is the top-``k``
      Rayleigh-Ritz vectors of the last ``(Q, M Q)``. Converges at the rate
      ``lambda_{b+1} / lambda_k``: slow on real graphs (tiny eigengaps).
    * ``acceleration="krylov"`` (default): block Krylov (block Lanczos with full
      re-orthogonalization, written as a block Davidson/Rayleigh-Ritz iteration). The
      server keeps the whole orthonormal basis ``V`` and ``W = M V`` (every column of W
      is a summed client product, so the projected matrix ``H = V^T M V`` is exact) and
      each round sends the next block: the residuals ``M y - theta y`` of the top-``b``
      Ritz pairs, orthogonalized against ``V``. After t rounds ``span(V)`` is the block
      Krylov space ``K_t(M, X_0)``, the best space any method reusing past products can
      have, and Rayleigh-Ritz on it gives the top-``k`` Ritz vectors. When the basis would
      exceed ``max-basis`` columns (0 = auto: every column up to a 256 MiB budget for V
      and W, at least 8 blocks, at most n) it is thick-restarted on its top ``3b`` Ritz
      vectors (their products are known, no extra round). To a sine of 1e-3 to the exact
      top-10 eigenspace, with a block of 20: 16 rounds on ego-Facebook instead of 200 for
      subspace iteration, 12 instead of 96 on email-Eu-core (``bench/fedspectral_repro.py``).
    * ``residual-tol`` > 0 stops as soon as every top-``k`` Ritz pair has
      ``||M y - theta y|| <= residual-tol`` (a federated, reference-free criterion; the
      sine to the exact eigenspace is about residual / eigengap). A block whose residuals
      all vanish (< 1e-10) means the Krylov space is invariant: the run stops there too.

    ``iters`` does not apply (a client cannot multiply by the global matrix on its own);
    a value other than 1 is ignored with a warning.

Per round ``result.json`` records (besides bytes, time, replies) ``subspace_change``: the
largest principal-angle sine between this round's top-``k`` space and the previous
round's, and in exact mode ``residual`` (largest top-``k`` Ritz residual), the basis size
and the block size. Every phase needs a reply from EVERY client: each client holds edges
nobody else may hold, and dropping one would silently change the graph (the run fails
with the client's reason instead). A client with no edges is fine (it contributes zeros
or, in paper mode, the halved block the formula gives). The result folder gets
``labels.npy`` (n labels) and ``embedding.npy`` (n x k; the eigenvector embedding before
row normalization; FedSpectral also ``client_labels.npy``, J x n). When the server can read the client files (a one-machine simulation
with ``dataset="edge-dir"``) and ``reference`` is true it also reports, for information
only, the agreement with the central spectral clustering of the union graph (Rand index,
ARI, NMI) and the largest principal-angle sine to the central top-``k`` eigenspace
(``central_reference`` in ``result.json``).

What leaves a client in FedSpectral+ is an n x b block of real numbers per round (plus,
in exact mode round 1, its weighted degree vector): linear images of server-chosen
blocks under the client's normalized adjacency, i.e. linear measurements of its edge
list that a server choosing random blocks can largely invert (``bench/fedspectral_repro.py
--privacy``). No formal privacy: see the README ("What a client reveals").
"""

from __future__ import annotations

from logging import INFO, WARNING
from pathlib import Path
from typing import Any

import numpy as np
from flwr.common.logger import log

from fedcluster.graph import canonical_edges, load_edge_list
from fedcluster.spectral import (
    central_eigenpairs,
    coassociation_matrix,
    embedding_labels,
    initial_block,
    orthonormalize,
    paper_aggregate,
    shifted_global_product,
    subspace_distance,
)

from .base import FederatedStrategy, FederationError, Reply, ReplySpec

# Columns of a new Krylov block whose norm (after projection) falls below this are
# numerically in the span already; ||M|| <= 1, so the threshold is absolute.
KRYLOV_DROP = 1e-10
# Memory budget for the Krylov basis V and W = M V on the server (auto max-basis).
KRYLOV_BUDGET_BYTES = 256 * 2**20


# --------------------------------------------------------------------------------------------
# Server-side linear algebra (pure NumPy, no Flower): Ritz pairs of a basis with known products
# --------------------------------------------------------------------------------------------


def start_block(num_nodes: int, block: int, seed: int) -> np.ndarray:
    """The random Gaussian ``G`` (n x b) of round 1: ``default_rng(seed).standard_normal``."""
    return np.random.default_rng(seed).standard_normal((num_nodes, block))


def degree_scaled_start(G: np.ndarray, degrees: np.ndarray) -> np.ndarray:
    """``X_0 = D^{1/2} G``: the start block whose product ``N X_0 = D^{-1/2} A G`` the server
    gets from round 1.

    Rows of degree-0 (isolated) nodes are zero: such a node is an eigenvector of M with
    eigenvalue 1/2, orthogonal to every eigenvector above 1/2, so the exact top-``k``
    eigenvectors are zero there, and starting with zero rows keeps every later block zero
    there too (a row of round-off size would otherwise be blown up to a unit vector by the
    row normalization before k-means). Only when fewer nodes than columns have an edge
    (the block would be rank deficient) do the isolated rows keep ``G``'s values.
    """
    G = np.asarray(G, dtype=np.float64)
    degrees = np.asarray(degrees, dtype=np.float64)
    positive = degrees > 0
    fill = 1.0 if np.count_nonzero(positive) < G.shape[1] else 0.0
    scale = np.where(positive, np.sqrt(np.maximum(degrees, 0.0)), fill)
    return G * scale[:, None]


def orthonormal_complement(V: np.ndarray, X: np.ndarray, drop: float = KRYLOV_DROP) -> np.ndarray:
    """Orthonormal basis of the part of ``span(X)`` orthogonal to ``span(V)``.

    Two passes of block Gram-Schmidt against ``V`` (V orthonormal), then an SVD that drops
    the directions with singular value ``<= drop`` (numerically already in ``span(V)``);
    may return fewer columns than ``X`` has, or none.
    """
    X = np.array(X, dtype=np.float64, copy=True)
    for _ in range(2):
        if V.shape[1]:
            X -= V @ (V.T @ X)
    if X.shape[1] == 0:
        return X
    U, s, _ = np.linalg.svd(X, full_matrices=False)
    U = U[:, s > drop]
    if U.shape[1] and V.shape[1]:  # one more pass: the SVD mixes in round-off
        U = U - V @ (V.T @ U)
        U = np.linalg.qr(U)[0]
    return U


class RitzBasis:
    """An orthonormal basis ``V`` (n x s) with its exact products ``W = M V`` and the
    projected matrix ``H = V^T W`` (kept up to date in O(n s b) per new block).

    :meth:`ritz` returns the top Ritz pairs of M in ``span(V)``; :meth:`extend` adds an
    orthonormal block ``X`` (orthogonal to V) with its product; :meth:`replace` starts over
    from a block (subspace iteration); :meth:`restart` keeps only the top Ritz vectors
    (thick restart: their products are ``W U``, no new multiplication).
    """

    def __init__(self, V: np.ndarray, W: np.ndarray) -> None:
        self.replace(V, W)

    @property
    def size(self) -> int:
        return int(self.V.shape[1])

    def replace(self, V: np.ndarray, W: np.ndarray) -> None:
        self.V = np.ascontiguousarray(V, dtype=np.float64)
        self.W = np.ascontiguousarray(W, dtype=np.float64)
        self.H = self.V.T @ self.W

    def extend(self, X: np.ndarray, MX: np.ndarray) -> None:
        C = self.V.T @ MX
        D = X.T @ MX
        self.H = np.block([[self.H, C], [C.T, D]])
        self.V = np.hstack([self.V, X])
        self.W = np.hstack([self.W, MX])

    def _eigen(self) -> tuple[np.ndarray, np.ndarray]:
        values, U = np.linalg.eigh(0.5 * (self.H + self.H.T))
        order = np.argsort(values)[::-1]
        return values[order], U[:, order]

    def ritz(self, count: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Top ``count`` Ritz values (descending), vectors ``Y`` and products ``M Y``."""
        values, U = self._eigen()
        U = U[:, :count]
        return values[:count], self.V @ U, self.W @ U

    def restart(self, keep: int) -> None:
        values, U = self._eigen()
        U = U[:, :keep]
        self.V = self.V @ U
        self.W = self.W @ U
        self.H = np.diag(values[:keep])


def residual_norms(values: np.ndarray, Y: np.ndarray, MY: np.ndarray) -> np.ndarray:
    """``||M y_i - theta_i y_i||`` for every Ritz pair (columns)."""
    return np.linalg.norm(MY - Y * values, axis=0)


def auto_max_basis(num_nodes: int, block: int) -> int:
    """Default Krylov basis size: every column that fits a 256 MiB budget for V and W,
    at least 8 blocks, never more than n."""
    budget = KRYLOV_BUDGET_BYTES // (16 * max(num_nodes, 1))
    return int(min(num_nodes, max(8 * block, budget)))


class ExactEigensolver:
    """The server side of exact mode, whatever delivers the products (the federation, or
    a central twin in a benchmark): top-``k`` eigenpairs of ``M = (I + N)/2`` by block
    subspace iteration (``acceleration="none"``) or block Krylov (``"krylov"``) with a
    block of ``block`` columns, one product per round.

    Protocol: send :meth:`first_block` (``[1, G]``) with unit degrees and pass the summed
    client replies ``sum_j w A_j [1, G]`` to :meth:`start`; then, while wanted,
    ``X = next_block()`` (None: the space is invariant, nothing left to learn), send ``X``
    with :attr:`degrees`, pass ``sum_j P_j`` to :meth:`absorb`. :meth:`observe` after
    every product gives the round's diagnostics; :meth:`result` the top-``k`` Ritz pairs.
    """

    def __init__(
        self, num_nodes: int, k: int, block: int, seed: int, acceleration: str = "krylov", max_basis: int = 0
    ) -> None:
        if acceleration not in ("krylov", "none"):
            raise ValueError(f"acceleration must be 'krylov' or 'none', got {acceleration!r}")
        if not 1 <= k <= block <= num_nodes:
            raise ValueError(f"need 1 <= k={k} <= block={block} <= num-nodes={num_nodes}")
        self.n, self.k, self.block, self.seed = num_nodes, k, block, seed
        self.acceleration = acceleration
        if acceleration == "krylov":
            self.max_basis = max(max_basis or auto_max_basis(num_nodes, block), min(num_nodes, 2 * block))
        else:
            self.max_basis = block
        self.keep = max(k, min(3 * block, self.max_basis - block))
        self.degrees = np.zeros(num_nodes)
        self.support: np.ndarray | None = None  # rows that may be non-zero (None: all)
        self.basis: RitzBasis | None = None
        self._previous: np.ndarray | None = None

    def first_block(self) -> np.ndarray:
        return np.hstack([np.ones((self.n, 1)), start_block(self.n, self.block, self.seed)])

    def start(self, first_sum: np.ndarray) -> None:
        """From ``sum_j w A_j [1, G]``: the degrees D and ``M X_0`` for ``X_0 = D^{1/2} G``."""
        first_sum = np.asarray(first_sum, dtype=np.float64)
        self.degrees = np.maximum(first_sum[:, 0], 0.0)  # sums of non-negative terms
        G = start_block(self.n, self.block, self.seed)
        X0 = degree_scaled_start(G, self.degrees)
        scale = np.zeros(self.n)
        positive = self.degrees > 0
        scale[positive] = 1.0 / np.sqrt(self.degrees[positive])
        # Isolated rows are exactly zero in every block (degree_scaled_start); QR and SVD
        # would smear round-off (1e-17) into them, which row normalization would blow up.
        self.support = positive if np.count_nonzero(positive) >= self.block else None
        MX0 = 0.5 * (X0 + scale[:, None] * first_sum[:, 1:])
        V0, R = np.linalg.qr(X0)
        W0 = np.linalg.solve(R.T, MX0.T).T  # M V0 = (M X0) R^{-1}
        self.basis = RitzBasis(self._mask(V0), self._mask(W0))
        self._previous = None

    def _mask(self, X: np.ndarray) -> np.ndarray:
        if self.support is not None:
            X[~self.support] = 0.0
        return X

    def observe(self) -> dict[str, Any]:
        """Diagnostics of the current space: largest top-``k`` Ritz residual, the largest
        principal-angle sine to the previous observation's top-``k`` space, ..."""
        values, Y, MY = self.basis.ritz(self.k)
        residual = float(residual_norms(values, Y, MY).max())
        change = None if self._previous is None else subspace_distance(Y, self._previous)
        self._previous = Y
        return {
            "residual": residual,
            "change": change,
            "basis_columns": self.basis.size,
            "ritz_value_k": float(values[-1]),
            "embedding": Y,
        }

    def next_block(self) -> np.ndarray | None:
        basis = self.basis
        if self.acceleration == "none":
            return self._mask(orthonormalize(basis.W))  # Q_{t+1} = qr(M Q_t)
        if basis.size + self.block > self.max_basis:
            basis.restart(min(self.keep, basis.size))
        values, Y, MY = basis.ritz(min(self.block, basis.size))
        X = orthonormal_complement(basis.V, MY - Y * values)
        return self._mask(X) if X.shape[1] else None

    def absorb(self, X: np.ndarray, product_sum: np.ndarray) -> None:
        """Take ``sum_j P_j`` for the block ``X`` (``M X = (X + sum_j P_j)/2``)."""
        MX = shifted_global_product(X, [product_sum])
        if self.acceleration == "none":
            self.basis.replace(X, MX)
        else:
            self.basis.extend(X, MX)

    def result(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Top-``k`` Ritz values (descending), vectors (n x k) and residual norms."""
        values, Y, MY = self.basis.ritz(self.k)
        return values, Y, residual_norms(values, Y, MY)


# --------------------------------------------------------------------------------------------
# Shared helpers of both strategies
# --------------------------------------------------------------------------------------------


def _label_check(num_nodes: int):
    def check(reply: Reply) -> str | None:
        labels = reply.arrays["labels"]
        if labels.dtype.kind not in "iu" and not np.all(labels == np.round(labels)):
            return "labels must be integers"
        if labels.size and (labels.min() < -1 or labels.max() >= num_nodes):
            return f"labels must be in -1 .. {num_nodes - 1}"
        return None

    return check


def _by_node(replies: list[Reply]) -> list[Reply]:
    """Replies in node order: sums are then reproducible to the last bit."""
    return sorted(replies, key=lambda reply: reply.node_id)


class _GraphStrategy(FederatedStrategy):
    """What FedSpectral and FedSpectral+ share: the graph size, all-clients phases, the
    result arrays and the optional central reference."""

    def graph_setup(self) -> tuple[int, int, list[int]]:
        n = int(self.config["num-nodes"])
        k = int(self.config["k"])
        if n < 1:
            raise FederationError(f"{self.name} needs run-config num-nodes (the global number of graph nodes)")
        if not 1 <= k <= n:
            raise FederationError(f"k={k} must be between 1 and num-nodes={n}")
        nodes = list(self.active_nodes)
        if not nodes:
            raise FederationError("no client connected")
        return n, k, nodes

    def all_clients(self, task: str, nodes: list[int], **kwargs: Any) -> list[Reply]:
        """Broadcast that needs a valid reply from every client (each holds its own edges)."""
        return _by_node(self.broadcast(task, nodes, min_replies=len(nodes), **kwargs))

    def reference(self, embedding: np.ndarray, labels: np.ndarray, num_clients: int) -> dict[str, Any] | None:
        """Agreement with the central spectral clustering of the union of the client files,
        when this server can read them (simulation on one machine). Reporting only."""
        cfg = self.config
        if not cfg["reference"] or cfg["dataset"] != "edge-dir" or not cfg["data-dir"]:
            return None
        try:
            return spectral_reference(
                Path(cfg["data-dir"]), num_clients, int(cfg["num-nodes"]), int(cfg["k"]), int(cfg["seed"]), embedding, labels
            )
        except Exception as exc:  # a report, never a reason to lose a run
            log(WARNING, "[fedcluster] no central spectral reference: %s: %s", type(exc).__name__, exc)
            return None


def spectral_reference(
    data_dir: Path, num_clients: int, n: int, k: int, seed: int, embedding: np.ndarray, labels: np.ndarray
) -> dict[str, Any] | None:
    """Central spectral clustering of the union of the first ``num_clients`` ``*.txt`` edge
    files of ``data_dir`` (the "global clustering": exact top-``k`` eigenvectors of
    ``(I + N)/2``, row-normalized, KMeans(n_init=10, random_state=seed)) compared with the
    federated ``labels`` and ``embedding``."""
    from fedcluster.data import list_client_files
    from fedcluster.metrics import adjusted_rand, nmi, rand_index

    if not data_dir.is_dir():
        return None
    files = list_client_files(data_dir, "*.txt")[:num_clients]
    edges = canonical_edges(np.concatenate([load_edge_list(f, n) for f in files]))
    values, vectors = central_eigenpairs(edges, n, min(k + 1, n), seed)
    central = vectors[:, :k]
    central_labels = embedding_labels(central, k, seed)
    return {
        "rand": rand_index(labels, central_labels),
        "ari": adjusted_rand(labels, central_labels),
        "nmi": nmi(labels, central_labels),
        "sine_to_central": subspace_distance(embedding, central),
        "central_eigenvalues": values[:k],
        "central_eigengap": float(values[k - 1] - values[k]) if values.size > k else None,
        "edges": int(edges.shape[0]),
        "how": (
            "central spectral clustering of the union of the client files (top-k eigenvectors of "
            "(I + N)/2 from an exact eigensolver, row-normalized, KMeans n_init=10, random_state=seed); "
            "reporting only"
        ),
    }


# --------------------------------------------------------------------------------------------
# FedSpectral (baseline)
# --------------------------------------------------------------------------------------------


class FedSpectral(_GraphStrategy):
    """FedSpectral, the paper's baseline: co-association of the clients' local spectral
    clusterings, clustered spectrally on the server.

    Run-config parameters: ``num-nodes``, ``k``, ``seed`` (client j uses ``seed + j`` for its
    local k-means), ``coassociation``.
    """

    name = "fedspectral"

    def run(self) -> dict[str, Any]:
        cfg = self.config
        n, k, nodes = self.graph_setup()
        seed = int(cfg["seed"])
        seeds = {node: seed + index for index, node in enumerate(nodes)}
        self.begin_round(1)
        replies = self.all_clients(
            "local_spectral_labels",
            nodes,
            config={"num-nodes": n, "k": k},
            per_node=lambda node: (None, {"seed": seeds[node]}),
            spec=ReplySpec(shapes={"labels": (n,)}, check=_label_check(n)),
            phase="local-spectral-labels",
        )
        label_lists = [r.arrays["labels"].astype(np.int64) for r in replies]
        similarity = coassociation_matrix(label_lists, n, denominator=cfg["coassociation"])
        embedding = affinity_embedding(similarity, k, seed)
        del similarity
        labels = embedding_labels(embedding, k, seed)
        held = np.zeros(n, dtype=bool)
        for client_labels in label_lists:
            held |= client_labels >= 0
        self.end_round(local_clusters=[int(np.unique(lab[lab >= 0]).size) for lab in label_lists])
        log(INFO, "[fedcluster] fedspectral: %d clients, %d of %d nodes held by some client", len(replies), held.sum(), n)
        outcome: dict[str, Any] = {
            "arrays": {"labels": labels, "embedding": embedding, "client_labels": np.stack(label_lists)},
            "final": {
                "num_nodes": n,
                "k": k,
                "communication_rounds": 1,
                "nodes_held": int(held.sum()),
                "cluster_sizes": np.bincount(labels, minlength=k),
            },
        }
        reference = self.reference(embedding, labels, len(nodes))
        if reference is not None:
            outcome["central_reference"] = reference
        return outcome


def affinity_embedding(S: np.ndarray, k: int, seed: int) -> np.ndarray:
    """Top-``k`` eigenvectors of ``D^{-1/2} S D^{-1/2}`` for a dense symmetric non-negative
    affinity S (zero rows for zero-degree nodes): the embedding behind
    :func:`fedcluster.spectral.affinity_spectral_labels` (same normalization and solver,
    which handles disconnected affinities component by component)."""
    from fedcluster.spectral import _top_eigenpairs  # the shared component-aware solver

    degrees = S.sum(axis=1)
    scale = np.zeros_like(degrees)
    scale[degrees > 0] = 1.0 / np.sqrt(degrees[degrees > 0])
    normalized = S * scale[:, None]
    normalized *= scale[None, :]
    normalized += normalized.T
    normalized *= 0.5
    _, vectors = _top_eigenpairs(normalized, k, seed)
    return vectors


# --------------------------------------------------------------------------------------------
# FedSpectral+
# --------------------------------------------------------------------------------------------


class FedSpectralPlus(_GraphStrategy):
    """FedSpectral+: federated power/subspace iteration for the global spectral embedding.

    Run-config parameters: ``num-nodes``, ``k``, ``num-rounds``, ``seed``, ``mode``
    (``"exact"`` or ``"paper"``), ``iters`` (paper), ``oversample``, ``acceleration``,
    ``max-basis``, ``residual-tol``, ``edge-copies`` (exact). See the module docstring.
    """

    name = "fedspectral-plus"

    def run(self) -> dict[str, Any]:
        cfg = self.config
        n, k, nodes = self.graph_setup()
        if cfg["mode"] == "paper":
            embedding, final = self.paper_mode(n, k, nodes)
        else:
            embedding, final = self.exact_mode(n, k, nodes)
        labels = embedding_labels(embedding, k, int(cfg["seed"]))
        final.update({"num_nodes": n, "k": k, "cluster_sizes": np.bincount(labels, minlength=k)})
        log(
            INFO,
            "[fedcluster] fedspectral-plus (%s): %d communication rounds, last subspace change %.3g",
            cfg["mode"],
            final["communication_rounds"],
            self.rounds[-1].get("subspace_change") or 0.0,
        )
        outcome: dict[str, Any] = {"arrays": {"labels": labels, "embedding": embedding}, "final": final}
        reference = self.reference(embedding, labels, len(nodes))
        if reference is not None:
            outcome["central_reference"] = reference
            log(
                INFO,
                "[fedcluster] against central spectral clustering: Rand %.4f, ARI %.4f, NMI %.4f, sine %.3g",
                reference["rand"],
                reference["ari"],
                reference["nmi"],
                reference["sine_to_central"],
            )
        return outcome

    # ------------------------------------------------------------------ paper mode
    def paper_mode(self, n: int, k: int, nodes: list[int]) -> tuple[np.ndarray, dict[str, Any]]:
        """Local power steps on the clients, average of the iterates, QR (the paper)."""
        cfg = self.config
        iters = int(cfg["iters"])
        Q = initial_block(n, k, int(cfg["seed"]))
        config = {"num-nodes": n, "iters": iters, "normalization": "local"}
        for t in range(1, int(cfg["num-rounds"]) + 1):
            self.begin_round(t)
            replies = self.all_clients(
                "power_step", nodes, arrays={"Q": Q}, config=config, kind="train",
                spec=ReplySpec(shapes={"Q": (n, k)}), phase="local-power-steps",
            )
            new = paper_aggregate([r.arrays["Q"] for r in replies])
            change = subspace_distance(new, Q)
            Q = new
            self.end_round(subspace_change=change, block_columns=k)
        return Q, {"mode": "paper", "iters": iters, "block": k, "communication_rounds": len(self.rounds)}

    # ------------------------------------------------------------------ exact mode
    def block_size(self, n: int, k: int) -> int:
        """``k + oversample`` columns, ``oversample = -1``: ``max(k, 10)`` (a block of only 2k
        converges very slowly for small k: ego-Facebook, k = 2, block 4 is still at sine 0.93
        after 20 rounds, block 12 at 4e-4), at most n."""
        p = int(self.config["oversample"])
        return int(min(n, k + (max(k, 10) if p < 0 else p)))

    def exact_mode(self, n: int, k: int, nodes: list[int]) -> tuple[np.ndarray, dict[str, Any]]:
        """Exact block subspace iteration (``acceleration="none"``) or block Krylov on the
        global ``M = (I + N)/2``; one summed product per round (module docstring)."""
        cfg = self.config
        rounds = int(cfg["num-rounds"])
        tol = float(cfg["residual-tol"])
        notes = []
        if int(cfg["iters"]) != 1:
            notes.append(f"iters={cfg['iters']} ignored: exact mode multiplies once per round")
            log(WARNING, "[fedcluster] %s", notes[-1])
        solver = ExactEigensolver(
            n, k, self.block_size(n, k), int(cfg["seed"]), cfg["acceleration"], int(cfg["max-basis"])
        )
        product_config = {
            "num-nodes": n, "iters": 1, "normalization": "global", "edge-weight": 1.0 / int(cfg["edge-copies"]),
        }

        def summed_products(X: np.ndarray, degrees: np.ndarray, phase: str) -> np.ndarray:
            replies = self.all_clients(
                "power_step", nodes, arrays={"Q": X, "degrees": degrees}, config=product_config,
                kind="train", spec=ReplySpec(shapes={"Q": (n, X.shape[1])}), phase=phase,
            )
            return np.sum([r.arrays["Q"] for r in replies], axis=0)

        # Round 1: the degrees and the first product in one exchange.
        self.begin_round(1)
        first = solver.first_block()
        solver.start(summed_products(first, np.ones(n), "degrees-and-first-product"))
        stopped, t, sent = "num-rounds", 1, first.shape[1]
        while True:
            state = solver.observe()
            self.end_round(
                subspace_change=state["change"],
                residual=state["residual"],
                basis_columns=state["basis_columns"],
                block_columns=sent,
                ritz_value_k=state["ritz_value_k"],
            )
            if tol > 0 and state["residual"] <= tol:
                stopped = f"residual-tol: top-{k} Ritz residuals <= {tol:g}"
                break
            if t >= rounds:
                break
            X = solver.next_block()
            if X is None:
                stopped = f"invariant subspace: every block residual below {KRYLOV_DROP:g}"
                break
            t, sent = t + 1, X.shape[1]
            self.begin_round(t)
            solver.absorb(X, summed_products(X, solver.degrees, "global-product"))

        values, Y, residuals = solver.result()
        degrees = solver.degrees
        final = {
            "mode": "exact",
            "acceleration": solver.acceleration,
            "block": solver.block,
            "max_basis": solver.max_basis,
            "communication_rounds": len(self.rounds),
            "stopped": stopped,
            "ritz_values": values,
            "ritz_residuals": residuals,
            "graph": {
                "isolated_nodes": int(np.count_nonzero(degrees <= 0)),
                "edges": float(degrees.sum() / 2.0),
                "edges_note": "sum of the weighted degrees / 2: the edge count when edge-copies is right",
            },
            "notes": notes,
        }
        return Y, final
