import numpy as np
import pytest

from fedcluster.lloyd import (
    MEMBERSHIP_MAX_K,
    assign,
    kmeans,
    kmeans_cost,
    kmeans_plus_plus,
    label_means,
    lloyd,
    label_sums,
    lloyd_statistics,
    lloyd_of_sets,
    lloyd_statistics_of_sets,
    lloyd_until_stable,
    nearest,
    nearest_of_sets,
)


def naive_statistics(X, C, w=None):
    w = np.ones(len(X)) if w is None else w
    d2 = ((X[:, None, :] - C[None, :, :]) ** 2).sum(-1)
    labels = d2.argmin(1)
    k = C.shape[0]
    sums = np.stack([(X[labels == j] * w[labels == j, None]).sum(0) for j in range(k)])
    counts = np.array([w[labels == j].sum() for j in range(k)])
    means = sums / np.maximum(counts, 1e-300)[:, None]
    scatter = np.stack([((X[labels == j] - means[j]) ** 2 * w[labels == j, None]).sum(0) for j in range(k)])
    return sums, counts, float((d2.min(1) * w).sum()), scatter, labels


@pytest.mark.parametrize("chunk", [1, 7, None])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("k", [6, MEMBERSHIP_MAX_K + 10])  # both ways of finding the nearest
def test_lloyd_statistics_match_naive(chunk, weighted, k):
    rng = np.random.default_rng(1)
    X = rng.normal(size=(300, 4)) * 3
    C = rng.normal(size=(k, 4)) * 3
    w = rng.uniform(0.1, 2.0, size=300) if weighted else None
    stats = lloyd_statistics(X, C, w, with_scatter=True, chunk_rows=chunk)
    sums, counts, cost, scatter, labels = naive_statistics(X, C, w)
    np.testing.assert_allclose(stats.sums, sums, rtol=1e-12, atol=1e-10)
    np.testing.assert_allclose(stats.counts, counts, rtol=1e-12)
    np.testing.assert_allclose(stats.scatter, scatter, rtol=1e-9, atol=1e-9)
    assert stats.cost == pytest.approx(cost, rel=1e-10)
    assert np.array_equal(assign(X, C, chunk_rows=chunk)[0], labels)


def test_cost_from_statistics_is_accurate_far_from_the_origin_and_never_negative():
    """The cost comes from the statistics (sum ||x||² + sum_j (W_j ||c_j||² − 2 c_j·S_j)):
    checked against the per-point form on data offset by 1e4 σ, and exactly on the centers."""
    rng = np.random.default_rng(2)
    X = rng.normal(size=(2000, 5)) + 1e4
    C = X[:4] + 0.5
    _, _, cost, _, _ = naive_statistics(X, C)
    assert lloyd_statistics(X, C, chunk_rows=64).cost == pytest.approx(cost, rel=1e-6)
    on_centers = np.repeat(C, 3, axis=0)
    assert lloyd_statistics(on_centers, C).cost >= 0.0
    assert lloyd_statistics(on_centers, C).cost <= 1e-6 * float((on_centers**2).sum()) * 1e-9


@pytest.mark.parametrize("k", [4, MEMBERSHIP_MAX_K + 4])
def test_ties_go_to_the_lowest_index(k):
    """A duplicated center and points exactly halfway between two centers: every such
    point counts once, for the lower index (as np.argmin), never for both."""
    rng = np.random.default_rng(3)
    C = rng.normal(size=(k, 2)) * 50
    C[0], C[1], C[2], C[3] = [1.0, 0.0], [-1.0, 0.0], [0.0, 8.0], [0.0, 8.0]  # 2 and 3 coincide
    X = np.array([[0.0, 0.0], [0.0, 0.5], [0.0, 8.0], [0.1, 7.9], [0.9, 0.1]])
    stats = lloyd_statistics(X, C, chunk_rows=2)
    sums, counts, cost, _, labels = naive_statistics(X, C)
    assert list(labels) == [0, 0, 2, 2, 0]
    np.testing.assert_array_equal(stats.counts, counts)
    np.testing.assert_allclose(stats.sums, sums, atol=1e-12)
    assert stats.counts.sum() == len(X)
    assert stats.cost == pytest.approx(cost, abs=1e-9)


