"""fedcluster.cell_moments: cluster statistics that no points inside the cluster's Voronoi
cell and the device's box can have, against honest statistics that always pass."""

from __future__ import annotations

import numpy as np
import pytest

from fedcluster.cell_moments import MAX_DIM, TOLERANCE, cell_moments_violation, largest_variance_gap


def _statistics(X, labels, k):
    """means, counts and per-coordinate scatters about the means of a labelling (one center set)."""
    d = X.shape[1]
    counts, sums, scatter = np.zeros(k), np.zeros((k, d)), np.zeros((k, d))
    np.add.at(counts, labels, 1.0)
    np.add.at(sums, labels, X)
    means = np.divide(sums, np.maximum(counts, 1.0)[:, None])
    np.add.at(scatter, labels, (X - means[labels]) ** 2)
    return means[None], counts[None], scatter[None]


def _nearest(X, C):
    return ((X[:, None] - C[None]) ** 2).sum(-1).argmin(1)


def test_all_points_claimed_for_the_middle_cell_scatter_more_than_it_holds():
    """Four corner clusters and one in the middle, 20 points each, all 100 claimed for the
    middle center. The claim passes every other check of a training reply (its mean lies in
    the middle cell, its sums add up, and all points sent to one center is exactly what the
    declared moments allow), but points inside the middle cell cannot spread as far as the
    corner clusters do."""
    from fedcluster.bounds import voronoi_violation
    from fedcluster.algorithms.fedkmeans.model import partitions_violation, whole_partition
    from fedcluster.bounds import Declared

    rng = np.random.default_rng(0)
    C = np.array([[0, 0], [10, 0], [0, 10], [10, 10], [5, 5]], dtype=float)
    X = np.concatenate([c + rng.normal(size=(20, 2)) for c in C])
    low, high = X.min(0), X.max(0)
    middle = np.full(len(X), 4)
    means, counts, scatter = _statistics(X, middle, 5)
    assert voronoi_violation(means[0], counts[0], C) is None
    declared = Declared(100.0, low, high, moment_sum=X.sum(0), moment_scatter=((X - X.mean(0)) ** 2).sum(0))
    part = (np.array([100.0]), X.mean(0)[None], np.array([((X - X.mean(0)) ** 2).sum()]))
    assert partitions_violation([(float(((X - C[4]) ** 2).sum()), C, part)], [], whole_partition(declared)) is None
    found = cell_moments_violation(means, counts, scatter, C[None], low, high)
    assert found is not None and found[0] == 0 and "center 4" in found[1], found
    assert cell_moments_violation(*_statistics(X, _nearest(X, C), 5), C[None], low, high) is None


def test_the_largest_variance_in_a_cut_box_by_hand():
    """The box [−1, 1]² cut by the wall x <= 0.5 (centers (0, 0) and (1, 0)), mean at the
    origin: along x the points reach −1 and 0.5, so the largest variance with that mean is
    1 × 0.5 = 0.5 (two points at the ends); along y, 1. Below both it passes, above either it
    fails, with the margin in units of the box width² (4)."""
    centers = np.array([[0.0, 0.0], [1.0, 0.0]])
    low, high = np.array([-1.0, -1.0]), np.array([1.0, 1.0])
    mean = np.zeros(2)
    assert largest_variance_gap(mean, np.array([0.45, 0.1]), centers, 0, low, high) >= 0
    assert largest_variance_gap(mean, np.array([0.55, 0.0]), centers, 0, low, high) == pytest.approx(
        (0.5 - 0.55) / 4, abs=1e-6
    )
    assert largest_variance_gap(mean, np.array([0.0, 1.1]), centers, 0, low, high) == pytest.approx(
        (1.0 - 1.1) / 4, abs=1e-6
    )


