"""Tests for fedcluster.algorithms.kfed.model (k-FED, Dennis, Li & Smith 2021)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from scipy.optimize import linear_sum_assignment

from fedcluster.algorithms.kfed.model import (
    farthest_point_init,
    induced_labels,
    kfed_assign_new_device,
    TooFewCenters,
    kfed_merge,
    local_kprime_means,
)
from fedcluster.kernel import DeviceData
from fedcluster.device import kernels


@pytest.fixture(autouse=True, scope="module")
def _single_threaded_blas():
    """The matrices here are small; on a loaded 2-core machine multi-threaded OpenBLAS
    spins (the d=300 test went from ~5 s to ~80 s). Limit BLAS to one thread when
    threadpoolctl (a scikit-learn dependency) is available."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover
        yield
        return
    with threadpool_limits(limits=1, user_api="blas"):
        yield


# --------------------------------------------------------------------------------------
# The Table-1 generator, spelled out here so the test does not trust other code:
# unit variance per coordinate; means ~ N(0, s^2 I) with s = sep / sqrt(2 d) (expected
# distance between two means = sep); k/k' groups of k' = sqrt(k) consecutive components;
# each point of a group goes to one of m0 devices of the group uniformly at random.
# --------------------------------------------------------------------------------------


def federated_mixture(d, k, sep, points, seed, m0=5):
    rng = np.random.default_rng(seed)
    k_prime = int(round(np.sqrt(k)))
    means = rng.normal(0.0, sep / np.sqrt(2 * d), size=(k, d))
    xs, ys = [], []
    for g in range(k // k_prime):
        y = np.repeat(np.arange(g * k_prime, (g + 1) * k_prime), points)
        x = means[y] + rng.normal(size=(y.size, d))
        device = rng.integers(m0, size=y.size)
        for z in range(m0):
            xs.append(x[device == z])
            ys.append(y[device == z])
    return xs, ys, k_prime


def matching(truth, pred, k):
    """Best one-to-one map predicted label -> true label (Hungarian) and its accuracy."""
    confusion = np.zeros((k, k))
    np.add.at(confusion, (truth, pred), 1)
    rows, cols = linear_sum_assignment(confusion, maximize=True)
    pred_to_true = np.full(k, -1)
    pred_to_true[cols] = rows
    return pred_to_true, confusion[rows, cols].sum() / truth.size


def run_kfed(xs, k, k_prime, seed, **merge_kwargs):
    device_kwargs = merge_kwargs.pop("device_kwargs", {})
    rng = np.random.default_rng(seed)
    local = [local_kprime_means(x, k_prime, rng, **device_kwargs) for x in xs]
    centers, assignment = kfed_merge([c for c, _, _ in local], [n for _, n, _ in local], k, rng, **merge_kwargs)
    preds = [induced_labels(lab, a) for (_, _, lab), a in zip(local, assignment)]
    return local, centers, assignment, preds


def check_lloyd_fixed_point(A, centers, counts, labels):
    """Properties of the device output that hold for ANY input: finite, non-empty
    clusters, counts = cluster sizes, each center the mean of its points, each point at
    its nearest center (the assignment is stable)."""
    assert np.all(np.isfinite(centers))
    assert centers.shape == (counts.size, A.shape[1])
    assert np.all(counts > 0)
    assert counts.sum() == A.shape[0]
    np.testing.assert_array_equal(np.bincount(labels, minlength=counts.size), counts)
    for r in range(counts.size):
        np.testing.assert_allclose(centers[r], A[labels == r].mean(axis=0), atol=1e-9)
    d2 = ((A[:, None, :] - centers[None, :, :]) ** 2).sum(-1)
    own = d2[np.arange(A.shape[0]), labels]
    assert np.all(own <= d2.min(axis=1) + 1e-9)


# --------------------------------------------------------------------------------------
# Exact recovery at large separation
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_exact_recovery_large_separation(seed):
    d, k = 100, 16
    xs, ys, k_prime = federated_mixture(d, k, sep=100.0, points=100, seed=seed)
    _, centers, _, preds = run_kfed(xs, k, k_prime, seed)
    truth = np.concatenate(ys)
    _, accuracy = matching(truth, np.concatenate(preds), k)
    assert accuracy == 1.0
    assert centers.shape == (k, d)


@pytest.mark.parametrize("seed", [0, 1])
def test_exact_recovery_paper_faithful_variant(seed):
    d, k = 100, 16
    xs, ys, k_prime = federated_mixture(d, k, sep=100.0, points=100, seed=seed)
    _, _, _, preds = run_kfed(
        xs,
        k,
        k_prime,
        seed,
        n_init=1,
        to_convergence=False,
        device_kwargs={"n_init": 1, "seeding": "core"},
    )
    _, accuracy = matching(np.concatenate(ys), np.concatenate(preds), k)
    assert accuracy == 1.0


def test_exact_recovery_d300_k64():
    d, k = 300, 64
    xs, ys, k_prime = federated_mixture(d, k, sep=100.0, points=100, seed=7)
    _, _, _, preds = run_kfed(xs, k, k_prime, 7)
    _, accuracy = matching(np.concatenate(ys), np.concatenate(preds), k)
    assert accuracy == 1.0


def test_every_true_component_gets_its_own_local_center():
    xs, ys, k_prime = federated_mixture(100, 16, sep=100.0, points=100, seed=11)
    rng = np.random.default_rng(0)
    for x, y in zip(xs, ys):
        _, counts, labels = local_kprime_means(x, k_prime, rng)
        assert counts.size == np.unique(y).size
        # each local cluster is exactly one true component
        for r in range(counts.size):
            assert np.unique(y[labels == r]).size == 1


# --------------------------------------------------------------------------------------
# Degenerate device data
# --------------------------------------------------------------------------------------


def test_n_at_most_k_prime_returns_the_points():
    rng = np.random.default_rng(0)
    A = rng.normal(size=(3, 5))
    centers, counts, labels = local_kprime_means(A, 4, rng)
    assert centers.shape == (3, 5)
    np.testing.assert_array_equal(counts, [1, 1, 1])
    np.testing.assert_array_equal(centers[labels], A)


def test_n_equal_k_prime():
    rng = np.random.default_rng(1)
    A = rng.normal(size=(4, 2))
    centers, counts, labels = local_kprime_means(A, 4, rng)
    np.testing.assert_array_equal(centers[labels], A)
    assert counts.sum() == 4


def test_one_point():
    A = np.array([[1.5, -2.0, 3.0]])
    centers, counts, labels = local_kprime_means(A, 3, np.random.default_rng(0))
    np.testing.assert_array_equal(centers, A)
    np.testing.assert_array_equal(counts, [1])
    np.testing.assert_array_equal(labels, [0])


def test_no_points():
    centers, counts, labels = local_kprime_means(np.zeros((0, 4)), 3, np.random.default_rng(0))
    assert centers.shape == (0, 4) and counts.shape == (0,) and labels.shape == (0,)


def test_duplicates_fewer_distinct_than_k_prime():
    base = np.array([[0.0, 0.0], [5.0, 5.0], [-3.0, 2.0]])
    A = base[[0, 1, 2, 0, 0, 1, 2, 2, 2, 0]]
    centers, counts, labels = local_kprime_means(A, 5, np.random.default_rng(0))
    assert centers.shape == (3, 2)
    np.testing.assert_array_equal(centers[labels], A)
    for r in range(3):
        assert counts[r] == np.sum(np.all(A == centers[r], axis=1))


def test_duplicates_more_distinct_than_k_prime():
    rng = np.random.default_rng(3)
    distinct = rng.normal(size=(9, 6)) * 10
    A = distinct[rng.integers(9, size=200)]
    centers, counts, labels = local_kprime_means(A, 4, rng)
    assert counts.size <= 4
    check_lloyd_fixed_point(A, centers, counts, labels)


def test_all_identical_points():
    A = np.tile([[2.0, -1.0, 0.5]], (50, 1))
    centers, counts, labels = local_kprime_means(A, 4, np.random.default_rng(0))
    np.testing.assert_array_equal(centers, A[:1])
    np.testing.assert_array_equal(counts, [50])
    np.testing.assert_array_equal(labels, np.zeros(50))


def test_k_prime_one():
    rng = np.random.default_rng(4)
    A = rng.normal(size=(30, 3))
    centers, counts, labels = local_kprime_means(A, 1, rng)
    np.testing.assert_allclose(centers, A.mean(axis=0, keepdims=True))
    np.testing.assert_array_equal(counts, [30])


def test_points_coinciding_in_projection():
    # Rows differ only in a direction orthogonal to the dominant ones: few distinct
    # projected points, many distinct original points.
    A = np.zeros((40, 3))
    A[:20, 0] = 100.0
    A[20:, 1] = 100.0
    A[:, 2] = np.arange(40) * 1e-3
    centers, counts, labels = local_kprime_means(A, 2, np.random.default_rng(0))
    check_lloyd_fixed_point(A, centers, counts, labels)


@pytest.mark.parametrize("seeding", ["best", "core", "voronoi"])
@pytest.mark.parametrize("seed", range(6))
def test_random_small_inputs_are_lloyd_fixed_points(seeding, seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 40))
    d = int(rng.integers(1, 6))
    A = np.round(rng.normal(size=(n, d)) * 3)  # rounding makes duplicates likely
    k_prime = int(rng.integers(1, 8))
    centers, counts, labels = local_kprime_means(A, k_prime, rng, seeding=seeding, n_init=2)
    assert counts.size <= k_prime
    check_lloyd_fixed_point(A, centers, counts, labels)


