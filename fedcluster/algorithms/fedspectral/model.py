"""FedSpectral and FedSpectral+: federated spectral clustering of a graph whose edges are
spread over clients ("FedSpectral+: Spectral Clustering using Federated Learning", 2023;
working specification docs/ALGORITHMS.md section 5). The phases are in
``fedcluster/algorithms/fedspectral/strategy.py``.

Spectral clustering is Ng-Jordan-Weiss on ``M = (I + N)/2``, ``N = D^{-1/2} A D^{-1/2}``
(a degree-0 node has ``D^{-1/2} = 0``): top-``k`` eigenvectors, rows normalized, k-means.

Device (tasks ``power_step``, ``local_spectral_labels``; products through scipy.sparse where
installed, NumPy otherwise: :class:`fedcluster.graph.AdjacencyOperator`) and
server (pure functions, no flwr): the co-association of the baseline, the paper's average
of client iterates, and the exact mode's eigensolver (:class:`ExactEigensolver`: block
subspace iteration or block Krylov on summed client products).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from fedcluster.graph import AdjacencyOperator, connected_components, local_graph
from fedcluster.kernel import DeviceData
from fedcluster.linalg import orthonormalize, rayleigh_ritz

from .config import BLOCK_VALUES_MAX, COASSOCIATION_NODES_MAX, NUM_NODES_MAX, PLUS_RUN_CONFIG, RUN_CONFIG  # noqa: F401


__all__ = [
    # device
    "inverse_sqrt_degrees",
    "local_degrees",
    "local_spectral_embedding",
    "subspace_iteration_embedding",
    "chebyshev_filtered_embedding",
    "chebyshev_filter",
    # shared spectral helpers
    "row_normalize",
    "embedding_labels",
    "principal_angle_sines",
    "subspace_distance",
    "top_eigenpairs_by_component",
    "cluster_sizes",
    # FedSpectral (baseline) server
    "label_problem",
    "coassociation_matrix",
    "affinity_embedding",
    "affinity_spectral_labels",
    "coassociation_spectral",
    "nodes_held",
    "local_cluster_counts",
    # FedSpectral+ server
    "initial_block",
    "paper_aggregate",
    "start_block",
    "degree_scaled_start",
    "shifted_global_product",
    "orthonormal_complement",
    "RitzBasis",
    "residual_norms",
    "auto_max_basis",
    "ExactEigensolver",
    "KRYLOV_DROP",
    "KRYLOV_BUDGET_BYTES",
]

# Columns of a new Krylov block whose norm (after projection) falls below this are
# numerically in the span already; ||M|| <= 1, so the threshold is absolute.
KRYLOV_DROP = 1e-10
# Memory budget for the Krylov basis V and W = M V on the server (auto max-basis).
KRYLOV_BUDGET_BYTES = 256 * 2**20
# Below this many nodes the component eigensolver is dense (exact and deterministic); above
# it ARPACK (scipy.sparse.linalg.eigsh).
DENSE_EIGEN_LIMIT = 2048


# ============================================================================================
# Device kernels
# ============================================================================================
#
# Every kernel works on the device's undirected simple graph G_j (``fedcluster.graph.local_graph``,
# cached in ``DeviceData.extra``); the metric ``num-examples`` is its number of undirected edges.
# No kernel forms an n x n matrix.

# Config values arrive from a Flower ConfigRecord (int, float, str, bool).


def _block(arrays: dict, num_nodes: int) -> np.ndarray:
    """The block ``Q`` (the protocol checked it is a finite n x b array): its n must be this
    run's ``num-nodes``."""
    Q = arrays["Q"]
    if Q.shape[0] != num_nodes:
        raise ValueError(f"'Q' must have shape (num-nodes={num_nodes}, b), got {Q.shape}")
    return Q


def inverse_sqrt_degrees(degrees: np.ndarray) -> np.ndarray:
    """``d^{-1/2}`` elementwise with 0 where ``d == 0`` (no NaN, no inf)."""
    degrees = np.asarray(degrees, dtype=np.float64)
    out = np.zeros_like(degrees)
    positive = degrees > 0
    out[positive] = 1.0 / np.sqrt(degrees[positive])
    return out


