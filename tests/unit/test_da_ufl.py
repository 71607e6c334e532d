"""DA-UFL kernels and server math on plain arrays (fedcluster/algorithms/da_ufl/model.py), against oracles
written here with plain loops (docs/ALGORITHMS.md §2)."""

from __future__ import annotations

import numpy as np
import pytest

from fedcluster.algorithms.da_ufl import model as da_ufl
from fedcluster.kernel import DeviceData
from fedcluster.device import run_task


def naive_weighted_means(points_list, weights_list, centers):
    """One weighted Lloyd step over several agents, by loops: every point goes to its
    nearest center (lowest index on ties) and adds weight * point to its cluster."""
    k, d = centers.shape
    sums, mass = np.zeros((k, d)), np.zeros(k)
    for X, w in zip(points_list, weights_list):
        for x, weight in zip(X, w):
            best = min(range(k), key=lambda j: (sum((x[i] - centers[j][i]) ** 2 for i in range(d)), j))
            sums[best] += weight * x
            mass[best] += weight
    out = centers.copy()
    for j in range(k):
        if mass[j] > 0:
            out[j] = sums[j] / mass[j]
    return out


def step(X, centers, anchor, weights, binning="uniform", outer=1, xi=0.0, seed=0, bins=10, **arrays):
    data = DeviceData(points=X, source="test")
    out, metrics = run_task(
        "daufl_step",
        data,
        {"centers": centers, "anchor": anchor, "weights": np.asarray(weights, float), **arrays},
        {"binning": binning, "outer": outer, "xi-max": xi, "seed": seed, "bins": bins},
    )
    assert metrics["num-examples"] == X.shape[0]
    return out


def test_eta_one_inner_step_is_one_weighted_lloyd_step():
    rng = np.random.default_rng(0)
    agents = [rng.normal(size=(40, 3)) + shift for shift in (0.0, 2.0, -1.0)]
    codebook = rng.normal(size=(6, 3))
    bin_weight = [rng.uniform(0.1, 1.0, size=6) for _ in agents]
    centers = rng.normal(size=(4, 3))
    z, weight = np.zeros_like(centers), np.zeros(4)
    point_weights = []
    for X, w in zip(agents, bin_weight):
        out = step(X, centers, centers, w, binning="codebook", codebook=codebook)
        z += out["gradient"]
        weight += out["weight"]
        nearest_unit = [int(np.argmin([np.sum((x - c) ** 2) for c in codebook])) for x in X]
        point_weights.append(w[nearest_unit])
    new = da_ufl.dual_averaging_update(centers, z, weight, eta=1.0)
    np.testing.assert_allclose(new, naive_weighted_means(agents, point_weights, centers), rtol=0, atol=1e-12)


def test_small_eta_contracts_geometrically_to_the_same_point():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(60, 2))
    anchor = rng.normal(size=(3, 2))
    target = naive_weighted_means([X], [np.ones(60)], anchor)
    z, centers = np.zeros_like(anchor), anchor
    for t in range(1, 6):
        out = step(X, centers, anchor, [1.0])
        z = z + out["gradient"]
        centers = da_ufl.dual_averaging_update(anchor, z, out["weight"], eta=0.5)
        # e_t = (1 - eta)^t e_0 for a cluster with mass (the recentred eq. 4b)
        moved = out["weight"] > 0
        np.testing.assert_allclose(centers[moved] - target[moved], 0.5**t * (anchor[moved] - target[moved]), atol=1e-12)


def test_one_agent_with_uniform_weights_is_central_kmeans_from_the_same_start():
    rng = np.random.default_rng(2)
    X = np.concatenate([rng.normal(size=(30, 2)) + c for c in ((0, 0), (6, 0), (0, 6), (6, 6))])
    start = X[[0, 1, 2, 3]].copy()
    central = start.copy()
    for _ in range(50):  # plain Lloyd, by loops
        central = naive_weighted_means([X], [np.ones(len(X))], central)
    centers = start.copy()
    for t1 in range(1, 51):
        anchor = centers
        out = step(X, centers, anchor, [1.0], outer=t1)
        centers = da_ufl.dual_averaging_update(anchor, out["gradient"], out["weight"], eta=1.0)
    np.testing.assert_allclose(centers, central, atol=1e-12)


