"""Server-side math of FedSpectral / FedSpectral+ and the central spectral references.

Spectral clustering here is Ng-Jordan-Weiss on the shifted normalized adjacency
``M = (I + N) / 2`` with ``N = D^{-1/2} A D^{-1/2}`` (A the 0/1 adjacency of the undirected
simple graph, D its degrees; a degree-0 node has ``D^{-1/2} = 0``). M has the eigenvectors of
N and its spectrum in ``[0, 1]``, so power/subspace iteration finds the top of N's spectrum
without eigenvalues near -1 competing. The embedding is the top-``k`` eigenvectors, the rows
are normalized to unit length, and k-means (scikit-learn, ``n_init=10``,
``random_state=seed``) gives the labels.

The FedSpectral+ "exact" protocol (see :mod:`fedcluster.graph`): the server sends an
orthonormal block Q (n x b); client j returns ``P_j = w_j D^{-1/2} A_j D^{-1/2} Q`` with the
global degrees D and ``w_j = 1/r``; the server forms ``M Q = (Q + sum_j P_j) / 2``
(:func:`shifted_global_product`) and the next block ``orthonormalize(M Q)``. Since
``sum_j w_j A_j = A`` this is exactly central block subspace iteration
(:func:`central_subspace_iteration`); :func:`rayleigh_ritz` on the last ``(Q, M Q)`` gives
the top-``k`` Ritz vectors.

SciPy and scikit-learn are imported inside the functions that need them, so importing this
module needs only NumPy.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from fedcluster.graph import canonical_edges

__all__ = [
    "normalized_adjacency",
    "orthonormalize",
    "initial_block",
    "shifted_global_product",
    "paper_aggregate",
    "rayleigh_ritz",
    "principal_angle_sines",
    "subspace_distance",
    "row_normalize",
    "embedding_labels",
    "central_eigenpairs",
    "central_subspace_iteration",
    "central_spectral",
    "coassociation_matrix",
    "affinity_spectral_labels",
    "coassociation_spectral",
]

# Below this many nodes the references use a dense symmetric eigensolver (exact and
# deterministic); above it ARPACK (scipy.sparse.linalg.eigsh) on the sparse matrix.
_DENSE_EIGEN_LIMIT = 2048


def normalized_adjacency(edges: np.ndarray, n: int):
    """``N = D^{-1/2} A D^{-1/2}`` as a ``scipy.sparse.csr_matrix`` (n x n) of the undirected
    simple graph of ``edges`` (made canonical first). Degree-0 rows/columns are zero."""
    import scipy.sparse as sp

    graph = canonical_edges(edges)
    if graph.shape[0] and int(graph.max()) >= n:
        raise ValueError(f"node id {int(graph.max())} is out of range for n={n}")
    rows = np.concatenate([graph[:, 0], graph[:, 1]])
    cols = np.concatenate([graph[:, 1], graph[:, 0]])
    degrees = np.bincount(rows, minlength=n).astype(np.float64)
    scale = np.zeros(n)
    scale[degrees > 0] = 1.0 / np.sqrt(degrees[degrees > 0])
    values = scale[rows] * scale[cols]
    return sp.csr_matrix((values, (rows, cols)), shape=(n, n))


def orthonormalize(Q: np.ndarray) -> np.ndarray:
    """Orthonormal basis of the columns of ``Q`` by ``numpy.linalg.qr`` (reduced), with the
    signs fixed so that ``diag(R) >= 0``: the result is then a continuous, unique function
    of a full-rank ``Q`` (the federated and the central runs produce the same basis, not
    one with flipped columns)."""
    Q = np.asarray(Q, dtype=np.float64)
    if Q.ndim != 2:
        raise ValueError(f"orthonormalize needs a 2-D array, got shape {Q.shape}")
    basis, R = np.linalg.qr(Q)
    signs = np.sign(np.diag(R))
    signs[signs == 0] = 1.0
    return basis * signs


def initial_block(n: int, block: int, seed: int) -> np.ndarray:
    """The random orthonormal start ``orthonormalize(default_rng(seed).standard_normal((n, block)))``
    shared by the federated server and :func:`central_subspace_iteration`."""
    if not 1 <= block <= n:
        raise ValueError(f"block must be between 1 and n={n}, got {block}")
    return orthonormalize(np.random.default_rng(seed).standard_normal((n, block)))


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


def paper_aggregate(client_blocks: Sequence[np.ndarray]) -> np.ndarray:
    """Paper-mode server step: average the clients' iterates, then QR (``orthonormalize``)."""
    if len(client_blocks) == 0:
        raise ValueError("no client blocks to aggregate")
    return orthonormalize(np.mean([np.asarray(b, dtype=np.float64) for b in client_blocks], axis=0))


