"""FedKMeans' server aggregation (fedcluster.robust.aggregate_centers) against naive
per-cluster, per-coordinate loops."""

from __future__ import annotations

import numpy as np
import pytest

from fedcluster.robust import aggregate_centers


def devices(m=10, k=3, d=2, seed=0):
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(m, k, d))
    counts = rng.integers(1, 50, size=(m, k)).astype(float)
    counts[0, 2] = 0.0  # device 0 never saw cluster 2
    return centers, counts


def naive_trimmed(centers, counts, trim):
    m, k, d = centers.shape
    out = np.zeros((k, d))
    for j in range(k):
        ids = [i for i in range(m) if counts[i, j] > 0]
        t = min(int(np.ceil(trim * len(ids))), (len(ids) - 1) // 2)
        for c in range(d):
            ranked = sorted(ids, key=lambda i: (centers[i, j, c], i))[t : len(ids) - t]
            out[j, c] = sum(counts[i, j] * centers[i, j, c] for i in ranked) / sum(counts[i, j] for i in ranked)
    return out


def test_mean_is_the_count_weighted_average():
    centers, counts = devices()
    totals, weighted = aggregate_centers(centers, counts, "mean")
    np.testing.assert_allclose(totals, counts.sum(0))
    for j in range(3):
        expected = sum(counts[i, j] * centers[i, j] for i in range(10))
        np.testing.assert_allclose(weighted[j], expected, rtol=1e-12)


@pytest.mark.parametrize("trim", [0.1, 0.2, 0.45])
def test_trimmed_mean_matches_naive_loops(trim):
    centers, counts = devices(seed=1)
    totals, weighted = aggregate_centers(centers, counts, "trimmed-mean", trim)
    np.testing.assert_allclose(weighted / totals[:, None], naive_trimmed(centers, counts, trim), rtol=1e-12)


def test_median_is_the_per_coordinate_median_of_the_devices_that_saw_the_cluster():
    centers, counts = devices(seed=2)
    totals, weighted = aggregate_centers(centers, counts, "median")
    np.testing.assert_allclose(weighted[2] / totals[2], np.median(centers[1:, 2], axis=0), rtol=1e-12)
    np.testing.assert_allclose(weighted[0] / totals[0], np.median(centers[:, 0], axis=0), rtol=1e-12)


@pytest.mark.parametrize("method", ["trimmed-mean", "median"])
def test_one_liar_in_ten_stays_within_the_honest_range(method):
    centers, counts = devices(seed=3)
    centers[4, 1] = [1e6, -1e6]  # moved far away, with a huge count
    counts[4, 1] = 1e9
    totals, weighted = aggregate_centers(centers, counts, method, 0.1)
    honest = np.delete(centers[:, 1], 4, axis=0)
    result = weighted[1] / totals[1]
    assert np.all(result >= honest.min(0)) and np.all(result <= honest.max(0))
    # the plain mean follows the liar
    mean_totals, mean_weighted = aggregate_centers(centers, counts, "mean")
    assert mean_weighted[1, 0] / mean_totals[1] > 1e5


def test_unknown_aggregation_is_named():
    with pytest.raises(ValueError, match="aggregation must be one of mean, trimmed-mean, median"):
        aggregate_centers(*devices(), "krum")


# ---------------------------------------------------------------- choosing k (k-range)
def naive_cost(X, C):
    return sum(min(float(((x - c) ** 2).sum()) for c in C) for x in X)


def test_padded_candidate_sets_cost_what_the_unpadded_ones_cost():
    from fedcluster.algorithms.fedkmeans.model import k_range_candidates

    rng = np.random.default_rng(0)
    points = rng.normal(size=(30, 2)) * 4
    X = rng.normal(size=(50, 2)) * 4
    batch = k_range_candidates(points, np.ones(30), [2, 3, 5], 2, points.min(0), points.max(0), rng)
    assert batch.shape == (3 * 2 + 1, 5, 2)
    for index, k in enumerate([2, 2, 3, 3, 5, 5, 1]):
        unpadded = batch[index][:k]
        assert naive_cost(X, batch[index]) == pytest.approx(naive_cost(X, unpadded), rel=1e-12)
        assert len({tuple(c) for c in batch[index]}) == k  # the padding repeats, never adds a center
    np.testing.assert_allclose(batch[-1][0], points.mean(0))


def test_k_range_report_by_hand():
    from fedcluster.algorithms.fedkmeans.model import k_range_report

    # ks 2..5, 2 candidates each, then the k = 1 cost T = 100; n = 50 points.
    costs = np.array([60.0, 50.0, 20.0, 30.0, 25.0, 18.0, 17.0, 16.0, 100.0])
    report = k_range_report([2, 3, 4, 5], 2, costs, 50)
    W = [50.0, 20.0, 18.0, 16.0]
    assert report["cost"] == pytest.approx([w / 50 for w in W])
    assert report["best_candidate"] == [1, 2, 5, 7]
    expected_ch = [((100 - w) / (k - 1)) / (w / (50 - k)) for k, w in zip([2, 3, 4, 5], W)]
    assert report["calinski_harabasz"] == pytest.approx(expected_ch)
    assert report["calinski_harabasz_k"] == 3  # CH: 48, 92, 83.1, 70.3
    # log W normalised: (0, 1) (1/3, 0.196) (2/3, 0.103) (1, 0): farthest below the chord at k = 3
    assert report["elbow_k"] == 3
    assert report["total_scatter"] == pytest.approx(2.0)


def test_k_range_report_never_lets_more_centers_cost_more():
    from fedcluster.algorithms.fedkmeans.model import k_range_report

    costs = np.array([40.0, 45.0, 30.0, 100.0])  # k = 3 candidates worse than k = 2's best
    report = k_range_report([2, 3, 4], 1, costs, 20)
    assert report["cost"] == pytest.approx([2.0, 2.0, 1.5])
    assert report["best_candidate"] == [0, 0, 2]


# ---------------------------------------------------------------- reassignment
def starved_after(counts, rounds, threshold=0.01, patience=3):
    from fedcluster.algorithms.fedkmeans.model import ServerState, reassign_starved

    counts = np.asarray(counts, dtype=float)
    k = counts.size
    centers = np.arange(k * 2, dtype=float).reshape(k, 2)
    scatter = counts[:, None] * np.ones(2)  # unit variance per coordinate
    state = ServerState.start(centers)
    moved = []
    for _ in range(rounds):
        moved += reassign_starved(centers, counts, scatter, state, threshold, patience)
    return moved


def test_reassignment_threshold_is_relative_to_the_largest_cluster():
    # A small TRUE cluster (14 of 1732 points: under 1 % of the total, but 5 % of the
    # largest cluster) is left alone; a cluster with 2 points (under 1 % of 286) is
    # re-seeded after patience rounds.
    counts = [14] + [286] * 6 + [2]
    assert starved_after(counts[:-1] + [286], rounds=5) == []
    assert starved_after(counts, rounds=2) == []
    assert starved_after(counts, rounds=3) == [7]


# ---------------------------------------------------------------- a training reply's cost
@pytest.mark.parametrize("beta", [1.0, 0.5])
@pytest.mark.parametrize("offset", [0.0, 1e3])
def test_train_cost_is_fixed_by_the_rest_of_a_full_batch_reply(beta, offset):
    from fedcluster.algorithms.fedkmeans.model import client_kmeans, train_cost_mismatch

    rng = np.random.default_rng(3)
    X = rng.normal(size=(300, 4)) + offset
    incoming = X[rng.choice(300, 5, replace=False)] + 0.3
    incoming[4] = offset + 1e4  # a cluster nobody joins
    counts, centers, scatter = client_kmeans(X, incoming, learning_rate=beta)
    cost = float(np.sum(np.min(((X[:, None, :] - incoming[None]) ** 2).sum(axis=2), axis=1)))  # by hand
    assert train_cost_mismatch(incoming, centers, counts, scatter, cost, beta) is None
    reason = train_cost_mismatch(incoming, centers, counts, scatter, 0.9 * cost, beta)
    assert reason is not None and "does not match" in reason
    # the lowest cost a device can claim: no scatter at all (the Jensen floor)
    floor = float(np.sum(counts[:, None] * ((centers - incoming) / beta) ** 2))
    assert train_cost_mismatch(incoming, centers, counts, np.zeros_like(scatter), floor, beta) is None


# --- init-server-starts: more starts on the summary, the same number scored on the devices ----


def _summary(seed: int):
    rng = np.random.default_rng(seed)
    points = np.concatenate([rng.normal(size=(30, 3)) + 6 * rng.normal(size=3) for _ in range(8)])
    weights = rng.integers(1, 20, size=points.shape[0]).astype(float)
    return points, weights, points.min(0), points.max(0)


def _weighted_cost(points, weights, centers):
    return float(weights @ ((points[:, None, :] - centers[None]) ** 2).sum(-1).min(1))


def test_server_starts_keep_the_lowest_cost_starts_in_draw_order():
    from fedcluster.algorithms.fedkmeans.model import summary_candidates

    points, weights, low, high = _summary(0)
    # the 40 starts by hand: the same generator, the plain draw of 40
    every = summary_candidates(points, weights, 6, 40, low, high, np.random.default_rng(7))
    costs = [_weighted_cost(points, weights, c) for c in every]
    kept = summary_candidates(points, weights, 6, 5, low, high, np.random.default_rng(7), starts=40)
    # kept: 5 of the 40 starts, in the order they were drawn ...
    rows, start = [], 0
    for c in kept:  # identical starts (the same local optimum) may repeat: match in order
        rows.append(next(i for i in range(start, 40) if np.array_equal(every[i], c)))
        start = rows[-1] + 1
    # ... of the lowest cost on the summary (equal-cost starts may tie either way)
    assert max(costs[i] for i in rows) <= np.sort(costs)[4] * (1 + 1e-9)
    assert max(costs[:5]) > max(costs[i] for i in rows) * (1 + 1e-9)  # the first 5 starts would be worse here


def test_server_starts_at_most_the_candidates_is_the_plain_draw():
    from fedcluster.algorithms.fedkmeans.model import summary_candidates

    points, weights, low, high = _summary(1)
    plain = summary_candidates(points, weights, 6, 5, low, high, np.random.default_rng(3))
    for starts in (0, 1, 5):
        np.testing.assert_array_equal(
            summary_candidates(points, weights, 6, 5, low, high, np.random.default_rng(3), starts=starts), plain
        )


def _stated(X, labels, k):
    """(n, means, scatters) of the non-empty parts of a labelling: a partition as a reply states it."""
    parts = [X[labels == j] for j in range(k) if np.any(labels == j)]
    return (
        np.array([len(p) for p in parts], dtype=float),
        np.array([p.mean(0) for p in parts]),
        np.array([((p - p.mean(0)) ** 2).sum() for p in parts]),
    )


def _violates(cost, centers, partition, relative=1e-8):
    """The readable one-pair oracle: a cost of ``centers`` above what ``partition`` (each part
    whole to its cheapest center) costs with them, beyond rounding."""
    from fedcluster.algorithms.fedkmeans.model import partition_bound

    bound, rounding = partition_bound(partition, centers)
    return cost > bound + relative * (abs(bound) + abs(cost)) + rounding


def _nearest(X, C):
    d2 = ((X[:, None] - C[None]) ** 2).sum(-1)
    return d2.argmin(1), float(d2.min(1).sum())


@pytest.mark.parametrize("seed", range(20))
def test_an_honest_devices_partitions_never_contradict_each_other(seed):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(int(rng.integers(5, 200)), 3)) * rng.uniform(0.1, 100) + rng.uniform(-1e3, 1e3)
    k = int(rng.integers(1, 8))
    sets = [X[rng.choice(len(X), size=k)] + rng.normal(size=(k, 3)) for _ in range(4)]
    stated = [(*_nearest(X, C), C) for C in sets]
    for labels, cost, C in stated:
        for other_labels, _, _ in stated:
            assert not _violates(cost, C, _stated(X, other_labels, k))