def test_bad_device_input():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="k-prime"):
        local_kprime_means(np.ones((5, 2)), 0, rng)
    with pytest.raises(ValueError, match="2-D"):
        local_kprime_means(np.ones(5), 2, rng)
    with pytest.raises(ValueError, match="NaN"):
        local_kprime_means(np.array([[np.nan, 1.0], [0.0, 0.0]]), 1, rng)
    with pytest.raises(ValueError, match="seeding"):
        local_kprime_means(np.ones((1, 2)), 2, rng, seeding="x")


def test_low_separation_core_set_collapse_is_avoided():
    # Far below the theory's separation the core sets are a handful of points; seeding
    # Lloyd in d=300 from their means used to collapse the local clustering.
    xs, ys, k_prime = federated_mixture(300, 64, sep=5.0, points=500, seed=0)
    x, y = xs[0], ys[0]
    _, _, labels = local_kprime_means(x, k_prime, np.random.default_rng(0), n_init=2)
    _, accuracy = matching(np.unique(y, return_inverse=True)[1].reshape(-1), labels, 64)
    assert accuracy > 0.8


# --------------------------------------------------------------------------------------
# Device task through kernels()
# --------------------------------------------------------------------------------------


def test_device_task_registered():
    rng = np.random.default_rng(0)
    A = np.vstack([rng.normal(size=(20, 4)), rng.normal(size=(20, 4)) + 50])
    arrays, metrics = kernels()["kfed_local"](DeviceData(points=A), {}, {"k-prime": 2, "seed": 3})
    assert set(arrays) == {"centers", "counts", "cost"}
    assert arrays["centers"].shape == (2, 4)
    np.testing.assert_array_equal(np.sort(arrays["counts"]), [20, 20])
    groups = [A[:20], A[20:]]  # the local cost is each point's squared distance to its local center
    assert arrays["cost"][0] == pytest.approx(sum(((g - g.mean(0)) ** 2).sum() for g in groups))
    assert metrics == {"num-examples": 40}
    # deterministic given the seed
    again, _ = kernels()["kfed_local"](DeviceData(points=A), {}, {"k-prime": 2, "seed": 3})
    np.testing.assert_array_equal(again["centers"], arrays["centers"])
    paper, _ = kernels()["kfed_local"](
        DeviceData(points=A), {}, {"k-prime": 2, "seed": 3, "n-init": 1, "seeding": "core"}
    )
    np.testing.assert_allclose(np.sort(paper["centers"], axis=0), np.sort(arrays["centers"], axis=0))