def test_nan_rows_count_once_as_np_argmin_says_even_beside_a_tie():
    """A NaN row matches no center by comparison; with a tied row in the same chunk the
    row total still adds up, so the kernel must look at the NaN itself."""
    X = np.array([[0.0, 0.0], [np.nan, 0.0], [5.0, 5.0]])
    C = np.array([[1.0, 0.0], [-1.0, 0.0], [5.0, 5.0]])
    stats = lloyd_statistics(X, C)
    np.testing.assert_array_equal(stats.counts, [2.0, 0.0, 1.0])  # np.argmin: NaN -> index 0
    assert stats.counts.sum() == len(X)


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


@pytest.mark.parametrize("chunk", [1, 7, None])
@pytest.mark.parametrize("weighted", [False, True])
def test_nearest_and_label_sums_match_naive(chunk, weighted):
    rng = np.random.default_rng(2)
    X = rng.normal(size=(200, 3)) * 2
    C = rng.normal(size=(5, 3)) * 2
    w = rng.uniform(0.1, 2.0, size=200) if weighted else None
    sums, counts, _, _, labels = naive_statistics(X, C, w)
    assert np.array_equal(nearest(X, C, chunk_rows=chunk), labels)
    got_sums, got_counts = label_sums(X, labels, 5, w, chunk_rows=chunk)
    np.testing.assert_allclose(got_sums, sums, rtol=1e-12, atol=1e-10)
    np.testing.assert_allclose(got_counts, counts, rtol=1e-12)


@pytest.mark.parametrize("offset", [0.0, 1e6])
@pytest.mark.parametrize("n", [300, 3000])  # every set in one block; a set per block, two chunks of rows
def test_nearest_within_each_set_is_the_nearest_by_own_differences(offset, n):
    """Every set's nearest center for every row, against each row's own differences from
    that set's centers: sets of different spreads stacked, exact ties (the lowest index),
    centers shared between sets, and two centers 1e-5 apart, 1e4 from the others, with rows
    on one of them, where the BLAS form rounds both distances alike."""
    rng = np.random.default_rng(4)
    m, k, d = 7, 12, 3
    sets = offset + rng.normal(size=(m, k, d)) * np.array([1.0, 10.0, 100.0, 1.0, 1.0, 1.0, 1.0])[:, None, None]
    X = offset + rng.normal(size=(n, d)) * 5
    sets[1, :6] = sets[0, :6]  # shared centers
    sets[2, 3] = sets[2, 7]  # an exact tie: the lowest index
    X[:4] = offset + 1e4
    sets[3, 0] = X[0] + np.array([1e-5, 0.0, 0.0])  # first among the form's ties, but farther
    sets[3, 1] = X[0]
    expected = np.stack([((X[:, None, :] - c[None]) ** 2).sum(-1).argmin(axis=1) for c in sets], axis=1)
    got = nearest_of_sets(X, sets)
    assert np.array_equal(got, expected)
    assert np.array_equal(got[:4, 3], [1, 1, 1, 1])


def test_label_means_keeps_the_previous_row_of_an_empty_group():
    X = np.array([[0.0, 0.0], [2.0, 0.0], [10.0, 10.0]])
    previous = np.array([[5.0, 5.0], [-1.0, -1.0], [7.0, 7.0]])
    means, counts = label_means(X, np.array([0, 0, 2]), previous)
    np.testing.assert_array_equal(means, [[1.0, 0.0], [-1.0, -1.0], [10.0, 10.0]])
    np.testing.assert_array_equal(counts, [2, 0, 1])