def test_a_cost_from_a_false_partition_contradicts_the_honest_one():
    from fedcluster.algorithms.fedkmeans.model import partition_bound

    rng = np.random.default_rng(3)
    X, C = rng.normal(size=(300, 2)), np.array([[-1.0, 0.0], [1.0, 0.0]])
    labels, cost = _nearest(X, C)
    # By hand: each part sent whole to its own center costs the honest cost exactly.
    assert partition_bound(_stated(X, labels, 2), C)[0] == pytest.approx(cost, rel=1e-12)
    moved = labels.copy()
    moved[np.argsort(X[:, 0])[-10:]] = 0  # the ten points farthest right claimed by the left center
    false_cost = float(((X - C[moved]) ** 2).sum())
    assert _violates(false_cost, C, _stated(X, labels, 2))


def test_declared_moments_bound_a_first_reply_and_name_what_it_contradicts():
    from fedcluster.bounds import Declared
    from fedcluster.algorithms.fedkmeans.model import partitions_violation, whole_partition

    rng = np.random.default_rng(5)
    X, C = rng.normal(size=(100, 2)) + 3.0, np.array([[3.0, 3.0], [30.0, 30.0]])
    declared = Declared(100.0, X.min(0), X.max(0), moment_sum=X.sum(0), moment_scatter=((X - X.mean(0)) ** 2).sum(0))
    labels, cost = _nearest(X, C)
    honest = [(cost, C, _stated(X, labels, 2))]
    assert partitions_violation(honest, [], whole_partition(declared)) is None
    all_at_the_far_center = float(((X - C[1]) ** 2).sum())  # more than all points at the near one
    lie = [(all_at_the_far_center, C, _stated(X, np.ones(100, dtype=int), 2))]
    reason = partitions_violation(lie, [], whole_partition(declared))
    assert reason.startswith("set 0 against its declared moments"), reason
    assert whole_partition(Declared(100.0)) is None  # no moments declared: no bound from them


