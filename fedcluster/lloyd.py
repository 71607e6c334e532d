"""The one k-means kernel every algorithm uses, on the device and on the server.

* assignment: :func:`nearest` (labels), :func:`assign` (labels and distances),
  :func:`squared_distances`;
* sufficient statistics of one Lloyd step: :func:`lloyd_statistics` (sums, counts, cost,
  optionally scatters about the clusters' means); of a given grouping: :func:`label_sums`, :func:`label_means`;
* Lloyd: :func:`lloyd_until_stable` (until the assignment is stable, weighted or not;
  k-FED's device and server steps), :func:`lloyd` (until the centers stop moving) and
  :func:`kmeans` (restarts);
* seeding and cost: :func:`kmeans_plus_plus` (points or their row indices),
  :func:`kmeans_cost`.

Everything here is NumPy only, so it runs on a phone-class device as well as on the
server. Distances use the BLAS form ``||x||^2 - 2 x.c + ||c||^2`` about a reference point
(:func:`reference`): the centers' mean when the data lie far from the origin, where the form
about the origin cancels (at 1e9 every term is 1e18 and a distance of 1 is rounding), so
that a shift of the data changes no assignment and no cost; the origin otherwise. Where
even about it the form's rounding could exceed :data:`RESOLUTION` of the centers'
separation (tight clusters far from the reference: one device's data far from the
others'), the rows it cannot decide are taken by their own differences. The data
are processed in row chunks so that memory stays bounded (``chunk_rows * max(k, d)``
floats) however large ``n`` is.

Naming follows scikit-learn: ``centers`` (k x d), ``labels`` (n,), ``inertia``/``cost``
(sum of squared distances to the nearest center).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Rows per chunk are chosen so that one chunk's block holds about this many floats
# (2^15 doubles = 256 KiB): big enough for BLAS to be efficient, small enough to stay in
# the L2 cache (a larger block that spills out of it is slower; the kernel timing of
# bench/speed.py measures the choice) and in memory bounds for any n.
CHUNK_FLOATS = 1 << 15

# Floats in the (rows x d) temporaries of a pass that is not a product (2^14 = 128 KiB, the
# default mmap threshold of glibc's malloc): larger temporaries made and freed over and over
# are returned to the system and mapped again each time, and the page faults cost more than
# the arithmetic: on a k-FED device's few hundred points an assignment in one piece costs
# far more than its arithmetic, in pieces below this size little more
# (bench/kfed_table.py times k-FED's device step).
SMALL_FLOATS = 1 << 14


def sum_of_squares(differences) -> np.ndarray:
    """Σ_q x_q² of ``differences`` given coordinate by coordinate, added in order. NumPy adds
    a sum of fewer than 8 terms in order too: for fewer than 8 coordinates this is, to the
    bit, squaring the stacked coordinates and summing them, without the stacked temporary."""
    total = None
    for x in differences:
        total = x * x if total is None else total + x * x
    return total


def column_extremes(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The smallest and largest value of every column of ``a`` (..., rows, d) over its rows:
    ``(low, high)``, each (..., d). NumPy reduces an array over its rows a row at a time
    when the rows are short, which makes per-coordinate extremes of few coordinates slow;
    taken along copies of blocks of rows with the coordinates first (about
    :data:`CHUNK_FLOATS` floats each: memory stays bounded), the reduction runs along memory.
    The same values (a minimum does not round), but for the sign of a zero, which may differ."""
    a = np.asarray(a)
    rows = a.shape[-2]
    if a.shape[-1] > FEW_COLUMNS or rows < FEW_ROWS:
        return a.min(axis=-2), a.max(axis=-2)
    step = max(FEW_ROWS, CHUNK_FLOATS // max(a.shape[-1] * int(np.prod(a.shape[:-2], dtype=np.int64)), 1))
    low = high = None
    for start in range(0, rows, step):
        across = np.ascontiguousarray(np.swapaxes(a[..., start : start + step, :], -1, -2))
        block_low, block_high = across.min(axis=-1), across.max(axis=-1)
        low = block_low if low is None else np.minimum(low, block_low)
        high = block_high if high is None else np.maximum(high, block_high)
    return low, high


# Up to this many columns :func:`column_extremes` reduces along a transposed copy: beyond,
# NumPy's own reduction over the rows is about as fast, and the copy costs memory; so it is
# below this many rows, where the calls cost more than the reduction.
FEW_COLUMNS = 32
FEW_ROWS = 64


def largest_magnitudes(a: np.ndarray) -> np.ndarray:
    """``np.abs(a).max(axis=-2)`` by :func:`column_extremes`: the largest magnitude of every
    column over the rows."""
    low, high = column_extremes(a)
    return np.maximum(high, -low)


def rows_per_chunk(n: int, k: int, rows: int | None = None) -> int:
    """Rows per chunk for ``n`` rows against ``k`` columns (``rows`` when given): every
    chunked loop over data in fedcluster uses this, so memory stays at about
    ``CHUNK_FLOATS`` floats per block."""
    if rows is not None:
        if rows < 1:
            raise ValueError(f"chunk_rows must be >= 1, got {rows}")
        return int(rows)
    return max(256, min(max(n, 1), CHUNK_FLOATS // max(k, 1)))


@dataclass
class LloydStatistics:
    """Sufficient statistics of one Lloyd step of ``centers`` on some data.

    Attributes
    ----------
    sums : (k, d) per-cluster (weighted) sums of the points assigned to each center.
    counts : (k,) per-cluster (weighted) counts.
    cost : float, sum over points of (weight times) the squared distance to the nearest center.
    scatter : (k, d) per-cluster, per-coordinate (weighted) sums of squared deviations from
        the cluster's own mean, or None when not requested: the per-dimension spread of
        every cluster without any single point leaving the data's owner, and the same
        numbers wherever the data lie (a sum of squared coordinates is not: far from the
        origin it is the square of the offset plus rounding).
    """

    sums: np.ndarray
    counts: np.ndarray
    cost: float
    scatter: np.ndarray | None = None

    def __add__(self, other: "LloydStatistics") -> "LloydStatistics":
        scatter = None
        if self.scatter is not None and other.scatter is not None:
            scatter = pooled_scatter(
                np.stack([self.counts, other.counts]),
                np.stack([self.sums, other.sums]),
                np.stack([self.scatter, other.scatter]),
            )
        return LloydStatistics(self.sums + other.sums, self.counts + other.counts, self.cost + other.cost, scatter)

    def centers(self, previous: np.ndarray) -> np.ndarray:
        """Lloyd update: the mean of each cluster; a cluster with no mass keeps ``previous``."""
        out = np.array(previous, dtype=np.float64, copy=True)
        nonempty = self.counts > 0
        out[nonempty] = self.sums[nonempty] / self.counts[nonempty, None]
        return out


def reference(points: np.ndarray) -> np.ndarray | None:
    """The point squared distances to ``points`` (centers, or data) are computed about: their
    mean when their bounding box lies farther from the origin than it is wide (data far from
    the origin, where the form about the origin cancels: at 1e9 its terms are 1e18 and a
    distance of 1 is rounding), else None: about the origin, whose rounding is then within a
    small factor of the centered form's, with no pass that subtracts (ordinary data run
    exactly the arithmetic they always did)."""
    if points.shape[0] == 0:
        return None
    low, high = column_extremes(points)
    middle, width = low + high, high - low  # the middle, doubled
    if middle.dot(middle) <= 4.0 * width.dot(width):
        return None
    return points.mean(axis=0)


# What the kernel promises of a nearest-center assignment: a row goes to a center whose
# squared distance exceeds the nearest one's by at most this share of the smallest squared
# separation of two (different) centers. The BLAS form rounds relative to the rows' and
# centers' squared distances from the reference, not to the distances compared; where that
# rounding could exceed it (a tight cluster far from the reference: one device's data far
# from the others', heavy tails, a standardized run whose bulk lies off the origin) the rows
# it cannot decide are settled by their own differences from the centers.
RESOLUTION = 1e-9
_EPS = float(np.finfo(np.float64).eps)
# Above this many (k² · d) floats the centers' separation is not computed: every chunk's
# undecided rows are looked for (:func:`_settle`).
SEPARATION_MAX_FLOATS = 1 << 22


def form_rounding(d: int, x_norm, reach: float):
    """How far ``||c||² − 2 x·c`` (or a squared distance by the BLAS form) may be off by
    rounding, for a row of norm ``x_norm`` against centers of norms at most ``reach`` (all
    about the reference used)."""
    return (d + 4) * _EPS * (x_norm + reach) ** 2


def separation(centers: np.ndarray) -> float:
    """The smallest squared distance between two different centers, by their own differences
    (inf for fewer than two different ones; 0 when there are too many to compare). Kept for
    the last few center arrays: every device a process serves gets the same centers in a
    round, and Lloyd's settling asks for them again."""
    k, d = centers.shape
    if k < 2:
        return float("inf")
    if k * k * d > SEPARATION_MAX_FLOATS:
        return 0.0
    key = np.ascontiguousarray(centers, dtype=np.float64).tobytes() + d.to_bytes(4, "little")
    found = _SEPARATIONS.get(key)
    if found is None:
        if len(_SEPARATIONS) >= SEPARATIONS_KEPT:
            _SEPARATIONS.clear()
        found = _SEPARATIONS[key] = _separation(centers)
    return found


SEPARATIONS_KEPT = 16  # center arrays whose separation is kept (by their bytes: a copy is the same key)
_SEPARATIONS: dict[bytes, float] = {}


def _separation(centers: np.ndarray) -> float:
    """:func:`separation`, computed."""
    k, d = centers.shape
    smallest = float("inf")
    few = d <= FEW_COORDINATES and k >= 32  # coordinate by coordinate: there the contraction is the slower
    step = max(1, CHUNK_FLOATS // max(k if few else k * d, 1))
    for start in range(0, k - 1, step):
        if few:
            gaps = sum_of_squares(
                coordinate[start : start + step, None] - coordinate[None, :] for coordinate in centers.T
            )
        else:
            diff = centers[start : start + step, None, :] - centers[None, :, :]
            gaps = np.einsum("ijd,ijd->ij", diff, diff)
        gaps[gaps == 0.0] = np.inf  # a center itself, or an exact duplicate (a tie by index either way)
        smallest = min(smallest, float(gaps.min()))
    return smallest


# Up to this many coordinates (and from 32 centers) :func:`separation` sums the squared
# differences coordinate by coordinate: at k = 100, d = 2 several times faster than the
# contraction over the last axis; with few centers the loop's own calls cost more.
FEW_COORDINATES = 4


def settling(about: np.ndarray) -> tuple[np.ndarray, float, float] | None:
    """What deciding rows against ``about`` (centers about the reference) the way
    :func:`_settle` does needs: ``(about, separation, largest norm)``; None for fewer than
    two different centers (nothing to decide)."""
    apart = separation(about)
    if apart == np.inf:
        return None
    return about, apart, float(np.sqrt(np.max(np.einsum("ij,ij->i", about, about))))


def undecided(Xc: np.ndarray, settle: tuple[np.ndarray, float, float] | None):
    """``settle`` when the BLAS form may assign some row of the chunk ``Xc`` beyond
    :data:`RESOLUTION` (a bound on its rows' norms from its largest coordinate), else None."""
    if settle is None or not Xc.size:
        return None
    largest = max(float(Xc.max()), -float(Xc.min())) * np.sqrt(Xc.shape[1])
    return settle if 2.0 * form_rounding(Xc.shape[1], largest, settle[2]) > RESOLUTION * settle[1] else None


def _settle(
    Xc: np.ndarray, values: np.ndarray, labels: np.ndarray, settle: tuple[np.ndarray, float, float]
) -> np.ndarray:
    """``labels`` (the argmin of ``values`` (rows x k), the BLAS form ``||c||² − 2 x·c`` of
    the rows ``Xc`` against ``settle``'s centers, see :func:`settling`) with every row whose
    smallest value the form's rounding cannot tell from another's given the nearest center
    by its own differences (ties: the lowest index). Changes ``labels`` in place and
    returns it."""
    about, _, reach = settle
    tol = 2.0 * form_rounding(Xc.shape[1], np.sqrt(np.einsum("ij,ij->i", Xc, Xc)), reach)
    (unsure,) = _unsure(values, labels, tol)
    step = max(1, CHUNK_FLOATS // max(about.size, 1))
    for start in range(0, unsure.size, step):
        rows = unsure[start : start + step]
        diff = Xc[rows, None, :] - about[None, :, :]
        labels[rows] = np.argmin(np.einsum("rkd,rkd->rk", diff, diff), axis=1)
    return labels


def _unsure(values: np.ndarray, labels: np.ndarray, tol: np.ndarray) -> tuple[np.ndarray, ...]:
    """Where (``np.nonzero`` of ``labels``' shape) the smallest of ``values`` along the last
    axis, at ``labels``, is within ``tol`` (rounding, one per label) of another: the
    assignments the BLAS form cannot decide."""
    best = np.take_along_axis(values, labels[..., None], axis=-1)
    return np.nonzero(np.count_nonzero(values <= best + tol[..., None], axis=-1) > 1)


def repeated(centers: np.ndarray) -> np.ndarray | None:
    """For centers (k, d) of which some repeat an earlier one exactly (the same bytes): each
    center's first occurrence (an index per center); None when none repeats, told by one sort
    of the first coordinate in the usual case and else by the rows' bytes. Every nearest-center
    rule here gives a repeat no rows (ties: the lowest index) from this: BLAS may round the
    same product differently in another column of a block, so the tie is not left to it."""
    k, d = centers.shape
    if k < 2:
        return None
    if not d:
        return np.zeros(k, dtype=np.int64)
    column = np.sort(centers[:, 0])
    if not np.any(column[1:] == column[:-1]):
        return None
    seen: dict[bytes, int] = {}
    first = np.array([seen.setdefault(row.tobytes(), j) for j, row in enumerate(np.asarray(centers, np.float64))])
    return None if len(seen) == k else first


def _first_occurrences(centers: np.ndarray) -> np.ndarray | None:
    """The rows of ``centers`` that repeat no earlier one (:func:`repeated`), or None when
    none repeats: the centers a kernel works on alone, a repeat getting nothing."""
    first = repeated(centers)
    return None if first is None else np.flatnonzero(first == np.arange(centers.shape[0]))


def _sets_repeating(center_sets: np.ndarray) -> np.ndarray:
    """The sets of ``center_sets`` (m, k, d) in which a center repeats another exactly
    (:func:`repeated`; the sort of every set's first coordinates at once)."""
    m, k, d = center_sets.shape
    if k < 2 or not m:
        return np.empty(0, dtype=np.int64)
    column = np.sort(center_sets[:, :, 0], axis=1) if d else np.zeros((m, k))
    maybe = np.flatnonzero(np.any(column[:, 1:] == column[:, :-1], axis=1))
    return np.array([s for s in maybe if repeated(center_sets[s]) is not None], dtype=np.int64)


def pooled_scatter(counts: np.ndarray, sums: np.ndarray, scatter: np.ndarray) -> np.ndarray:
    """Per-coordinate scatter about the pooled mean of groups given by their (weighted)
    counts (g, ...), sums (g, ..., d) and scatters about their own means (g, ..., d): the
    parallel-axis (Chan et al.) combination ``Σ V_g + Σ n_g (μ_g − μ)²``, each term a
    difference of nearby means (no cancellation of large squares). An empty group adds
    nothing."""
    counts = np.asarray(counts, dtype=np.float64)
    total = counts.sum(axis=0)
    safe = np.where(counts > 0, counts, 1.0)[..., None]
    means = np.asarray(sums, dtype=np.float64) / safe
    pooled_mean = np.asarray(sums, dtype=np.float64).sum(axis=0) / np.where(total > 0, total, 1.0)[..., None]
    return np.asarray(scatter, dtype=np.float64).sum(axis=0) + (counts[..., None] * (means - pooled_mean) ** 2).sum(
        axis=0
    )


def squared_distances(X: np.ndarray, centers: np.ndarray, x_sq: np.ndarray | None = None) -> np.ndarray:
    """(n, k) squared Euclidean distances, computed with one matrix product about
    :func:`reference` of the centers, clipped at 0; a row the product rounds beyond
    :data:`RESOLUTION` of the centers' separation by its own differences. With ``x_sq`` (the rows' squared norms)
    the caller has put ``X`` and ``centers`` in coordinates of its own (already about a
    reference) and they are used as given."""
    settle = x_sq is None
    if settle:
        origin = reference(centers)
        if origin is not None:
            X, centers = X - origin, centers - origin
        x_sq = np.einsum("ij,ij->i", X, X)
    c_sq = np.einsum("ij,ij->i", centers, centers)
    d2 = X @ centers.T
    d2 *= -2.0
    d2 += x_sq[:, None]
    d2 += c_sq[None, :]
    np.maximum(d2, 0.0, out=d2)
    if settle and X.shape[0] and centers.shape[0] > 1:
        # rows whose distances the form rounds beyond RESOLUTION: by their own differences
        reach = float(np.sqrt(c_sq.max()))
        unsure = np.flatnonzero(form_rounding(X.shape[1], np.sqrt(x_sq), reach) > RESOLUTION * separation(centers))
        step = max(1, CHUNK_FLOATS // max(centers.size, 1))
        for start in range(0, unsure.size, step):
            rows = unsure[start : start + step]
            diff = X[rows, None, :] - centers[None, :, :]
            d2[rows] = np.einsum("rkd,rkd->rk", diff, diff)
    first = repeated(centers)
    if first is not None:  # a repeated center's column is its first occurrence's, to the bit
        d2 = d2[:, first]
    return d2


def farthest_first(points: np.ndarray, start: np.ndarray, k: int) -> np.ndarray:
    """Indices chosen greedily, each the row of ``points`` farthest from the chosen set
    (initialised with the rows listed in ``start``) until ``k`` are chosen (k-FED's merge,
    FedDP's histogram fill)."""
    chosen = list(int(i) for i in start)
    if len(chosen) >= k:
        return np.asarray(chosen[:k], dtype=np.int64)
    closest = np.min(squared_distances(points, points[chosen]), axis=1)
    closest[chosen] = -1.0  # never re-pick (ties at distance 0 pick unchosen duplicates)
    while len(chosen) < k:
        nxt = int(np.argmax(closest))
        chosen.append(nxt)
        closest = np.minimum(closest, squared_distances(points, points[nxt : nxt + 1])[:, 0])
        closest[chosen] = -1.0
    return np.asarray(chosen, dtype=np.int64)


def assign(X: np.ndarray, centers: np.ndarray, chunk_rows: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Nearest center of every row of ``X``: ``(labels, squared_distance)``, chunked; the
    distance is the row's own difference from its center (no cancellation: a point on its
    center is at 0). A repeated center gets no rows: :func:`squared_distances` gives it its
    first occurrence's column."""
    X = np.asarray(X, dtype=np.float64)
    centers = np.asarray(centers, dtype=np.float64)
    n = X.shape[0]
    k = centers.shape[0]
    labels = np.empty(n, dtype=np.int64)
    mind = np.empty(n, dtype=np.float64)
    step = rows_per_chunk(n, k, chunk_rows)
    for start in range(0, n, step):
        Xc = X[start : start + step]
        lab = np.argmin(squared_distances(Xc, centers), axis=1)
        labels[start : start + step] = lab
        deviation = Xc - centers[lab]
        mind[start : start + step] = np.einsum("ij,ij->i", deviation, deviation)
    return labels, mind


def _nearest_form(centers: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(-2 centersᵀ, ||c||²)``: argmin_j ||x - c_j||² = argmin_j (||c_j||² - 2 x·c_j), so
    the nearest center needs one (rows x d) @ (d x k) product; ||x||² only enters the cost.
    Callers take the rows and the centers about :func:`reference` first (far from the origin
    these terms would be the offset's square, and a distance its rounding). The (d x k)
    factor is C-contiguous: BLAS is markedly faster on it than on the transposed view
    (bench/speed.py)."""
    return np.ascontiguousarray(-2.0 * centers.T), np.einsum("ij,ij->i", centers, centers)


def _nearest_block(Xc: np.ndarray, minus_two_centers_t: np.ndarray, c_sq: np.ndarray, with_values: bool = True):
    """Nearest center of every row of one chunk (ties: the lowest index) and, when
    ``with_values``, the value ``||c||² - 2 x·c`` at it."""
    block = Xc @ minus_two_centers_t
    block += c_sq
    labels = np.argmin(block, axis=1)
    if not with_values:
        return labels
    return labels, np.take_along_axis(block, labels[:, None], axis=1)[:, 0]


# Up to this many centers, :func:`lloyd_statistics` finds each row's nearest center by a
# minimum over the centers and a comparison with it, along contiguous rows of a (k x rows)
# block; beyond it, by a per-row argmin over a (rows x k) block. The first reads the
# block along contiguous rows and needs no per-row argmin, which wins for few centers;
# for many centers the argmin over a (rows x k) block wins. The threshold is where the two
# crossed when timed with one thread over n, d and k (bench/speed.py's single-thread
# kernel table times the kernel).
MEMBERSHIP_MAX_K = 40


def _membership_block(Xc, minus_two_centers_t, c_sq, membership, ones, scratch=None, settle=None):
    """Fill ``membership`` (k x rows) with the indicator of every row's nearest center
    (ties: the lowest index, as :func:`nearest`); return the rows per center and a work
    buffer for the next chunk of the same size. ``ones`` holds ``rows`` ones. ``settle``:
    what :func:`settling` gives, when the chunk's rows may be too far from the centers for
    the BLAS form to decide (:func:`undecided`)."""
    k, rows = membership.shape
    if settle is not None:
        membership.fill(0.0)
        values = Xc @ minus_two_centers_t
        values += c_sq
        membership[_settle(Xc, values, np.argmin(values, axis=1), settle), np.arange(rows)] = 1.0
        return membership @ ones, scratch
    if k > MEMBERSHIP_MAX_K:
        membership.fill(0.0)
        labels = _nearest_block(Xc, minus_two_centers_t, c_sq, with_values=False)
        membership[labels, np.arange(rows)] = 1.0
        return membership @ ones, scratch
    if scratch is None:
        scratch = (np.empty((k, rows)), np.empty(rows))
    block, nearest_value = scratch  # ||c||² - 2 x·c, one column per row of the chunk
    np.matmul(Xc, minus_two_centers_t, out=block.T)
    block += c_sq[:, None]
    np.minimum.reduce(block, axis=0, out=nearest_value)
    np.equal(block, nearest_value, out=membership, casting="unsafe")
    row_counts = membership @ ones
    if row_counts.sum() != rows or not np.isfinite(nearest_value.sum()):
        # A row with two nearest centers at exactly the same value, or a NaN (a row that
        # matches no center; with a tie elsewhere the total alone could still add up):
        # the index np.argmin gives, the lowest among ties.
        membership.fill(0.0)
        membership[np.argmin(block, axis=0), np.arange(rows)] = 1.0
        row_counts = membership @ ones
    return row_counts, scratch


def _chunk_labels(Xc, minus_two_centers_t, c_sq, settle=None) -> np.ndarray:
    """Nearest center of every row of one chunk (ties: the lowest index); ``settle`` as in
    :func:`_membership_block`."""
    values = Xc @ minus_two_centers_t
    values += c_sq
    labels = np.argmin(values, axis=1)
    settle = undecided(Xc, settle)
    return labels if settle is None else _settle(Xc, values, labels, settle)


def nearest(X: np.ndarray, centers: np.ndarray, chunk_rows: int | None = None) -> np.ndarray:
    """Index of the nearest center of every row of ``X`` (ties: the lowest index), chunked.

    The assignment of :func:`lloyd_statistics` without the statistics: what a Lloyd loop
    that keeps its own sums (:func:`lloyd_until_stable`) needs."""
    X = np.asarray(X, dtype=np.float64)
    centers = np.asarray(centers, dtype=np.float64)
    kept = _first_occurrences(centers)
    if kept is not None:  # the first occurrences alone
        return kept[nearest(X, centers[kept], chunk_rows)]
    n = X.shape[0]
    labels = np.empty(n, dtype=np.int64)
    origin = reference(centers)  # far from the origin: rows and centers about the centers' mean
    about = centers if origin is None else centers - origin
    minus_two_centers_t, c_sq = _nearest_form(about)
    settle = settling(about)
    step = rows_per_chunk(n, centers.shape[0], chunk_rows)
    for start in range(0, n, step):
        Xc = X[start : start + step] if origin is None else X[start : start + step] - origin
        labels[start : start + step] = _chunk_labels(Xc, minus_two_centers_t, c_sq, settle)
    return labels


def nearest_of_sets(X: np.ndarray, center_sets: np.ndarray) -> np.ndarray:
    """Index of the nearest center within each set of ``center_sets`` (m, k, d) for every
    row of ``X``: (n, m), ties the lowest index. The BLAS form against every set's centers
    about :func:`reference` of them all, a block of sets at a time (about
    :data:`CHUNK_FLOATS` floats: fresh large temporaries cost more in page faults than their
    arithmetic); every row whose smallest value in a set the form's rounding cannot tell
    from another's is settled in that set by its own differences, as :func:`_settle` settles
    a row (which :func:`nearest` asks only of the chunks its separation test flags). A set
    with a repeated center (:func:`repeated`) is taken again by :func:`nearest` on its own."""
    X = np.asarray(X, dtype=np.float64)
    m, k, d = center_sets.shape
    flat = np.asarray(center_sets, dtype=np.float64).reshape(m * k, d)
    origin = reference(flat) if flat.size else None
    about = flat if origin is None else flat - origin
    minus_two_centers_t, c_sq = _nearest_form(about)
    reach = float(np.sqrt(np.max(c_sq))) if c_sq.size else 0.0
    labels = np.empty((X.shape[0], m), dtype=np.int64)
    step = rows_per_chunk(X.shape[0], k)
    group = max(1, CHUNK_FLOATS // (min(step, max(X.shape[0], 1)) * max(k, 1)))  # sets per block
    centers, pairs = about.reshape(m, k, d), max(1, CHUNK_FLOATS // max(k * d, 1))  # (row, set) pairs settled at once
    for start in range(0, X.shape[0], step):
        Xc = X[start : start + step] if origin is None else X[start : start + step] - origin
        tol = 2.0 * form_rounding(d, np.sqrt(np.einsum("ij,ij->i", Xc, Xc)), reach)[:, None]
        for first in range(0, m, group):
            sets = slice(first * k, min(first + group, m) * k)
            values = Xc @ minus_two_centers_t[:, sets]
            values += c_sq[sets]
            values = values.reshape(Xc.shape[0], -1, k)
            chunk = np.argmin(values, axis=2)
            rows, which = _unsure(values, chunk, np.broadcast_to(tol, chunk.shape))
            for part in range(0, rows.size, pairs):
                r, q = rows[part : part + pairs], which[part : part + pairs]
                diff = Xc[r, None, :] - centers[first + q]
                chunk[r, q] = np.argmin(np.einsum("pkd,pkd->pk", diff, diff), axis=1)
            labels[start : start + Xc.shape[0], first : first + chunk.shape[1]] = chunk
    for s in _sets_repeating(center_sets):  # the first occurrences alone
        labels[:, s] = nearest(X, center_sets[s])
    return labels


def label_sums(
    X: np.ndarray,
    labels: np.ndarray,
    k: int,
    weights: np.ndarray | None = None,
    chunk_rows: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(Weighted) per-group sums (k x d) and counts (k,) of the rows of ``X`` grouped by
    ``labels`` (values in ``[0, k)``). The sums are one indicator-matrix product per chunk
    (BLAS rather than a scatter), as in :func:`lloyd_statistics`."""
    X = np.asarray(X, dtype=np.float64)
    labels = np.asarray(labels, dtype=np.int64)
    weights = None if weights is None else np.asarray(weights, dtype=np.float64)
    sums = np.zeros((k, X.shape[1]))
    step = rows_per_chunk(X.shape[0], k, chunk_rows)
    for start in range(0, X.shape[0], step):
        lab = labels[start : start + step]
        indicator = np.zeros((k, lab.size))
        indicator[lab, np.arange(lab.size)] = 1.0 if weights is None else weights[start : start + step]
        sums += indicator @ X[start : start + step]
    return sums, np.bincount(labels, weights=weights, minlength=k).astype(np.float64)


def label_means(
    X: np.ndarray,
    labels: np.ndarray,
    previous: np.ndarray,
    weights: np.ndarray | None = None,
    chunk_rows: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(Weighted) means of the rows of ``X`` grouped by ``labels``: ``(centers, counts)``.
    A group with no mass keeps its row of ``previous``."""
    sums, counts = label_sums(X, labels, previous.shape[0], weights, chunk_rows)
    return LloydStatistics(sums, counts, 0.0).centers(previous), counts


def lloyd_until_stable(
    X: np.ndarray,
    centers: np.ndarray,
    max_iter: int,
    weights: np.ndarray | None = None,
    labels: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, float]:
    """Lloyd from ``centers`` until the assignment stops changing: ``(centers, labels, cost)``.

    The nearest-center assignment of ``centers`` first, its (weighted) means, then at most
    ``max_iter`` steps of reassignment and means (``max_iter=0``: the one round "group
    around the start, take the means"). ``labels`` may pass the first assignment when the
    caller has it. The returned centers are the means of the returned labels (an empty
    group keeps its previous center) and ``cost`` is Σ w·||x − c_label||² for them. Without
    weights, a step where few points moved updates the sums by the movers only.
    """
    X = np.asarray(X, dtype=np.float64)
    centers = np.asarray(centers, dtype=np.float64)
    origin = reference(centers)
    if origin is not None:  # far from the origin: the whole loop about the start's mean
        centers, labels, cost = lloyd_until_stable(X - origin, centers - origin, max_iter, weights, labels)
        return centers + origin, labels, cost
    w = None if weights is None else np.asarray(weights, dtype=np.float64)
    n = X.shape[0]
    k = centers.shape[0]
    if rows_per_chunk(n, k) >= n:
        # One chunk (a device's few hundred points, a server's summary): the same arithmetic
        # as nearest() / label_means() without their chunk loops and argument checks, which
        # are most of a step's cost at this size (bench/kfed_table.py times k-FED's device
        # step).
        rows = np.arange(n)
        indicator = np.empty((k, n))
        minus_two_centers_t = np.empty((X.shape[1], k))
        largest = max(float(X.max()), -float(X.min())) * np.sqrt(X.shape[1]) if n else 0.0  # bounds a row's norm

        def assign(c: np.ndarray) -> np.ndarray:
            np.multiply(c.T, -2.0, out=minus_two_centers_t)  # _nearest_form, in place
            block = X @ minus_two_centers_t
            block += np.einsum("ij,ij->i", c, c)
            labels = block.argmin(axis=1)
            settle = settling(c)
            if settle is not None and 2.0 * form_rounding(X.shape[1], largest, settle[2]) > RESOLUTION * settle[1]:
                labels = _settle(X, block, labels, settle)
            first = repeated(c)
            return labels if first is None else first[labels]  # a repeated center's rows: its first occurrence's

        def means(lab: np.ndarray, previous: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            indicator.fill(0.0)
            indicator[lab, rows] = 1.0 if w is None else w
            counts = np.bincount(lab, weights=w, minlength=k).astype(np.float64)
            sums = indicator @ X
            if counts.all():
                return sums / counts[:, None], counts
            return LloydStatistics(sums, counts, 0.0).centers(previous), counts
    else:

        def assign(c: np.ndarray) -> np.ndarray:
            return nearest(X, c)

        def means(lab: np.ndarray, previous: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            return label_means(X, lab, previous, w)

    if labels is None:
        labels = assign(centers)
    centers, counts = means(labels, centers)
    sums = centers * counts[:, None]  # exact zero rows for empty clusters
    incremental = False
    for _ in range(max_iter):
        new_labels = assign(centers)
        moved = (new_labels != labels).nonzero()[0]
        if moved.size == 0:
            break
        if w is None and 4 * moved.size < n:
            # Few points moved: update the sums by the movers only (one small product).
            new_moved, old_moved = new_labels[moved], labels[moved]
            cols = np.arange(moved.size)
            delta = np.zeros((k, moved.size))
            delta[new_moved, cols] = 1.0  # a mover's old and new labels differ
            delta[old_moved, cols] = -1.0
            sums += delta @ X[moved]
            counts += np.bincount(new_moved, minlength=k) - np.bincount(old_moved, minlength=k)
            labels = new_labels
            if counts.min() > 0:
                centers = sums / counts[:, None]
            else:
                centers = centers.copy()
                nonempty = counts > 0
                centers[nonempty] = sums[nonempty] / counts[nonempty, None]
                sums[~nonempty] = 0.0
            incremental = True
        else:
            labels = new_labels
            centers, counts = means(labels, centers)
            sums = centers * counts[:, None]
            incremental = False
    if incremental:  # exact means of the final assignment (no rounding drift)
        centers, _ = means(labels, centers)
    cost = 0.0
    step = max(16, SMALL_FLOATS // max(X.shape[1], 1))  # the (rows x d) differences stay small
    for start in range(0, n, step):
        diff = X[start : start + step] - centers[labels[start : start + step]]
        row_cost = np.einsum("ij,ij->i", diff, diff)
        cost += float(row_cost.sum() if w is None else row_cost @ w[start : start + step])
    return centers, labels, cost


def lloyd_statistics(
    X: np.ndarray,
    centers: np.ndarray,
    weights: np.ndarray | None = None,
    *,
    with_scatter: bool = False,
    chunk_rows: int | None = None,
) -> LloydStatistics:
    """Assignment, per-cluster sums and counts, and cost of ``centers`` on ``X``.

    Parameters
    ----------
    X : (n, d) data.
    centers : (k, d) current centers.
    weights : optional (n,) non-negative point weights (default 1).
    with_scatter : also return the per-cluster scatter (sums of squared deviations from
        each cluster's mean, per coordinate).
    chunk_rows : rows per chunk (default: about 2^15 / max(k, d)).

    Far from the origin (:func:`reference`) every chunk is taken about the centers' mean
    before the products, so the statistics and the cost are those of the data about it:
    the same numbers, up to the rounding of the data's own coordinates, wherever the data
    lie. Ordinary data skip that subtraction. With the scatters the cost is taken from them
    and the clusters' means (:func:`_parallel_axis_cost`), without cancellation; without,
    from the expansion of the squared distances, and row by row where that cancels.
    """
    X = np.asarray(X, dtype=np.float64)
    centers = np.asarray(centers, dtype=np.float64)
    if X.ndim != 2 or centers.ndim != 2 or X.shape[1] != centers.shape[1]:
        raise ValueError(f"data of shape {X.shape} and centers of shape {centers.shape} do not match")
    n, d = X.shape
    k = centers.shape[0]
    kept = _first_occurrences(centers)
    if kept is not None:  # the first occurrences alone; a repeat gets no rows
        one = lloyd_statistics(X, centers[kept], weights, with_scatter=with_scatter, chunk_rows=chunk_rows)
        sums, counts = np.zeros((k, d)), np.zeros(k)
        sums[kept], counts[kept] = one.sums, one.counts
        scatter = None
        if one.scatter is not None:
            scatter = np.zeros((k, d))
            scatter[kept] = one.scatter
        return LloydStatistics(sums=sums, counts=counts, cost=one.cost, scatter=scatter)
    w_all = None if weights is None else np.asarray(weights, dtype=np.float64)
    origin = reference(centers)
    about = centers if origin is None else centers - origin
    counts = np.zeros(k)
    labelled = np.empty(n, dtype=np.int64) if with_scatter else None  # every row's cluster, for the scatter
    x_sq = 0.0  # sum of (weighted) ||x − origin||^2
    # The chunk holds both the distance block (k x rows) and the rows of X (rows x d):
    # sized by the wider one so that both stay in cache.
    step = rows_per_chunk(n, max(k, d), chunk_rows)
    minus_two_centers_t, c_sq = _nearest_form(about)
    sums_t = np.zeros((d, k))  # accumulated transposed: (d x rows) @ (rows x k) is the faster product
    membership = np.empty((k, min(step, n)))  # 1 where the center is the row's nearest, else 0
    ones = np.ones(membership.shape[1])
    scratch = None
    shifted = None if origin is None else np.empty((min(step, n), d))  # the chunk about the origin chosen
    settle_all = settling(about)
    by_labels = k > MEMBERSHIP_MAX_K and _counts_win(k, d)
    for start in range(0, n, step):
        Xc = X[start : start + step]
        rows = Xc.shape[0]
        if rows != membership.shape[1]:
            membership, ones, scratch = np.empty((k, rows)), np.ones(rows), None
        if shifted is not None:
            Xc = np.subtract(Xc, origin, out=shifted[:rows])
        if by_labels:  # many centers, few coordinates: a weighted count per coordinate, no membership matrix
            labels = _chunk_labels(Xc, minus_two_centers_t, c_sq, settle_all)
            w = None if w_all is None else w_all[start : start + step]
            counts += np.bincount(labels, w, minlength=k)
            sums_t += _group_sums(labels, w, 1, k, rows, d)(Xc[None])[0].T
            if labelled is not None:
                labelled[start : start + rows] = labels
            x_sq += float(np.vdot(Xc, Xc)) if w is None else float(np.einsum("ij,ij->i", Xc, Xc) @ w)
            continue
        settle = undecided(Xc, settle_all)
        row_counts, scratch = _membership_block(Xc, minus_two_centers_t, c_sq, membership, ones, scratch, settle)
        if labelled is not None:
            labelled[start : start + rows] = np.argmax(membership, axis=0)  # exactly one 1 per row (ties resolved)
        if w_all is None:
            counts += row_counts
            x_sq += float(np.vdot(Xc, Xc))
        else:
            w = w_all[start : start + step]
            membership *= w
            counts += membership @ ones
            x_sq += float(np.einsum("ij,ij->i", Xc, Xc) @ w)
        # Per-cluster sums as one matrix product: the (k x rows) membership matrix (holding
        # the weights) times the chunk -- BLAS instead of a scatter.
        sums_t += Xc.T @ membership.T
    sums = np.ascontiguousarray(sums_t.T)  # about the origin chosen
    scatter = None
    if labelled is None:
        # cost = sum_i w_i ||x_i - c_{l_i}||^2 = sum_i w_i ||x_i||^2 + sum_j (W_j ||c_j||^2 - 2 c_j . S_j),
        # all about the origin chosen: from the statistics, without a per-row distance. It
        # rounds relative to its terms; when they cancel to (nearly) nothing (points on their
        # centers) the cost is taken again from each row's own distance.
        cost = max(x_sq + float(counts @ c_sq) - 2.0 * float(np.vdot(about, sums)), 0.0)
        if cost <= CANCELLED * x_sq:
            cost = _exact_cost(X, about, origin, w_all, step, minus_two_centers_t, c_sq, settle_all)
    else:  # a second pass: the deviations from each cluster's mean, exactly
        means = LloydStatistics(sums, counts, 0.0).centers(about)
        if 0 < n <= step and not by_labels:  # one chunk: its rows (about the origin chosen) and membership at hand
            deviation = Xc - means[labelled]
            residual = membership @ deviation
            scatter = membership @ (deviation * deviation)
        else:
            scatter, residual = np.zeros((k, d)), np.zeros((k, d))
            for start in range(0, n, step):
                lab = labelled[start : start + step]
                Xc = X[start : start + step] if origin is None else X[start : start + step] - origin
                deviation = Xc - means[lab]
                indicator = np.zeros((k, lab.size))
                indicator[lab, np.arange(lab.size)] = 1.0 if w_all is None else w_all[start : start + step]
                residual += indicator @ deviation
                scatter += indicator @ (deviation * deviation)
        cost = float(_parallel_axis_cost(counts, means, about, scatter, residual))  # with scatters: no cancellation
    if origin is not None:
        sums += counts[:, None] * origin
    return LloydStatistics(sums=sums, counts=counts, cost=cost, scatter=scatter)


# :func:`lloyd_statistics_of_sets` takes every set in one pass while its largest temporary
# (rows x sets x centers, or rows x sets x d) holds at most this many floats (2^18 = 2 MiB):
# a device's few hundred or thousand points against the side-by-side sets of a round.
SETS_FLOATS = 1 << 18


def lloyd_statistics_of_sets(
    X: np.ndarray, center_sets: np.ndarray, weights: np.ndarray | None = None, *, with_scatter: bool = True
) -> tuple[np.ndarray, ...]:
    """:func:`lloyd_statistics` with scatters of every set of ``center_sets`` (m, k, d) on
    ``X`` (optionally weighted): ``(sums (m, k, d), counts (m, k), cost (m,), scatter (m, k, d))``.

    The same arithmetic for every set at once when the pass fits in :data:`SETS_FLOATS`:
    each set's rows about its own :func:`reference` (or the origin), one batched product
    for the distances, one grouped sum for the sums and one for the scatters
    (:func:`_group_sums`). The rows the BLAS form cannot decide within :data:`RESOLUTION`
    are settled set by set and chunk by chunk of rows as :func:`lloyd_statistics` settles
    them (:func:`_settle_sets`): the same statistics, up to the rounding of products taken
    in another shape. With scatters the cost is theirs (:func:`_parallel_axis_cost`), as
    :func:`lloyd_statistics` gives it; without, the scatters are zeros and a set whose cost
    the expansion cancels goes through :func:`lloyd_statistics` on its own, as does a set
    with a repeated center (:func:`repeated`). One set alone is :func:`lloyd_statistics`'s own."""
    X = np.asarray(X, dtype=np.float64)
    center_sets = np.asarray(center_sets, dtype=np.float64)
    if X.ndim != 2 or center_sets.ndim != 3 or X.shape[1] != center_sets.shape[2]:
        raise ValueError(f"data of shape {X.shape} and center sets of shape {center_sets.shape} do not match")
    n, d = X.shape
    m, k, _ = center_sets.shape
    w = None if weights is None else np.asarray(weights, dtype=np.float64)
    if m == 1 or not (n and k and n * m * max(k, d) <= SETS_FLOATS):
        empty = (np.zeros((m, k, d)), np.zeros((m, k)), np.zeros(m), np.zeros((m, k, d)))
        return _each_set(X, center_sets, w, np.arange(m), empty, with_scatter)
    origins = block_references(center_sets.reshape(m * k, d), np.arange(m) * k)[0]  # zero: about the origin
    about = center_sets - origins[:, None, :]
    rows = X[None, :, :] - origins[:, None, :]  # (m, n, d): every set's rows about its reference
    c_sq = np.einsum("skd,skd->sk", about, about)
    block = np.matmul(rows, np.ascontiguousarray(-2.0 * about.transpose(0, 2, 1)))  # (m, n, k): ||c||² − 2 x·c
    block += c_sq[:, None, :]
    labels = np.argmin(block, axis=2)  # (m, n); ties: the lowest index
    _settle_sets(rows, about, block, labels, c_sq)
    flat = (labels + (np.arange(m) * k)[:, None]).reshape(-1)
    weights = None if w is None else np.tile(w, m)
    counts = np.bincount(flat, weights, minlength=m * k).astype(np.float64).reshape(m, k)
    group_sums = _group_sums(flat, weights, m, k, n, d)
    sums = group_sums(rows)  # (m, k, d), about each set's reference
    scatter = np.zeros((m, k, d))
    if with_scatter:
        means = np.where(counts[..., None] > 0, sums / np.where(counts > 0, counts, 1.0)[..., None], about)
        deviation = rows - np.take_along_axis(means, labels[..., None], axis=1)
        residual = group_sums(deviation)
        deviation *= deviation
        scatter = group_sums(deviation)
        cost = _parallel_axis_cost(counts, means, about, scatter, residual)
        alone = np.empty(0, dtype=np.int64)
    else:
        x_sq = np.einsum("snd,snd->s", rows, rows) if w is None else np.einsum("snd,snd,n->s", rows, rows, w)
        cost = x_sq + np.einsum("sk,sk->s", counts, c_sq) - 2.0 * np.einsum("skd,skd->s", about, sums)
        np.maximum(cost, 0.0, out=cost)
        alone = np.flatnonzero(cost <= CANCELLED * x_sq)
    sums += counts[..., None] * origins[:, None, :]
    alone = np.union1d(alone, _sets_repeating(center_sets))  # a set with a repeated center: lloyd_statistics'
    return _each_set(X, center_sets, w, alone, (sums, counts, cost, scatter), with_scatter)


def _settle_sets(rows: np.ndarray, about: np.ndarray, block: np.ndarray, labels: np.ndarray, c_sq: np.ndarray):
    """Settle ``labels`` (m, n) in place where :func:`lloyd_statistics` would settle them set
    by set: in every set whose rows the BLAS form may not decide within :data:`RESOLUTION`,
    chunk by chunk of rows as it takes them (:func:`undecided` of each chunk), the rows whose
    smallest value of ``block`` the rounding cannot tell from another's (:func:`_settle`)."""
    m, n, d = rows.shape
    k = about.shape[1]
    apart = _separations(about)
    largest = np.maximum(rows.max(axis=(1, 2)), -rows.min(axis=(1, 2))) * np.sqrt(d)
    # A set no chunk of which is undecided is passed over; the margin of 2 covers the last
    # bits by which this separation may differ from :func:`separation`'s, which decides.
    maybe = (apart < np.inf) & (4.0 * form_rounding(d, largest, np.sqrt(np.max(c_sq, axis=1))) > RESOLUTION * apart)
    step = rows_per_chunk(n, max(k, d))
    for s in np.flatnonzero(maybe):
        settle = settling(about[s])
        for start in range(0, n, step):
            Xc = rows[s, start : start + step]
            chunk = undecided(Xc, settle)
            if chunk is not None:
                _settle(Xc, block[s, start : start + step], labels[s, start : start + step], chunk)


def _parallel_axis_cost(
    counts: np.ndarray, means: np.ndarray, centers: np.ndarray, scatter: np.ndarray, residual: np.ndarray
) -> np.ndarray:
    """Σ_j [Σ_d scatter_jd + n_j ||μ_j − c_j||² + 2 r_j·(μ_j − c_j)] over the last two axes:
    the cost of the centers from each cluster's (weighted) count, computed mean μ_j, scatter
    about it and residual r_j = Σ w (x − μ_j) (the parallel axis theorem about the computed
    mean, which the rounding of a mean far from the reference moves off the true one: without
    r_j a tight cluster far from the reference would lose digits). The first two terms are at
    least 0 and the last is of the size of the rounding; the identity a training reply's
    check holds the cost to."""
    moved = means - centers
    return (
        scatter.sum(axis=(-2, -1))
        + np.einsum("...k,...kd,...kd->...", counts, moved, moved)
        + 2.0 * np.einsum("...kd,...kd->...", residual, moved)
    )


def _counts_win(k: int, d: int) -> bool:
    """Whether per-cluster sums of ``d`` coordinates over ``k`` clusters are taken by a
    weighted count per coordinate (at most half as many coordinates as clusters: an
    indicator matrix would be mostly zeros) rather than by an indicator product."""
    return 2 * d <= k


def _group_sums(flat: np.ndarray, weights: np.ndarray | None, m: int, k: int, n: int, d: int):
    """Per (set, cluster) sums of (m, n, d) values by the flat labels ``flat`` (set s's
    clusters from s·k), optionally weighted: a function of the values. With at most half as
    many coordinates as clusters a weighted count per coordinate (the indicator matrix would
    be mostly zeros); else an indicator product (a (m, k, n) matrix holding the weights), the
    faster with few clusters."""

    def by_counts(values: np.ndarray) -> np.ndarray:
        out = np.empty((m * k, d))
        for j in range(d):
            column = values[..., j].reshape(-1)
            out[:, j] = np.bincount(flat, column if weights is None else column * weights, minlength=m * k)
        return out.reshape(m, k, d)

    def by_product(values: np.ndarray) -> np.ndarray:
        return np.matmul(membership, values)

    if _counts_win(k, d):
        return by_counts
    membership = np.zeros((m, k, n))
    membership.reshape(m * k, n)[flat, np.tile(np.arange(n), m)] = 1.0 if weights is None else weights
    return by_product


def block_references(points: np.ndarray, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`reference` of every block of ``points`` (blocks one after another, block b
    from row ``starts[b]``; none empty): ``(references (blocks, d), which blocks have one)``,
    zero rows where :func:`reference` gives None."""
    low = np.minimum.reduceat(points, starts, axis=0)
    high = np.maximum.reduceat(points, starts, axis=0)
    middle, width = low + high, high - low
    far = np.einsum("bd,bd->b", middle, middle) > 4.0 * np.einsum("bd,bd->b", width, width)
    references = np.zeros((starts.size, points.shape[1]))
    stops = np.append(starts[1:], points.shape[0])
    for b in np.flatnonzero(far):  # the mean as reference() takes it: the same origin to the last bit
        references[b] = points[starts[b] : stops[b]].mean(axis=0)
    return references, far


def _each_set(X, center_sets, weights, which, out, with_scatter):
    """``out`` (sums, counts, cost, scatter of every set) with the sets ``which`` taken by
    :func:`lloyd_statistics`, one at a time."""
    sums, counts, cost, scatter = out
    for s in which:
        one = lloyd_statistics(X, center_sets[s], weights, with_scatter=with_scatter)
        sums[s], counts[s], cost[s] = one.sums, one.counts, one.cost
        if with_scatter:
            scatter[s] = one.scatter
    return sums, counts, cost, scatter


def _separations(center_sets: np.ndarray) -> np.ndarray:
    """:func:`separation` of every set of ``center_sets`` (m, k, d): at once while the
    differences hold at most :data:`SETS_FLOATS` floats, else set by set."""
    m, k, d = center_sets.shape
    if k < 2:
        return np.full(m, np.inf)
    if m * k * k * d > SETS_FLOATS:
        return np.array([separation(c) for c in center_sets])
    diff = center_sets[:, :, None, :] - center_sets[:, None, :, :]
    gaps = np.einsum("sijd,sijd->sij", diff, diff)
    gaps[gaps == 0.0] = np.inf
    return gaps.min(axis=(1, 2))


# A cost below this share of the squared norms it is the difference of (about the origin
# chosen) has lost most of its digits to rounding: it is taken again row by row.
CANCELLED = 1e-6


def _exact_cost(X, about, origin, weights, step, minus_two_centers_t, c_sq, settle) -> float:
    """Σ w ||x − c_label||² by each row's own difference from its center (the labels as
    :func:`lloyd_statistics` finds them: the same products, the lowest index among ties,
    the rows the form cannot decide settled the same way)."""
    cost = 0.0
    for start in range(0, X.shape[0], step):
        Xc = X[start : start + step] if origin is None else X[start : start + step] - origin
        labels = _chunk_labels(Xc, minus_two_centers_t, c_sq, settle)
        deviation = Xc - about[labels]
        row_cost = np.einsum("ij,ij->i", deviation, deviation)
        cost += float(row_cost.sum() if weights is None else row_cost @ weights[start : start + step])
    return cost


def kmeans_cost(X: np.ndarray, centers: np.ndarray, weights: np.ndarray | None = None) -> float:
    """Sum of (weighted) squared distances of the rows of ``X`` to their nearest center."""
    if weights is None:
        return float(assign(X, centers)[1].sum())
    return float(assign(X, centers)[1] @ np.asarray(weights, dtype=np.float64))


def kmeans_plus_plus(
    X: np.ndarray,
    k: int,
    rng: np.random.Generator,
    weights: np.ndarray | None = None,
    n_local_trials: int | None = None,
    *,
    indices: bool = False,
) -> np.ndarray:
    """Greedy k-means++ seeding (Arthur & Vassilvitskii 2007, greedy variant as in sklearn):
    the ``k`` chosen points (a copy), or with ``indices=True`` their row indices, all different.

    Each new center is the best of ``2 + log(k)`` candidates drawn with probability
    proportional to weight x squared distance to the current centers (a chosen row is
    never drawn again; when every remaining row coincides with a chosen one, the
    candidates are drawn uniformly among the rows not chosen yet).
    """
    X = np.asarray(X, dtype=np.float64)
    n = X.shape[0]
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if n < k:
        raise ValueError(f"k-means++ needs at least k={k} points, got {n}")
    w = np.ones(n) if weights is None else np.asarray(weights, dtype=np.float64)
    if w.sum() <= 0:
        raise ValueError("k-means++ weights sum to zero")
    if n_local_trials is None:
        n_local_trials = 2 + int(np.log(k))
    points = X
    origin = reference(X)
    if origin is not None:  # far from the origin: every distance about the points' mean
        X = X - origin
    distances = _distances_to_rows(X)
    chosen = [int(rng.choice(n, p=w / w.sum()))]
    closest = distances(chosen)[:, 0]
    while len(chosen) < k:
        pot = closest * w
        pot[chosen] = 0.0
        if pot.sum() <= 0:  # every remaining point coincides with a center
            rest = np.setdiff1d(np.arange(n), chosen)
            cand = rng.choice(rest, size=min(n_local_trials, rest.size), replace=False)
        else:
            cum = np.cumsum(pot)
            cand = np.minimum(np.searchsorted(cum, rng.random(n_local_trials) * cum[-1]), n - 1)
        d_cand = distances(cand)  # (n, trials)
        np.minimum(d_cand, closest[:, None], out=d_cand)
        best = int(np.argmin(w @ d_cand))
        chosen.append(int(cand[best]))
        closest = d_cand[:, best]
    rows = np.asarray(chosen, dtype=np.int64)
    return rows if indices else points[rows].copy()


def _distances_to_rows(X: np.ndarray):
    """A function of row indices ``rows`` giving (n, rows) squared distances of every row of
    ``X`` to those rows by the BLAS form ``||x||² − 2 x·c + ||c||²`` (as
    :func:`squared_distances` with the rows' squared norms given), clipped at 0: one product
    of the points lifted by ``(x, ||x||², 1)`` with the rows lifted by ``(−2 c, 1, ||c||²)``,
    instead of a product and three passes over its block. The same terms, added in the same
    order where BLAS adds a product's terms in order; its rounding is the form's
    (:func:`form_rounding`) either way."""
    n, d = X.shape
    lifted = np.empty((n, d + 2))
    lifted[:, :d], lifted[:, d], lifted[:, d + 1] = X, np.einsum("ij,ij->i", X, X), 1.0

    def distances(rows) -> np.ndarray:
        form = np.empty((d + 2, len(rows)))
        form[:d], form[d], form[d + 1] = -2.0 * X[rows].T, 1.0, lifted[rows, d]
        block = lifted @ form
        return np.maximum(block, 0.0, out=block)

    return distances


def lloyd(
    X: np.ndarray,
    centers: np.ndarray,
    weights: np.ndarray | None = None,
    *,
    max_iter: int = 300,
    tol: float = 1e-6,
) -> tuple[np.ndarray, float, int]:
    """Weighted Lloyd iterations from ``centers`` until the centers move less than ``tol``
    (relative to the data's mean squared distance from their mean, as scikit-learn's tol
    is relative to their variance: the same iterations wherever the data lie) or the
    assignment is stable.

    Empty clusters keep their center. Returns ``(centers, cost, iterations)``.
    """
    out, costs, iterations = lloyd_of_sets(
        X, np.asarray(centers, dtype=np.float64)[None], weights, max_iter=max_iter, tol=tol
    )
    return out[0], float(costs[0]), int(iterations[0])


def lloyd_of_sets(
    X: np.ndarray, center_sets: np.ndarray, weights: np.ndarray | None = None, *, max_iter: int = 300, tol: float = 1e-6
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`lloyd` from every set of ``center_sets`` (m, k, d), the sets still moving
    stepped together (:func:`lloyd_statistics_of_sets`), each stopped as :func:`lloyd`
    stops it: ``(centers (m, k, d), costs (m,) by :func:`kmeans_cost`, iterations (m,))``."""
    X = np.asarray(X, dtype=np.float64)
    centers = np.array(center_sets, dtype=np.float64, copy=True)
    scale = float(np.sum(np.var(X, axis=0))) if X.size else 1.0
    threshold = tol * max(scale, 1e-300)
    moving = np.arange(centers.shape[0])
    iterations = np.zeros(centers.shape[0], dtype=np.int64)
    for it in range(1, max_iter + 1):
        if not moving.size:
            break
        sums, counts = lloyd_statistics_of_sets(X, centers[moving], weights, with_scatter=False)[:2]
        new = np.where(counts[..., None] > 0, sums / np.where(counts > 0, counts, 1.0)[..., None], centers[moving])
        shift = np.sum((new - centers[moving]) ** 2, axis=(1, 2))
        centers[moving] = new
        iterations[moving] = it
        moving = moving[shift > threshold]
    return centers, np.array([kmeans_cost(X, c, weights) for c in centers]), iterations


def kmeans(
    X: np.ndarray,
    k: int,
    rng: np.random.Generator,
    weights: np.ndarray | None = None,
    *,
    n_init: int = 10,
    max_iter: int = 300,
    tol: float = 1e-6,
) -> tuple[np.ndarray, float]:
    """Weighted k-means: ``n_init`` k-means++ starts, each refined by Lloyd; the best wins.

    NumPy only (the server uses it on summaries, devices on their own data).
    Returns ``(centers, cost)``.
    """
    X = np.asarray(X, dtype=np.float64)
    best_centers, best_cost = None, np.inf
    for _ in range(max(1, n_init)):
        init = kmeans_plus_plus(X, k, rng, weights)
        centers, cost, _ = lloyd(X, init, weights, max_iter=max_iter, tol=tol)
        if cost < best_cost:
            best_centers, best_cost = centers, cost
    return best_centers, float(best_cost)