def naive_lloyd_until_stable(X, C, w, max_iter):
    """Textbook Lloyd (no incremental sums): assign, mean, repeat until no label changes."""
    w = np.ones(len(X)) if w is None else w
    labels = ((X[:, None] - C[None]) ** 2).sum(-1).argmin(1)
    for it in range(max_iter + 1):
        C = np.array(
            [
                (X[labels == j] * w[labels == j, None]).sum(0) / w[labels == j].sum() if (labels == j).any() else C[j]
                for j in range(len(C))
            ]
        )
        if it == max_iter:
            break
        new = ((X[:, None] - C[None]) ** 2).sum(-1).argmin(1)
        if np.array_equal(new, labels):
            break
        labels = new
    cost = float((((X - C[labels]) ** 2).sum(1) * w).sum())
    return C, labels, cost


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("max_iter", [0, 1, 100])
def test_lloyd_until_stable_matches_textbook_lloyd(weighted, max_iter):
    rng = np.random.default_rng(4)
    X = np.concatenate([rng.normal(loc=m, size=(400, 2)) for m in (0, 3, 6, 9)])
    w = rng.uniform(0.5, 3.0, size=len(X)) if weighted else None
    for seed in range(5):
        start = X[np.random.default_rng(seed).choice(len(X), 4, replace=False)]
        centers, labels, cost = lloyd_until_stable(X, start, max_iter, w)
        ref_centers, ref_labels, ref_cost = naive_lloyd_until_stable(X, start, w, max_iter)
        assert np.array_equal(labels, ref_labels)
        np.testing.assert_allclose(centers, ref_centers, rtol=1e-10, atol=1e-12)
        assert cost == pytest.approx(ref_cost, rel=1e-10)
        if max_iter == 100:  # converged: a fixed point, and the cost is the k-means cost
            assert cost == pytest.approx(kmeans_cost(X, centers, w), rel=1e-10)


@pytest.mark.parametrize("weighted", [False, True])
def test_lloyd_until_stable_cost_over_many_row_pieces(weighted):
    """High d: the cost pass runs in pieces of a few rows (SMALL_FLOATS); every row counted once."""
    from fedcluster.lloyd import SMALL_FLOATS

    rng = np.random.default_rng(7)
    d = 2 * SMALL_FLOATS // 16  # 16-row pieces
    X = np.concatenate([rng.normal(loc=m, size=(37, d)) for m in (0.0, 0.5, 1.0)])  # 111 rows: 7 pieces, the last short
    w = rng.uniform(0.5, 3.0, size=len(X)) if weighted else None
    start = X[[0, 40, 80]]
    centers, labels, cost = lloyd_until_stable(X, start, 100, w)
    ref_centers, ref_labels, ref_cost = naive_lloyd_until_stable(X, start, w, 100)
    assert np.array_equal(labels, ref_labels)
    assert cost == pytest.approx(ref_cost, rel=1e-12)


def test_kmeans_plus_plus_indices_are_distinct_even_with_duplicates():
    X = np.repeat(np.array([[0.0, 0.0], [1.0, 1.0]]), 5, axis=0)
    for seed in range(10):
        rows = kmeans_plus_plus(X, 6, np.random.default_rng(seed), indices=True)
        assert len(set(rows.tolist())) == 6
        assert {tuple(X[r]) for r in rows} == {(0.0, 0.0), (1.0, 1.0)}
    np.testing.assert_array_equal(
        kmeans_plus_plus(X, 2, np.random.default_rng(3)),
        X[kmeans_plus_plus(X, 2, np.random.default_rng(3), indices=True)],
    )


@pytest.mark.parametrize("offset", [0.0, 5.0, 1e9])
def test_rows_of_exactly_repeated_centers_go_to_the_first(offset):
    """A center repeated exactly (k-means++ on data with repeated points, a set padded by
    repeats) takes no row from its first occurrence, in every nearest-center rule: BLAS may
    round the same product differently in another column of a block, so the tie is not left
    to the product. Half the sets share their first coordinate without repeating a center
    (a constant feature): :func:`repeated` finds no repeat there."""
    from fedcluster.lloyd import repeated, squared_distances

    rng = np.random.default_rng(7)
    failures = []
    for trial in range(120):
        n, d, k, m = (int(rng.integers(lo, hi)) for lo, hi in ((20, 300), (1, 41), (2, 70), (2, 9)))
        X = rng.normal(size=(n, d)) * 0.01 + offset
        C = X[rng.integers(0, n, size=(m, k))] + rng.normal(size=(m, k, d)) * 0.01 * (trial % 2)
        for s in range(m):
            if s % 2:
                C[s, :, 0] = C[s, 0, 0]  # a shared first coordinate, no repeat yet
                assert d == 1 or repeated(C[s]) is None or trial % 2 == 0
            i, j = sorted(rng.choice(k, size=2, replace=False))
            C[s, j] = C[s, i]
        first = [np.array([int(np.flatnonzero((c == c[j]).all(axis=1))[0]) for j in range(k)]) for c in C]
        repeats = [np.flatnonzero(f != np.arange(k)) for f in first]
        _, counts, _, _ = lloyd_statistics_of_sets(X, C)
        of_sets = nearest_of_sets(X, C)
        for s in range(m):
            np.testing.assert_array_equal(repeated(C[s]), first[s])
            one = lloyd_statistics(X, C[s], with_scatter=s % 2 == 0)
            for name, c in (("sets", counts[s]), ("one", one.counts)):
                if c[repeats[s]].any():
                    failures.append((trial, s, name))
            for name, lab in (
                ("nearest", nearest(X, C[s])),
                ("of_sets", of_sets[:, s]),
                ("assign", assign(X, C[s])[0]),
                ("until_stable", lloyd_until_stable(X, C[s], 0)[1]),
                ("distances", np.argmin(squared_distances(X, C[s]), axis=1)),
            ):
                if np.isin(lab, repeats[s]).any():
                    failures.append((trial, s, name))
    assert not failures, failures[:10]


