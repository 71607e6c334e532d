"""A device's declarations bind its later replies (fedcluster.bounds), on hand-built replies."""

from __future__ import annotations

import numpy as np
import pytest

from fedcluster import protocol
from fedcluster.bounds import Declared, box_violation, coordinate_rounding, declaration, violation

LLOYD = protocol.task("lloyd_stats")
TRAIN = protocol.task("fedkmeans_train")
SCORE = protocol.task("score_candidates")
SUMMARY = protocol.task("local_summary")


def honest_device():
    """Ten points in the box [0, 2] x [0, 4], two clusters, and their exact statistics."""
    X = np.array([[0, 0], [0, 1], [1, 0], [1, 1], [0, 0.5], [2, 4], [2, 3], [1.5, 4], [2, 3.5], [1.5, 3]], float)
    centers = np.array([[0.5, 0.5], [1.8, 3.5]])
    labels = np.array([0] * 5 + [1] * 5)
    sums = np.stack([X[labels == j].sum(0) for j in range(2)])
    counts = np.array([5.0, 5.0])
    cost = float(((X - centers[labels]) ** 2).sum())
    return X, centers, {"sums": sums, "counts": counts, "cost": np.array([cost])}, Declared(10, X.min(0), X.max(0))


def test_honest_statistics_pass():
    X, centers, reply, declared = honest_device()
    assert violation(LLOYD, reply, {"num-examples": 10}, {"centers": centers}, declared) is None


@pytest.mark.parametrize(
    "change, reason",
    [
        (lambda r: {**r, "counts": r["counts"] * 1000}, "counts add up to 10000, not to the 10 points"),
        (lambda r: {**r, "sums": r["sums"] + np.array([[0, 100], [0, 0]])}, "'sums' row 0 lies outside"),
        (lambda r: {**r, "cost": np.array([1e-3])}, "below what its own sums and counts imply"),
        (lambda r: {**r, "cost": np.array([1e6])}, "more than 10 points inside the declared bounding box can cost"),
    ],
)
def test_a_statistic_no_ten_points_in_the_box_can_produce_is_refused(change, reason):
    X, centers, reply, declared = honest_device()
    assert reason in violation(LLOYD, change(reply), {"num-examples": 10}, {"centers": centers}, declared)


def test_num_examples_is_fixed_by_the_first_reply():
    X, centers, reply, declared = honest_device()
    assert "differs from the 10 points" in violation(LLOYD, reply, {"num-examples": 11}, {"centers": centers}, declared)


def test_cost_bound_is_the_farthest_box_corner_from_the_nearest_center():
    # box [0,2]x[0,4]; one center at (0,0): farthest corner (2,4) is 20 away squared -> 10 points cost <= 200
    declared = Declared(10, np.array([0.0, 0.0]), np.array([2.0, 4.0]))
    candidates = np.array([[[0.0, 0.0]], [[1.0, 2.0]]])  # second set: farthest corner 1 + 4 = 5 -> <= 50
    ok = {"costs": np.array([200.0, 50.0])}
    assert violation(SCORE, ok, {"num-examples": 10}, {"candidates": candidates}, declared) is None
    bad = {"costs": np.array([200.0, 50.1])}
    assert "entry 1" in violation(SCORE, bad, {"num-examples": 10}, {"candidates": candidates}, declared)


def test_client_kmeans_centers_may_lie_between_the_box_and_the_received_centers():
    declared = Declared(10, np.array([0.0, 0.0]), np.array([2.0, 4.0]))
    received = np.array([[[-5.0, 1.0], [1.0, 1.0]]])  # one center set
    base = {"counts": np.array([[5.0, 5.0]]), "scatter": np.array([[[1.0, 1.0], [1.0, 1.0]]]), "cost": np.array([1.0])}
    inside = {**base, "centers": np.array([[[-4.0, 1.0], [1.5, 3.9]]])}  # moved from -5 towards the box
    assert violation(TRAIN, inside, {"num-examples": 10}, {"centers": received}, declared) is None
    beyond = {**base, "centers": np.array([[[-6.0, 1.0], [1.5, 3.9]]])}  # further away than it was sent
    assert "'centers' row 0 lies outside" in violation(
        TRAIN, beyond, {"num-examples": 10}, {"centers": received}, declared
    )
    # 5 points with y in [0, 4] scatter at most 5 · 4²/4 = 20 about their mean
    spread = {**inside, "scatter": np.array([[[1.0, 1.0], [1.0, 20.0]]])}
    assert violation(TRAIN, spread, {"num-examples": 10}, {"centers": received}, declared) is None
    spread["scatter"] = np.array([[[1.0, 1.0], [1.0, 20.1]]])
    assert "'scatter' row 1 spreads more" in violation(
        TRAIN, spread, {"num-examples": 10}, {"centers": received}, declared
    )