def test_device_task_errors():
    with pytest.raises(ValueError, match="k-prime"):
        kernels()["kfed_local"](DeviceData(points=np.ones((3, 2))), {}, {"seed": 0})
    with pytest.raises(ValueError, match="point data"):
        kernels()["kfed_local"](DeviceData(edges=np.zeros((2, 2), int)), {}, {"k-prime": 2})
    with pytest.raises(ValueError, match="seeding"):
        kernels()["kfed_local"](DeviceData(points=np.ones((3, 2))), {}, {"k-prime": 2, "seeding": "x"})


def test_kfed_module_is_numpy_only():
    code = (
        "import sys, fedcluster.algorithms.kfed.device;"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('flwr', 'scipy', 'sklearn')];"
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=_repo_root())


def _repo_root():
    import pathlib

    return str(pathlib.Path(__file__).resolve().parents[2])


# --------------------------------------------------------------------------------------
# Server side
# --------------------------------------------------------------------------------------


def test_farthest_point_init_by_hand():
    # 1-D: device 0 = {0, 1}, device 1 = {10}, device 2 = {4, 20}. Starting from device 0
    # M = {0, 1}; farthest is 20 (distance 19), then 10 (distance 9 vs 4's 3).
    dc = [np.array([[0.0], [1.0]]), np.array([[10.0]]), np.array([[4.0], [20.0]])]
    for seed in range(20):
        rng = np.random.default_rng(seed)
        start = rng.integers(3)  # the same draw farthest_point_init makes
        M = farthest_point_init(dc, 4, np.random.default_rng(seed))
        expected = {0: [0, 1, 20, 10], 1: [10, 0, 20, 4], 2: [4, 20, 10, 0]}[int(start)]
        np.testing.assert_array_equal(M[:, 0], expected)