@pytest.mark.parametrize(
    "offset, scale, rounded",
    [(0.0, 1.0, False), (1e9, 1.0, False), (0.0, 1e3, True), (5.0, 0.01, False), (1e9, 1e-3, True)],
)
def test_every_set_at_once_gives_each_sets_own_statistics(offset, scale, rounded):
    """The one-pass kernel of a round's side-by-side sets against :func:`lloyd_statistics`
    set by set: the same counts (so the same assignment, ties to the lowest index), and
    sums, scatters and costs equal up to the rounding of products taken in another shape;
    about the origin, far from it (timestamps), on a grid with exact ties, with duplicate
    centers and a set tight enough to need its rows settled one by one."""
    rng = np.random.default_rng(int(offset) % 97 + int(scale * 10))
    for trial in range(60):
        n, d, k, m = (int(rng.integers(lo, hi)) for lo, hi in ((1, 300), (1, 10), (1, 14), (1, 17)))
        X = rng.normal(size=(n, d)) * scale
        X = (np.round(X) if rounded else X) + offset
        C = X[rng.integers(0, n, size=(m, k))] + rng.normal(size=(m, k, d)) * scale * (trial % 3) * 0.2
        if k > 1 and trial % 4 == 0:
            C[0, 1] = C[0, 0]  # a duplicate center: its rows go to the lower index
        if trial % 5 == 0:
            C[-1] = X[0] + rng.normal(size=(k, d)) * 1e-7 * max(scale, 1e-300)  # needs settling
        sums, counts, cost, scatter = lloyd_statistics_of_sets(X, C)
        for s in range(m):
            one = lloyd_statistics(X, C[s], with_scatter=True)
            np.testing.assert_array_equal(counts[s], one.counts)
            np.testing.assert_allclose(sums[s], one.sums, rtol=1e-12, atol=0)
            assert abs(cost[s] - one.cost) <= 1e-11 * one.cost
            np.testing.assert_allclose(
                scatter[s], one.scatter, rtol=1e-9, atol=1e-12 * float(np.max(one.scatter, initial=0))
            )


@pytest.mark.parametrize("offset", [0.0, 1e6])
def test_every_set_at_once_settles_the_rows_the_form_cannot_decide(offset):
    """Rows on a center whose neighbour, first among the BLAS form's ties, lies 1e-5 away,
    1e4 from the middle of the set's centers: the one-pass kernel sends each row to its own
    center by its own differences, as :func:`lloyd_statistics` does set by set."""
    rng = np.random.default_rng(8)
    X = offset + rng.normal(size=(50, 2)) * 100  # a cost far from cancelling (not taken set by set)
    X[:6] = offset + 1e4
    C = offset + rng.normal(size=(3, 5, 2)) * 100
    C[1, 0] = X[0] + np.array([1e-5, 0.0])
    C[1, 1] = X[0]
    C[1, 2] = offset - 1e4
    sums, counts, cost, scatter = lloyd_statistics_of_sets(X, C)
    for s in range(3):
        labels = ((X[:, None, :] - C[s][None]) ** 2).sum(-1).argmin(axis=1)
        np.testing.assert_array_equal(counts[s], np.bincount(labels, minlength=5))
        np.testing.assert_array_equal(counts[s], lloyd_statistics(X, C[s]).counts)
    assert counts[1, 0] == 0 and counts[1, 1] == 6