def test_every_center_set_of_a_training_reply_is_bound_on_its_own():
    """Center sets trained side by side (n-init): each set's counts add up to the device's
    points, each set's centers lie between the box and the centers of THAT set."""
    declared = Declared(10, np.array([0.0, 0.0]), np.array([2.0, 4.0]))
    received = np.array([[[-5.0, 1.0], [1.0, 1.0]], [[1.0, 1.0], [1.0, 3.0]]])
    honest = {
        "counts": np.array([[5.0, 5.0], [4.0, 6.0]]),
        "scatter": np.ones((2, 2, 2)),
        "cost": np.array([1.0, 2.0]),
        "centers": np.array([[[-4.0, 1.0], [1.5, 3.9]], [[1.0, 0.5], [1.5, 3.5]]]),
    }
    assert violation(TRAIN, honest, {"num-examples": 10}, {"centers": received}, declared) is None
    # -4 is allowed for set 0 (sent -5) but not for set 1 (sent 1: the box bounds it)
    moved = {**honest, "centers": honest["centers"].copy()}
    moved["centers"][1, 0, 0] = -4.0
    assert violation(TRAIN, moved, {"num-examples": 10}, {"centers": received}, declared).startswith(
        "set 1: array 'centers' row 0"
    )
    counted = {**honest, "counts": np.array([[5.0, 5.0], [4.0, 16.0]])}
    assert "set 1: its counts add up to 20" in violation(
        TRAIN, counted, {"num-examples": 10}, {"centers": received}, declared
    )


def test_suppressed_clusters_may_count_fewer_points_but_never_more():
    declared = Declared(10, np.array([0.0, 0.0]), np.array([2.0, 4.0]))
    fewer = {"centers": np.array([[1.0, 1.0]]), "counts": np.array([7.0])}
    assert violation(SUMMARY, fewer, {"num-examples": 10}, {}, declared) is None
    more = {"centers": np.array([[1.0, 1.0]]), "counts": np.array([11.0])}
    assert "more than the 10 points" in violation(SUMMARY, more, {"num-examples": 10}, {}, declared)


def test_declarations_come_from_the_first_reply_and_a_data_summary_brings_the_box():
    summary = protocol.task("data_summary")
    first = declaration(
        summary, {"min": np.array([0.0, 1.0]), "max": np.array([2.0, 3.0])}, {"num-examples": 7, "dim": 2}
    )
    assert first.points == 7 and first.low.tolist() == [0.0, 1.0] and first.high.tolist() == [2.0, 3.0]
    assert declaration(LLOYD, {}, {"num-examples": 7}).low is None
    assert "minimum above its maximum" in box_violation(
        summary, {"min": np.array([0.0, 5.0]), "max": np.array([2.0, 3.0])}
    )


def test_without_a_box_only_the_point_count_binds():
    declared = Declared(10)
    _, centers, reply, _ = honest_device()
    far = {**reply, "sums": reply["sums"] + 1e6}
    assert violation(LLOYD, far, {"num-examples": 10}, {"centers": centers}, declared) is None
    assert "not to the 10 points" in violation(
        LLOYD, {**far, "counts": np.array([5.0, 6.0])}, {"num-examples": 10}, {"centers": centers}, declared
    )


# ------------------------------------------------------------- declared moments, Voronoi
def with_moments(X, declared):
    return Declared(
        declared.points, declared.low, declared.high, moment_sum=X.sum(0), moment_scatter=((X - X.mean(0)) ** 2).sum(0)
    )


def test_a_data_summary_with_moments_declares_them():
    X = honest_device()[0]
    summary = protocol.task("data_summary")
    arrays = {"min": X.min(0), "max": X.max(0), "sum": X.sum(0), "scatter": ((X - X.mean(0)) ** 2).sum(0)}
    declared = declaration(summary, arrays, {"num-examples": 10})
    np.testing.assert_array_equal(declared.moment_sum, X.sum(0))
    np.testing.assert_array_equal(declared.moment_scatter, ((X - X.mean(0)) ** 2).sum(0))
    assert declaration(summary, {"min": X.min(0), "max": X.max(0)}, {"num-examples": 10}).moment_sum is None


@pytest.mark.parametrize(
    "change, reason",
    [
        # every point moved by +0.1 on x: a statistic of other points than declared
        (lambda r, X: {**r, "sums": r["sums"] + np.array([[0.5, 0], [0, 0]])}, "another sum of its points"),
        # the scatter hidden: the cost its sums, counts and declared moments fix is larger
        (lambda r, X: {**r, "cost": r["cost"] * 0.9}, "declared moments imply"),
        (lambda r, X: {**r, "cost": r["cost"] * 1.1}, "declared moments imply"),
    ],
)
def test_lloyd_statistics_must_add_up_to_the_declared_moments(change, reason):
    X, centers, reply, declared = honest_device()
    declared = with_moments(X, declared)
    assert violation(LLOYD, reply, {"num-examples": 10}, {"centers": centers}, declared) is None
    assert reason in violation(LLOYD, change(reply, X), {"num-examples": 10}, {"centers": centers}, declared)


