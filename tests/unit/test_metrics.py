"""Metrics against scikit-learn / SciPy and against independent brute-force computations."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy.stats import entropy
from sklearn import metrics as sk

from fedcluster import metrics


def random_labellings(seed: int, n: int, k_a: int, k_b: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(k_a, size=n), rng.integers(k_b, size=n)


LABELLING_CASES = [
    (seed, n, k_a, k_b)
    for seed, (n, k_a, k_b) in enumerate(
        [(2, 1, 2), (7, 3, 2), (50, 5, 5), (200, 2, 7), (500, 10, 3), (1000, 20, 20), (300, 300, 4)]
    )
]


@pytest.mark.parametrize("seed,n,k_a,k_b", LABELLING_CASES)
def test_rand_index_matches_sklearn(seed, n, k_a, k_b):
    a, b = random_labellings(seed, n, k_a, k_b)
    assert metrics.rand_index(a, b) == pytest.approx(sk.rand_score(a, b), abs=1e-12)


def test_rand_index_matches_pair_enumeration():
    a, b = random_labellings(11, 40, 4, 3)
    agree = [(a[i] == a[j]) == (b[i] == b[j]) for i, j in itertools.combinations(range(a.size), 2)]
    assert metrics.rand_index(a, b) == pytest.approx(np.mean(agree), abs=1e-12)


@pytest.mark.parametrize("seed,n,k_a,k_b", LABELLING_CASES)
def test_adjusted_rand_matches_sklearn(seed, n, k_a, k_b):
    a, b = random_labellings(seed, n, k_a, k_b)
    assert metrics.adjusted_rand(a, b) == pytest.approx(sk.adjusted_rand_score(a, b), abs=1e-12)


@pytest.mark.parametrize("seed,n,k_a,k_b", LABELLING_CASES)
@pytest.mark.parametrize("average", ["arithmetic", "geometric", "min", "max"])
def test_nmi_matches_sklearn(seed, n, k_a, k_b, average):
    a, b = random_labellings(seed, n, k_a, k_b)
    expected = sk.normalized_mutual_info_score(a, b, average_method=average)
    assert metrics.nmi(a, b, average=average) == pytest.approx(expected, abs=1e-10)


@pytest.mark.parametrize("seed,n,k_a,k_b", LABELLING_CASES)
def test_variation_of_information_matches_entropies(seed, n, k_a, k_b):
    a, b = random_labellings(seed, n, k_a, k_b)
    mutual_information = sk.mutual_info_score(a, b)
    expected = entropy(np.bincount(a)) + entropy(np.bincount(b)) - 2.0 * mutual_information
    assert metrics.variation_of_information(a, b) == pytest.approx(expected, abs=1e-10)


def test_identical_partitions_up_to_renaming_score_perfectly():
    rng = np.random.default_rng(3)
    a = rng.integers(6, size=400)
    renamed = np.array([10, 3, 7, 0, 42, 5])[a]  # a bijective renaming of the labels
    assert metrics.rand_index(a, renamed) == 1.0
    assert metrics.adjusted_rand(a, renamed) == pytest.approx(1.0)
    assert metrics.nmi(a, renamed) == pytest.approx(1.0)
    assert metrics.variation_of_information(a, renamed) == pytest.approx(0.0, abs=1e-12)


def test_string_and_negative_labels_agree_with_integer_codes():
    a, b = random_labellings(5, 300, 4, 5)
    names = np.array(["w", "x", "y", "z"])[a]
    shifted = b - 1000
    for function in (metrics.rand_index, metrics.adjusted_rand, metrics.nmi, metrics.variation_of_information):
        assert function(names, shifted) == pytest.approx(function(a, b), abs=1e-12)


def test_many_singleton_labels_use_the_sparse_table():
    # 5000 x 5000 labels: a dense table would hold 25 million cells.
    rng = np.random.default_rng(8)
    a = rng.permutation(5000) * 7  # all distinct, spread out (not small codes)
    b = rng.permutation(5000)
    assert metrics.adjusted_rand(a, b) == pytest.approx(sk.adjusted_rand_score(a, b), abs=1e-12)
    assert metrics.nmi(a, b) == pytest.approx(sk.normalized_mutual_info_score(a, b), abs=1e-10)


def test_large_n_does_not_overflow():
    rng = np.random.default_rng(9)
    a = rng.integers(3, size=300_000)
    b = (a + (rng.random(a.size) < 0.1)) % 3
    assert metrics.adjusted_rand(a, b) == pytest.approx(sk.adjusted_rand_score(a, b), abs=1e-10)
    assert metrics.rand_index(a, b) == pytest.approx(sk.rand_score(a, b), abs=1e-12)


@pytest.mark.parametrize(
    "function",
    [
        metrics.rand_index,
        metrics.adjusted_rand,
        metrics.nmi,
        metrics.variation_of_information,
        metrics.hungarian_accuracy,
    ],
)
def test_label_length_mismatch_is_rejected(function):
    with pytest.raises(ValueError, match="length mismatch"):
        function(np.zeros(5, int), np.zeros(4, int))


def test_empty_labelling_is_rejected():
    with pytest.raises(ValueError, match="empty"):
        metrics.rand_index(np.array([], int), np.array([], int))


def test_contingency_matrix_matches_sklearn():
    a, b = random_labellings(4, 250, 5, 3)
    np.testing.assert_array_equal(metrics.contingency_matrix(a, b), sk.cluster.contingency_matrix(a, b))


# --- Hungarian accuracy --------------------------------------------------------------


def test_hungarian_accuracy_is_one_for_permuted_labels():
    rng = np.random.default_rng(0)
    true = rng.integers(8, size=500)
    permutation = rng.permutation(8)
    assert metrics.hungarian_accuracy(true, permutation[true]) == 1.0


def brute_force_matching_accuracy(true: np.ndarray, pred: np.ndarray) -> float:
    """Best accuracy over every injective map from the smaller label set to the larger."""
    true_values, pred_values = np.unique(true), np.unique(pred)
    best = 0
    if pred_values.size <= true_values.size:
        for image in itertools.permutations(true_values, pred_values.size):
            mapping = dict(zip(pred_values, image))
            best = max(best, sum(mapping[p] == t for p, t in zip(pred, true)))
    else:
        for image in itertools.permutations(pred_values, true_values.size):
            mapping = dict(zip(true_values, image))
            best = max(best, sum(mapping[t] == p for p, t in zip(pred, true)))
    return best / true.size


@pytest.mark.parametrize("k_true,k_pred", [(4, 4), (3, 5), (5, 3), (1, 4)])
def test_hungarian_accuracy_matches_brute_force(k_true, k_pred):
    rng = np.random.default_rng(k_true * 10 + k_pred)
    true = rng.integers(k_true, size=60)
    pred = np.where(rng.random(60) < 0.6, true % k_pred, rng.integers(k_pred, size=60))
    assert metrics.hungarian_accuracy(true, pred) == pytest.approx(brute_force_matching_accuracy(true, pred))


def test_hungarian_accuracy_counts_unmatched_labels_as_wrong():
    true = np.array([0, 0, 0, 0, 1, 1])
    pred = np.array([0, 0, 1, 1, 2, 2])  # three predicted clusters for two true ones
    assert metrics.hungarian_accuracy(true, pred) == pytest.approx(4 / 6)


# --- Internal metrics ----------------------------------------------------------------


def test_cost_per_point_is_mean_squared_distance_to_nearest_center():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(123, 4))
    centers = rng.normal(size=(5, 4))
    squared = ((X[:, None, :] - centers[None, :, :]) ** 2).sum(axis=2)
    assert metrics.cost_per_point(X, centers) == pytest.approx(squared.min(axis=1).mean())


def test_cost_per_point_rejects_dimension_mismatch():
    with pytest.raises(ValueError, match="dimension mismatch"):
        metrics.cost_per_point(np.zeros((4, 3)), np.zeros((2, 2)))


def test_intra_cluster_distance_by_hand():
    X = np.array([[0.0, 0.0], [2.0, 0.0], [10.0, 0.0], [10.0, 3.0], [10.0, 6.0]])
    labels = np.array([1, 1, 7, 7, 7])
    # cluster 1: mean (1, 0), distances 1, 1; cluster 7: mean (10, 3), distances 3, 0, 3
    assert metrics.intra_cluster_distance(X, labels) == pytest.approx((1 + 1 + 3 + 0 + 3) / 5)


def test_intra_cluster_distance_matches_loop():
    rng = np.random.default_rng(2)
    X = rng.normal(size=(200, 3))
    labels = rng.integers(6, size=200)
    expected = np.mean([np.linalg.norm(X[i] - X[labels == labels[i]].mean(axis=0)) for i in range(200)])
    assert metrics.intra_cluster_distance(X, labels) == pytest.approx(expected)


def test_intra_cluster_distance_rejects_length_mismatch():
    with pytest.raises(ValueError, match="length mismatch"):
        metrics.intra_cluster_distance(np.zeros((5, 2)), np.zeros(4, int))


@pytest.mark.parametrize("seed,n,d,k", [(0, 50, 1, 2), (1, 200, 3, 5), (2, 400, 10, 12)])
def test_davies_bouldin_matches_sklearn(seed, n, d, k):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    labels = rng.integers(k, size=n)
    assert metrics.davies_bouldin(X, labels) == pytest.approx(sk.davies_bouldin_score(X, labels), rel=1e-10)


def test_davies_bouldin_on_separated_blobs_matches_sklearn():
    rng = np.random.default_rng(4)
    labels = np.repeat(np.arange(4), 30)
    X = rng.normal(size=(120, 2)) * 0.3 + np.array([[0, 0], [5, 0], [0, 5], [5, 5]])[labels]
    assert metrics.davies_bouldin(X, labels) == pytest.approx(sk.davies_bouldin_score(X, labels), rel=1e-10)


def test_davies_bouldin_rejects_single_cluster():
    with pytest.raises(ValueError, match="between 2 and"):
        metrics.davies_bouldin(np.arange(10.0).reshape(5, 2), np.zeros(5, int))


# --- Central reference ---------------------------------------------------------------


def test_central_kmeans_matches_sklearn_inertia_and_finds_blobs():
    rng = np.random.default_rng(5)
    true_centers = np.array([[0.0, 0.0], [20.0, 0.0], [0.0, 20.0]])
    labels = np.repeat(np.arange(3), 100)
    X = true_centers[labels] + rng.normal(size=(300, 2))
    centers, cost = metrics.central_kmeans(X, 3, seed=0)
    assert centers.shape == (3, 2)
    from sklearn.cluster import KMeans

    reference = KMeans(n_clusters=3, n_init=10, random_state=0).fit(X)
    assert cost == pytest.approx(reference.inertia_, rel=1e-6)
    squared = ((X[:, None, :] - centers[None]) ** 2).sum(axis=2).min(axis=1)
    assert cost == pytest.approx(squared.sum())
    # every true center has a found center within 0.5
    gaps = np.linalg.norm(true_centers[:, None, :] - centers[None], axis=2).min(axis=1)
    assert np.all(gaps < 0.5)


def test_central_kmeans_rejects_too_many_clusters():
    with pytest.raises(ValueError, match="k must be between"):
        metrics.central_kmeans(np.zeros((3, 2)), 4, seed=0)


def test_metrics_module_imports_no_scipy_or_sklearn_at_top():
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(metrics))
    top_level_imports = [
        alias.name if isinstance(node, ast.Import) else node.module
        for node in tree.body
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in (node.names if isinstance(node, ast.Import) else [None])
    ]
    assert not any(name.split(".")[0] in {"scipy", "sklearn", "flwr"} for name in top_level_imports)
