"""Data far from the origin (issue 42, case 1), on plain arrays: the k-means kernel and the
server's checks give at an offset of 1e6 … 1e12 what they give about the offset, an honest
device's statistics pass there and a liar's are still caught; a run's texts stay readable.

The oracle everywhere is arithmetic about the offset: ``X − offset`` is exact for coordinates
within a factor of two of it, and from there every distance is a direct difference."""

from __future__ import annotations

import numpy as np
import pytest

from fedcluster.lloyd import (
    MEMBERSHIP_MAX_K,
    assign,
    kmeans,
    kmeans_cost,
    lloyd,
    lloyd_statistics,
    lloyd_until_stable,
    nearest,
)

OFFSETS = [1e6, 1e8, 1e9, 1.7e9, 1e12]
_EPS = np.finfo(np.float64).eps


def mixture(seed=0, n=2000, d=3, k=5, spread=4.0):
    rng = np.random.default_rng(seed)
    means = rng.normal(size=(k, d)) * spread
    return rng.normal(size=(n, d)) + means[rng.integers(k, size=n)]


def about(X, C):
    """Squared distances (n, k) by direct differences: the oracle."""
    return ((X[:, None, :] - C[None]) ** 2).sum(-1)


def shifted(offset, seed=0, k=5, d=3):
    """Points and centers at ``offset``, and the same numbers about it (exact)."""
    X0 = mixture(seed, d=d)
    rng = np.random.default_rng(seed + 1)
    C0 = X0[rng.choice(len(X0), size=k, replace=False)] + rng.normal(size=(k, d)) * 0.3
    X, C = X0 + offset, C0 + offset
    return X, C, X - offset, C - offset


def nearest_up_to_rounding(labels, d2, offset):
    """Every label is a nearest center but for ties within what the data's own rounding at
    this offset can decide (a few units in the last place of the offset, times the spread)."""
    chosen = d2[np.arange(len(labels)), labels]
    return bool(np.all(chosen - d2.min(1) <= 1e-13 * offset * 100))


# ------------------------------------------------------------------ the kernel
@pytest.mark.parametrize("offset", OFFSETS, ids=lambda o: f"{o:g}")
@pytest.mark.parametrize("k", [5, MEMBERSHIP_MAX_K + 5])  # both ways of finding the nearest
def test_lloyd_statistics_far_from_the_origin_are_those_about_it(offset, k):
    X, C, Xr, Cr = shifted(offset, k=k)
    d2 = about(Xr, Cr)
    stats = lloyd_statistics(X, C, with_scatter=True, chunk_rows=500)
    labels = nearest(X, C)
    for found in (labels, assign(X, C)[0]):
        assert nearest_up_to_rounding(found, d2, offset)
    # the statistics are those of the kernel's own assignment, about the offset
    counts = np.bincount(labels, minlength=k).astype(float)
    np.testing.assert_array_equal(stats.counts, counts)
    means = np.stack([Xr[labels == j].mean(0) if counts[j] else Cr[j] for j in range(k)])
    np.testing.assert_allclose(
        stats.sums - counts[:, None] * offset,
        counts[:, None] * means,
        atol=float(counts.max()) * 16 * _EPS * offset + 1e-9,
    )
    cost = float(d2[np.arange(len(labels)), labels].sum())
    assert stats.cost == pytest.approx(cost, rel=1e-9)
    assert kmeans_cost(X, C) == pytest.approx(cost, rel=1e-9)
    scatter = np.stack([((Xr[labels == j] - means[j]) ** 2).sum(0) for j in range(k)])
    np.testing.assert_allclose(stats.scatter, scatter, rtol=1e-6, atol=len(X) * (16 * _EPS * offset) ** 2)


@pytest.mark.parametrize("offset", OFFSETS, ids=lambda o: f"{o:g}")
def test_lloyd_k_means_and_its_stable_form_are_shift_invariant(offset):
    X, C, Xr, Cr = shifted(offset)
    near, far = lloyd(Xr, Cr, tol=1e-4), lloyd(X, C, tol=1e-4)
    assert far[2] == near[2]  # as many iterations: tol is relative to the data's spread, not their norm
    np.testing.assert_allclose(
        far[0] - offset, near[0], atol=1e-9 + 4 * np.spacing(offset)
    )  # centers rounded at the offset
    assert far[1] == pytest.approx(near[1], rel=1e-6)
    stable_near, stable_far = lloyd_until_stable(Xr, Cr, 100), lloyd_until_stable(X, C, 100)
    np.testing.assert_array_equal(stable_far[1], stable_near[1])
    assert stable_far[2] == pytest.approx(stable_near[2], rel=1e-6)
    best_near = kmeans(Xr, 5, np.random.default_rng(0), n_init=3)[1]
    best_far = kmeans(X, 5, np.random.default_rng(0), n_init=3)
    assert kmeans_cost(X, best_far[0]) == pytest.approx(best_far[1], rel=1e-9)
    assert best_far[1] <= 1.01 * best_near