def test_points_put_in_the_wrong_cluster_are_refused_whatever_the_moments():
    X, centers, reply, declared = honest_device()
    # all ten points "assigned" to center 1: true sums and counts, true cost of that partition
    lie = {
        "sums": np.stack([np.zeros(2), X.sum(0)]),
        "counts": np.array([0.0, 10.0]),
        "cost": np.array([float(((X - centers[1]) ** 2).sum())]),
    }
    assert "not a nearest-center assignment" in violation(
        LLOYD, lie, {"num-examples": 10}, {"centers": centers}, declared
    )


def test_voronoi_check_by_loops_over_random_assignments():
    from fedcluster.bounds import voronoi_violation

    rng = np.random.default_rng(5)
    for _ in range(100):
        X, centers = rng.normal(size=(60, 3)), rng.normal(size=(4, 3))
        nearest = ((X[:, None] - centers[None]) ** 2).sum(-1).argmin(1)
        labels = nearest if rng.random() < 0.5 else rng.integers(0, 4, size=60)
        counts = np.bincount(labels, minlength=4).astype(float)
        means = np.stack([X[labels == j].mean(0) if counts[j] else centers[j] for j in range(4)])
        expected = any(counts[j] and ((means[j] - centers) ** 2).sum(1).argmin() != j for j in range(4))
        assert (voronoi_violation(means, counts, centers) is not None) == expected
        if labels is nearest:
            assert voronoi_violation(means, counts, centers) is None  # a cell is convex: its mean is inside


def test_perturbed_labels_pass_the_widened_check_and_a_far_cluster_does_not():
    from fedcluster.bounds import voronoi_violation
    from fedcluster.algorithms.da_ufl.model import perturbed_labels

    rng = np.random.default_rng(2)
    X, centers = rng.normal(size=(400, 2)) * 3, rng.normal(size=(5, 2)) * 3
    scatter = float(((X - X.mean(0)) ** 2).sum())
    for outer in (1, 2, 5):
        labels = perturbed_labels(X, centers, outer, 0.5, rng)
        counts = np.bincount(labels, minlength=5).astype(float)
        means = np.stack([X[labels == j].mean(0) if counts[j] else centers[j] for j in range(5)])
        assert voronoi_violation(means, counts, centers, 1 + 0.5 / outer, scatter) is None
    far = int(((centers - X.mean(0)) ** 2).sum(1).argmax())
    counts = np.zeros(5)
    counts[far] = 400
    means = centers.copy()
    means[far] = X.mean(0)
    assert voronoi_violation(means, counts, centers, 1 + 0.05, scatter) is not None


def test_standardized_moments_are_the_moments_of_the_standardized_points():
    from fedcluster.scaling import Scaling

    rng = np.random.default_rng(1)
    X = rng.normal(size=(50, 3)) * [1, 10, 0.1] + [1e4, -3, 0]
    scaling = Scaling(np.array([9e3, -2.0, 0.5]), np.array([2.0, 5.0, 0.2]))
    rounding = coordinate_rounding(X)
    S, V, scaled_rounding = scaling.apply_moments(50, X.sum(0), ((X - X.mean(0)) ** 2).sum(0), rounding)
    Z = scaling.apply(X)
    np.testing.assert_allclose(S, Z.sum(0), rtol=1e-9, atol=1e-6)
    np.testing.assert_allclose(V, ((Z - Z.mean(0)) ** 2).sum(0), rtol=1e-9)
    assert np.all(scaled_rounding >= rounding / scaling.scale)


@pytest.mark.parametrize("constant", [0.0, 0.5, 1e9])
def test_a_feature_constant_on_a_device_passes_the_scatter_check_about_far_centers(constant):
    """A feature every point of a device holds at one value (uci/yeast: a 0/0.83 flag) has a
    box of width 0; its scatter, computed about the centers' reference, is rounding of the
    CENTERS' size, not the box's: an honest device is not dropped for it."""
    from fedcluster.algorithms.fedkmeans.model import client_kmeans

    rng = np.random.default_rng(3)
    X = np.column_stack([rng.uniform(0, 1, 40), np.full(40, constant)])
    received = np.array([[[0.2, constant + 0.61], [0.8, constant + 0.83]]])
    counts, centers, scatter = client_kmeans(X, received[0])
    reply = {
        "counts": counts[None],
        "centers": centers[None],
        "scatter": scatter[None],
        "cost": np.array([float(((X[:, None] - received[0][None]) ** 2).sum(-1).min(1).sum())]),
    }
    declared = Declared(40, X.min(0), X.max(0))
    assert violation(TRAIN, reply, {"num-examples": 40}, {"centers": received}, declared) is None
    wide = {**reply, "scatter": reply["scatter"] + np.array([0.0, 1e-3])}
    assert "'scatter' row 0 spreads more" in violation(
        TRAIN, wide, {"num-examples": 40}, {"centers": received}, declared
    )