def test_a_set_the_form_cannot_decide_gets_its_own_statistics_over_chunks_of_rows():
    """Rows the BLAS form puts on the wrong side of a bisector in the first chunk of rows
    :func:`lloyd_statistics` takes, and one far row in a later chunk: the one-pass kernel
    gives that set exactly the counts and cost :func:`lloyd_statistics` gives it alone."""
    from fractions import Fraction

    from fedcluster.lloyd import rows_per_chunk

    def exact(x, centers):
        gaps = [sum((Fraction(a) - Fraction(b)) ** 2 for a, b in zip(x, c)) for c in centers]
        return gaps.index(min(gaps))

    rng = np.random.default_rng(0)
    C = np.array([[0.3, 0.7], [1.7, 0.9]])
    middle, normal = C.mean(0), C[1] - C[0]
    along = np.array([-normal[1], normal[0]]) / np.linalg.norm(normal)
    misordered = []
    while len(misordered) < 20:
        x = middle + along * rng.normal() * 3 + normal * rng.integers(-8, 9) * 1e-16
        if int(np.argmin(x @ (-2.0 * C.T) + (C * C).sum(1))) != exact(x, C):
            misordered.append(x)
    n = rows_per_chunk(10**9, 2) + 10
    X = rng.normal(size=(n, 2))
    X[: len(misordered)] = misordered
    X[-1] = 1e4
    sums, counts, cost, _ = lloyd_statistics_of_sets(X, np.stack([C, C + 0.01]))
    for s, centers in enumerate((C, C + 0.01)):
        one = lloyd_statistics(X, centers)
        np.testing.assert_array_equal(counts[s], one.counts)
        assert abs(cost[s] - one.cost) <= 1e-11 * one.cost


@pytest.mark.parametrize("seed", range(4))
def test_a_cost_with_scatters_loses_no_digits_to_far_rows(seed):
    """A few rows 1e4 out on a center of one set, the rest about the origin: the cost is a
    small share of the squared norms the BLAS expansion takes it from, which loses digits
    there. With scatters both kernels give the cost from each cluster's scatter, mean and
    residual (the parallel axis theorem): each row's own distance, summed, to 1e-12."""
    rng = np.random.default_rng(seed)
    n, m, k, d = 4000, 3, 10, 20
    X = rng.normal(size=(n, d))
    C = rng.normal(size=(m, k, d))
    X[:6] = 1e4
    C[1, 0] = X[0] + np.r_[1e-5, np.zeros(d - 1)]
    C[1, 1] = X[0]
    C[1, 2] = -1e4
    w = rng.integers(1, 5, size=n).astype(float)
    for weights in (None, w):
        cost = lloyd_statistics_of_sets(X, C, weights)[2]
        for s in range(m):
            own = ((X[:, None, :] - C[s][None]) ** 2).sum(-1).min(axis=1)
            brute = float(own.sum() if weights is None else own @ weights)
            assert abs(cost[s] - brute) <= 1e-12 * brute
            alone = lloyd_statistics(X, C[s], weights, with_scatter=True).cost
            assert abs(alone - brute) <= 1e-12 * brute


