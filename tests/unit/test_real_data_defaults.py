"""The pure helpers behind the defaults that fit real data (issue: real data): FedKMeans'
side-by-side center sets and re-seed rule, k-FED's device-chosen k', DA-UFL's SOM size,
the federated standardization. Each against a naive oracle or a hand-worked case."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from fedcluster.algorithms.da_ufl.model import device_grid, is_grid, som_grid, train_som
from fedcluster.algorithms.fedkmeans.model import keep_sets, reseed_allowed, set_count, start_sets
from fedcluster.algorithms.kfed.model import auto_local_means, induced_over_nearest, separated_clusters, ward_costs
from fedcluster.scaling import Scaling


# ----------------------------------------------------------------------------- FedKMeans
def test_no_reseed_in_the_last_round_and_a_non_empty_cluster_only_when_measured_next():
    counts = np.array([0.0, 3.0, 100.0, 5.0])
    protected = np.array([False, False, False, True])
    assert not reseed_allowed(counts, protected, rounds_left=False, measured_next=True).any()
    np.testing.assert_array_equal(reseed_allowed(counts, protected, True, False), [True, False, False, False])
    np.testing.assert_array_equal(reseed_allowed(counts, protected, True, True), [True, True, True, False])


def test_start_sets_take_the_cheapest_then_the_seeds_and_skip_equal_optima():
    costs = np.array([5.0, 3.0, 3.0 * (1 + 1e-12), 4.0, 9.0, 8.0])
    # 1 is cheapest; 2 is the same optimum as 1; seeds 4, 5 come next, then the cheapest left
    assert start_sets(costs, 4, seeds=[4, 5]) == [1, 4, 5, 3]
    assert start_sets(costs, 1, seeds=[4, 5]) == [1]
    assert start_sets(costs, 10) == [1, 3, 0, 5, 4]  # only five distinct costs


def test_keep_sets_stops_stalled_losers_and_keeps_only_the_best_once_finished():
    costs = [2.0, 1.0, 3.0, 1.5, 2.5]
    assert keep_sets(costs, [True, True, False, False, True], finished=False) == [1, 2, 3]
    assert keep_sets(costs, [False] * 5, finished=False) == [0, 1, 2, 3, 4]
    assert keep_sets(costs, [False] * 5, finished=True) == [1]


def test_auto_set_count_follows_the_size_of_the_centers():
    assert set_count(3, 10, 10) == 3
    assert set_count(0, 4, 2) == 16
    assert set_count(0, 100, 100) == 6  # 65536 // 10000 floats
    assert set_count(0, 1000, 1000) == 1


# ----------------------------------------------------------------------------- k-FED
def naive_ward(C, N):
    """Ward's merge costs by brute force: every step tries every pair."""
    groups = [(np.array(c, float), float(n)) for c, n in zip(C, N)]
    out = []
    while len(groups) > 1:
        a, b = min(
            itertools.combinations(range(len(groups)), 2),
            key=lambda p: (
                groups[p[0]][1]
                * groups[p[1]][1]
                / (groups[p[0]][1] + groups[p[1]][1])
                * float(((groups[p[0]][0] - groups[p[1]][0]) ** 2).sum())
            ),
        )
        (ca, na), (cb, nb) = groups[a], groups[b]
        out.append(na * nb / (na + nb) * float(((ca - cb) ** 2).sum()))
        groups[a] = ((na * ca + nb * cb) / (na + nb), na + nb)
        del groups[b]
    return np.array(out[::-1])  # merge[j - 1]: from j + 1 groups to j


@pytest.mark.parametrize("seed", range(5))
def test_ward_costs_match_brute_force_ward(seed):
    rng = np.random.default_rng(seed)
    C, N = rng.normal(size=(7, 3)), rng.integers(1, 20, size=7)
    np.testing.assert_allclose(ward_costs(C, N), naive_ward(C, N), rtol=1e-10)


def test_separated_clusters_needs_a_jump_of_a_hundredfold():
    assert separated_clusters(np.array([1e6, 1.0, 0.9, 0.5])) == 2  # 2 -> 1 costs 1e6 x the rest
    assert separated_clusters(np.array([1e6, 5e5, 1.0, 0.5])) == 3
    assert separated_clusters(np.array([50.0, 2.0, 1.0])) is None  # 25x: not beyond doubt