def test_bin_weights_sum_to_one_across_agents_and_follow_the_counts():
    counts = np.array([[3, 0, 1, 0], [1, 0, 1, 5], [0, 0, 2, 5]], dtype=float)
    w = da_ufl.bin_weights(counts)
    for b in range(4):
        total = sum(counts[j][b] for j in range(3))
        for j in range(3):
            assert w[j, b] == (counts[j][b] / total if total else 0.0)
    np.testing.assert_allclose(w.sum(axis=0)[[0, 2, 3]], 1.0)
    assert w[:, 1].sum() == 0.0  # an empty bin weighs nothing


def test_full_overlap_counts_every_distinct_point_once():
    """Three agents that see the same points: bin weights make the weighted count the
    number of distinct points (the double counting the weights exist for)."""
    rng = np.random.default_rng(3)
    X = rng.normal(size=(50, 2))
    low, high = X.min(0), X.max(0)
    counts = np.stack(
        [
            run_task("bin_counts", DeviceData(points=X), {"low": low, "high": high}, {"binning": "grid", "bins": 4})[0][
                "counts"
            ]
            for _ in range(3)
        ]
    )
    assert counts.sum() == 150
    w = da_ufl.bin_weights(counts)
    centers = X[:2].copy()
    mass = sum(step(X, centers, centers, w[j], binning="grid", bins=4, low=low, high=high)["weight"] for j in range(3))
    assert mass.sum() == pytest.approx(50.0, abs=1e-12)


def test_xi_max_zero_gives_deterministic_nearest_labels():
    rng = np.random.default_rng(4)
    X, centers = rng.normal(size=(100, 3)), rng.normal(size=(5, 3))
    oracle = [int(np.argmin([np.sum((x - c) ** 2) for c in centers])) for x in X]
    for seed in (0, 1, 99):
        labels = da_ufl.perturbed_labels(X, centers, 1, 0.0, np.random.default_rng(seed))
        assert labels.tolist() == oracle


def test_xi_is_drawn_per_point_and_per_cluster():
    """Points equidistant from two centers: a draw per point would scale both distances
    alike and keep the tie (label 0 everywhere); per point AND cluster splits them."""
    X = np.zeros((200, 2))
    centers = np.array([[1.0, 0.0], [-1.0, 0.0]])
    labels = da_ufl.perturbed_labels(X, centers, 1, 0.5, np.random.default_rng(0))
    assert 50 < int(labels.sum()) < 150
    late = da_ufl.perturbed_labels(X + [[0.01, 0.0]], centers, 10**6, 0.5, np.random.default_rng(0))
    assert late.tolist() == [0] * 200  # ξ/t1 -> 0: the plain nearest center


def test_a_cluster_with_no_weight_keeps_its_center():
    rng = np.random.default_rng(5)
    X = rng.normal(size=(30, 2))
    centers = np.array([[0.0, 0.0], [1000.0, 1000.0]])
    out = step(X, centers, centers, [1.0])
    assert out["weight"][1] == 0
    new = da_ufl.dual_averaging_update(centers, out["gradient"], out["weight"], eta=0.7)
    assert new[1].tolist() == [1000.0, 1000.0]
    np.testing.assert_allclose(new[0], 0.3 * centers[0] + 0.7 * X.mean(0), atol=1e-12)


def test_changed_labels_are_counted_against_the_previous_iteration():
    rng = np.random.default_rng(6)
    X = rng.normal(size=(80, 2))
    before, after = np.array([[0.0, 0.0], [1.0, 1.0]]), np.array([[0.0, 0.0], [0.2, 0.2]])
    data = DeviceData(points=X)
    out, _ = run_task(
        "daufl_step",
        data,
        {"centers": after, "anchor": after, "weights": np.ones(1), "previous": before},
        {"binning": "uniform", "outer": 2, "previous-outer": 1},
    )
    oracle = sum(int(np.argmin(((x - before) ** 2).sum(1)) != np.argmin(((x - after) ** 2).sum(1))) for x in X)
    assert oracle > 0 and out["changed"][0] == oracle