def test_farthest_point_init_device_with_more_than_k_centers():
    dc = [np.array([[0.0], [1.0], [9.0], [5.0]])]
    M = farthest_point_init(dc, 3, np.random.default_rng(0))
    # farthest-first from the device's first center: 0, then 9, then 5 (4 away) over 1
    np.testing.assert_array_equal(M[:, 0], [0.0, 9.0, 5.0])


def test_k_larger_than_number_of_device_centers():
    dc = [np.zeros((2, 3)), np.ones((1, 3))]
    with pytest.raises(ValueError, match="k=4 is larger than the 3 local centers"):
        farthest_point_init(dc, 4, np.random.default_rng(0))
    with pytest.raises(ValueError, match="k=4"):
        kfed_merge(dc, [np.ones(2), np.ones(1)], 4, np.random.default_rng(0))


@pytest.mark.parametrize("weighting", ["count", "uniform"])
def test_one_round_merge_equals_weighted_means_around_M(weighting):
    rng = np.random.default_rng(5)
    dc = [rng.normal(size=(int(rng.integers(1, 5)), 3)) * 5 for _ in range(6)]
    cn = [rng.integers(1, 100, size=c.shape[0]).astype(float) for c in dc]
    k = 5
    M = farthest_point_init(dc, k, np.random.default_rng(9))
    centers, assignment = kfed_merge(
        dc, cn, k, np.random.default_rng(9), weighting=weighting, to_convergence=False, n_init=1
    )
    P = np.vstack(dc)
    w = np.concatenate(cn) if weighting == "count" else np.ones(P.shape[0])
    groups = np.argmin(((P[:, None] - M[None]) ** 2).sum(-1), axis=1)
    np.testing.assert_array_equal(np.concatenate(assignment), groups)
    for j in range(k):
        if np.any(groups == j):
            expected = (w[groups == j, None] * P[groups == j]).sum(0) / w[groups == j].sum()
        else:
            expected = M[j]
        np.testing.assert_allclose(centers[j], expected)