def test_a_contradiction_between_two_sets_of_equal_cost_is_named():
    from fedcluster.algorithms.fedkmeans.model import partitions_violation

    rng = np.random.default_rng(8)
    X, C = rng.normal(size=(60, 2)), np.array([[-1.0, 0.0], [1.0, 0.0]])
    labels, cost = _nearest(X, C)
    honest = (cost, C, _stated(X, labels, 2))
    false_cost = float(((X - C[1 - labels]) ** 2).sum())  # every point at its farther center
    lie = (false_cost, C.copy(), _stated(X, 1 - labels, 2))
    twin = (false_cost, C.copy(), _stated(X, 1 - labels, 2))  # same cost: names must not compare arrays
    reason = partitions_violation([twin, lie, honest], [])
    assert reason is not None and reason.startswith("set 1 against set 0"), reason  # the twin: same data, another claim


@pytest.mark.parametrize("offset", [0.0, 1e9])
def test_many_devices_statements_at_once_get_each_ones_own_verdict(offset):
    """``partitions_violations`` of many devices' statements (each with its own number of
    sets, parts and centers, an earlier reply or not, declared moments or not; honest ones
    and liars) gives each statement the verdict and the named pair it gets alone: devices
    padded to the largest never see each other's partitions."""
    from fedcluster.bounds import Declared
    from fedcluster.algorithms.fedkmeans.model import partitions_violation, partitions_violations, whole_partition

    rng = np.random.default_rng(4)
    statements, lies = [], 0
    for device in range(24):
        X = offset + rng.normal(size=(int(rng.integers(4, 60)), 2)) * rng.uniform(0.5, 5.0)
        k = int(rng.integers(1, 6))
        stated = []
        for _ in range(int(rng.integers(1, 4))):
            C = X[rng.choice(len(X), size=k)] + rng.normal(size=(k, 2))
            labels, cost = _nearest(X, C)
            if rng.random() < 0.3:  # a lie: points claimed for a center not their nearest, at that cost
                labels = (labels + 1) % k if k > 1 else labels
                cost = float(((X - C[labels]) ** 2).sum()) * (1.0 if k > 1 else 1.5)
                lies += 1
            stated.append((cost, C, _stated(X, labels, k)))
        earlier = stated[-1:] if len(stated) > 1 and rng.random() < 0.5 else []
        declared = Declared(
            float(len(X)), X.min(0), X.max(0), moment_sum=X.sum(0), moment_scatter=((X - X.mean(0)) ** 2).sum(0)
        )
        whole = whole_partition(declared) if rng.random() < 0.7 else None
        statements.append((stated[: len(stated) - len(earlier)] or stated, earlier, whole))
    together = partitions_violations(statements)
    alone = [partitions_violation(*statement) for statement in statements]
    assert [r is None for r in together] == [r is None for r in alone]
    assert [r.split(":")[0] for r in together if r] == [r.split(":")[0] for r in alone if r]
    assert lies > 3 and 3 <= sum(r is not None for r in alone) < len(statements)  # both kinds, several of each