def test_som_training_is_deterministic_for_a_seed_and_covers_the_data():
    rng = np.random.default_rng(7)
    X = np.concatenate([rng.normal(size=(100, 2)) * 0.3 + c for c in ((0, 0), (5, 0), (0, 5), (5, 5))])
    data = DeviceData(points=X)
    one = run_task("som_codebook", data, {}, {"grid": 4, "epochs": 30, "seed": 11})[0]["codebook"]
    two = run_task("som_codebook", data, {}, {"grid": 4, "epochs": 30, "seed": 11})[0]["codebook"]
    other = run_task("som_codebook", data, {}, {"grid": 4, "epochs": 30, "seed": 12})[0]["codebook"]
    assert one.shape == (16, 2) and np.array_equal(one, two) and not np.array_equal(one, other)
    few = run_task("som_codebook", DeviceData(points=X[:10]), {}, {"grid": 4, "epochs": 30, "seed": 11})[0]["codebook"]
    assert few.shape == (9, 2)  # 10 points: a 3 x 3 grid, not more units than points
    quantization = np.mean([min(np.sum((x - u) ** 2) for u in one) for x in X])
    assert quantization < 0.1 * X.var(0).sum()  # the units sit on the data
    # the units are spread over every blob
    for c in ((0, 0), (5, 0), (0, 5), (5, 5)):
        assert min(np.sum((u - np.array(c)) ** 2) for u in one) < 1.0


def test_grid_index_matches_a_loop_and_the_cell_centers():
    rng = np.random.default_rng(8)
    X = rng.uniform(-1, 3, size=(200, 3))
    low, high, b = np.array([-1.0, -1.0, -1.0]), np.array([3.0, 3.0, 3.0]), 4
    oracle = []
    for x in X:
        cell = [min(int((x[i] - low[i]) / (high[i] - low[i]) * b), b - 1) for i in range(3)]
        oracle.append(cell[0] * b * b + cell[1] * b + cell[2])
    assert da_ufl.grid_index(X, low, high, b).tolist() == oracle
    centers = da_ufl.grid_centers(low, high, b)
    assert da_ufl.grid_index(centers, low, high, b).tolist() == list(range(b**3))


def test_too_many_bins_is_refused_pointing_to_the_som_variant():
    assert da_ufl.grid_cells(10, 2, 100) == 100
    with pytest.raises(da_ufl.TooManyBins, match="weighting='som'"):
        da_ufl.grid_cells(10, 8, 100_000)


def test_weighted_init_uses_only_populated_bins():
    points = np.array([[0.0, 0.0], [1.0, 0.0], [50.0, 50.0], [2.0, 2.0]])
    counts = np.array([[1, 2, 0, 3], [0, 1, 0, 0]])
    for seed in range(10):
        init = da_ufl.weighted_init(points, counts, 3, np.random.default_rng(seed))
        assert not any(np.array_equal(row, points[2]) for row in init)
    # fewer populated bins than clusters: the empty representative comes last, after every populated one
    for seed in range(10):
        init = da_ufl.weighted_init(points, counts, 4, np.random.default_rng(seed))
        assert sorted(map(tuple, init)) == sorted(map(tuple, points))
    with pytest.raises(ValueError, match="only 4 distinct bin representatives"):
        da_ufl.weighted_init(points, counts, 5, np.random.default_rng(0))


def test_weighted_init_with_restarts_is_the_cheapest_distinct_start():
    rng = np.random.default_rng(3)
    points = rng.normal(size=(60, 2)) + np.repeat([[0, 0], [6, 0], [0, 6], [6, 6]], 15, axis=0)
    counts = rng.integers(1, 9, size=60)
    candidates = da_ufl.init_candidates(points, counts, 4, np.random.default_rng(0), 20, 5)

    def cost(C):
        return float(np.sum(counts * ((points[:, None] - C[None]) ** 2).sum(-1).min(1)))

    costs = [cost(C) for C in candidates]
    assert costs == sorted(costs) and len(set(np.round(costs, 9))) == len(costs)
    np.testing.assert_array_equal(da_ufl.weighted_init(points, counts, 4, np.random.default_rng(0), 20), candidates[0])


def test_daufl_paper_model_overlaps_and_follows_the_snr():
    from fedcluster.data import daufl_paper

    X, y, observed, positions = daufl_paper(5, 50, 20.0, seed=0)
    assert X.shape == (800, 2) and np.bincount(y).tolist() == [50] * 16 and positions.shape == (5, 2)
    assert (observed.sum(0) >= 2).any()  # some points seen by several agents
    means = np.array([X[y == c].mean(0) for c in range(16)])
    assert np.abs(np.sort(np.unique(np.round(means / 2.5) * 2.5)) - [-7.5, -2.5, 2.5, 7.5]).max() < 1e-9
    # distance to agent 0 vs. observation: nearer points are seen more often
    d = np.sqrt(((X - positions[0]) ** 2).sum(1))
    assert observed[0][d < np.median(d)].mean() > observed[0][d >= np.median(d)].mean()
    low = daufl_paper(5, 50, 0.0, seed=0)[2]
    assert low.sum() < observed.sum()