def rayleigh_ritz(Q: np.ndarray, MQ: np.ndarray, k: int, return_values: bool = False):
    """Top-``k`` Ritz vectors of a symmetric M in ``span(Q)`` from ``Q`` (orthonormal columns,
    n x b) and ``MQ = M @ Q``: eigen-decompose ``H = Q^T M Q`` (symmetrized), keep the ``k``
    largest eigenvalues, return ``Q @ V_k`` (n x k, eigenvalues descending), and the Ritz
    values too when ``return_values``."""
    Q = np.asarray(Q, dtype=np.float64)
    MQ = np.asarray(MQ, dtype=np.float64)
    if Q.shape != MQ.shape or Q.ndim != 2:
        raise ValueError(f"Q {Q.shape} and MQ {MQ.shape} must be 2-D of the same shape")
    if not 1 <= k <= Q.shape[1]:
        raise ValueError(f"k must be between 1 and the block size {Q.shape[1]}, got {k}")
    H = Q.T @ MQ
    values, V = np.linalg.eigh(0.5 * (H + H.T))
    top = np.argsort(values)[::-1][:k]
    vectors = Q @ V[:, top]
    return (values[top], vectors) if return_values else vectors


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


def row_normalize(X: np.ndarray) -> np.ndarray:
    """Rows scaled to unit Euclidean norm; all-zero rows stay zero."""
    X = np.asarray(X, dtype=np.float64)
    norms = np.linalg.norm(X, axis=1, keepdims=True)
    return np.divide(X, norms, out=np.zeros_like(X), where=norms > 0)


def embedding_labels(Q: np.ndarray, k: int, seed: int) -> np.ndarray:
    """Ng-Jordan-Weiss labels of an embedding: row-normalize ``Q`` (all its columns; pass the
    top-``k`` vectors) and run ``sklearn.cluster.KMeans(k, n_init=10, random_state=seed)``."""
    from sklearn.cluster import KMeans

    X = row_normalize(Q)
    return KMeans(n_clusters=k, n_init=10, random_state=seed).fit_predict(X).astype(np.int64)