@pytest.mark.parametrize("constant", [0.0, 0.5])
def test_a_feature_constant_on_a_device_passes_the_sums_check_about_far_centers(constant):
    """The same device's Lloyd statistics: sums taken about the centers' reference round
    relative to the centers' size, which the box of a constant feature does not show."""
    from fedcluster.lloyd import lloyd_statistics

    rng = np.random.default_rng(4)
    X = np.column_stack([rng.uniform(0, 1, 40), np.full(40, constant)])
    for offset in (0.61, 3.7, 1e3):
        received = np.array([[0.2, constant + offset], [0.8, constant + offset * 1.4]])
        stats = lloyd_statistics(X, received)
        reply = {"sums": stats.sums, "counts": stats.counts, "cost": np.array([stats.cost])}
        declared = Declared(40, X.min(0), X.max(0))
        assert violation(LLOYD, reply, {"num-examples": 40}, {"centers": received}, declared) is None, offset


@pytest.mark.parametrize("offset", [0.0, 1e6])
def test_every_set_checked_at_once_gives_the_verdict_of_checking_them_one_by_one(offset, monkeypatch):
    """A training reply for m center sets is checked with all the sets' rows at once; the
    verdict (and, when refused, the reason) is the set-by-set one, on honest replies and on
    replies with one set's counts, scatter, centers or cost tampered with."""
    import fedcluster.bounds as bounds
    from fedcluster.algorithms.fedkmeans.model import client_step

    rng = np.random.default_rng(12)
    verdicts = []
    for trial in range(80):
        d, k, m = int(rng.integers(1, 4)), int(rng.integers(1, 5)), int(rng.integers(1, 5))
        X = offset + rng.uniform(-3, 3, size=(int(rng.integers(k, 60)), d))
        received = offset + rng.normal(scale=4.0, size=(m, k, d))
        steps = [client_step(X, c) for c in received]
        reply = {f: np.stack([st[i] for st in steps]) for i, f in enumerate(("counts", "centers", "scatter", "cost"))}
        s, what, scale = int(rng.integers(m)), int(rng.integers(5)), float(rng.choice([1e-6, 1e-2, 1.0, 100.0]))
        if what == 1:
            reply["counts"][s, int(rng.integers(k))] += 1
        elif what == 2:
            reply["scatter"][s] = reply["scatter"][s] * (1 + scale) + scale
        elif what == 3:
            reply["centers"][s] += scale * rng.normal(size=(k, d))
        elif what == 4:
            reply["cost"][s] = reply["cost"][s] * (1 + scale) + scale * 1e3
        declared = Declared(X.shape[0], X.min(0), X.max(0))
        metrics, request = {"num-examples": X.shape[0]}, {"centers": received}
        at_once = violation(TRAIN, reply, metrics, request, declared)
        with monkeypatch.context() as patch:
            patch.setattr(bounds, "_every_set_passes", lambda *args: False)
            one_by_one = violation(TRAIN, reply, metrics, request, declared)
        assert at_once == one_by_one, (trial, what, at_once, one_by_one)
        verdicts.append(at_once is None)
    assert 10 < sum(verdicts) < 70  # both honest-looking and refused replies were seen


def test_counts_that_are_not_numbers_or_wrap_around_break_the_count_rule():
    """A reply's counts are untrusted: a NaN total breaks "all" and "at-most" on its own, and
    integer counts that would wrap around to the declared total are summed in floating point
    (one set's counts, and several sets' at once, naming the bad set's total)."""
    from fedcluster.bounds import _counts_violation

    assert _counts_violation(np.array([np.nan, 1.0]), "all", 5.0)
    assert _counts_violation(np.array([np.nan, 1.0]), "at-most", 5.0)
    wrapping = np.array([2**62] * 4 + [100], dtype=np.int64)
    assert int(wrapping.sum()) == 100  # what an integer sum would see
    assert _counts_violation(wrapping, "all", 100.0)
    assert _counts_violation(np.array([[60.0, 40.0], [70.0, 40.0]]), "all", 100.0) == (
        "its counts add up to 110, not to the 100 points it declared"
    )
    assert _counts_violation(np.array([[60.0, 40.0], [50.0, 50.0]]), "all", 100.0) is None