def local_degrees(data: DeviceData, num_nodes: int, edge_weight: float = 1.0) -> np.ndarray:
    """Weighted local degrees ``edge_weight * deg_j`` (``(n,)`` float64) of the local graph,
    each local edge counted once per endpoint. Summed over the clients with
    ``edge_weight = 1/r`` they give the global degrees. (No task sends them: in exact mode
    the degrees arrive as the first column of the first product, ``A_j 1``.)"""
    return edge_weight * local_graph(data, num_nodes).degrees


_PRODUCT_KEY = "fedcluster.algorithms.fedspectral.model.global-product"


def _global_product(
    data: DeviceData, graph: AdjacencyOperator, degrees: np.ndarray, weight: float
) -> Callable[[np.ndarray], np.ndarray]:
    """``Q -> w D^{-1/2} A_j D^{-1/2} Q`` for the global degrees ``degrees`` (``(n,)``,
    finite, non-negative: checked by the protocol), kept on the device while the server
    sends the same degrees and weight (every round of a run). Raises ``ValueError`` when a
    node with local edges has global degree 0."""
    kept = data.extra.get(_PRODUCT_KEY)
    if (
        kept is not None
        and kept[0] == weight
        and kept[1] is graph
        and kept[2].shape == degrees.shape
        and np.array_equal(kept[2], degrees)
    ):
        return kept[3]
    missing = (graph.degrees > 0) & (degrees <= 0)
    if np.any(missing):
        node = int(np.flatnonzero(missing)[0])
        raise ValueError(
            f"global degree of node {node} is 0 but the node has local edges: the degree vector does not match the data"
        )
    scale = inverse_sqrt_degrees(degrees)
    product = graph.scaled(weight * scale, scale)
    data.extra[_PRODUCT_KEY] = (weight, graph, np.array(degrees, dtype=np.float64), product)
    return product


def product_violation(product: np.ndarray, X: np.ndarray, weight: float, edges: float, first: bool) -> str | None:
    """Why a ``power_step`` reply cannot be an honest client's product of the block ``X``,
    or None (the server's check of every reply; its own degrees depend on them).

    Every later product ``w D^{-1/2} A_j D^{-1/2} X`` (and every local power step, whose
    ``N_j`` has norm at most 1) has each column no longer than ``X``'s: with
    ``w D_j <= D``, ``||w D^{-1/2} A_j D^{-1/2}|| <= ||N_j|| <= 1``. The first product,
    ``w A_j [1, G]``, carries the degrees: its first column is ``w`` times the client's
    local degrees — non-negative, adding up to at most ``2 w`` per local edge (``edges``,
    the count it declared) — and no column is longer than ``w ||A_j||_F ||x|| =
    w sqrt(2 edges) ||x||``."""
    product = np.asarray(product, dtype=np.float64)
    lengths = np.linalg.norm(X, axis=0)
    if first:
        degrees = product[:, 0]
        if np.any(degrees < 0):
            return f"its degree column has {int(np.sum(degrees < 0))} negative entries"
        if degrees.sum() > 2 * weight * edges * (1 + 1e-9) + 1e-9:
            return (
                f"its degrees add up to {degrees.sum():.6g}, more than 2·w per local edge allows "
                f"({2 * weight * edges:.6g})"
            )
        bound = weight * np.sqrt(2.0 * max(edges, 0.0)) * lengths
    else:
        bound = lengths
    got = np.linalg.norm(product, axis=0)
    over = np.flatnonzero(got > bound * (1 + 1e-9) + 1e-12)
    if over.size:
        j = int(over[0])
        return f"column {j} of its product has length {got[j]:.6g}, more than an honest product can ({bound[j]:.6g})"
    return None


def snapped_degrees(first_sum: np.ndarray, weight: float) -> np.ndarray:
    """The first summed product with its degree column (w times a whole number of edges at
    every node) snapped to the nearest multiple of w: secure aggregation's fixed-point grid
    leaves it off by at most (clients × grid step)/2, far below w/2."""
    out = np.array(first_sum, dtype=np.float64, copy=True)
    out[:, 0] = np.round(out[:, 0] / weight) * weight
    return out