def far_group(k):
    """Tight clusters 1e-8 wide at -0.3 and one group at 3: a standardized federation in
    which one device's points lie 1e9 from the others' (the bulk is off the origin, and
    the centers' box is wider than far, so the BLAS form is taken about the origin where
    its rounding, 1e-17, is that of the clusters' own squared distances)."""
    X0 = mixture(4, n=1500, d=3, k=4, spread=4.0)
    X = np.concatenate([X0 * 1e-8 - 0.3, X0[:200] * 1e-8 + 3.0])
    rng = np.random.default_rng(2)
    C = np.concatenate([X[rng.choice(1500, size=k - 1, replace=False)], X[1500:1501]])
    return X, C


@pytest.mark.parametrize("k", [5, MEMBERSHIP_MAX_K + 5])
def test_tight_clusters_far_from_the_reference_get_their_nearest_center(k):
    """The kernel's nearest center, statistics and cost are those of direct differences when
    the clusters are tighter than the BLAS form's rounding about the reference (issue 42's
    probe: one device far from the others with standardize = true had every honest
    device's reply dropped as "not a nearest-center assignment")."""
    from fedcluster.algorithms.da_ufl.model import perturbed_labels
    from fedcluster.lloyd import squared_distances

    X, C = far_group(k)
    d2 = about(X, C)
    exact = d2.argmin(1)
    for chunk in (None, 256):
        np.testing.assert_array_equal(nearest(X, C, chunk_rows=chunk), exact)
        stats = lloyd_statistics(X, C, with_scatter=True, chunk_rows=chunk)
        np.testing.assert_array_equal(stats.counts, np.bincount(exact, minlength=k))
        assert stats.cost == pytest.approx(float(d2.min(1).sum()), rel=1e-9)
    np.testing.assert_array_equal(assign(X, C)[0], exact)
    np.testing.assert_array_equal(perturbed_labels(X, C, 1, 0.0, np.random.default_rng(0)), exact)
    np.testing.assert_allclose(squared_distances(X, C), d2, rtol=1e-9, atol=1e-30)
    labels = lloyd_until_stable(X, C, 0)[1]  # one chunk: the device's own loop
    np.testing.assert_array_equal(labels, exact)


@pytest.mark.parametrize("offset", [1e9, 1e12], ids=lambda o: f"{o:g}")
def test_k_feds_device_step_is_shift_invariant_with_fewer_local_clusters_than_dimensions(offset):
    """k' < d: the projection is onto the top directions of the points about their mean (the
    paper's uncentred one is the offset's direction far from the origin)."""
    from fedcluster.algorithms.kfed.model import local_kprime_means

    X0 = mixture(3, n=400, d=6, k=3, spread=6.0)
    near = local_kprime_means(X0, 3, np.random.default_rng(0))
    far = local_kprime_means(X0 + offset, 3, np.random.default_rng(0))
    np.testing.assert_array_equal(far[1], near[1])
    np.testing.assert_allclose(far[0] - offset, near[0], atol=1e-6 + 4 * np.spacing(offset))


def test_the_data_summary_and_standardize_are_shift_invariant():
    from fedcluster.kernel import DeviceData
    from fedcluster.shared_kernels import data_summary
    from fedcluster.scaling import Scaling

    parts0 = [mixture(seed, n=300) * [1.0, 10.0, 0.1] for seed in range(4)]
    for offset in OFFSETS:
        parts = [p + offset for p in parts0]
        rounded = [p - offset for p in parts]  # the devices' points about the offset, exactly
        pooled = np.concatenate(rounded)
        replies = [data_summary(DeviceData(points=p), {}, {"moments": True})[0] for p in parts]
        for reply, part in zip(replies, rounded):
            np.testing.assert_allclose(reply["scatter"], ((part - part.mean(0)) ** 2).sum(0), rtol=1e-9)
        scaling = Scaling.from_summaries(
            np.array([len(p) for p in parts]),
            np.stack([r["sum"] for r in replies]),
            np.stack([r["scatter"] for r in replies]),
        )
        # a device's mean travels as its sum, rounded at n × the offset: a coordinate's rounding
        np.testing.assert_allclose(scaling.scale, pooled.std(0), rtol=1e-9, atol=4 * np.spacing(offset))
        np.testing.assert_allclose(scaling.mean - offset, pooled.mean(0), atol=1e-9 + 4 * np.spacing(offset))