@pytest.mark.parametrize("seed", range(12))
def test_nearest_center_statistics_always_pass(seed):
    """Honest statistics, several center sets at once: Gaussian mixtures, integer grids with
    centers on half-integers (points on the bisectors), constant features, duplicated rows,
    1-D data, offsets of 1e6 and heavy tails."""
    rng = np.random.default_rng(seed)
    for _ in range(20):
        d, k, n = int(rng.integers(1, MAX_DIM + 1)), int(rng.integers(2, 9)), int(rng.integers(2, 300))
        kind = rng.integers(5)
        X = rng.normal(size=(n, d)) + (rng.normal(size=(k, d)) * 4)[rng.integers(k, size=n)]
        if kind == 1:
            X = np.round(X)
        if kind == 2:
            X = rng.standard_cauchy(size=(n, d)) + 1e6
        if kind == 3:
            X[:, 0] = 2.5
            X = np.concatenate([X, X[: n // 3]])
        low, high = X.min(0), X.max(0)
        sets = np.stack(
            [X[rng.choice(len(X), size=k)] + rng.normal(size=(k, d)) * rng.choice([0.0, 0.3]) for _ in range(3)]
        )
        if kind == 1:
            sets = np.round(sets) + 0.5
        stats = [_statistics(X, _nearest(X, C), k) for C in sets]
        means, counts, scatter = (np.concatenate([s[i] for s in stats]) for i in range(3))
        assert cell_moments_violation(means, counts, scatter, sets, low, high) is None
        for s, j in zip(*np.nonzero(counts > 1)):  # every cluster through the solver, not only the two it takes
            var = scatter[s, j] / counts[s, j]
            gap = largest_variance_gap(means[s, j], var * (1 - 1e-9), sets[s], int(j), low, high)
            assert gap is None or gap >= -TOLERANCE, (s, j, gap)


def test_above_its_dimension_or_without_a_box_it_says_nothing():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(50, MAX_DIM + 1))
    C = np.stack([X[:25].mean(0) + 50.0, X.mean(0)])
    lie = _statistics(X, np.ones(50, dtype=int), 2)  # everything for center 1
    assert cell_moments_violation(*lie, C[None], X.min(0), X.max(0)) is None
    Y = X[:, :2]
    C2 = np.stack([Y[:25].mean(0) + 0.5, Y.mean(0)])
    lie2 = _statistics(Y, np.ones(50, dtype=int), 2)
    assert cell_moments_violation(*lie2, C2[None], None, None) is None


@pytest.mark.parametrize("seed", range(6))
def test_vertices_solved_at_once_are_qhulls(seed):
    """The two ways to enumerate a cell's vertices agree (the fast one decides most checks;
    a rejection is confirmed on Qhull's)."""
    from fedcluster.cell_moments import _vertices

    rng = np.random.default_rng(seed)
    for _ in range(10):
        dim = int(rng.integers(2, 5))
        walls = rng.normal(size=(int(rng.integers(1, 5)), dim))
        A = np.vstack([walls, np.eye(dim), -np.eye(dim)])
        b = np.concatenate([rng.uniform(0.1, 1.0, size=len(walls)), np.ones(2 * dim)])
        A, b = A / np.linalg.norm(A, axis=1)[:, None], b / np.linalg.norm(A, axis=1)
        fast, slow = _vertices(A, b, dim), _vertices(A, b, dim, qhull=True)
        as_set = lambda V: {tuple(np.round(v, 8)) for v in V}  # noqa: E731
        assert as_set(fast) == as_set(slow)


@pytest.mark.parametrize("offset, beta", [(1e8, 1.0), (1.7e9, 1.0), (1.7e9, 0.5)])
def test_replies_of_the_device_kernel_pass_at_large_offsets(offset, beta):
    """A device's own kernel (client_kmeans) decides nearest centers with terms that round in
    absolute terms: with a coordinate near 1e8–1e9 (epoch seconds) points near a bisector
    land on either side. Such honest replies, checked as FedKMeans checks them (means implied
    by the moved centers), still pass."""
    from fedcluster.algorithms.fedkmeans.model import client_kmeans, implied_means

    rng = np.random.default_rng(1)
    for _ in range(150):
        d, k, n = int(rng.integers(2, 4)), int(rng.integers(2, 5)), int(rng.integers(2, 12))
        pool = rng.normal(size=(200, d)) + (rng.normal(size=(k, d)) * 3)[rng.integers(k, size=200)]
        pool[:, 0] += offset
        X = pool[rng.choice(200, size=n, replace=False)]
        C = pool[rng.choice(200, size=k, replace=False)] + rng.normal(size=(k, d)) * 0.3
        counts, centers, scatter = client_kmeans(X, C, learning_rate=beta)
        means = implied_means(C, centers, beta)
        assert cell_moments_violation(means[None], counts[None], scatter[None], C[None], X.min(0), X.max(0)) is None


def test_a_mean_rounded_outside_a_thin_box_gets_no_verdict():
    """One coordinate near 1e6 spread over 3e-6 (a width of 3e-12 of its size): the mean a
    device's statistics imply may round a few ulps outside the box; that is no proof of a
    lie (the bounds checks hold the box)."""
    low, high = np.array([1e6, 0.0]), np.array([1e6 + 3e-6, 1.0])
    centers = np.array([[1e6, 0.5], [1e6 + 50.0, 0.5]])
    mean = np.array([1e6 - 2e-7, 0.5])  # just below the box, as rounded
    assert largest_variance_gap(mean, np.array([0.0, 0.2]), centers, 0, low, high) is None


def test_decoys_do_not_shield_a_cluster_the_solver_rejects():
    """A reply (found by a random search) with one false cluster the solver rejects alone,
    ranked below others no certificate passes but the solver accepts: of the two solved per
    reply, one is drawn at random by the server, so the false one is caught in some replies
    (with a fixed ranking a device could hide it behind decoys for good)."""
    from fedcluster import cell_moments

    C = np.array(
        [
            [5.7823471645833795, 0.5435513025992644],
            [3.3827675543327276, 6.515112480817679],
            [1.1005475194045322, 4.189591313359542],
            [8.25674592180239, 6.348336490322925],
            [6.5463586926091475, 5.015320189175555],
            [5.674000722759067, 0.4965075258279361],
        ]
    )
    X = np.array(
        [
            [3.5588414189508266, 3.416953657349835],
            [4.971217518645812, 6.957055433175363],
            [2.339962194257078, 8.548303732080004],
            [4.516507305428965, 6.28388180665981],
            [8.32943526909322, 1.0277250208250244],
            [7.939072615369124, 6.276389599558652],
            [3.036832547007232, 2.432262419987855],
            [7.865295782204682, 2.3839874292729855],
            [6.881566841389749, 6.560720332996585],
            [5.640424743251918, 0.5950197132502966],
            [4.734662278151726, 2.1942346238886454],
            [9.686310626102584, 1.1690409076515063],
            [8.975651480657822, 5.423074387238087],
            [7.700880027246164, 4.476083533628734],
            [6.236999099396617, 9.553659956591172],
            [0.46611570372969147, 9.45196015672112],
        ]
    )
    labels = np.array([4, 1, 1, 1, 0, 3, 4, 0, 3, 5, 5, 0, 3, 4, 3, 1])
    means, counts, scatter = _statistics(X, labels, len(C))
    low, high = X.min(0), X.max(0)
    var = scatter[0] / np.maximum(counts[0], 1)[:, None]
    false = [
        j
        for j in range(len(C))
        if counts[0, j] > 1
        and (largest_variance_gap(means[0, j], var[j] * (1 - 1e-6), C, j, low, high) or 0.0) < -cell_moments.TOLERANCE
    ]
    assert len(false) == 1
    passed, need = cell_moments._axis_certificate(
        means[0], var, C[None], np.zeros(len(C), dtype=int), np.arange(len(C)), low, high
    )
    assert (need[~passed] > need[false[0]]).sum() >= 1  # not the one farthest from passing
    caught = [
        cell_moments_violation(means, counts, scatter, C[None], low, high, np.random.default_rng(seed))
        for seed in range(40)
    ]
    assert any(found is not None and f"center {false[0]}" in found[1] for found in caught)


@pytest.mark.parametrize("offset", [0.0, 1e9])
@pytest.mark.parametrize("block", [None, 1, 7])
def test_the_axis_certificate_reaches_each_cells_walls_along_every_axis(offset, block, monkeypatch):
    """The axis certificate (every part of every set at once, in blocks of parts) reaches,
    from each part's mean along each axis, the nearest of its cell's walls as the solver
    states them (``_walls``: one part at a time) and of the box: its ``need`` is
    Σ_d v_d / (s⁺_d s⁻_d) of those segments, and it passes exactly the parts whose segments
    are inside the cell with ``need`` below 1. Near and far from the origin, with a repeated
    center."""
    from fedcluster import cell_moments

    if block is not None:
        monkeypatch.setattr(cell_moments, "BLOCK_FLOATS", block)
    rng = np.random.default_rng(3)
    m, k, d = 3, 9, 3
    centers = offset + rng.normal(size=(m, k, d))
    centers[1, 4] = centers[1, 2]
    sets, parts = np.repeat(np.arange(m), k), np.tile(np.arange(k), m)
    means = centers[sets, parts] + rng.normal(scale=0.2, size=(m * k, d))
    var = rng.uniform(0.0, 0.3, size=(m * k, d))
    low, high = centers.min(axis=(0, 1)) - 0.5, centers.max(axis=(0, 1)) + 0.5
    passed, need = cell_moments._axis_certificate(means, var, centers, sets, parts, low, high)
    slack = cell_moments.SLACK * (high - low)
    for p in range(m * k):
        a, b = cell_moments._walls(centers[sets[p]], int(parts[p]), means[p], low, high)
        with np.errstate(divide="ignore", invalid="ignore"):
            up = np.array([np.min(b[a[:, q] > 0] / a[a[:, q] > 0, q], initial=np.inf) for q in range(d)])
            down = np.array([np.min(b[a[:, q] < 0] / -a[a[:, q] < 0, q], initial=np.inf) for q in range(d)])
        up, down = np.minimum(up, high - means[p] + slack), np.minimum(down, means[p] - low + slack)
        expected = np.sum(np.where(var[p] > 0, var[p] / (up * down), 0.0))
        assert need[p] == pytest.approx(expected, rel=1e-9, abs=0.0), p
        inside = bool(np.all(b > 0) and np.all(up > 0) and np.all(down > 0))
        assert passed[p] == (inside and expected <= 1.0 - 1e-9), p
    assert 0 < passed.sum() < m * k  # both kinds occur