# ---------------------------------------------------------------- robust combining
def agents_gradients(num_agents=10, k=3, d=2, seed=0):
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(k, d))
    means = rng.normal(size=(num_agents, k, d)) * 0.1  # every agent's weighted mean S/W
    weights = rng.uniform(1.0, 5.0, size=(num_agents, k))
    gradients = weights[..., None] * centers[None] - weights[..., None] * means  # g = W m − S
    return centers, gradients, weights, means


def test_mean_combining_is_the_plain_sum():
    from fedcluster.algorithms.da_ufl.model import combine_gradients

    centers, gradients, weights, _ = agents_gradients()
    z, w = combine_gradients(centers, gradients, weights, "mean")
    np.testing.assert_array_equal(z, gradients.sum(axis=0))
    np.testing.assert_array_equal(w, weights.sum(axis=0))


def test_trimmed_combining_step_is_the_trimmed_mean_of_the_agents_means_by_loops():
    from fedcluster.algorithms.da_ufl.model import combine_gradients, dual_averaging_update

    centers, gradients, weights, means = agents_gradients()
    z, w = combine_gradients(centers, gradients, weights, "trimmed-mean", 0.1)
    step = dual_averaging_update(centers, z, w, 1.0)  # η = 1 from the anchor: the combined mean
    for j in range(centers.shape[0]):
        for c in range(centers.shape[1]):
            order = np.argsort(means[:, j, c], kind="stable")[1:-1]  # t = ceil(0.1 · 10) = 1 each end
            naive = np.sum(weights[order, j] * means[order, j, c]) / np.sum(weights[order, j])
            assert step[j, c] == pytest.approx(naive, rel=1e-10, abs=1e-12)


@pytest.mark.parametrize("method", ["trimmed-mean", "median"])
def test_one_lying_agent_in_ten_cannot_move_a_daufl_step_outside_the_honest_range(method):
    from fedcluster.algorithms.da_ufl.model import combine_gradients, dual_averaging_update

    centers, gradients, weights, means = agents_gradients()
    gradients[0] = weights[0, :, None] * (centers - 1e6)  # claims its points sit at +1e6
    weights[0] *= 1000  # with a huge weight
    honest = means[1:]
    for how in ("mean", method):
        z, w = combine_gradients(centers, gradients, weights, how, 0.1)
        step = dual_averaging_update(centers, z, w, 1.0)
        inside = np.all((step >= honest.min(axis=0) - 1e-9) & (step <= honest.max(axis=0) + 1e-9))
        assert inside == (how != "mean"), how


# ---------------------------------------------------------------- agents that come and go
def agents_with_labels(seed=3, num_agents=4, k=3, d=2, offset=0.0):
    """Agents' points, bin weights and FIXED labels (an outer iteration), and a naive
    gradient at any centers by loops: g_k = Σ_{label k} w (m_k − x), W_k = Σ_{label k} w."""
    rng = np.random.default_rng(seed)
    agents = [
        (offset + rng.normal(scale=3.0, size=(30, d)), rng.uniform(0.1, 2.0, size=30), rng.integers(k, size=30))
        for _ in range(num_agents)
    ]

    def naive(agent, centers):
        X, w, labels = agent
        gradient, weight = np.zeros((k, d)), np.zeros(k)
        for x, wn, label in zip(X, w, labels):
            gradient[label] += wn * (centers[label] - x)
            weight[label] += wn
        return gradient, weight

    return agents, naive


def test_a_gradient_sent_at_other_centers_moves_to_these_exactly():
    agents, naive = agents_with_labels()
    rng = np.random.default_rng(4)
    sent_at, now = rng.normal(size=(3, 2)), rng.normal(size=(3, 2))
    for agent in agents:
        gradient, weight = naive(agent, sent_at)
        moved = da_ufl.gradients_at(now, gradient[None], weight[None], sent_at[None])[0]
        np.testing.assert_allclose(moved, naive(agent, now)[0], rtol=1e-12, atol=1e-12)


