"""The central references the federated results are judged against, for reporting and
testing only: they play no part in any algorithm.

* **Points** (:func:`central_reference`): when the server can reconstruct the pooled data
  (generated datasets, or an ``npy-dir`` it can read in a one-machine simulation) it runs
  scikit-learn's KMeans (k-means++, n_init=10) on the pooled points and evaluates the
  federated centers on the same points, so the run prints "federated cost vs central
  cost". The pooled data never leaves the server process.
* **Graphs**: central spectral clustering of the whole graph, which FedSpectral /
  FedSpectral+ are judged against (docs/ALGORITHMS.md section 5, "global clustering").
  :func:`central_eigenpairs` (an accurate eigensolver) and :func:`central_spectral` give the
  global clustering; :func:`central_subspace_iteration` is what FedSpectral+ "exact" must
  equal; :func:`compare_with_central` is the server's optional report on the union of the
  client files.

SciPy and scikit-learn are imported inside the functions that need them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np

from fedcluster.algorithms.fedspectral.model import (
    embedding_labels,
    initial_block,
    subspace_distance,
    top_eigenpairs_by_component,
)
from .graph import canonical_edges, load_edge_list
from .linalg import orthonormalize, rayleigh_ritz
from .lloyd import kmeans_cost
from .node_data import pooled_points

__all__ = [
    "central_reference",
    "normalized_adjacency",
    "central_eigenpairs",
    "central_subspace_iteration",
    "central_spectral",
    "compare_with_central",
]


def central_reference(
    config: dict[str, Any],
    num_clients: int,
    centers: np.ndarray | None,
    num_points: int | None = None,
    scaling: Any = None,
) -> dict[str, Any] | None:
    """Pooled central k-means cost beside the federated one, or None when unavailable.

    ``num_points`` is the number of points the federation reported; when the pooled data
    the server can rebuild has a different size, the nodes held something else and no
    reference is given. ``scaling`` (a standardized run, in the units the run clustered
    in: :class:`fedcluster.scaling.Scaling`): the pooled points and ``centers`` (in the
    run's standardized units) are compared after it, as a StandardScaler → KMeans pipeline.
    """
    if centers is None:
        return None
    pooled = pooled_points(config, num_clients)
    if pooled is None:
        return None
    X, _ = pooled
    if scaling is not None:
        X = scaling.apply(X)
    k = centers.shape[0]  # the run's k (a k-range run: the k it chose)
    if X.shape[0] < k or X.shape[1] != centers.shape[1]:
        return None
    if num_points is not None and X.shape[0] != num_points:
        # The nodes did not hold what the server can rebuild (e.g. a deployment whose
        # SuperNodes read their own files, or excluded nodes): no honest reference.
        return None
    from .metrics import central_kmeans

    _, central_total = central_kmeans(X, k, config["seed"], n_init=10)
    federated_total = kmeans_cost(X, centers)
    return {
        "num_points": int(X.shape[0]),
        "central_cost": central_total / X.shape[0],
        "federated_cost": federated_total / X.shape[0],
        "ratio": federated_total / central_total if central_total > 0 else None,
        "how": "scikit-learn KMeans(k-means++, n_init=10) on the pooled points; federated centers evaluated on the "
        "same points" + ("; both standardized by the run's scaling" if scaling is not None else ""),
    }


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


def central_eigenpairs(edges: np.ndarray, n: int, k: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Top-``k`` eigenpairs of ``M = (I + N)/2`` of the whole graph: ``(values, vectors)`` with
    values descending, component by component (dense up to 2048 nodes, else ARPACK ``eigsh``
    to machine precision, started from a ``seed``-determined vector)."""
    values, vectors = top_eigenpairs_by_component(normalized_adjacency(edges, n), k, seed)
    return 0.5 * (1.0 + values), vectors


def _shifted_matmat(edges: np.ndarray, n: int) -> Callable[[np.ndarray], np.ndarray]:
    N = normalized_adjacency(edges, n)
    return lambda Q: 0.5 * (Q + N @ Q)


def central_subspace_iteration(
    edges: np.ndarray, n: int, block: int, rounds: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Central block subspace iteration on ``M = (I + N)/2``: the oracle of FedSpectral+
    "exact" driven by ``initial_block`` starts.

    Starts from ``Q_0 = initial_block(n, block, seed)``; round ``t = 0 .. rounds-1`` computes
    ``MQ_t = M Q_t`` and ``Q_{t+1} = orthonormalize(MQ_t)``. Returns ``(Q_{rounds-1},
    MQ_{rounds-1})``: the block multiplied in the last round and its product, i.e. exactly
    what a federated server holds after ``rounds`` rounds. The next iterate is
    ``orthonormalize(MQ)``, the top-``k`` Ritz vectors ``rayleigh_ritz(Q, MQ, k)[1]``.
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
    block. Returns ``(embedding, labels)``: the eigenvectors (n x k, orthonormal columns,
    eigenvalues descending, NOT row-normalized) and :func:`embedding_labels` of them.
    """
    if block is None:
        _, embedding = central_eigenpairs(edges, n, k, seed)
    else:
        if block < k:
            raise ValueError(f"block must be >= k={k}, got {block}")
        Q, MQ = central_subspace_iteration(edges, n, block, iters, seed)
        _, embedding = rayleigh_ritz(Q, MQ, k)
    return embedding, embedding_labels(embedding, k, seed)


def compare_with_central(
    data_dir: Path, num_clients: int, n: int, k: int, seed: int, embedding: np.ndarray, labels: np.ndarray
) -> dict[str, Any] | None:
    """Central spectral clustering of the union of the first ``num_clients`` ``*.txt`` edge
    files of ``data_dir`` (exact top-``k`` eigenvectors of ``(I + N)/2``, row-normalized,
    KMeans(n_init=10, random_state=seed)) compared with the federated ``labels`` and
    ``embedding``: Rand index, ARI, NMI and the largest principal-angle sine. None when
    ``data_dir`` is not a directory."""
    from .data import list_client_files
    from .metrics import adjusted_rand, nmi, rand_index

    data_dir = Path(data_dir)
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