def product_range(X: np.ndarray, weight: float, first: bool) -> float:
    """The public range of every coordinate of one client's ``power_step`` product of the
    block ``X`` under secure aggregation, fixed before the round from what the server sends
    (the device clips to it; :func:`product_violation` checks more, but needs each reply):
    a later product's columns are no longer than ``X``'s, so no coordinate exceeds the
    longest; the first, ``w A_j [1, G]`` of a simple graph (at most n − 1 neighbours),
    none exceeds ``w (n − 1) max|X|``."""
    X = np.asarray(X, dtype=np.float64)
    if first:
        bound = weight * max(X.shape[0] - 1, 1) * float(np.max(np.abs(X), initial=0.0))
    else:
        bound = float(np.max(np.linalg.norm(X, axis=0), initial=0.0))
    return bound if bound > 0 else 1.0


def local_spectral_embedding(
    graph: AdjacencyOperator,
    k: int,
    rng: np.random.Generator,
    block: int | None = None,
    max_iters: int = 1000,
    tol: float = 1e-6,
) -> tuple[np.ndarray, np.ndarray, int, float]:
    """Top-``k`` eigenpairs of ``M = (I + N)/2`` of ``graph`` (every node with an edge).

    The start is a random orthonormal block ``Q_0`` of ``block`` columns (default ``2k``, at
    least ``k + 5``, at most n). Every connected component C has the eigenvalue 1, the top
    of M's spectrum (eigenvector ``D^{1/2} 1_C``). With fewer than ``k`` components the
    top-``k`` space is the limit of subspace iteration from ``Q_0``, reached by
    Chebyshev-filtered subspace iteration (:func:`chebyshev_filtered_embedding`) at the
    square root of its rate. With ``k`` or more the top-``k`` eigenvalues are all 1 and no
    top-``k`` space is distinguished: the answer is where plain subspace iteration from
    ``Q_0`` stands when its Ritz residual first falls below ``tol`` or after ``max_iters``
    steps (:func:`subspace_iteration_embedding`). ``max_iters`` caps the block products.
    Returns ``(values, vectors, products, residual)``, values descending, ``residual`` the
    largest ``||M v - theta v||`` of the top-``k`` Ritz pairs.
    """
    n = graph.num_nodes
    k = min(k, n)
    b = min(n, block if block is not None else max(2 * k, k + 5))
    b = max(b, k)
    scale = inverse_sqrt_degrees(graph.degrees)

    def apply(X: np.ndarray) -> np.ndarray:
        return 0.5 * (X + graph.matmat(X, scale, scale))

    Q = orthonormalize(rng.standard_normal((n, b)))
    if connected_components(graph.edges, n)[0] >= k:
        return subspace_iteration_embedding(apply, Q, k, max_iters, tol)
    return chebyshev_filtered_embedding(apply, Q, k, max_iters, tol)


# Subspace iteration steps between two Rayleigh-Ritz checks (and orthonormalizations).
RITZ_CHECK_EVERY = 5


def subspace_iteration_embedding(
    apply: Callable[[np.ndarray], np.ndarray], Q: np.ndarray, k: int, max_iters: int, tol: float
) -> tuple[np.ndarray, np.ndarray, int, float]:
    """Block subspace iteration ``Q_{t+1} = qr(M Q_t)`` from the orthonormal ``Q`` (n x b)
    for the top-``k`` Ritz pairs of a symmetric ``M`` with spectrum in [0, 1], checked every
    :data:`RITZ_CHECK_EVERY` steps (and at ``max_iters``): it stops when the largest top-``k``
    residual is below ``tol``. The span of ``Q_t`` is that of ``M^t Q``, so the block is
    orthonormalized only at the checks (no eigenvalue of M above 1 can overflow it between)."""
    X = Q
    values = vectors = None
    residual = np.inf
    iteration = 0
    for iteration in range(1, max_iters + 1):
        if iteration % RITZ_CHECK_EVERY == 0 or iteration == max_iters:
            Q = orthonormalize(X)
            MQ = apply(Q)
            values, vectors = rayleigh_ritz(Q, MQ, k)
            # M y = (M Q) (Q^T y): Q has orthonormal columns and y lies in its span.
            R = MQ @ (Q.T @ vectors) - vectors * values
            residual = float(np.max(np.linalg.norm(R, axis=0)))
            if residual < tol:
                break
            X = MQ
        else:
            X = apply(X)
    return values, vectors, iteration, residual


