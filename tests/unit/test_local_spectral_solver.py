"""FedSpectral's device eigensolver (``local_spectral_embedding``): it reaches the top-k
space of a graph with a small spectral gap within its product budget, gives the subspace
iteration answer where the top-k space is not unique, and its NumPy component search
agrees with SciPy's."""

import numpy as np
import pytest

from fedcluster.algorithms.fedspectral.model import local_spectral_embedding, principal_angle_sines
from fedcluster.graph import AdjacencyOperator, connected_components


def cycle(n: int) -> np.ndarray:
    return np.stack([np.arange(n), (np.arange(n) + 1) % n], axis=1)


def dense_top(edges: np.ndarray, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    A = np.zeros((n, n))
    A[edges[:, 0], edges[:, 1]] = A[edges[:, 1], edges[:, 0]] = 1.0
    scale = 1.0 / np.sqrt(A.sum(axis=1))
    values, vectors = np.linalg.eigh(0.5 * (np.eye(n) + scale[:, None] * A * scale[None, :]))
    return values[::-1][:k], vectors[:, ::-1][:, :k]


def test_small_gap_converges_within_the_product_budget():
    """A 400-cycle: the 3rd and 9th eigenvalues of (I + N)/2 differ by 1e-3, so plain
    subspace iteration needs ~15 000 products for a 1e-6 residual; the device solver must
    get there within its default 1000."""
    n, k = 400, 3
    edges = cycle(n)
    values, vectors, products, residual = local_spectral_embedding(
        AdjacencyOperator(edges, n), k, np.random.default_rng(0)
    )
    expected_values, expected_vectors = dense_top(edges, n, k)
    assert residual < 1e-6 and products < 1000
    np.testing.assert_allclose(values, expected_values, atol=1e-9)
    assert principal_angle_sines(expected_vectors, vectors)[0] < 1e-2  # residual / gap (1.9e-4)


def test_more_components_than_k_keeps_the_subspace_iteration_answer():
    """With more components than k the top-k eigenvalues are all 1 and no space is
    distinguished: the answer is the plain subspace iteration from the same start, checked
    here against that iteration written out (orthonormalized every step)."""
    edges = np.concatenate([cycle(m) + offset for m, offset in ((30, 0), (40, 30), (25, 70), (35, 95), (20, 130))])
    graph = AdjacencyOperator(edges, 150)
    count = connected_components(graph.edges, 150)[0]
    k, iters = 2, 60
    assert count > k
    values, vectors, products, _ = local_spectral_embedding(graph, k, np.random.default_rng(1), max_iters=iters)
    scale = 1.0 / np.sqrt(graph.degrees)
    Q = np.linalg.qr(np.random.default_rng(1).standard_normal((150, max(2 * k, k + 5))))[0]
    for _ in range(iters - 1):
        Q = np.linalg.qr(0.5 * (Q + graph.matmat(Q, scale, scale)))[0]
    H = Q.T @ (0.5 * (Q + graph.matmat(Q, scale, scale)))
    w, U = np.linalg.eigh(0.5 * (H + H.T))
    assert products == iters
    np.testing.assert_allclose(values, w[::-1][:k], atol=1e-12)
    assert principal_angle_sines(Q @ U[:, ::-1][:, :k], vectors)[0] < 1e-8


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_connected_components_match_scipy(seed):
    sp = pytest.importorskip("scipy.sparse")
    from scipy.sparse.csgraph import connected_components as scipy_components

    rng = np.random.default_rng(seed)
    n = 300
    edges = rng.integers(0, n, size=(200 + 60 * seed, 2))
    count, component = connected_components(edges, n)
    matrix = sp.coo_matrix((np.ones(len(edges)), (edges[:, 0], edges[:, 1])), shape=(n, n))
    expected_count, expected = scipy_components(matrix, directed=False)
    assert count == expected_count
    pairs = set(zip(component.tolist(), expected.tolist()))
    assert len(pairs) == count  # the same partition of the nodes
    assert component[0] == 0 and np.all(np.diff(np.unique(component, return_index=True)[1]) > 0)


def test_connected_components_of_nothing():
    count, component = connected_components(np.zeros((0, 2), dtype=np.int64), 3)
    assert count == 3 and component.tolist() == [0, 1, 2]