@pytest.mark.parametrize("offset", [0.0, 1e9])
def test_a_pairs_threshold_is_its_bound_plus_the_one_pair_slack(offset):
    """Every pair of every device at once (``_partition_pairs``) refuses a cost exactly when
    it exceeds the pair's bound (the cheapest center of the set for each part, by
    ``part_minima``) plus the slack written pair by pair: the coordinates' rounding
    (``deviation_rounding`` of ``coordinate_rounding``) and the BLAS form's
    (``expansion_rounding``), with no relative share (which would hide them). Costs set a
    quarter of a slack below and above their thresholds, near and far from the origin, for
    devices of different sizes side by side, their centers spread wider than their parts."""
    from fedcluster.bounds import coordinate_rounding, deviation_rounding, expansion_rounding
    from fedcluster.algorithms.fedkmeans.model import _partition_pairs, part_minima

    rng = np.random.default_rng(12)
    groups, expected = [], []
    for device, (k, parts) in enumerate([(3, 5), (1, 2), (6, 9), (2, 1)]):
        every = []
        for _ in range(2):  # a new statement and an earlier one
            n = rng.integers(1, 9, size=parts).astype(float)
            partition = (n, offset + rng.normal(size=(parts, 2)), rng.uniform(0.0, 2.0, size=parts))
            every.append([0.0, offset + 4.0 * rng.normal(size=(k, 2)), partition])
        for j, i, above in ((0, 1, 0.75 + device % 2 / 2), (1, 0, 1.25 - device % 2 / 2)):
            (n, means, _), centers = every[j][2], every[i][1]
            bound = float(part_minima(every[j][2], centers, [0]).sum())
            points = float(n.sum())
            slack = deviation_rounding(
                points, bound, np.maximum(coordinate_rounding(means), coordinate_rounding(centers))
            ) + expansion_rounding(n, means, centers)
            every[i][0] = bound + above * slack
            expected.append((device, j, i, above > 1.0))
        groups.append(([tuple(e) for e in every], np.array([True, False])))
    bad, bounds, costs = _partition_pairs(groups, 0.0)  # the rounding terms alone decide
    for device, j, i, refused in expected:
        assert bool(bad[device, j, i]) == refused, (device, j, i)
    assert not bad[:, [0, 1], [0, 1]].any()


class _Reply:
    def __init__(self, node_id, arrays):
        self.node_id, self.arrays = node_id, arrays


def _train_reply(node, X, sent, lr=1.0):
    """A full-batch training reply of a device holding X: counts, centers moved by lr towards
    the cluster means, per-cluster scatters about the means."""
    labels, _ = _nearest(X, sent)
    k, d = sent.shape
    counts, centers, scatter = np.zeros(k), sent.copy(), np.zeros((k, d))
    for j in range(k):
        part = X[labels == j]
        if len(part):
            counts[j], scatter[j] = len(part), ((part - part.mean(0)) ** 2).sum(0)
            centers[j] = sent[j] + lr * (part.mean(0) - sent[j])
    return _Reply(node, {"counts": counts, "centers": centers, "scatter": scatter})


@pytest.mark.parametrize("seed", range(10))
def test_the_memory_bound_is_an_upper_bound_of_the_cost_on_every_device_and_exact_at_a_fixed_point(seed):
    """What the server knows without asking: the latest partition each device stated, every
    part sent whole to its cheapest current center, over all devices."""
    from fedcluster.algorithms.fedkmeans.model import CenterSet, ServerState

    rng = np.random.default_rng(seed)
    devices = [rng.normal(size=(int(rng.integers(5, 60)), 2)) + rng.uniform(-5, 5, size=2) for _ in range(6)]
    sent = rng.normal(size=(3, 2)) * 3
    lr = float(rng.choice([1.0, 0.5]))
    center_set = CenterSet(0, sent.copy(), ServerState.start(sent))
    # devices report at different rounds: each against the centers the server had then
    for i, X in enumerate(devices):
        center_set.remember([_train_reply(i, X, center_set.centers, lr)], center_set.centers, lr)
        center_set.centers = center_set.centers + rng.normal(scale=0.3, size=sent.shape)
    pooled = np.vstack(devices)
    true = _nearest(pooled, center_set.centers)[1] / len(pooled)
    bound = center_set.memory_bound()
    assert bound >= true * (1 - 1e-12) and bound < 10 * true
    # at a fixed point (every device stated the nearest partition of the current centers) it is exact
    for i, X in enumerate(devices):
        center_set.remember([_train_reply(i, X, center_set.centers, 1.0)], center_set.centers, 1.0)
    assert center_set.memory_bound() == pytest.approx(_nearest(pooled, center_set.centers)[1] / len(pooled), rel=1e-9)
    # a node whose latest reply stated no partition (mini-batch): no bound; forgetting it restores one
    center_set.remember([_train_reply(9, devices[0], center_set.centers)])
    assert center_set.memory_bound() is None
    center_set.forget({9})
    assert center_set.memory_bound() is not None


@pytest.mark.parametrize("seed", range(30))
def test_the_vectorized_check_finds_exactly_the_pairs_the_one_pair_oracle_finds(seed):
    from fedcluster.algorithms.fedkmeans.model import partitions_violation

    rng = np.random.default_rng(seed)
    X = rng.normal(size=(int(rng.integers(5, 80)), 2)) * rng.uniform(0.5, 20)
    k = int(rng.integers(1, 5))
    stated = []
    for _ in range(int(rng.integers(2, 5))):
        C = X[rng.choice(len(X), size=k)] + rng.normal(size=(k, 2))
        labels, cost = _nearest(X, C)
        if rng.random() < 0.4:  # a lie: some points moved to another center, the cost of that labelling
            labels = labels.copy()
            moved = rng.random(len(X)) < 0.3
            labels[moved] = rng.integers(k, size=int(moved.sum()))
            cost = float(((X - C[labels]) ** 2).sum())
        stated.append((cost, C, _stated(X, labels, k)))
    new, earlier = stated[:2], stated[2:]
    pairs = [(i, j) for i in range(len(stated)) for j in range(len(stated)) if i != j and (i < 2 or j < 2)]
    expected = any(_violates(stated[i][0], stated[i][1], stated[j][2]) for i, j in pairs)
    assert (partitions_violation(new, earlier) is not None) == expected


def _declared(X):
    from fedcluster.bounds import Declared

    return Declared(
        float(len(X)), X.min(0), X.max(0), moment_sum=X.sum(0), moment_scatter=((X - X.mean(0)) ** 2).sum(0)
    )