# ------------------------------------------------------------------ the server's checks
def lloyd_reply(Xr, Cr, offset):
    """A device's exact ``lloyd_stats`` reply at ``offset`` (computed about it) and its declaration."""
    from fedcluster.bounds import Declared

    labels = about(Xr, Cr).argmin(1)
    k = len(Cr)
    counts = np.bincount(labels, minlength=k).astype(float)
    sums = np.stack([Xr[labels == j].sum(0) for j in range(k)]) + counts[:, None] * offset
    cost = float(((Xr - Cr[labels]) ** 2).sum())
    declared = Declared(
        float(len(Xr)),
        Xr.min(0) + offset,
        Xr.max(0) + offset,
        moment_sum=Xr.sum(0) + len(Xr) * offset,
        moment_scatter=((Xr - Xr.mean(0)) ** 2).sum(0),
    )
    declared.rounding = None
    return {"sums": sums, "counts": counts, "cost": np.array([cost])}, declared


@pytest.mark.parametrize("offset", OFFSETS, ids=lambda o: f"{o:g}")
def test_an_honest_evaluation_passes_and_a_hidden_tenth_of_its_cost_is_caught(offset):
    from fedcluster import protocol
    from fedcluster.bounds import violation

    X0 = mixture(1, n=300)
    C0 = np.stack([X0[i::5].mean(0) for i in range(5)])
    Xr, Cr = (X0 + offset) - offset, (C0 + offset) - offset
    reply, declared = lloyd_reply(Xr, Cr, offset)
    task, request = protocol.task("lloyd_stats"), {"centers": Cr + offset}
    assert violation(task, reply, {"num-examples": 300}, request, declared) is None
    lie = {**reply, "cost": reply["cost"] * 0.9}
    assert "declared moments imply" in violation(task, lie, {"num-examples": 300}, request, declared)


@pytest.mark.parametrize("offset", [1e9, 1.7e9], ids=lambda o: f"{o:g}")
def test_a_mean_moved_into_another_cell_is_caught_far_from_the_origin(offset):
    """The tolerance of the Voronoi test is the data's spread and the coordinates' rounding,
    not the square of the coordinates (1e18 at 1e9: every lie passed)."""
    from fedcluster.bounds import voronoi_violation

    centers = np.array([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]]) + offset
    counts = np.array([20.0, 20.0, 20.0])
    honest = centers + np.array([[1.0, 1.0], [-1.0, 0.5], [0.5, -1.0]])
    assert voronoi_violation(honest, counts, centers) is None
    lie = honest.copy()
    lie[0] = centers[0] + [5.5, 0.0]  # nearer center 1 by one unit of distance
    assert "not a nearest-center assignment" in voronoi_violation(lie, counts, centers)


@pytest.mark.parametrize("offset", OFFSETS, ids=lambda o: f"{o:g}")
def test_a_full_batch_training_reply_passes_every_check_far_from_the_origin(offset):
    """FedKMeans' checks of one honest training reply (cost implied, Voronoi, declared
    moments, the cell's scatter, one fixed set of points), all at the offset."""
    from fedcluster.bounds import Declared, moments_violation, voronoi_violation
    from fedcluster.cell_moments import cell_moments_violation
    from fedcluster.algorithms.fedkmeans.model import (
        client_kmeans,
        implied_means,
        partitions_violation,
        stated_in_reply,
        train_cost_mismatch,
        whole_partition,
    )

    X, C, Xr, Cr = shifted(offset, seed=2)
    X, Xr = X[:400], Xr[:400]
    declared = Declared(
        400.0, X.min(0), X.max(0), moment_sum=Xr.sum(0) + 400 * offset, moment_scatter=((Xr - Xr.mean(0)) ** 2).sum(0)
    )
    counts, centers, scatter = client_kmeans(X, C)
    cost = kmeans_cost(X, C)
    means = implied_means(C, centers, 1.0)
    assert train_cost_mismatch(C, centers, counts, scatter, cost, 1.0) is None
    assert voronoi_violation(means, counts, C) is None
    assert moments_violation(counts[:, None] * means, scatter, declared, counts=counts) is None
    assert (
        cell_moments_violation(means[None], counts[None], scatter[None], C[None], declared.low, declared.high) is None
    )
    arrays = {"centers": centers[None], "counts": counts[None], "scatter": scatter[None], "cost": np.array([cost])}
    assert partitions_violation(stated_in_reply(C[None], arrays, 1.0), [], whole_partition(declared)) is None
    assert "does not match" in train_cost_mismatch(C, centers, counts, scatter, 0.9 * cost, 1.0)