# Block products between two Rayleigh-Ritz steps of the Chebyshev-filtered iteration.
CHEBYSHEV_DEGREE = 10


def chebyshev_filtered_embedding(
    apply: Callable[[np.ndarray], np.ndarray], Q: np.ndarray, k: int, max_products: int, tol: float
) -> tuple[np.ndarray, np.ndarray, int, float]:
    """Top-``k`` eigenpairs of a symmetric ``M`` with spectrum in [0, 1] (``apply(X) = M X``)
    by Chebyshev-filtered subspace iteration (Zhou and Saad, 2007) from the orthonormal
    block ``Q`` (n x b).

    After every Rayleigh-Ritz step the Ritz block is filtered by the degree-
    :data:`CHEBYSHEV_DEGREE` Chebyshev polynomial that is small on ``[0, theta_b]`` (theta_b
    the block's smallest Ritz value) and grows fastest above it: the same space as that many
    subspace iteration steps tend to, reached at the square root of their rate. Stops when
    the largest top-``k`` residual is below ``tol``, or after ``max_products`` products.
    """
    n, b = Q.shape
    MQ = apply(Q)
    products = 1
    while True:
        H = Q.T @ MQ
        theta, U = np.linalg.eigh(0.5 * (H + H.T))
        theta, U = theta[::-1], U[:, ::-1]
        Y, MY = Q @ U, MQ @ U
        residual = float(np.max(np.linalg.norm(MY[:, :k] - Y[:, :k] * theta[:k], axis=0)))
        if residual < tol or products >= max_products or b == n:
            return theta[:k], Y[:, :k], products, residual
        degree = min(CHEBYSHEV_DEGREE, max_products - products)
        Q = orthonormalize(chebyshev_filter(apply, Y, MY, float(theta[-1]), degree))
        MQ = apply(Q)
        products += degree


def chebyshev_filter(
    apply: Callable[[np.ndarray], np.ndarray], Y: np.ndarray, MY: np.ndarray, cut: float, degree: int
) -> np.ndarray:
    """``p(M) Y`` for the scaled Chebyshev polynomial ``p`` of degree ``degree`` that is small on
    ``[0, cut]`` and 1 at 1 (``MY = M Y`` given: ``degree - 1`` new products). Where the
    interval is empty (``cut <= 0``) or ``degree`` is 1, one power step ``M Y``."""
    if cut <= 1e-12 or degree <= 1:
        return MY
    half, centre = cut / 2.0, cut / 2.0
    sigma1 = half / (1.0 - centre)
    sigma = sigma1
    previous, current = Y, (MY - centre * Y) * (sigma1 / half)
    for _ in range(degree - 1):
        following = 1.0 / (2.0 / sigma1 - sigma)
        step = (apply(current) - centre * current) * (2.0 * following / half) - (sigma * following) * previous
        previous, current, sigma = current, step, following
    return current


# ============================================================================================
# Spectral helpers shared by the server and the central references
# ============================================================================================


def row_normalize(X: np.ndarray) -> np.ndarray:
    """Rows scaled to unit Euclidean norm; all-zero rows stay zero."""
    X = np.asarray(X, dtype=np.float64)
    norms = np.linalg.norm(X, axis=1, keepdims=True)
    return np.divide(X, norms, out=np.zeros_like(X), where=norms > 0)


def embedding_labels(Q: np.ndarray, k: int, seed: int) -> np.ndarray:
    """Ng-Jordan-Weiss labels of an embedding: row-normalize ``Q`` (all its columns; pass the
    top-``k`` vectors) and run ``sklearn.cluster.KMeans(k, n_init=10, random_state=seed)``
    (server side: scikit-learn is imported here, not at module import)."""
    from sklearn.cluster import KMeans

    X = row_normalize(Q)
    return KMeans(n_clusters=k, n_init=10, random_state=seed).fit_predict(X).astype(np.int64)