def _evaluation(X, C):
    """An honest ``lloyd_stats`` reply of a device holding X for centers C."""
    labels, cost = _nearest(X, C)
    k, d = C.shape
    sums = np.zeros((k, d))
    np.add.at(sums, labels, X)
    return {"counts": np.bincount(labels, minlength=k).astype(float), "sums": sums, "cost": np.array([cost])}


def test_a_training_claim_that_its_own_evaluation_undercuts_is_a_contradiction():
    """Four corner clusters and one in the middle; the device claims all 100 of its points
    for the middle center. Every check of the training reply alone holds (its cost is the
    one its statistics imply, its mean lies in the middle cell, and sending all points to
    one center is exactly what its declared moments allow), but its honest evaluation's
    partition of the same points for the same centers costs less than the claim."""
    from fedcluster.bounds import voronoi_violation
    from fedcluster.algorithms.fedkmeans.model import evaluation_statement, partitions_violation, whole_partition

    rng = np.random.default_rng(0)
    C = np.array([[0, 0], [10, 0], [0, 10], [10, 10], [5, 5]], dtype=float)
    X = np.concatenate([c + rng.normal(size=(20, 2)) for c in C])
    declared = _declared(X)
    middle = np.full(len(X), 4)
    lie = (float(((X - C[4]) ** 2).sum()), C, _stated(X, middle, 5))
    means, counts = C.copy(), np.array([0.0, 0.0, 0.0, 0.0, 100.0])
    means[4] = X.mean(0)
    assert voronoi_violation(means, counts, C) is None  # its mean lies in the middle cell
    assert partitions_violation([lie], [], whole_partition(declared)) is None  # training alone: no objection
    honest = evaluation_statement(_evaluation(X, C), C, declared)
    reason = partitions_violation([honest], [lie], whole_partition(declared), names=["its evaluation"])
    assert reason is not None and reason.startswith("an earlier reply against its evaluation"), reason
    honest_training = (_nearest(X, C)[1], C, _stated(X, _nearest(X, C)[0], 5))
    assert (
        partitions_violation([honest], [honest_training], whole_partition(declared), names=["its evaluation"]) is None
    )


@pytest.mark.parametrize("seed", range(10))
def test_an_honest_devices_evaluation_never_contradicts_its_training(seed):
    """Random data (offsets, integer grids with ties on the bisectors, constant features),
    training centers and evaluation centers near or far from them: an honest evaluation
    and scores never contradict an honest training reply or the declared moments."""
    from fedcluster.algorithms.fedkmeans.model import (
        evaluation_statement,
        partitions_violation,
        scores_violation,
        whole_partition,
    )

    rng = np.random.default_rng(seed)
    for _ in range(30):
        n, d, k = int(rng.integers(2, 200)), int(rng.integers(1, 6)), int(rng.integers(1, 8))
        X = rng.normal(size=(n, d)) * rng.choice([0.01, 1.0, 100.0]) + rng.choice([0.0, 1e4])
        if rng.random() < 0.3:
            X = np.round(X)
        if rng.random() < 0.2:
            X[:, 0] = 3.0
        trained = X[rng.choice(n, size=k)] + rng.normal(size=(k, d)) * 0.1
        evaluated = trained + rng.normal(size=(k, d)) * rng.choice([0.0, 0.01, 1.0])
        declared = _declared(X)
        training = (_nearest(X, trained)[1], trained, _stated(X, _nearest(X, trained)[0], k))
        stated = evaluation_statement(_evaluation(X, evaluated), evaluated, declared)
        assert partitions_violation([stated], [training], whole_partition(declared)) is None
        candidates = np.stack([evaluated, trained])
        scores = np.array([_nearest(X, c)[1] for c in candidates])
        assert scores_violation(scores, candidates, [training], whole_partition(declared)) is None


def test_a_score_above_what_a_stated_partition_costs_is_named():
    from fedcluster.algorithms.fedkmeans.model import scores_violation, whole_partition

    rng = np.random.default_rng(2)
    X, C = rng.normal(size=(80, 2)), np.array([[-1.0, 0.0], [1.0, 0.0]])
    training = (_nearest(X, C)[1], C, _stated(X, _nearest(X, C)[0], 2))
    honest = _nearest(X, C)[1]
    assert scores_violation(np.array([honest]), C[None], [training], None) is None
    reason = scores_violation(np.array([honest, 1.5 * honest]), np.stack([C, C]), [training], None)
    assert reason is not None and reason.startswith("candidate 1: cost"), reason
    far = C + 50.0
    inflated = 1.01 * float(((X - far[0]) ** 2).sum())  # more than all points at one center: against the moments
    reason = scores_violation(np.array([inflated]), far[None], [], whole_partition(_declared(X)))
    assert reason is not None and "its declared moments" in reason, reason


@pytest.mark.parametrize("offset", [0.0, 1e9])
def test_every_candidate_is_held_to_its_own_partition_bound(offset):
    """The scores check takes all candidates of a partition at once: each candidate's cost
    is refused just above, and passed just below, what :func:`partition_bound` gives that
    candidate alone (bound, its relative slack and its rounding), candidate by candidate."""
    from fedcluster.algorithms.fedkmeans.model import partition_bound, scores_violation, whole_partition
    from fedcluster.bounds import RELATIVE_SLACK

    rng = np.random.default_rng(11)
    for _ in range(40):
        n, d, k, m = (
            int(rng.integers(5, 120)),
            int(rng.integers(1, 5)),
            int(rng.integers(1, 9)),
            int(rng.integers(1, 6)),
        )
        X = rng.normal(size=(n, d)) * rng.choice([0.01, 1.0, 100.0]) + offset
        trained = X[rng.choice(n, size=k)]
        training = (_nearest(X, trained)[1], trained, _stated(X, _nearest(X, trained)[0], k))
        whole = whole_partition(_declared(X))
        candidates = X[rng.integers(0, n, size=(m, k))] + rng.normal(size=(m, k, d))
        limits, margins = np.full(m, np.inf), np.zeros(m)
        for statement in (training, whole):
            for c in range(m):
                bound, rounding = partition_bound(statement[2], candidates[c])
                # the largest cost the check lets through: cost <= bound + relative (|bound| + cost) + rounding
                limit = (bound + RELATIVE_SLACK * abs(bound) + rounding) / (1.0 - RELATIVE_SLACK)
                if limit < limits[c]:  # a quarter of the rounding granted: the bounds' own last bits are far less
                    limits[c], margins[c] = limit, 0.25 * rounding
        target = int(rng.integers(m))
        below, above = limits - margins, limits - margins
        above[target] = limits[target] + margins[target]
        assert scores_violation(below, candidates, [training], whole) is None
        reason = scores_violation(above, candidates, [training], whole)
        assert reason is not None and reason.startswith(f"candidate {target}: cost"), reason