def test_a_device_chooses_k_prime_from_its_own_data():
    rng = np.random.default_rng(0)
    k = 9
    # two clusters 1000 sigma apart: the device shows 2 and sends 2 centers
    two = np.concatenate([rng.normal(size=(200, 4)), rng.normal(size=(200, 4)) + 1000])
    centers, counts, labels = auto_local_means(two, k, 1)
    assert centers.shape[0] == 2 and sorted(counts.tolist()) == [200, 200]
    np.testing.assert_array_equal(np.bincount(labels), counts)
    # nine overlapping ones: no jump, it keeps k local centers (the paper's k' >= its clusters)
    nine = np.concatenate([rng.normal(size=(60, 2)) + 2.5 * np.array(divmod(i, 3)) for i in range(k)])
    assert auto_local_means(nine, k, 1)[0].shape[0] == k
    # nine clusters far apart and k = 16: it sends the nine
    far = np.concatenate([rng.normal(size=(60, 2)) + 250 * np.array(divmod(i, 3)) for i in range(k)])
    assert auto_local_means(far, 16, 1)[0].shape[0] == k


def test_induced_over_nearest_is_the_induced_cost_over_the_nearest_cost():
    rng = np.random.default_rng(3)
    G = np.array([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]])
    devices = [rng.normal(size=(30, 2)) + G[i % 3] * (1 + (i == 2)) for i in range(4)]
    local = [np.stack([X[:15].mean(0), X[15:].mean(0)]) for X in devices]
    labels = [np.repeat([0, 1], 15) for _ in devices]
    assignment = [((c[:, None] - G[None]) ** 2).sum(-1).argmin(1) for c in local]
    induced = sum(((X - G[a[lab]]) ** 2).sum() for X, a, lab in zip(devices, assignment, labels))
    nearest = sum(((X[:, None] - G[None]) ** 2).sum(-1).min(1).sum() for X in devices)
    costs = [((X - c[lab]) ** 2).sum() for X, c, lab in zip(devices, local, labels)]
    counts = [np.array([15, 15]) for _ in devices]
    assert induced_over_nearest(local, counts, costs, assignment, G, nearest) == pytest.approx(
        induced / nearest, rel=1e-10
    )


# ----------------------------------------------------------------------------- DA-UFL
def test_auto_som_has_about_four_units_per_cluster_and_a_device_uses_what_it_can_fill():
    assert som_grid(1) == 4 and som_grid(16) == 8 and som_grid(31) == 12
    assert som_grid(10) ** 2 >= 4 * 10
    assert device_grid(8, 1000) == 8 and device_grid(8, 20) == 4 and device_grid(8, 1) == 1
    assert is_grid(16, 8) and is_grid(64, 8) and not is_grid(15, 8) and not is_grid(81, 8)


def test_batch_som_with_a_tiny_radius_is_lloyd():
    """With σ ≪ 1 the neighbourhood is the unit itself: each pass is a Lloyd step."""
    rng = np.random.default_rng(2)
    X = rng.normal(size=(300, 2))
    som = train_som(X, 3, 1, np.random.default_rng(5), radius=(1e-3, 1e-3))
    start = X[np.random.default_rng(5).choice(300, size=9, replace=False)]
    labels = ((X[:, None] - start[None]) ** 2).sum(-1).argmin(1)
    expected = np.stack([X[labels == j].mean(0) if np.any(labels == j) else start[j] for j in range(9)])
    np.testing.assert_allclose(som, expected, rtol=1e-9, atol=1e-12)


# ----------------------------------------------------------------------------- standardize
def test_federated_moments_give_standard_scalers_mean_and_scale():
    from sklearn.preprocessing import StandardScaler

    rng = np.random.default_rng(4)
    parts = [rng.normal(size=(50 + 10 * i, 3)) * [1.0, 100.0, 0.0] + [5.0, -3.0, 7.0] for i in range(4)]
    X = np.concatenate(parts)
    scaling = Scaling.from_summaries(
        np.array([len(p) for p in parts]),
        np.stack([p.sum(0) for p in parts]),
        np.stack([((p - p.mean(0)) ** 2).sum(0) for p in parts]),
    )
    reference = StandardScaler().fit(X)
    np.testing.assert_allclose(scaling.mean, reference.mean_, rtol=1e-9)
    np.testing.assert_allclose(
        scaling.scale, reference.scale_, rtol=1e-6
    )  # constant feature: scale 1, as StandardScaler
    np.testing.assert_allclose(scaling.apply(X), reference.transform(X), atol=1e-6)
    np.testing.assert_allclose(scaling.undo(scaling.apply(X)), X, atol=1e-9)


def test_a_malformed_scaling_in_a_request_is_refused_with_its_name():
    with pytest.raises(ValueError, match="scale-factor"):
        Scaling.from_arrays({"scale-shift": np.zeros(2), "scale-factor": np.array([1.0, 0.0])})
    with pytest.raises(ValueError, match="both"):
        Scaling.from_arrays({"scale-shift": np.zeros(2)})
    assert Scaling.from_arrays({"centers": np.zeros((2, 2))}) is None