@pytest.mark.parametrize("offset", [1e9, 1.7e9], ids=lambda o: f"{o:g}")
def test_all_points_claimed_for_the_middle_cell_are_caught_far_from_the_origin(offset):
    """test_cell_moments' liar (all 100 points for the middle of five cells) at the offset:
    the cell's widening is the kernel's rounding at the data's spread, not at the offset's
    square (1.2e7 at 1e9: the liar passed)."""
    from fedcluster.cell_moments import cell_moments_violation

    rng = np.random.default_rng(0)
    C = np.array([[0, 0], [10, 0], [0, 10], [10, 10], [5, 5]], dtype=float)
    X = np.concatenate([c + rng.normal(size=(20, 2)) for c in C])
    mean = X.mean(0)
    scatter = ((X - mean) ** 2).sum(0)
    means, counts, scatters = np.tile(C, (1, 1, 1)).astype(float), np.zeros((1, 5)), np.zeros((1, 5, 2))
    means[0, 4], counts[0, 4], scatters[0, 4] = mean, 100.0, scatter
    found = cell_moments_violation(
        means + offset, counts, scatters, C[None] + offset, X.min(0) + offset, X.max(0) + offset
    )
    assert found is not None and "center 4" in found[1], found


@pytest.mark.parametrize("offset", [1e9, 1.7e9, 1e12], ids=lambda o: f"{o:g}")
def test_k_feds_evaluation_check_passes_honest_scores_and_catches_inflated_ones(offset):
    """An honest device's scores of the merge's candidates within what its declared local
    centers, counts and cost allow, at the offset (from 1e9 on, every honest device was
    refused: 2048 > 1098.93, rounding); a score a tenth above its bound is still caught."""
    from fedcluster.algorithms.kfed.model import local_kprime_means, score_bounds, score_violation

    X, _, Xr, _ = shifted(offset, seed=4)
    X, Xr = X[:300], Xr[:300]
    centers, counts, labels = local_kprime_means(X, 5, np.random.default_rng(0))
    assert len(centers) == 5
    local_cost = float(((X - centers[labels]) ** 2).sum())
    rng = np.random.default_rng(5)
    # its own centers (bound: its local cost) and the merge's kind of candidates near them
    candidates = np.stack([centers] + [centers[rng.choice(5, 5)] + rng.normal(size=(5, 3)) for _ in range(3)])
    scores = np.array([about(Xr, c - offset).min(1).sum() for c in candidates])
    bounds = score_bounds(centers, counts, local_cost, candidates)
    assert score_violation(scores, bounds) is None
    inflated = scores.copy()
    inflated[0] *= 1.1
    assert "its cost of candidate 0 exceeds" in score_violation(inflated, bounds)


@pytest.mark.parametrize("offset", OFFSETS, ids=lambda o: f"{o:g}")
def test_da_ufls_gradients_and_moves_are_those_about_the_offset(offset):
    from fedcluster.algorithms.da_ufl.model import max_move, weighted_gradient

    X, C, Xr, Cr = shifted(offset, seed=6)
    labels = about(Xr, Cr).argmin(1)
    weights = np.random.default_rng(7).uniform(0.5, 2.0, size=len(X))
    near, far = weighted_gradient(Xr, labels, weights, Cr), weighted_gradient(X, labels, weights, C)
    np.testing.assert_allclose(far[1], near[1], rtol=1e-12)
    np.testing.assert_allclose(far[0], near[0], atol=float(far[1].max()) * 64 * _EPS * offset + 1e-9)
    # a step that moved no center further than a coordinate's rounding has not moved it
    assert max_move(C + np.spacing(C), C) == 0.0
    assert max_move(C + 0.5, C) > 0.5


# ------------------------------------------------------------------ what a run says
def test_the_last_versus_best_sentence_stays_readable():
    """Costs of 0 (k at least the distinct points), costs of 1e-80 against 1e110 (rounding
    at 1e150), and centers that did not move."""
    from fedcluster.algorithms.fedkmeans.model import last_versus_best

    centers = np.zeros((2, 3))
    extras, text, loud = last_versus_best(5.0, 20, 0, 0.0, 3, 0, False, 0.01)
    assert extras and "which cost 0" in text and loud
    extras, text, loud = last_versus_best(1e110, 20, 0, 1e-80, 3, 0, False, 0.01)
    assert "1e+190 times as much as" in text and len(text) < 200
    assert last_versus_best(1e110, 20, 0, 1e-80, 3, 0, False, 0.01, centers, centers.copy()) == (None, "", False)
    assert last_versus_best(2e-31, 20, 0, 0.0, 3, 0, False, 0.01, tie=1e-12)[2] is False  # a rounding, no warning