def test_a_lloyd_step_from_evaluation_replies_is_the_pooled_mean_and_keeps_unseen_centers():
    from fedcluster.algorithms.fedkmeans.model import lloyd_step

    rng = np.random.default_rng(4)
    C = np.array([[0.0, 0.0], [5.0, 5.0], [100.0, 100.0]])
    devices = [rng.normal(size=(30, 2)) + rng.choice([0.0, 5.0]) for _ in range(4)]
    replies = [_evaluation(X, C) for X in devices]
    stepped = lloyd_step(np.stack([r["counts"] for r in replies]), np.stack([r["sums"] for r in replies]), C)
    pooled = np.concatenate(devices)
    labels, _ = _nearest(pooled, C)
    for j in (0, 1):
        np.testing.assert_allclose(stepped[j], pooled[labels == j].mean(0), rtol=1e-12)
    np.testing.assert_array_equal(stepped[2], C[2])  # no device saw it


@pytest.mark.parametrize("seed", range(4))
def test_the_dense_memory_gives_what_every_nodes_latest_reply_gives(seed):
    """The server's memory of every node's latest statistics is kept as dense rows (so a
    round's step costs array operations over the population, no loop over it): its
    aggregates, total scatters, orphaned clusters and bound must be those computed
    from the latest replies themselves, in node order, through growth, overwrites and
    forgetting."""
    from fedcluster.algorithms.fedkmeans.model import Memory, partition_bound, partition_of_reply

    rng = np.random.default_rng(seed)
    k, d = 3, 2
    data = {node: rng.normal(size=(int(rng.integers(3, 30)), d)) + rng.uniform(-4, 4, size=d) for node in range(40)}
    order = list(range(40))
    memory, latest, parts, implied = Memory(k, d), {}, {}, {}
    memory.reserve(order[:25])  # the rest take rows as they first report
    for step in range(12):
        sent = rng.normal(size=(k, d)) * 3
        lr = float(rng.choice([1.0, 0.5]))
        nodes = rng.choice(40, size=int(rng.integers(1, 15)), replace=False).tolist()
        stated = bool(rng.random() < 0.8)
        replies = [_train_reply(n, data[n], sent, lr) for n in nodes]
        memory.remember(replies, sent if stated else None, lr)
        for r in replies:
            latest[r.node_id] = r
            implied[r.node_id] = sent + (r.arrays["centers"] - sent) / lr if stated else r.arrays["centers"]
            parts[r.node_id] = (
                partition_of_reply(sent, r.arrays["centers"], r.arrays["counts"], r.arrays["scatter"], lr)
                if stated
                else None
            )
        left = set(rng.choice(40, size=int(rng.integers(0, 4)), replace=False).tolist()) if step % 3 == 2 else set()
        staying = sum((latest[n].arrays["counts"] for n in latest if n not in left), np.zeros(k))
        leaving = sum((latest[n].arrays["counts"] for n in latest if n in left), np.zeros(k))
        assert memory.orphaned(left) == np.flatnonzero((leaving > 0) & (staying <= 0)).tolist()
        memory.forget(left)
        for n in left:
            latest.pop(n, None), parts.pop(n, None)
        assert len(memory) == len(latest) and all(n in memory for n in latest) and not any(n in memory for n in left)
        pool = [latest[n] for n in sorted(latest, key=lambda n: memory.rows[n])]
        for method in ("mean", "trimmed-mean", "median"):
            expected = aggregate_centers(
                np.stack([r.arrays["centers"] for r in pool]), np.stack([r.arrays["counts"] for r in pool]), method, 0.2
            )
            got = memory.aggregate(method, 0.2)
            np.testing.assert_allclose(got[0], expected[0], rtol=1e-12, atol=1e-12)
            np.testing.assert_allclose(got[1], expected[1], rtol=1e-12, atol=1e-9)
        # the pooled scatter about each cluster's pooled mean, by hand from the replies (their
        # implied means, or their centers when they state no partition)
        pooled_counts = np.sum([r.arrays["counts"] for r in pool], axis=0)
        means = [implied[r.node_id] for r in pool]
        pooled_mean = (
            np.sum([r.arrays["counts"][:, None] * m for r, m in zip(pool, means)], axis=0)
            / np.maximum(pooled_counts, 1)[:, None]
        )
        expected = np.sum(
            [r.arrays["scatter"] + r.arrays["counts"][:, None] * (m - pooled_mean) ** 2 for r, m in zip(pool, means)],
            axis=0,
        )
        np.testing.assert_allclose(memory.total_scatter(), expected, rtol=1e-9, atol=1e-9)
        centers = rng.normal(size=(k, d)) * 3
        if any(parts[n] is None for n in latest):
            assert memory.bound(centers) is None
        else:
            every = tuple(np.concatenate([parts[n][i] for n in latest]) for i in range(3))
            assert memory.bound(centers) == pytest.approx(
                partition_bound(every, centers)[0] / every[0].sum(), rel=1e-12
            )


