import numpy as np
import pytest

from fedcluster.lloyd import assign, kmeans, kmeans_plus_plus, lloyd_statistics


def naive_statistics(X, C, w=None):
    w = np.ones(len(X)) if w is None else w
    d2 = ((X[:, None, :] - C[None, :, :]) ** 2).sum(-1)
    labels = d2.argmin(1)
    k = C.shape[0]
    sums = np.stack([(X[labels == j] * w[labels == j, None]).sum(0) for j in range(k)])
    counts = np.array([w[labels == j].sum() for j in range(k)])
    sumsq = np.stack([(X[labels == j] ** 2 * w[labels == j, None]).sum(0) for j in range(k)])
    return sums, counts, float((d2.min(1) * w).sum()), sumsq, labels


@pytest.mark.parametrize("chunk", [1, 7, None])
@pytest.mark.parametrize("weighted", [False, True])
def test_lloyd_statistics_match_naive(chunk, weighted):
    rng = np.random.default_rng(1)
    X = rng.normal(size=(300, 4)) * 3
    C = rng.normal(size=(6, 4)) * 3
    w = rng.uniform(0.1, 2.0, size=300) if weighted else None
    stats = lloyd_statistics(X, C, w, with_sumsq=True, chunk_rows=chunk)
    sums, counts, cost, sumsq, labels = naive_statistics(X, C, w)
    np.testing.assert_allclose(stats.sums, sums, rtol=1e-12, atol=1e-10)
    np.testing.assert_allclose(stats.counts, counts, rtol=1e-12)
    np.testing.assert_allclose(stats.sumsq, sumsq, rtol=1e-12, atol=1e-10)
    assert stats.cost == pytest.approx(cost, rel=1e-10)
    assert np.array_equal(assign(X, C, chunk_rows=chunk)[0], labels)


def test_empty_cluster_keeps_center():
    X = np.zeros((5, 2))
    C = np.array([[0.0, 0.0], [100.0, 100.0]])
    stats = lloyd_statistics(X, C)
    assert stats.counts[1] == 0
    np.testing.assert_array_equal(stats.centers(C)[1], C[1])


def test_dimension_mismatch_is_named():
    with pytest.raises(ValueError, match="do not match"):
        lloyd_statistics(np.zeros((3, 2)), np.zeros((2, 3)))


def test_kmeans_plus_plus_picks_one_point_per_separated_blob():
    rng = np.random.default_rng(0)
    means = np.array([[0, 0], [100, 0], [0, 100], [100, 100]], dtype=float)
    X = np.concatenate([m + rng.normal(size=(50, 2)) for m in means])
    for seed in range(5):
        C = kmeans_plus_plus(X, 4, np.random.default_rng(seed))
        nearest_mean = ((C[:, None, :] - means[None]) ** 2).sum(-1).argmin(1)
        assert sorted(nearest_mean) == [0, 1, 2, 3]


def test_kmeans_close_to_sklearn():
    from sklearn.cluster import KMeans

    rng = np.random.default_rng(3)
    X = np.concatenate([rng.normal(loc=m, size=(200, 3)) for m in (0, 4, 8, 12)])
    _, cost = kmeans(X, 4, np.random.default_rng(0))
    reference = KMeans(4, n_init=10, random_state=0).fit(X).inertia_
    assert cost <= reference * 1.01