def cluster_sizes(labels: np.ndarray, k: int) -> np.ndarray:
    """Nodes per cluster ``0 .. k-1`` (``(k,)`` int64)."""
    return np.bincount(np.asarray(labels, dtype=np.int64), minlength=k)


def principal_angle_sines(U: np.ndarray, V: np.ndarray) -> np.ndarray:
    """Sines of the principal angles between ``span(U)`` and ``span(V)``, largest first.

    ``min(p, q)`` values for ``U`` (n x p) and ``V`` (n x q); the first one is the subspace
    distance (0 for equal spaces, 1 when some direction of the smaller space is orthogonal to
    the other). Computed as the singular values of ``(I - U U^T) V`` on orthonormalized bases
    (accurate for small angles, unlike ``sqrt(1 - cos^2)``).
    """
    U = np.asarray(U, dtype=np.float64)
    V = np.asarray(V, dtype=np.float64)
    if U.ndim == 1:
        U = U[:, None]
    if V.ndim == 1:
        V = V[:, None]
    if U.shape[0] != V.shape[0]:
        raise ValueError(f"U {U.shape} and V {V.shape} must have the same number of rows")
    if V.shape[1] > U.shape[1]:
        U, V = V, U
    U = np.linalg.qr(U)[0]
    V = np.linalg.qr(V)[0]
    residual = V - U @ (U.T @ V)
    sines = np.linalg.svd(residual, compute_uv=False)
    return np.clip(np.sort(sines)[::-1], 0.0, 1.0)


def subspace_distance(U: np.ndarray, V: np.ndarray) -> float:
    """Largest principal-angle sine between ``span(U)`` and ``span(V)``."""
    return float(principal_angle_sines(U, V)[0])