@pytest.mark.parametrize("seed", range(4))
def test_a_rollback_gives_the_memory_at_the_checkpoint_without_the_nodes_forgotten_since(seed):
    """The undo of a re-seed: every node's statistics as at the checkpoint (overwritten rows
    restored, nodes that first reported since gone), but a node forgotten since (it left or
    sent an invalid reply) stays forgotten; a commit keeps everything."""
    from fedcluster.algorithms.fedkmeans.model import Memory

    rng = np.random.default_rng(seed)
    k, d = 3, 2
    data = {node: rng.normal(size=(20, d)) + rng.uniform(-4, 4, size=d) for node in range(30)}

    def state(memory):
        used = len(memory.rows)
        return {
            node: tuple(getattr(memory, name)[row].copy() for name in Memory._ARRAYS)
            for node, row in memory.rows.items()
            if memory.present[row]
        } | {"rows": used}

    memory = Memory(k, d)
    memory.reserve(range(10))
    sent = rng.normal(size=(k, d))
    memory.remember([_train_reply(n, data[n], sent) for n in range(12)], sent, 1.0)
    before = state(memory)
    memory.checkpoint()
    sent2 = rng.normal(size=(k, d))
    memory.remember([_train_reply(n, data[n], sent2) for n in (0, 3, 11, 20, 25)], sent2, 1.0)  # 20, 25: new rows
    memory.forget([5, 3])
    memory.rollback()
    after = state(memory)
    expected = {node: value for node, value in before.items() if node not in (5, 3)}
    assert after.keys() == expected.keys() and 20 not in memory and 25 not in memory and len(memory.rows) == 12
    for node in expected:
        if node != "rows":
            for got, want in zip(after[node], expected[node]):
                np.testing.assert_array_equal(got, want)
    aggregate = memory.aggregate("mean", 0.1)
    fresh = Memory(k, d)
    fresh.reserve(range(10))
    fresh.remember([_train_reply(n, data[n], sent) for n in range(12) if n not in (5, 3)], sent, 1.0)
    np.testing.assert_array_equal(aggregate[0], fresh.aggregate("mean", 0.1)[0])
    np.testing.assert_allclose(aggregate[1], fresh.aggregate("mean", 0.1)[1], rtol=1e-12)
    # a commit keeps what changed
    memory.checkpoint()
    memory.remember([_train_reply(7, data[7], sent2)], sent2, 1.0)
    memory.commit()
    np.testing.assert_array_equal(memory.centers[memory.rows[7]], _train_reply(7, data[7], sent2).arrays["centers"])
    with pytest.raises(RuntimeError):
        memory.rollback()


def test_a_node_that_leaves_in_the_round_that_undoes_a_re_seed_leaves_the_memory():
    """The round's measurement undoes the previous re-seed (the memory goes back to its
    checkpoint) in the same round a node leaves: the node must not come back with the
    rollback and feed every later step (from a helper's review: it did, before and after
    the dense memory)."""
    from types import SimpleNamespace as NS

    import fedcluster.algorithms.fedkmeans.strategy as strategy
    from fedcluster.algorithms.fedkmeans.model import CenterSet, ServerState, Undo

    k, d = 2, 2
    cfg = NS(
        batch_size=0,
        local_epochs=1,
        client_lr=1.0,
        server_memory=True,
        aggregation="mean",
        trim_fraction=0.1,
        server_lr=1.0,
        momentum=0.0,
        fraction=0.5,
        eval_every=1,
        reassign_threshold=0.01,
        reassign_patience=20,
    )
    server = NS(config=cfg, order_key=lambda n: (0, n, n))

    def reply(node, centers, counts):
        return _Reply(
            node,
            {"centers": np.asarray(centers, float), "counts": np.asarray(counts, float), "scatter": np.ones((k, d))},
        )

    start = np.array([[0.0, 0.0], [10.0, 10.0]])
    center_set = CenterSet(0, start.copy(), ServerState.start(start))
    center_set.memory.reserve([1, 2])
    center_set.remember([reply(1, [[0, 0], [10, 10]], [5, 5]), reply(2, [[1, 1], [11, 11]], [5, 5])], None)
    center_set.hold(Undo(start.copy(), 1.0, [1]))  # the round re-seeded cluster 1
    center_set.incoming = [reply(1, [[0, 0], [10, 10]], [5, 5])]
    strategy.FedKMeans.update(server, center_set, {"cost": 2.0, "exact": True, "sampled_cost": 2.0}, {2}, 2, 10)
    assert center_set.undone == [1] and 2 not in center_set.memory and 1 in center_set.memory
    center_set.incoming = [reply(1, [[0, 0], [10, 10]], [5, 5])]
    strategy.FedKMeans.update(server, center_set, {"cost": 1.0, "exact": True, "sampled_cost": 1.0}, set(), 3, 10)
    np.testing.assert_allclose(center_set.centers, [[0, 0], [10, 10]])  # node 1 alone