def test_merge_to_convergence_is_a_weighted_lloyd_fixed_point():
    rng = np.random.default_rng(6)
    dc = [rng.normal(size=(3, 2)) * 4 for _ in range(8)]
    cn = [rng.integers(1, 50, size=3).astype(float) for _ in range(8)]
    centers, assignment = kfed_merge(dc, cn, 4, np.random.default_rng(1), to_convergence=True)
    P, w, a = np.vstack(dc), np.concatenate(cn), np.concatenate(assignment)
    np.testing.assert_array_equal(a, np.argmin(((P[:, None] - centers[None]) ** 2).sum(-1), 1))
    for j in np.unique(a):
        np.testing.assert_allclose(centers[j], (w[a == j, None] * P[a == j]).sum(0) / w[a == j].sum())


def test_more_starts_never_increase_the_merge_cost():
    rng = np.random.default_rng(8)
    dc = [rng.normal(size=(4, 3)) * 3 for _ in range(10)]
    cn = [rng.integers(1, 50, size=4).astype(float) for _ in range(10)]
    P, w = np.vstack(dc), np.concatenate(cn)

    def cost(centers):
        return float((((P[:, None] - centers[None]) ** 2).sum(-1).min(1) * w).sum())

    one, _ = kfed_merge(dc, cn, 6, np.random.default_rng(2), n_init=1)
    many, _ = kfed_merge(dc, cn, 6, np.random.default_rng(2), n_init=30)
    assert cost(many) <= cost(one) + 1e-9


def test_empty_group_keeps_its_initial_center():
    dc = [np.array([[0.0, 0.0], [0.0, 0.0]])]
    centers, assignment = kfed_merge(dc, [np.array([3.0, 4.0])], 2, np.random.default_rng(0))
    np.testing.assert_array_equal(centers, np.zeros((2, 2)))
    assert assignment[0].shape == (2,)


def test_merge_input_errors():
    dc = [np.zeros((2, 3)), np.ones((2, 3))]
    with pytest.raises(ValueError, match="weighting"):
        kfed_merge(dc, [np.ones(2)] * 2, 2, np.random.default_rng(0), weighting="mass")
    with pytest.raises(ValueError, match="counts"):
        kfed_merge(dc, [np.ones(3), np.ones(2)], 2, np.random.default_rng(0))
    with pytest.raises(ValueError, match="dimensions"):
        kfed_merge([np.zeros((2, 3)), np.ones((2, 4))], [np.ones(2)] * 2, 2, 0)
    with pytest.raises(ValueError, match="non-negative"):
        kfed_merge(dc, [np.array([1.0, -1.0]), np.ones(2)], 2, np.random.default_rng(0))


def test_induced_labels():
    np.testing.assert_array_equal(induced_labels([0, 2, 1, 2], [7, 3, 5]), [7, 5, 3, 5])
    with pytest.raises(ValueError):
        induced_labels([0, 3], [1, 2])


# --------------------------------------------------------------------------------------
# Partial participation: absent devices, new devices
# --------------------------------------------------------------------------------------


def test_absent_device_and_new_device_mapping():
    d, k = 100, 16
    xs, ys, k_prime = federated_mixture(d, k, sep=100.0, points=100, seed=21)
    held_out = 7
    rng = np.random.default_rng(0)
    local = [local_kprime_means(x, k_prime, rng) for x in xs]
    present = [z for z in range(len(xs)) if z != held_out]
    centers, assignment = kfed_merge([local[z][0] for z in present], [local[z][1] for z in present], k, rng)
    preds = [induced_labels(local[z][2], a) for z, a in zip(present, assignment)]
    truth = np.concatenate([ys[z] for z in present])
    pred_to_true, accuracy = matching(truth, np.concatenate(preds), k)
    assert accuracy == 1.0

    # The held-out device joins later: only its own centers and the global ones are used.
    new_centers, _, new_labels = local_kprime_means(xs[held_out], k_prime, np.random.default_rng(1))
    mapping = kfed_assign_new_device(new_centers, centers)
    assert mapping.shape == (new_centers.shape[0],)
    new_pred = induced_labels(new_labels, mapping)
    np.testing.assert_array_equal(pred_to_true[new_pred], ys[held_out])