def _top_eigenpairs_connected(matrix, k: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Largest ``k`` eigenpairs of a symmetric (sparse or dense) matrix, values descending:
    NumPy's full ``eigh`` for small matrices, else ARPACK ``eigsh`` to machine precision.

    Not :func:`fedcluster.linalg.top_eigenpairs` (SciPy's subset driver): its round-off
    differs, and on email-Eu-core, whose embedding has many near-identical rows, that
    flips the k-means labels of the central reference."""
    import scipy.sparse as sp

    n = matrix.shape[0]
    k = min(k, n)
    if n <= DENSE_EIGEN_LIMIT or k >= n - 1:
        dense = matrix.toarray() if sp.issparse(matrix) else np.asarray(matrix, dtype=np.float64)
        values, vectors = np.linalg.eigh(dense)
    else:
        from scipy.sparse.linalg import eigsh

        v0 = np.random.default_rng(seed).uniform(-1.0, 1.0, n)
        values, vectors = eigsh(matrix, k=k, which="LA", v0=v0, tol=0.0)
    order = np.argsort(values)[::-1][:k]
    return values[order], vectors[:, order]


def top_eigenpairs_by_component(matrix, k: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Largest ``k`` eigenpairs of a symmetric non-negative (normalized adjacency-like)
    matrix, dense or sparse, values descending, correct for disconnected graphs (needs SciPy).

    A Krylov solver (ARPACK) finds only ONE eigenvector per eigenvalue from one start vector,
    so on a graph with c components it misses c - 1 of the eigenvalue-1 eigenvectors. The
    matrix is therefore split into connected components, each solved on its own, and the
    best ``k`` eigenpairs over all components are kept (ties: larger component first). When
    more than ``k`` components tie at the top the top-``k`` space is not unique and this
    choice is arbitrary but deterministic.
    """
    import scipy.sparse as sp
    from scipy.sparse.csgraph import connected_components

    n = matrix.shape[0]
    k = min(k, n)
    count, component = connected_components(sp.csr_matrix(matrix), directed=False)
    if count == 1:
        return _top_eigenpairs_connected(matrix, k, seed)
    sizes = np.bincount(component, minlength=count)
    candidates = []  # (value, -size, component, column, nodes, local vectors)
    for c in np.argsort(-sizes, kind="stable"):
        nodes = np.flatnonzero(component == c)
        if sp.issparse(matrix):
            block = sp.csr_matrix(matrix)[nodes][:, nodes]
        else:
            block = np.asarray(matrix)[np.ix_(nodes, nodes)]
        values, vectors = _top_eigenpairs_connected(block, min(k, nodes.size), seed)
        for column, value in enumerate(values):
            candidates.append((-float(value), -int(nodes.size), int(c), column, nodes, vectors))
    candidates.sort(key=lambda item: item[:4])
    chosen = candidates[:k]
    out_values = np.array([-item[0] for item in chosen])
    out_vectors = np.zeros((n, len(chosen)))
    for j, (_, _, _, column, nodes, vectors) in enumerate(chosen):
        out_vectors[nodes, j] = vectors[:, column]
    return out_values, out_vectors


# ============================================================================================
# FedSpectral (baseline) server: co-association of the clients' local clusterings
# ============================================================================================


def label_problem(labels: np.ndarray, num_nodes: int) -> str | None:
    """Why a client's ``local_spectral_labels`` reply is invalid (None: it is fine): labels
    must be integers in ``-1 .. num_nodes-1``."""
    labels = np.asarray(labels)
    if labels.dtype.kind not in "iu" and not np.all(labels == np.round(labels)):
        return "labels must be integers"
    if labels.size and (labels.min() < -1 or labels.max() >= num_nodes):
        return f"labels must be in -1 .. {num_nodes - 1}"
    return None


def coassociation_matrix(label_lists: Sequence[np.ndarray], n: int, denominator: str = "both-present") -> np.ndarray:
    """Co-association similarity of several (partial) clusterings, dense ``n x n``.

    ``label_lists[j]`` is client j's ``(n,)`` label vector, ``-1`` for nodes absent from its
    local graph. ``T_uv`` = number of clients that hold both u and v and put them in the same
    cluster. With ``denominator="both-present"`` (default) ``S_uv = T_uv / B_uv`` where
    ``B_uv`` = number of clients that hold both u and v (0 where no client holds both): a
    client that never saw a node casts no vote about it. With ``"all-clients"``
    ``S_uv = T_uv / J`` (absent counts as "apart"). ``S_uu`` is 1 for a node held by some
    client and 0 for a node held by none. (The paper's formula, its eq. 1, was lost in
    extraction; both readings are offered.)

    Built from one-hot matrices with no Python loop over pairs:
    ``T = sum_j H_j H_j^T`` (H_j sparse n x k_j) and ``B = P P^T`` (P the n x J presence
    matrix). Memory ``O(n^2)`` for the dense result.
    """
    import scipy.sparse as sp

    if denominator not in ("both-present", "all-clients"):
        raise ValueError(f"denominator must be 'both-present' or 'all-clients', got {denominator!r}")
    J = len(label_lists)
    if J == 0:
        raise ValueError("no client labels")
    blocks = []
    presence = np.zeros((n, J))
    for j, labels in enumerate(label_lists):
        labels = np.asarray(labels).reshape(-1)
        if labels.shape != (n,):
            raise ValueError(f"client {j} labels have shape {labels.shape}, expected ({n},)")
        labels = labels.astype(np.int64)
        nodes = np.flatnonzero(labels >= 0)
        presence[nodes, j] = 1.0
        clusters, inverse = np.unique(labels[nodes], return_inverse=True)
        blocks.append(sp.csr_matrix((np.ones(nodes.size), (nodes, inverse)), shape=(n, max(clusters.size, 1))))
    H = sp.hstack(blocks).tocsr()
    together = (H @ H.T).toarray()
    if denominator == "all-clients":
        return together / J
    both = presence @ presence.T
    return np.divide(together, both, out=np.zeros_like(together), where=both > 0)


def affinity_embedding(S: np.ndarray, k: int, seed: int) -> np.ndarray:
    """Top-``k`` eigenvectors of ``D^{-1/2} S D^{-1/2}`` (symmetrized) for a dense symmetric
    non-negative affinity ``S`` (n x n), zero rows for zero-degree nodes; disconnected
    affinities are solved component by component (:func:`top_eigenpairs_by_component`).
    Works in place on one n x n copy."""
    S = np.asarray(S, dtype=np.float64)
    if S.ndim != 2 or S.shape[0] != S.shape[1]:
        raise ValueError(f"affinity must be square, got {S.shape}")
    scale = inverse_sqrt_degrees(S.sum(axis=1))
    normalized = S * scale[:, None]
    normalized *= scale[None, :]
    normalized += normalized.T
    normalized *= 0.5
    _, vectors = top_eigenpairs_by_component(normalized, k, seed)
    return vectors


def affinity_spectral_labels(S: np.ndarray, k: int, seed: int) -> np.ndarray:
    """Ng-Jordan-Weiss spectral clustering of an affinity ``S``: :func:`affinity_embedding`,
    then :func:`embedding_labels` (KMeans n_init=10, random_state=seed)."""
    return embedding_labels(affinity_embedding(S, k, seed), k, seed)


def coassociation_spectral(
    label_lists: Sequence[np.ndarray],
    n: int,
    k: int,
    seed: int,
    denominator: str = "both-present",
) -> tuple[np.ndarray, np.ndarray]:
    """The FedSpectral server: spectral clustering of the co-association similarity
    (:func:`coassociation_matrix`) of the clients' local labels. Returns
    ``(embedding (n x k), labels (n,) int64)``."""
    embedding = affinity_embedding(coassociation_matrix(label_lists, n, denominator=denominator), k, seed)
    return embedding, embedding_labels(embedding, k, seed)


def nodes_held(label_lists: Sequence[np.ndarray]) -> int:
    """Number of nodes some client holds (label >= 0 somewhere)."""
    held = np.zeros(np.asarray(label_lists[0]).shape, dtype=bool)
    for labels in label_lists:
        held |= np.asarray(labels) >= 0
    return int(held.sum())


def local_cluster_counts(label_lists: Sequence[np.ndarray]) -> list[int]:
    """Number of distinct local clusters of every client."""
    return [int(np.unique(labels[labels >= 0]).size) for labels in map(np.asarray, label_lists)]


# ============================================================================================
# FedSpectral+ server, paper mode: average of the client iterates
# ============================================================================================


def initial_block(n: int, block: int, seed: int) -> np.ndarray:
    """The random orthonormal start ``orthonormalize(default_rng(seed).standard_normal((n, block)))``
    of paper mode (and of :func:`fedcluster.central.central_subspace_iteration`)."""
    if not 1 <= block <= n:
        raise ValueError(f"block must be between 1 and n={n}, got {block}")
    return orthonormalize(np.random.default_rng(seed).standard_normal((n, block)))


def paper_aggregate(client_blocks: Sequence[np.ndarray]) -> np.ndarray:
    """Paper-mode server step: average the clients' iterates, then QR (``orthonormalize``)."""
    if len(client_blocks) == 0:
        raise ValueError("no client blocks to aggregate")
    return orthonormalize(np.mean([np.asarray(b, dtype=np.float64) for b in client_blocks], axis=0))


# ============================================================================================
# FedSpectral+ server, exact mode: block methods on the global M, one summed product per round
# ============================================================================================


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


def shifted_global_product(Q: np.ndarray, client_products: Sequence[np.ndarray]) -> np.ndarray:
    """Exact-mode server step: ``M Q = (Q + sum_j P_j) / 2`` from the clients' replies
    ``P_j = w_j D^{-1/2} A_j D^{-1/2} Q`` of ``power_step`` with ``normalization="global"``."""
    Q = np.asarray(Q, dtype=np.float64)
    total = np.zeros_like(Q)
    for product in client_products:
        product = np.asarray(product, dtype=np.float64)
        if product.shape != Q.shape:
            raise ValueError(f"client product has shape {product.shape}, expected {Q.shape}")
        total += product
    return 0.5 * (Q + total)


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

    def _top(self, count: int) -> tuple[np.ndarray, np.ndarray]:
        """Top ``count`` Ritz values and coefficient vectors ``U`` (Ritz vectors ``V U``):
        Rayleigh-Ritz in V's own coordinates, where the basis is the identity and its
        product the known ``H``. (Exactly NumPy's ``eigh`` of the symmetrized ``H``;
        :func:`fedcluster.linalg.top_eigenpairs` would use SciPy's subset driver, whose
        different round-off flips k-means labels on email-Eu-core.)"""
        return rayleigh_ritz(np.eye(self.size), self.H, count)

    def ritz(self, count: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Top ``count`` Ritz values (descending), vectors ``Y`` and products ``M Y``."""
        values, U = self._top(count)
        return values, self.V @ U, self.W @ U

    def restart(self, keep: int) -> None:
        values, U = self._top(keep)
        self.V = self.V @ U
        self.W = self.W @ U
        self.H = np.diag(values)


def residual_norms(values: np.ndarray, Y: np.ndarray, MY: np.ndarray) -> np.ndarray:
    """``||M y_i - theta_i y_i||`` for every Ritz pair (columns)."""
    return np.linalg.norm(MY - Y * values, axis=0)


def auto_max_basis(num_nodes: int, block: int) -> int:
    """Default Krylov basis size: every column that fits :data:`KRYLOV_BUDGET_BYTES` for V
    and W, at least 8 blocks, never more than n."""
    budget = KRYLOV_BUDGET_BYTES // (16 * max(num_nodes, 1))
    return int(min(num_nodes, max(8 * block, budget)))


class ExactEigensolver:
    """The server side of exact mode, whatever delivers the products (the federation, or
    a central twin in a benchmark): top-``k`` eigenpairs of ``M = (I + N)/2`` with a block
    of ``block`` columns, one product per round.

    * ``acceleration="none"``: block subspace iteration ``Q_{t+1} = qr(M Q_t)``; the
      embedding is the top-``k`` Rayleigh-Ritz vectors of the last ``(Q, M Q)``.
    * ``acceleration="krylov"``: block Krylov (block Lanczos with full
      re-orthogonalization, written as a block Davidson/Rayleigh-Ritz iteration): the basis
      ``V`` and ``W = M V`` are kept (:class:`RitzBasis`), each round sends the residuals
      of the top-``b`` Ritz pairs orthogonalized against ``V``, so after t rounds
      ``span(V)`` is the block Krylov space ``K_t(M, X_0)``. Past ``max_basis`` columns
      (0: :func:`auto_max_basis`) the basis is thick-restarted on its top ``3b`` Ritz vectors.

    Round 1 delivers the global degrees and the first product at once: send
    :meth:`first_block` (``[1, G]``) with :meth:`first_degrees` (ones) and pass the summed
    replies ``sum_j w A_j [1, G]`` to :meth:`start` (the first column sums to the degrees D;
    ``X_0 = D^{1/2} G``, see :func:`degree_scaled_start`). Then, while wanted,
    ``X = next_block()`` (None: the space is invariant, nothing left to learn), send ``X``
    with :attr:`degrees`, pass ``sum_j P_j`` to :meth:`absorb`. :meth:`observe` after every
    product gives the round's diagnostics; :meth:`result` the top-``k`` Ritz pairs.
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

    def first_degrees(self) -> np.ndarray:
        """Unit "degrees" sent with :meth:`first_block`: the clients then return ``w A_j [1, G]``."""
        return np.ones(self.n)

    def start(self, first_sum: np.ndarray) -> None:
        """From ``sum_j w A_j [1, G]``: the degrees D and ``M X_0`` for ``X_0 = D^{1/2} G``."""
        first_sum = np.asarray(first_sum, dtype=np.float64)
        self.degrees = np.maximum(first_sum[:, 0], 0.0)  # sums of non-negative terms
        G = start_block(self.n, self.block, self.seed)
        X0 = degree_scaled_start(G, self.degrees)
        scale = inverse_sqrt_degrees(self.degrees)
        positive = self.degrees > 0
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

    def graph_summary(self) -> dict[str, Any]:
        """What the summed degrees say about the graph (after :meth:`start`)."""
        return {
            "isolated_nodes": int(np.count_nonzero(self.degrees <= 0)),
            "edges": float(self.degrees.sum() / 2.0),
            "edges_note": "sum of the weighted degrees / 2: the edge count when edge-copies is right",
        }