def test_a_step_over_held_statistics_is_the_step_with_every_agent_answering():
    """Agents 1 and 2 answer only every other step; the server steps with what each last
    sent (moved to the current centers): z and the centers are those of the run in which
    every agent answers every step (labels fixed within the outer iteration)."""
    agents, naive = agents_with_labels()
    anchor = np.random.default_rng(5).normal(size=(3, 2))
    full = (anchor, np.zeros_like(anchor))  # (centers, z) with every agent answering
    held = {}
    centers, z = anchor, np.zeros_like(anchor)
    for t in range(1, 8):
        stats = [naive(agent, full[0]) for agent in agents]
        full_z = full[1] + sum(g for g, _ in stats)
        full = (da_ufl.dual_averaging_update(anchor, full_z, sum(w for _, w in stats), 0.6), full_z)
        for j, agent in enumerate(agents):
            if j in (1, 2) and t % 2 == 0 and j in held:
                continue  # away: the server keeps what it sent last
            held[j] = (*naive(agent, centers), centers)
        rows = [held[j] for j in sorted(held)]
        z, centers = da_ufl.inner_step(
            anchor,
            z,
            centers,
            np.stack([r[0] for r in rows]),
            np.stack([r[1] for r in rows]),
            np.stack([r[2] for r in rows]),
            0.6,
        )
        np.testing.assert_allclose(centers, full[0], rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(z, full[1], rtol=1e-12, atol=1e-9)


@pytest.mark.parametrize("offset", [0.0, 1e6, 1e9])
def test_an_honest_step_reply_is_never_called_outside_its_box(offset):
    """The liar test of a step reply must be sound: no honest agent's reply fails it, with
    any weights, labels and centers, near the origin or far from it."""
    for seed in range(40):
        agents, naive = agents_with_labels(seed, offset=offset)
        centers = offset + np.random.default_rng(seed).normal(scale=20.0, size=(3, 2))
        for X, w, labels in agents:
            sums, weight = np.zeros((3, 2)), np.zeros(3)
            np.add.at(sums, labels, w[:, None] * X)
            np.add.at(weight, labels, w)
            gradient = weight[:, None] * centers - sums  # as the device forms it
            assert da_ufl.implied_mean_violation(centers, gradient, weight, X.min(axis=0), X.max(axis=0)) is None


def test_a_step_reply_no_points_in_its_box_produce_is_named():
    agents, naive = agents_with_labels()
    X, w, labels = agents[0]
    centers = X[:3] + 0.5
    gradient, weight = naive(agents[0], centers)
    low, high = X.min(axis=0), X.max(axis=0)
    assert da_ufl.implied_mean_violation(centers, gradient, weight, low, high) is None
    reason = da_ufl.implied_mean_violation(centers, 50.0 * gradient, weight, low, high)  # its gradient inflated
    assert reason is not None and "outside the bounding box its data summary declared" in reason
    empty = weight.copy()
    empty[1] = 0.0
    assert "weight 0" in da_ufl.implied_mean_violation(centers, gradient, empty, low, high)


def test_a_feature_constant_at_zero_on_a_device_is_not_called_outside_its_box():
    """uci/yeast: a flag feature is 0 on every point of some devices (a box of width 0 there)
    while other clusters' centers lie at 0.8 in it; the device's sums about the centers'
    reference round like 0.8, and its honest reply must pass."""
    rng = np.random.default_rng(5)
    X = np.column_stack([rng.uniform(5.2, 5.9, 30), np.zeros(30), rng.uniform(5.3, 5.7, 30)])
    centers = np.array([[5.3, 2.6e-17, 5.4], [5.7, 3.6e-17, 5.6], [5.5, 0.83, 5.5]])  # taken about their mean
    labels = np.argmin(((X[:, None] - centers[None]) ** 2).sum(-1), axis=1)
    for weights in (np.full(30, 0.04), rng.uniform(1e-4, 1.0, 30)):
        gradient, weight = da_ufl.weighted_gradient(X, labels, weights, centers)
        assert da_ufl.implied_mean_violation(centers, gradient, weight, X.min(axis=0), X.max(axis=0)) is None
        lie = gradient + np.array([0.0, 1e-3, 0.0]) * weight[:, None]  # its flag at -0.001: no point of its
        assert da_ufl.implied_mean_violation(centers, lie, weight, X.min(axis=0), X.max(axis=0))