def test_device_with_no_centers_in_the_merge():
    xs, ys, k_prime = federated_mixture(100, 16, sep=100.0, points=60, seed=3)
    rng = np.random.default_rng(0)
    local = [local_kprime_means(x, k_prime, rng) for x in xs]
    dc = [c for c, _, _ in local] + [np.zeros((0, 100))]
    cn = [n for _, n, _ in local] + [np.zeros(0)]
    centers, assignment = kfed_merge(dc, cn, 16, rng)
    assert len(assignment) == len(dc) and assignment[-1].shape == (0,)
    preds = [induced_labels(lab, a) for (_, _, lab), a in zip(local, assignment)]
    _, accuracy = matching(np.concatenate(ys), np.concatenate(preds), 16)
    assert accuracy == 1.0


def test_assign_new_device_errors():
    with pytest.raises(ValueError, match="do not match"):
        kfed_assign_new_device(np.zeros((2, 3)), np.zeros((4, 2)))
    assert kfed_assign_new_device(np.zeros((0, 3)), np.zeros((4, 3))).shape == (0,)


# --- speed paths of the device step (Gram eigenvectors, restart de-duplication, early stop)


@pytest.mark.parametrize("shape", [(200, 30), (20, 60), (8, 8)])
def test_top_singular_subspace_matches_svd(shape):
    from fedcluster.algorithms.kfed.model import _top_right_singular_vectors

    A = np.random.default_rng(1).normal(size=shape) + 3.0
    r = 4
    V = _top_right_singular_vectors(A, r)
    _, _, Vt = np.linalg.svd(A, full_matrices=False)
    W = Vt[:r].T
    assert V.shape == W.shape
    np.testing.assert_allclose(V.T @ V, np.eye(r), atol=1e-10)
    # Same subspace: projections onto it agree.
    np.testing.assert_allclose(V @ V.T, W @ W.T, atol=1e-8)


def test_rank_deficient_wide_device_falls_back_cleanly():
    from fedcluster.algorithms.kfed.model import _top_right_singular_vectors

    rng = np.random.default_rng(2)
    A = rng.normal(size=(6, 2)) @ rng.normal(size=(2, 50))  # n < d, rank 2
    V = _top_right_singular_vectors(A, 4)
    assert V.shape == (50, 4) and np.all(np.isfinite(V))
    np.testing.assert_allclose(V.T @ V, np.eye(4), atol=1e-8)
    centers, counts, labels = local_kprime_means(A, 4, np.random.default_rng(0))
    assert np.all(np.isfinite(centers)) and counts.sum() == 6


def test_early_stop_keeps_the_exhaustive_answer_on_separated_data():
    rng = np.random.default_rng(5)
    means = rng.normal(scale=10.0, size=(4, 40))
    A = np.vstack([m + rng.normal(size=(60, 40)) for m in means])
    full = local_kprime_means(A, 4, np.random.default_rng(3), early_stop=0)
    fast = local_kprime_means(A, 4, np.random.default_rng(3))
    cost = lambda c, lab: float(((A - c[lab]) ** 2).sum())  # noqa: E731
    assert cost(fast[0], fast[2]) == pytest.approx(cost(full[0], full[2]), rel=1e-9)


def test_cap_device_weights_by_hand():
    from fedcluster.algorithms.kfed.model import cap_device_weights

    capped = cap_device_weights([np.array([1.0, 3.0]), np.array([10.0]), np.array([2.0, 2.0, 2.0]), np.array([4e9])])
    # totals 4, 10, 6, 4e9; median 8: the devices above 8 are scaled down to 8, the rest kept
    np.testing.assert_allclose(capped[0], [1.0, 3.0])
    np.testing.assert_allclose(capped[1], [8.0])
    np.testing.assert_allclose(capped[2], [2.0, 2.0, 2.0])
    np.testing.assert_allclose(capped[3], [8.0])


# --- min_devices: a global cluster needs centers of several devices ----------------------------


def test_unsupported_centers_matches_a_naive_count_of_devices_per_cluster():
    from fedcluster.algorithms.kfed.model import unsupported_centers

    rng = np.random.default_rng(5)
    for _ in range(50):
        k = int(rng.integers(1, 6))
        owner = rng.integers(0, 7, size=int(rng.integers(1, 30)))
        labels = rng.integers(0, k, size=owner.size)
        for min_devices in (1, 2, 3):
            naive = np.array(
                [len({o for o, lab in zip(owner, labels) if lab == label}) < min_devices for label in labels]
            )
            assert np.array_equal(unsupported_centers(owner, labels, k, min_devices), naive)