@pytest.mark.parametrize("offset", [0.0, 1e6])
@pytest.mark.parametrize("blocks", ["one", "a cluster each"])
def test_the_set_screen_passes_honest_replies_and_flags_every_set_a_check_refuses(offset, blocks, monkeypatch):
    """``sets_to_check`` spares the per-set checks only for sets they pass: over honest
    replies and many tampered ones (cost, centers, counts, scatter), every set refused by
    train_cost_mismatch, voronoi_violation or moments_violation is among those it returns,
    and no honest set is; with the clusters' distances in one block and one cluster per block."""
    from fedcluster.algorithms.fedkmeans import model
    from fedcluster.algorithms.fedkmeans.model import client_step, implied_means, sets_to_check, train_cost_mismatch
    from fedcluster.bounds import Declared, moments_violation, voronoi_violation

    if blocks != "one":
        monkeypatch.setattr(model, "CHUNK_FLOATS", 1)

    rng = np.random.default_rng(11)
    flagged = refused = 0
    for trial in range(60):
        d, k, m = int(rng.choice([1, 2, 3, 4, 9])), int(rng.integers(1, 6)), int(rng.integers(1, 5))
        X = offset + rng.normal(scale=rng.uniform(0.1, 10), size=(int(rng.integers(k, 80)), d))
        incoming = offset + rng.normal(scale=3.0, size=(m, k, d))
        beta = float(rng.choice([1.0, 0.5]))
        steps = [client_step(X, c, beta) for c in incoming]
        reply = {f: np.stack([st[i] for st in steps]) for i, f in enumerate(("counts", "centers", "scatter", "cost"))}
        declared = Declared(X.shape[0], X.min(0), X.max(0))
        declared.moment_sum, declared.moment_scatter = X.sum(0), ((X - X.mean(0)) ** 2).sum(0)
        assert sets_to_check(incoming, **_args(reply), learning_rate=beta, declared=declared).size == 0
        tampered = {f: v.copy() for f, v in reply.items()}
        s, what = int(rng.integers(m)), rng.integers(5)
        scale = float(rng.choice([1e-9, 1e-7, 1e-3, 0.3]))
        if what == 0:
            tampered["cost"][s] *= 1 + scale
        elif what == 1:
            tampered["centers"][s] += scale * rng.normal(size=(k, d)) * (1 + np.abs(incoming[s]))
        elif what == 2:
            tampered["scatter"][s] *= 1 + scale
        elif what == 3:
            j = int(rng.integers(k))
            tampered["counts"][s, j] += 1
        elif k > 1:  # two clusters' points swapped, its cost made to agree: only the cells tell
            means = implied_means(incoming[s], tampered["centers"][s], beta)[[1, 0] + list(range(2, k))]
            for f in ("counts", "scatter"):
                tampered[f][s] = tampered[f][s][[1, 0] + list(range(2, k))]
            tampered["centers"][s] = incoming[s] + beta * (means - incoming[s])
            seen = tampered["counts"][s] > 0
            moved = tampered["counts"][s][seen] * ((means[seen] - incoming[s][seen]) ** 2).sum(1)
            tampered["cost"][s] = tampered["scatter"][s][seen].sum() + moved.sum()
        screen = set(sets_to_check(incoming, **_args(tampered), learning_rate=beta, declared=declared).tolist())
        for t in range(m):
            a = {f: v[t] for f, v in tampered.items()}
            means = implied_means(incoming[t], a["centers"], beta)
            reason = (
                train_cost_mismatch(incoming[t], a["centers"], a["counts"], a["scatter"], float(a["cost"]), beta)
                or voronoi_violation(means, a["counts"], incoming[t])
                or moments_violation(
                    a["counts"][:, None] * means, a["scatter"], declared, counts=a["counts"], about=[incoming[t]]
                )
            )
            if reason:
                refused += 1
                assert t in screen, (trial, t, reason)
        flagged += len(screen)
    assert refused > 20  # the tampering did produce refusals to catch


def _args(reply):
    return {"centers": reply["centers"], "counts": reply["counts"], "scatter": reply["scatter"], "cost": reply["cost"]}


def test_part_costs_of_many_sets_at_once_are_each_sets_own_near_and_far_from_the_origin():
    """The partition check prices every part against the sets of a reply, the device's
    earlier reply and its declared mean in one pass: each set's columns must be that
    set's own parallel-axis costs, taken about its own reference when it lies far from
    the origin (a timestamp column) and about the origin otherwise, with an empty set
    among them."""
    from fedcluster.algorithms.fedkmeans.model import part_costs

    rng = np.random.default_rng(5)
    n, means, scatter = rng.integers(1, 9, size=6).astype(float), rng.normal(size=(6, 3)), rng.random(6)
    sets = [rng.normal(size=(4, 3)), np.empty((0, 3)), rng.normal(size=(2, 3)) + 1e9, rng.normal(size=(1, 3))]
    means[3:] += 1e9
    columns = np.cumsum([0] + [len(c) for c in sets[:-1]])
    got = part_costs((n, means, scatter), np.concatenate(sets), columns)
    exact = [scatter[:, None] + n[:, None] * ((means[:, None, :] - c[None]) ** 2).sum(-1) for c in sets if len(c)]
    np.testing.assert_allclose(got, np.concatenate(exact, axis=1), rtol=1e-6)
    np.testing.assert_allclose(got[3:, 4:6], exact[1][3:], rtol=1e-12)  # far parts against the far set: no offset²


@pytest.mark.parametrize("chunk", [None, 1])
def test_part_minima_are_the_cheapest_part_cost_of_each_set_to_the_bit(chunk, monkeypatch):
    """The partition check takes each part's cheapest center per set without the parts x
    centers table: the same numbers, to the bit, as the minimum over each set's columns
    of :func:`part_costs` (sets of different sizes, one far from the origin); in many
    small passes, the same up to the rounding of products of another shape."""
    from fedcluster.algorithms.fedkmeans import model
    from fedcluster.algorithms.fedkmeans.model import part_costs, part_minima

    if chunk:
        monkeypatch.setattr(model, "CHUNK_FLOATS", chunk)

    rng = np.random.default_rng(9)
    n, means, scatter = rng.integers(1, 50, size=40).astype(float), rng.normal(size=(40, 2)), rng.random(40)
    sets = [rng.normal(size=(k, 2)) for k in (100, 100, 3, 1)] + [rng.normal(size=(7, 2)) + 1e9]
    columns = np.cumsum([0] + [len(c) for c in sets[:-1]])
    table = part_costs((n, means, scatter), np.concatenate(sets), columns)
    expected = np.minimum.reduceat(table, columns, axis=1)
    got = part_minima((n, means, scatter), np.concatenate(sets), columns)
    with_empty = part_minima((n, means, scatter), np.concatenate(sets), np.insert(columns, 2, columns[2]))
    assert np.isinf(with_empty[:, 2]).all()  # no center: no bound, never a made-up one
    assert np.array_equal(np.delete(with_empty, 2, axis=1), got)
    if chunk:  # products of another shape: equal up to their rounding
        np.testing.assert_allclose(got, expected, rtol=1e-12)
    else:
        assert np.array_equal(got, expected)