def _top_eigenpairs_connected(matrix, k: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Largest ``k`` eigenpairs of a symmetric (sparse or dense) matrix, values descending:
    dense ``eigh`` for small matrices, else ARPACK ``eigsh`` to machine precision."""
    import scipy.sparse as sp

    n = matrix.shape[0]
    k = min(k, n)
    if n <= _DENSE_EIGEN_LIMIT or k >= n - 1:
        dense = matrix.toarray() if sp.issparse(matrix) else np.asarray(matrix, dtype=np.float64)
        values, vectors = np.linalg.eigh(dense)
    else:
        from scipy.sparse.linalg import eigsh

        v0 = np.random.default_rng(seed).uniform(-1.0, 1.0, n)
        values, vectors = eigsh(matrix, k=k, which="LA", v0=v0, tol=0.0)
    order = np.argsort(values)[::-1][:k]
    return values[order], vectors[:, order]


def _top_eigenpairs(matrix, k: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Largest ``k`` eigenpairs of a symmetric non-negative (normalized adjacency-like)
    matrix, values descending, correct for disconnected graphs.

    A Krylov solver (ARPACK) finds only ONE eigenvector per eigenvalue from one start vector,
    so on a graph with c components it misses c - 1 of the eigenvalue-1 eigenvectors (seen on
    a client's share of ego-Facebook: 8 components, eigsh returned 2). The matrix is
    therefore split into connected components, each solved on its own, and the best ``k``
    eigenpairs over all components are kept (ties: larger component first). When more than
    ``k`` components tie at the top the top-``k`` space is not unique and this choice is
    arbitrary but deterministic.
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


def central_eigenpairs(edges: np.ndarray, n: int, k: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Top-``k`` eigenpairs of ``M = (I + N)/2`` of the whole graph: ``(values, vectors)`` with
    values descending (dense ``eigh`` up to 2048 nodes, else ARPACK ``eigsh`` to machine
    precision, started from a ``seed``-determined vector)."""
    values, vectors = _top_eigenpairs(normalized_adjacency(edges, n), k, seed)
    return 0.5 * (1.0 + values), vectors


def _shifted_matmat(edges: np.ndarray, n: int) -> Callable[[np.ndarray], np.ndarray]:
    N = normalized_adjacency(edges, n)
    return lambda Q: 0.5 * (Q + N @ Q)


def central_subspace_iteration(
    edges: np.ndarray, n: int, block: int, rounds: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Central block subspace iteration on ``M = (I + N)/2``: the reference of FedSpectral+
    "exact".

    Starts from ``Q_0 = initial_block(n, block, seed)``; round ``t = 0 .. rounds-1`` computes
    ``MQ_t = M Q_t`` and ``Q_{t+1} = orthonormalize(MQ_t)``. Returns ``(Q_{rounds-1},
    MQ_{rounds-1})``: the block multiplied in the last round and its product, i.e. exactly
    what the federated server holds after ``rounds`` rounds. The next iterate is
    ``orthonormalize(MQ)``, the top-``k`` Ritz vectors ``rayleigh_ritz(Q, MQ, k)``.
    """
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    apply = _shifted_matmat(edges, n)
    Q = initial_block(n, block, seed)
    MQ = apply(Q)
    for _ in range(rounds - 1):
        Q = orthonormalize(MQ)
        MQ = apply(Q)
    return Q, MQ


def central_spectral(
    edges: np.ndarray,
    n: int,
    k: int,
    seed: int,
    block: int | None = None,
    iters: int = 300,
) -> tuple[np.ndarray, np.ndarray]:
    """The "global clustering": spectral clustering of the whole graph.

    ``block=None`` (default): the top-``k`` eigenvectors of ``(I + N)/2`` from an accurate
    eigensolver (:func:`central_eigenpairs`). ``block=b``: ``iters`` rounds of
    :func:`central_subspace_iteration` with ``b`` columns and Rayleigh-Ritz on the last
    block (what an exact federated run with the same seed computes).
    Returns ``(embedding, labels)``: the eigenvectors (n x k, orthonormal columns,
    eigenvalues descending, NOT row-normalized) and :func:`embedding_labels` of them.
    """
    if block is None:
        _, embedding = central_eigenpairs(edges, n, k, seed)
    else:
        if block < k:
            raise ValueError(f"block must be >= k={k}, got {block}")
        Q, MQ = central_subspace_iteration(edges, n, block, iters, seed)
        embedding = rayleigh_ritz(Q, MQ, k)
    return embedding, embedding_labels(embedding, k, seed)


# --------------------------------------------------------------------------------------------
# FedSpectral baseline: co-association of the clients' local clusterings
# --------------------------------------------------------------------------------------------


def coassociation_matrix(
    label_lists: Sequence[np.ndarray], n: int, denominator: str = "both-present"
) -> np.ndarray:
    """Co-association similarity of several (partial) clusterings, dense ``n x n``.

    ``label_lists[j]`` is client j's ``(n,)`` label vector, ``-1`` for nodes absent from its
    local graph. ``T_uv`` = number of clients that hold both u and v and put them in the same
    cluster. With ``denominator="both-present"`` (default) ``S_uv = T_uv / B_uv`` where
    ``B_uv`` = number of clients that hold both u and v (0 where no client holds both): a
    client that never saw a node casts no vote about it. With ``"all-clients"``
    ``S_uv = T_uv / J`` (absent counts as "apart"). ``S_uu`` is 1 for a node held by some
    client and 0 for a node held by none.

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
        blocks.append(
            sp.csr_matrix((np.ones(nodes.size), (nodes, inverse)), shape=(n, max(clusters.size, 1)))
        )
    H = sp.hstack(blocks).tocsr()
    together = (H @ H.T).toarray()
    if denominator == "all-clients":
        return together / J
    both = presence @ presence.T
    return np.divide(together, both, out=np.zeros_like(together), where=both > 0)


def affinity_spectral_labels(S: np.ndarray, k: int, seed: int) -> np.ndarray:
    """Ng-Jordan-Weiss spectral clustering of a symmetric non-negative affinity ``S`` (n x n):
    top-``k`` eigenvectors of ``D^{-1/2} S D^{-1/2}``, row-normalized, KMeans(n_init=10,
    random_state=seed). Zero-degree nodes get zero rows."""
    S = np.asarray(S, dtype=np.float64)
    if S.ndim != 2 or S.shape[0] != S.shape[1]:
        raise ValueError(f"affinity must be square, got {S.shape}")
    degrees = S.sum(axis=1)
    scale = np.zeros_like(degrees)
    scale[degrees > 0] = 1.0 / np.sqrt(degrees[degrees > 0])
    normalized = scale[:, None] * S * scale[None, :]
    normalized = 0.5 * (normalized + normalized.T)
    _, vectors = _top_eigenpairs(normalized, k, seed)
    return embedding_labels(vectors, k, seed)


def coassociation_spectral(
    label_lists: Sequence[np.ndarray],
    n: int,
    k: int,
    seed: int,
    denominator: str = "both-present",
) -> np.ndarray:
    """FedSpectral server: spectral clustering (:func:`affinity_spectral_labels`) of the
    co-association similarity (:func:`coassociation_matrix`) of the clients' local labels.
    Returns ``(n,)`` int64 labels."""
    S = coassociation_matrix(label_lists, n, denominator=denominator)
    return affinity_spectral_labels(S, k, seed)