def _far_center_federation(rng):
    """Eight devices, each with one center near each of three true means (0, 10, 20 on a
    line, x2 jitter), and one more device whose second center sits at 200."""
    means = np.array([[0.0, 0.0], [10.0, 0.0], [20.0, 0.0]])
    centers = [means + rng.normal(scale=0.3, size=means.shape) for _ in range(8)]
    counts = [np.full(3, 50.0) for _ in range(8)]
    centers.append(np.array([[10.2, 0.1], [200.0, 0.0]]))
    counts.append(np.array([50.0, 50.0]))
    return means, centers, counts


def test_min_devices_keeps_one_device_from_claiming_a_cluster_with_a_far_center():
    means, centers, counts = _far_center_federation(np.random.default_rng(0))
    # the paper's merge: the far center is a global cluster, two true means share one
    plain, _ = kfed_merge(centers, counts, 3, np.random.default_rng(1))
    assert np.min(np.linalg.norm(plain - [200.0, 0.0], axis=1)) < 1e-9
    robust, assignment, kept = kfed_merge(centers, counts, 3, np.random.default_rng(1), min_devices=2, return_kept=True)
    order = np.argsort(robust[:, 0])
    assert np.allclose(robust[order], means, atol=0.5), robust
    assert kept.tolist() == [True] * 25 + [False]  # only the far center was left out
    assert assignment[-1][1] == order[2]  # it takes the nearest global cluster (the one at 20)
    assert [a.shape for a in assignment] == [c.shape[:1] for c in centers]


def test_min_devices_one_is_the_plain_merge_and_too_few_supported_centers_is_an_error():
    _, centers, counts = _far_center_federation(np.random.default_rng(2))
    a = kfed_merge(centers, counts, 3, np.random.default_rng(3))
    b, _, kept = kfed_merge(centers, counts, 3, np.random.default_rng(3), min_devices=1, return_kept=True)
    assert np.array_equal(a[0], b) and kept.all()
    with pytest.raises(TooFewCenters, match="min-devices=10"):
        kfed_merge(centers, counts, 3, np.random.default_rng(3), min_devices=10)
    with pytest.raises(ValueError, match="min_devices"):
        kfed_merge(centers, counts, 3, np.random.default_rng(3), min_devices=0)


def test_ward_agglomeration_by_its_invariants_and_a_naive_merge():
    """The merge costs add up to the scatter of the weighted centers about their mean, and
    the groups left at every level are those a naive agglomeration (the cheapest pair
    merged, the whole cost table recomputed each time) leaves, as a set."""
    from fedcluster.algorithms.kfed.model import ward_agglomeration

    rng = np.random.default_rng(8)
    for _ in range(50):
        c, d = int(rng.integers(2, 12)), int(rng.integers(1, 4))
        C, N = rng.normal(size=(c, d)) * 5, rng.integers(1, 30, size=c).astype(float)
        merge, _ = ward_agglomeration(C, N)
        mean = (N[:, None] * C).sum(0) / N.sum()
        assert merge.sum() == pytest.approx(float((N * ((C - mean) ** 2).sum(1)).sum()), rel=1e-9)
        groups, weights = [row for row in C], list(N)
        while len(groups) > 1:
            g = len(groups)
            pairs = [
                (weights[i] * weights[j] / (weights[i] + weights[j]) * ((groups[i] - groups[j]) ** 2).sum(), i, j)
                for i in range(g)
                for j in range(i + 1, g)
            ]
            _, i, j = min(pairs)
            groups[i] = (weights[i] * groups[i] + weights[j] * groups[j]) / (weights[i] + weights[j])
            weights[i] += weights[j]
            del groups[j], weights[j]
            left = ward_agglomeration(C, N, len(groups))[1]
            np.testing.assert_allclose(
                np.array(sorted(map(tuple, left))), np.array(sorted(map(tuple, groups))), atol=1e-9
            )