def test_every_set_at_once_falls_back_to_one_at_a_time_beyond_its_memory():
    """A pass larger than ``SETS_FLOATS`` is taken set by set: the same numbers exactly."""
    from fedcluster import lloyd

    rng = np.random.default_rng(3)
    X, C = rng.normal(size=(lloyd.SETS_FLOATS // 20 + 1, 4)), rng.normal(size=(2, 10, 4))
    sums, counts, cost, scatter = lloyd_statistics_of_sets(X, C)
    for s in range(2):
        one = lloyd_statistics(X, C[s], with_scatter=True)
        assert (sums[s] == one.sums).all() and (counts[s] == one.counts).all()
        assert cost[s] == one.cost and (scatter[s] == one.scatter).all()


@pytest.mark.parametrize("max_iter", [1, 5, 100])
def test_lloyd_of_many_sets_stops_each_set_where_lloyd_stops_it(max_iter):
    """The server screens and refines its start candidates side by side: each set's centers
    and cost must be :func:`lloyd`'s from that set alone (weighted, near and far from the
    origin), though the sets stop after different numbers of iterations."""
    rng = np.random.default_rng(max_iter)
    for trial in range(20):
        n, d, k = int(rng.integers(12, 150)), int(rng.integers(1, 6)), int(rng.integers(1, 9))
        X = rng.normal(size=(n, d)) + (1e9 if trial % 4 == 0 else 0.0)
        w = rng.integers(1, 30, size=n).astype(float)
        starts = np.stack([kmeans_plus_plus(X, k, rng, w) for _ in range(int(rng.integers(1, 25)))])
        centers, costs, _ = lloyd_of_sets(X, starts, w, max_iter=max_iter)
        for s, start in enumerate(starts):
            alone, cost, _ = lloyd(X, start, w, max_iter=max_iter)
            np.testing.assert_allclose(centers[s], alone, rtol=1e-12, atol=1e-12 * float(np.abs(X).max()))
            assert abs(costs[s] - cost) <= 1e-12 * cost


@pytest.mark.parametrize("k, d", [(3, 1), (40, 2), (100, 2), (64, 4), (50, 8)])
def test_separation_is_the_smallest_gap_between_different_centers(k, d):
    """Coordinate by coordinate (few coordinates, many centers) or by the contraction: the
    smallest squared distance between two different centers, duplicates skipped, over
    row chunks smaller than k."""
    from fedcluster import lloyd

    rng = np.random.default_rng(k * d)
    centers = rng.normal(size=(k, d))
    centers[k - 1] = centers[0]  # a duplicate is no gap
    pairs = [((a - b) ** 2).sum() for i, a in enumerate(centers) for b in centers[i + 1 :]]
    expected = min(p for p in pairs if p > 0)
    assert lloyd.separation(centers) == pytest.approx(expected, rel=1e-14)
    lloyd_chunk = lloyd.CHUNK_FLOATS
    try:
        lloyd.CHUNK_FLOATS = 3 * k * d  # three rows per chunk
        assert lloyd.separation(centers) == pytest.approx(expected, rel=1e-14)
    finally:
        lloyd.CHUNK_FLOATS = lloyd_chunk


@pytest.mark.parametrize("d", range(1, 8))
def test_sums_of_squares_coordinate_by_coordinate_are_numpys_to_the_bit(d):
    """Below 8 coordinates ``sum_of_squares`` of the coordinates one by one is, to the bit,
    squaring the stacked differences and summing them (what the checks it replaces did),
    near and far from the origin."""
    from fedcluster.lloyd import sum_of_squares

    rng = np.random.default_rng(d)
    for scale, offset in ((1.0, 0.0), (1e-3, 1e9), (1e6, -3.0)):
        x = offset + scale * rng.normal(size=(40, 30, d))
        y = offset + scale * rng.normal(size=(30, d))
        stacked = ((x - y) ** 2).sum(axis=2)
        assert np.array_equal(sum_of_squares(x[:, :, q] - y[:, q] for q in range(d)), stacked)


def test_a_kept_separation_is_of_the_centers_as_they_are_now():
    """``separation`` keeps its last results by the centers' contents: the same centers (a
    copy too) give the same gap, and centers changed in place give their new one."""
    from fedcluster.lloyd import SEPARATIONS_KEPT, _separation, separation

    rng = np.random.default_rng(2)
    centers = rng.normal(size=(12, 3))
    first = separation(centers)
    assert first == _separation(centers) and separation(centers.copy()) == first
    centers[5] = centers[7] + 1e-3  # in place: now these two are the closest
    assert separation(centers) == _separation(centers) == pytest.approx(3e-6)
    for _ in range(SEPARATIONS_KEPT + 2):  # more arrays than are kept: still each one's own
        other = rng.normal(size=(12, 3))
        assert separation(other) == _separation(other)
    assert separation(centers.T.copy().T) == _separation(centers)  # another memory layout, the same centers


@pytest.mark.parametrize(
    "shape", [(5, 2), (64, 1), (300, 2), (300, 4), (7, 90, 3), (200, 40), (3, 0, 2), (40000, 2), (3, 9000, 4)]
)
def test_column_extremes_are_numpys_over_the_rows(shape):
    """The per-column extremes and magnitudes taken along transposed copies of blocks of rows
    (one block and several) are NumPy's own reduction over the rows, with zeros, infinities
    and NaN among the values (a zero's sign is not compared)."""
    from fedcluster.lloyd import column_extremes, largest_magnitudes

    rng = np.random.default_rng(len(shape) * 100 + shape[-2])
    a = rng.normal(size=shape) * 10.0 ** rng.integers(-300, 300, size=shape)
    if a.size:
        flat = a.reshape(-1)
        flat[:: max(1, a.size // 5)] = -0.0
        flat[1] = np.inf
        flat[-1] = -np.inf
    if shape[-2] == 0:
        with pytest.raises(ValueError):
            column_extremes(a)
        return
    low, high = column_extremes(a)
    np.testing.assert_array_equal(low, a.min(axis=-2))
    np.testing.assert_array_equal(high, a.max(axis=-2))
    np.testing.assert_array_equal(largest_magnitudes(a), np.abs(a).max(axis=-2))
    a.reshape(-1)[a.size // 2] = np.nan
    low, high = column_extremes(a)
    np.testing.assert_array_equal(np.isnan(low), np.isnan(a.min(axis=-2)))
    np.testing.assert_array_equal(np.isnan(high), np.isnan(a.max(axis=-2)))


@pytest.mark.parametrize("n, d, offset", [(500, 1, 0.0), (3000, 2, 0.0), (800, 8, 1e6), (300, 20, 0.0), (200, 64, 0.0)])
@pytest.mark.parametrize("candidates", [1, 3, 7])
def test_kmeans_plus_plus_distances_are_within_the_forms_rounding(n, d, offset, candidates):
    """k-means++ takes its candidates' distances from one lifted product: each is within the
    BLAS form's rounding (:func:`form_rounding`) of the distance by the point's own
    differences, and never negative; exact duplicates and far rows included."""
    from fedcluster.lloyd import _distances_to_rows, form_rounding, reference

    rng = np.random.default_rng(n + d + candidates)
    X = rng.normal(size=(n, d)) * 10.0 + offset
    X[: n // 10] = X[n // 10 : 2 * (n // 10)]  # duplicates
    origin = reference(X)
    X = X if origin is None else X - origin
    rows = rng.integers(0, n, size=candidates)
    got = _distances_to_rows(X)(rows)
    own = ((X[:, None, :] - X[rows][None, :, :]) ** 2).sum(-1)
    norms = np.sqrt(np.einsum("ij,ij->i", X, X))
    assert got.shape == (n, candidates) and (got >= 0).all()
    assert (np.abs(got - own) <= form_rounding(d, norms[:, None], norms[rows][None, :])).all()
    assert (got[rows, np.arange(candidates)] <= form_rounding(d, norms[rows], norms[rows])).all()


@pytest.mark.parametrize("weighted", [False, True])
def test_a_tight_cluster_far_from_the_reference_costs_its_exact_cost(weighted):
    """400 rows within 1e-9..1e-6 of each other 1e4 out, a set whose other center at −1e4 puts
    its reference at the origin: the cluster's mean rounds off its true mean by far more
    than its spread. With scatters both kernels still give the exact cost (by fractions),
    to a few units in the last place: the parallel axis theorem about the computed mean,
    with its residual."""
    from fractions import Fraction

    rng = np.random.default_rng(5)
    for sigma in (1e-6, 1e-8, 1e-9):
        X = 1e4 + sigma * rng.normal(size=(400, 2))
        C = np.array([X.mean(0) + sigma * rng.normal(size=2), [-1e4, -1e4]])
        w = rng.integers(1, 5, size=400).astype(float) if weighted else None
        exact = sum(
            min(sum((Fraction(a) - Fraction(b)) ** 2 for a, b in zip(x, c)) for c in C)
            * (1 if w is None else Fraction(w[i]))
            for i, x in enumerate(X)
        )
        alone = lloyd_statistics(X, C, w, with_scatter=True).cost
        together = lloyd_statistics_of_sets(X, np.stack([C, C + [[sigma, 0.0], [0.0, 0.0]]]), w)[2][0]
        for cost in (alone, together):
            assert abs(Fraction(cost) - exact) <= 1e-12 * exact


def test_statistics_of_no_points_are_zeros():
    """A device with no points: zero counts, sums, scatters and cost, with or without
    scatters, few centers or many."""
    for k in (3, 50):
        C = np.arange(2.0 * k).reshape(k, 2)
        for with_scatter in (False, True):
            one = lloyd_statistics(np.zeros((0, 2)), C, with_scatter=with_scatter)
            assert one.cost == 0.0 and not one.counts.any() and not one.sums.any()
            if with_scatter:
                assert not one.scatter.any()
        sums, counts, cost, scatter = lloyd_statistics_of_sets(np.zeros((0, 2)), np.stack([C, C]))
        assert not (sums.any() or counts.any() or cost.any() or scatter.any())
