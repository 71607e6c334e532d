"""What a device has declared binds its later replies (server side, NumPy only).

A device's first valid reply in a run fixes its number of points ``n``; its data summary
(task ``data_summary``) fixes its bounding box ``[low, high]``. Every later reply is
checked against them, with the roles the protocol table gives its arrays
(:class:`fedcluster.protocol.ArrayField` ``role``):

- ``num-examples`` must equal ``n``; per-cluster ``count`` arrays must add up to ``n``
  (``Task.counts = "all"``) or to at most ``n`` (``"at-most"``: suppressed or filtered);
- a per-cluster ``sum`` lies within what its count of points inside the box can produce,
  ``count·low <= sum <= count·high``; a ``scatter`` (squared deviations from the cluster's
  mean) within ``count·width²/4`` per coordinate (no points in an interval spread more);
- a ``mean`` (a center computed from the device's points) lies inside the box, or inside
  the box widened by the centers it was sent (``of``: ClientKMeans moves a received center
  towards its points, never beyond them);
- a ``cost`` of given centers lies within ``n`` times the largest squared distance from the
  box to the nearest center, and, with sums and counts, above ``Σ count·||mean − c||²``
  (Jensen: no cluster scatters less than its mean's distance says).

A data summary with ``moments`` also fixes the device's per-feature sum ``S`` (mean ``m``)
and scatter ``V`` about that mean (:func:`moments_violation`): later per-cluster statistics
over all its points must add up to them (sums to ``S``; scatters, by the parallel axis
theorem, ``Σ_j V_j + Σ_j n_j (μ_j − m)² = V``; counts times means to ``S``), and a cost they
determine must be that one: the cost of centers ``c`` is
``ΣV + Σ_j n_j (||μ_j − c_j||² − ||μ_j − m||²)``, a local k-means cost ``ΣV − Σ_j n_j ||μ_j − m||²``.
Statistics of given centers by nearest-center assignment put each cluster's mean in its
center's Voronoi cell (:func:`voronoi_violation`): the cell is convex.

Every check is of differences between nearby points (a mean and a center, a mean and the
device's mean), so it is the same check wherever the data lie; its slack is relative to
the data's spread (the box's width, the scatter) plus what rounding the coordinates' own
size causes (:func:`coordinate_rounding`: far from the origin a coordinate is known only to
a few units in its last place), never relative to the squares of the coordinates.

What a device can still do inside these bounds: declare a false ``n``, box or moments in
its first replies (behave as a device holding other data), and report any statistic that
some set of ``n`` points with those moments in its box could produce: it can shift points
between clusters while the totals stay. Robust aggregation (``aggregation``) is what
limits the effect of that on the result.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from fedcluster.lloyd import largest_magnitudes
from fedcluster.protocol import NUM_EXAMPLES, Task

# Relative slack for rounding, on the data's spread (sums of up to millions of float64 values).
RELATIVE_SLACK = 1e-8
# Relative slack of the moments checks, on the scatters and costs they compare.
MOMENT_SLACK = 1e-8
# Units in the last place a coordinate (and a mean or a difference of coordinates) may be off
# by rounding alone, at the size of the data's coordinates: what the data's offset from the
# origin costs in precision (a point at 1e9 is known to about 1e-7).
OFFSET_ULPS = 64
_EPS = float(np.finfo(np.float64).eps)


@dataclass
class Declared:
    """What one device declared: its points ``n`` and, once it sent a data summary, its
    bounding box."""

    points: float
    low: np.ndarray | None = None
    high: np.ndarray | None = None
    scaled: bool = False  # the box is in a standardized run's units (fedcluster.scaling)
    moment_sum: np.ndarray | None = None  # S, per feature (a data summary with moments)
    moment_scatter: np.ndarray | None = None  # V, per feature: Σ (x − S/n)²
    rounding: np.ndarray | None = None  # per feature, how far a coordinate may be off by rounding alone

    @property
    def moment_mean(self) -> np.ndarray | None:
        return None if self.moment_sum is None else self.moment_sum / max(self.points, 1.0)

    def coordinate_rounding(self) -> np.ndarray:
        """:attr:`rounding`, or from the box when unset."""
        if self.rounding is not None:
            return self.rounding
        return coordinate_rounding(self.low, self.high)


def coordinate_rounding(*arrays: np.ndarray | None) -> np.ndarray:
    """Per coordinate, how far a coordinate of the size of ``arrays`` (points, boxes,
    centers: the last axis is the coordinate) may be off by rounding alone, a mean or a
    difference of such coordinates included: ``OFFSET_ULPS`` units in the last place of the
    largest of them."""
    largest = None
    for a in arrays:
        if a is None or not np.size(a):
            continue
        a = np.asarray(a, dtype=np.float64)
        size = largest_magnitudes(a.reshape(-1, a.shape[-1])) if a.ndim > 1 else np.abs(a)
        largest = size if largest is None else np.maximum(largest, size)
    return OFFSET_ULPS * _EPS * largest if largest is not None else np.zeros(1)


def deviation_rounding(points: float, total, rounding: np.ndarray | float):
    """How far a sum of ``points`` squared distances whose total is ``total`` (a number, or
    one per center set) may be off when every coordinate difference is off by at most
    ``rounding`` (per coordinate, or one number; or (sets, d), one row per set):
    Σ ||a_i + e_i||² − ||a_i||² ≤ 2 ||e|| Σ ||a_i|| + n ||e||² ≤ 2 ||e|| √(n · total) + n ||e||²."""
    e = np.sqrt(np.sum(np.square(np.atleast_1d(rounding)), axis=-1))  # one per row of a (sets, d) rounding
    return 2.0 * e * math.sqrt(max(float(points), 0.0)) * np.sqrt(np.maximum(total, 0.0)) + float(points) * e * e


def expansion_rounding(counts: np.ndarray, means: np.ndarray, centers: np.ndarray) -> float:
    """How far ``Σ_p counts_p min_i ||means_p − centers_i||²`` may be off when the squared
    distances come from the BLAS form about the centers' reference r
    (:func:`fedcluster.lloyd.squared_distances`): each rounds relative to
    ``||μ − r||² + ||c − r||²``, not to the distance (far from the origin r is the centers'
    mean, so this is the data's spread, never the offset's square). All of ``centers`` as
    one set: :func:`expansion_roundings` of it."""
    centers = np.asarray(centers, dtype=np.float64)
    if not centers.size:
        return 0.0
    return float(expansion_roundings(counts, means, centers.reshape(1, -1, centers.shape[-1]))[0])


def expansion_roundings(counts: np.ndarray, means: np.ndarray, center_sets: np.ndarray) -> np.ndarray:
    """:func:`expansion_rounding` of each set of ``center_sets`` (m, k, d; none empty), each
    about its own reference (:func:`fedcluster.lloyd.block_references`: the same as
    :func:`fedcluster.lloyd.reference`'s, to the bit)."""
    from .lloyd import block_references

    m, k, d = center_sets.shape
    origins = block_references(center_sets.reshape(m * k, d), np.arange(m) * k)[0]
    counts = np.asarray(counts, dtype=np.float64)
    spread = np.sum(counts * np.sum((np.asarray(means)[None] - origins[:, None, :]) ** 2, axis=-1), axis=-1)
    reach = np.max(np.sum((center_sets - origins[:, None, :]) ** 2, axis=2), axis=1)
    return (d + OFFSET_ULPS) * _EPS * (spread + float(np.sum(counts)) * reach)


def declaration(task: Task, arrays: Mapping[str, np.ndarray], metrics: Mapping[str, Any]) -> Declared | None:
    """What a device's first valid reply declares (None if it carries no point count)."""
    if NUM_EXAMPLES not in metrics:
        return None
    declared = Declared(float(metrics[NUM_EXAMPLES]))
    boxed = {f.role: arrays[f.name] for f in task.reply if f.role in ("box-min", "box-max") and f.name in arrays}
    if len(boxed) == 2:
        declared.low, declared.high = np.asarray(boxed["box-min"], float), np.asarray(boxed["box-max"], float)
        declared.rounding = coordinate_rounding(declared.low, declared.high)
        moments = {
            f.role: arrays[f.name]
            for f in task.reply
            if f.role in ("moment-sum", "moment-scatter") and f.name in arrays
        }
        if len(moments) == 2:
            declared.moment_sum = np.asarray(moments["moment-sum"], float)
            declared.moment_scatter = np.asarray(moments["moment-scatter"], float)
    return declared


def sums_rounding(
    counts: np.ndarray, declared: Declared, asked: Sequence[np.ndarray] = (), terms: float | None = None
) -> np.ndarray:
    """Per cluster and coordinate (or per coordinate for a total), how far a sum of
    ``counts`` of a device's points may be off: relative to the box's width, plus each
    point's coordinate rounding, which a sum of n of them accumulates like √n (a device that
    adds its points about the origin, its centers near it and its own box far from it). A
    sum taken about the reference of the centers ``asked`` rounds relative to their size
    too (a feature constant on the device has a box of width 0). ``terms``: how many points
    each sum adds when that is not its count (soft weights: every point of the device)."""
    counts = np.asarray(counts, dtype=np.float64)[..., None]
    delta = np.maximum(declared.coordinate_rounding(), coordinate_rounding(*asked))
    rounding = counts * np.maximum(1.0, np.sqrt(counts if terms is None else terms)) * delta
    return RELATIVE_SLACK * counts * (declared.high - declared.low) + rounding + 1e-300


def scatter_rounding(declared: Declared, about: Sequence[np.ndarray] = ()) -> np.ndarray:
    """Per feature, how far a scatter over all of a device's points may differ from the
    declared one by rounding alone (the points added in another order, about other means:
    the reference of the centers ``about``, whose size the coordinates' rounding then has)."""
    scatter = np.maximum(declared.moment_scatter, 0.0)
    n = max(float(declared.points), 1.0)
    e = np.abs(np.maximum(declared.coordinate_rounding(), coordinate_rounding(*about)))
    return (
        MOMENT_SLACK * scatter + 2.0 * e * math.sqrt(n) * np.sqrt(scatter) + n * e * e
    )  # deviation_rounding, per feature


def moments_violation(
    sums: np.ndarray,
    scatter: np.ndarray | None,
    declared: Declared,
    what: str = "its per-cluster statistics",
    counts: np.ndarray | None = None,
    about: Sequence[np.ndarray] = (),
) -> str | None:
    """Per-cluster sums (k, d) (and scatters about each cluster's mean, with ``counts``) over
    ALL of a device's points that do not add up to the moments it declared (None when they
    do, up to rounding, or when it declared none): the sums to its sum, the scatters with
    the clusters' spread about its mean (parallel axis) to its scatter. ``about``: the
    centers the statistics were taken about (their size is part of the rounding)."""
    if declared.moment_sum is None:
        return None
    gap = np.abs(np.sum(sums, axis=0) - declared.moment_sum)
    if np.any(gap > sums_rounding(np.array(max(declared.points, 1.0)), declared, about)):
        return f"{what} add up to another sum of its points than the one its data summary declared"
    if scatter is None or counts is None:
        return None
    seen = counts > 0
    between = counts[seen, None] * (sums[seen] / counts[seen, None] - declared.moment_mean) ** 2
    pooled = np.sum(scatter[seen], axis=0) + np.sum(between, axis=0)
    slack = scatter_rounding(declared, about) + MOMENT_SLACK * pooled
    if np.any(np.abs(pooled - declared.moment_scatter) > slack + 1e-300):
        return f"{what} add up to another scatter of its points than the one its data summary declared"
    return None


def voronoi_violation(
    means: np.ndarray, counts: np.ndarray, centers: np.ndarray, ratio: float = 1.0, scatter: float = 0.0
) -> str | None:
    """Statistics of a nearest-center assignment: the points of center j lie in its Voronoi
    cell, which is convex, so their mean does too; a cluster whose mean lies nearer another
    center was not assigned by distance (None when every one is, up to rounding).

    ``ratio`` ρ > 1: each point's center is only within ρ × its distance to any other
    (DA-UFL's perturbed labels). Summed over a group of n_g points with mean μ and scatter
    V ≤ ``scatter`` (the device's whole scatter): ||μ − c_own||² ≤ ρ² ||μ − c_j||² + (ρ² − 1) V / n_g."""
    seen = np.flatnonzero(counts > 0)
    if seen.size == 0 or centers.shape[0] < 2:
        return None
    mu = means[seen]
    gaps = ((mu[:, None, :] - centers[None, :, :]) ** 2).sum(axis=2)  # (seen, k)
    own = gaps[np.arange(seen.size), seen]
    allowed = ratio**2 * gaps + (ratio**2 - 1.0) * scatter / counts[seen][:, None]
    # rounding: relative to the distances compared, and each coordinate's own (a mean and a
    # center far from the origin are known to a few units in their last place)
    e = float(np.sqrt(np.sum(np.square(coordinate_rounding(mu, centers)))))
    rounding = 2.0 * e * (np.sqrt(own)[:, None] + ratio**2 * np.sqrt(gaps)) + (1.0 + ratio**2) * e * e
    nearer = allowed + RELATIVE_SLACK * (gaps + own[:, None] + allowed) + rounding + 1e-300 < own[:, None]
    if np.any(nearer):
        row = int(np.flatnonzero(nearer.any(axis=1))[0])
        return (
            f"the mean of the points it assigned to center {int(seen[row])} lies nearer center "
            f"{int(np.argmax(nearer[row]))}: not a nearest-center assignment"
        )
    return None


def declared_scatter(declared: Declared) -> float | None:
    """Σ ||x − mean||² over the device's points, from its declared moments (None without)."""
    if declared.moment_sum is None:
        return None
    return max(float(np.sum(declared.moment_scatter)), 0.0)


def implied_cost_violation(cost: float, implied: float, slack: float) -> str | None:
    """A cost that the declared moments and the reply's own statistics fix (``implied``, up
    to ``slack``) but that is another number."""
    if abs(cost - implied) > slack + 1e-300:
        return f"its cost {cost:.10g} is not the one its statistics and declared moments imply ({implied:.10g})"
    return None


def box_violation(task: Task, arrays: Mapping[str, np.ndarray]) -> str | None:
    """A data summary whose minimum lies above its maximum."""
    low = [arrays[f.name] for f in task.reply if f.role == "box-min" and f.name in arrays]
    high = [arrays[f.name] for f in task.reply if f.role == "box-max" and f.name in arrays]
    if low and high and np.any(low[0] > high[0]):
        return "its bounding box has a minimum above its maximum"
    return None


def violation(
    task: Task,
    arrays: Mapping[str, np.ndarray],
    metrics: Mapping[str, Any],
    request: Mapping[str, np.ndarray],
    declared: Declared,
    config: Mapping[str, Any] | None = None,
) -> str | None:
    """The reason a reply breaks what its device declared, or None. A reply for several
    center sets at once (a leading set axis ``m`` on its arrays) is checked set by set."""
    n = declared.points
    if NUM_EXAMPLES in metrics and abs(float(metrics[NUM_EXAMPLES]) - n) > 0.5:
        return (
            f"num-examples {metrics[NUM_EXAMPLES]} differs from the {n:g} points the node declared in its first reply"
        )
    fields = {f.role: f for f in task.reply if f.role and f.name in arrays and _active(f, config)}
    sets = [f for f in fields.values() if f.shape[:1] == ("m",) and f.role != "cost"]
    if sets:
        if "sum" not in fields and _every_set_passes(fields, task.counts, arrays, request, declared):
            return None
        for index in range(arrays[sets[0].name].shape[0]):  # which set, and why
            part = {name: value[index] for name, value in arrays.items()}
            part.update({f.name: arrays[f.name][index : index + 1] for f in fields.values() if f.role == "cost"})
            asked = {name: (value[index] if value.ndim == 3 else value) for name, value in request.items()}
            reason = _violation(fields, task.counts, part, asked, declared)
            if reason:
                return f"set {index}: {reason}" if len(arrays[sets[0].name]) > 1 else reason
        return None
    return _violation(fields, task.counts, arrays, request, declared)


def _every_set_passes(
    fields: dict,
    task_counts: str,
    arrays: Mapping[str, np.ndarray],
    request: Mapping[str, np.ndarray],
    declared: Declared,
) -> bool:
    """The checks of :func:`_violation` on every center set at once (arrays with a leading
    set axis ``m``; per-cluster checks hold row by row, so the sets' rows are checked
    together, the coordinates' rounding taken over every set's): True when all pass."""
    counts = arrays[fields["count"].name] if "count" in fields else None
    if counts is not None and _counts_violation(counts, task_counts, declared.points):
        return False
    if declared.low is None:
        return True
    d = declared.low.shape
    rows = {
        f.name: arrays[f.name].reshape(-1, *arrays[f.name].shape[2:])
        for f in fields.values()
        if f.role != "cost" and f.shape[:1] == ("m",)
    }
    flat = {
        role: f for role, f in fields.items() if f.name in rows and (role == "count" or rows[f.name].shape[-1:] == d)
    }
    asked = {
        name: (value.reshape(-1, value.shape[-1]) if value.ndim == 3 else value) for name, value in request.items()
    }
    row_counts = rows[fields["count"].name] if "count" in flat else None
    for check in (_scatter_too_wide, _means_outside):
        if check(flat, rows, asked, row_counts, declared, task_counts):
            return False
    costed = {
        role: f for role, f in fields.items() if role == "cost" and request.get(f.of, np.zeros(0)).shape[-1:] == d
    }
    return not _cost_violation(costed, arrays, request, None, declared, task_counts)


def _violation(
    fields: dict,
    task_counts: str,
    arrays: Mapping[str, np.ndarray],
    request: Mapping[str, np.ndarray],
    declared: Declared,
) -> str | None:
    counts = arrays[fields["count"].name] if "count" in fields else None
    reason = _counts_violation(counts, task_counts, declared.points)
    if reason or declared.low is None:
        return reason
    # Only arrays in the box's own space are bound by it (not, e.g., projected ones).
    low = declared.low
    fields = {
        role: f
        for role, f in fields.items()
        if role == "count"
        or arrays[f.name].shape[-1:] == low.shape
        or (role == "cost" and request.get(f.of, np.zeros(0)).shape[-1:] == low.shape)
    }
    for check in (_sums_outside, _scatter_too_wide, _means_outside, _cost_violation, _cell_violation):
        reason = check(fields, arrays, request, counts, declared, task_counts)
        if reason:
            return reason
    if declared.moment_sum is not None and counts is not None and task_counts == "all":
        return _moments(fields, arrays, request, counts, declared)
    return None


def _asked(request: Mapping[str, np.ndarray], declared: Declared) -> list[np.ndarray]:
    """The request's arrays in the box's space (the centers a statistic was taken about)."""
    return [a for a in request.values() if np.shape(a)[-1:] == declared.low.shape]


def _counts_violation(counts: np.ndarray | None, task_counts: str, n: float) -> str | None:
    """Counts over all (``"all"``) or some (``"at-most"``) of the declared points; ``counts``
    (k,), or (m, k) for m center sets at once (the message gives the first bad set's total).
    Summed in floating point (integer counts cannot wrap around); a total that is not a
    number breaks the rule."""
    if counts is None or not task_counts:
        return None
    totals = np.sum(counts, axis=-1, dtype=np.float64)
    slack = RELATIVE_SLACK * max(n, 1.0)
    for rule, bad, says in (
        ("all", ~(np.abs(totals - n) <= slack), "not to"),
        ("at-most", ~(totals <= n + slack), "more than"),
    ):
        if task_counts == rule and np.any(bad):
            total = float(totals[np.argmax(bad)] if np.ndim(bad) else totals)
            return f"its counts add up to {total:g}, {says} the {n:g} points it declared"
    return None


def _sums_outside(fields, arrays, request, counts, declared, task_counts) -> str | None:
    """Per-cluster sums no count of points inside the box can add up to."""
    if "sum" not in fields or counts is None:
        return None
    sums = arrays[fields["sum"].name]
    slack = sums_rounding(counts, declared, _asked(request, declared))
    outside = (sums < counts[:, None] * declared.low - slack) | (sums > counts[:, None] * declared.high + slack)
    if not np.any(outside):
        return None
    row = int(np.flatnonzero(outside.any(axis=1))[0])
    return (
        f"array {fields['sum'].name!r} row {row} lies outside what {counts[row]:g} points inside "
        f"the node's declared bounding box can add up to"
    )


def _scatter_too_wide(fields, arrays, request, counts, declared, task_counts) -> str | None:
    """Scatter wider than points inside the box can spread (Popoviciu)."""
    if "scatter" not in fields or counts is None:
        return None
    scatter = arrays[fields["scatter"].name]
    top = counts[:, None] * (declared.high - declared.low) ** 2 / 4.0
    # Taken about the centers' reference, a scatter rounds relative to the centers' size too
    # (a feature constant on the device has a box of width 0, its scatter is that rounding).
    delta = np.maximum(declared.coordinate_rounding(), coordinate_rounding(*_asked(request, declared)))
    slack = RELATIVE_SLACK * top + 2.0 * delta * np.sqrt(counts[:, None] * top) + counts[:, None] * delta**2
    over = scatter > top + slack + 1e-300
    if not np.any(over):
        return None
    row = int(np.flatnonzero(over.any(axis=1))[0])
    return (
        f"array {fields['scatter'].name!r} row {row} spreads more than {counts[row]:g} points inside the declared box "
        "can"
    )


def _means_outside(fields, arrays, request, counts, declared, task_counts) -> str | None:
    """Means outside the box (widened to the request's array they move from, if any)."""
    if "mean" not in fields:
        return None
    means = arrays[fields["mean"].name]
    lo, hi = declared.low, declared.high
    source = fields["mean"].of
    if source and source in request:
        lo, hi = np.minimum(lo, request[source]), np.maximum(hi, request[source])
    slack = RELATIVE_SLACK * (hi - lo) + coordinate_rounding(lo, hi) + 1e-300
    rows = np.ones(means.shape[0], dtype=bool) if counts is None else counts > 0
    outside = ((means < lo - slack) | (means > hi + slack)).any(axis=1) & rows
    if not np.any(outside):
        return None
    return (
        f"array {fields['mean'].name!r} row {int(np.flatnonzero(outside)[0])} lies outside the node's declared "
        "bounding box"
    )


def _cost_violation(fields, arrays, request, counts, declared, task_counts) -> str | None:
    """A cost above what the declared points inside the box can cost with the request's
    centers, or below what its own sums and counts imply."""
    if "cost" not in fields or fields["cost"].of not in request:
        return None
    n, low, high = declared.points, declared.low, declared.high
    costs = np.atleast_1d(arrays[fields["cost"].name])
    centers = request[fields["cost"].of]
    sets = centers[None] if centers.ndim == 2 else centers
    far = np.maximum((low - sets) ** 2, (high - sets) ** 2).sum(axis=2).min(axis=1)  # per center set
    delta = coordinate_rounding(low, high, sets)
    slack = RELATIVE_SLACK * n * far + deviation_rounding(n, n * far, delta) + 1e-300
    above = costs > n * far + slack
    if np.any(above):
        index = int(np.flatnonzero(above)[0])
        return (
            f"array {fields['cost'].name!r} entry {index} ({costs[index]:g}) is more than {n:g} points inside the "
            f"declared bounding box can cost ({n * far[index]:g})"
        )
    if "sum" not in fields or counts is None or centers.ndim != 2:
        return None
    used = counts > 0
    means = arrays[fields["sum"].name][used] / counts[used, None]
    floor = float(np.sum(counts[used] * np.sum((means - centers[used]) ** 2, axis=1)))
    rounding = deviation_rounding(float(np.sum(counts[used])), floor, coordinate_rounding(low, high, centers))
    if costs[0] < floor * (1 - RELATIVE_SLACK) - rounding - 1e-300:
        return (
            f"array {fields['cost'].name!r} ({costs[0]:g}) is below what its own sums and counts imply "
            f"({floor:g}): the cost was under-reported"
        )
    return None


def _cell_violation(fields, arrays, request, counts, declared, task_counts) -> str | None:
    """Statistics of a nearest-center assignment of all points: each mean in its center's cell."""
    if "sum" not in fields or counts is None or task_counts != "all" or "cost" not in fields:
        return None
    centers = request.get(fields["cost"].of) if fields["cost"].of else None
    sums = arrays[fields["sum"].name]
    if centers is None or centers.shape != sums.shape:
        return None
    return voronoi_violation(sums / np.maximum(counts, 1e-300)[:, None], counts, centers)


def _moments(
    fields: dict,
    arrays: Mapping[str, np.ndarray],
    request: Mapping[str, np.ndarray],
    counts: np.ndarray,
    declared: Declared,
) -> str | None:
    """Statistics over all of a device's points against its declared moments: sums (or
    counts × means of its own points) and scatters add up to them; the cost of given
    centers (with sums) or of its own means is the one they fix."""
    if declared.moment_sum.shape != declared.low.shape:
        return None
    sums = arrays[fields["sum"].name] if "sum" in fields else None
    means = arrays[fields["mean"].name] if "mean" in fields and not fields["mean"].of else None
    if sums is None and means is not None:
        sums = counts[:, None] * means
    if sums is None:
        return None
    scatter = arrays[fields["scatter"].name] if "scatter" in fields else None
    reason = moments_violation(sums, scatter, declared, counts=counts, about=_asked(request, declared))
    if reason or "cost" not in fields:
        return reason
    cost = float(np.atleast_1d(arrays[fields["cost"].name])[0])
    centers = request.get(fields["cost"].of) if fields["cost"].of else None
    seen = counts > 0
    mu = sums[seen] / counts[seen, None]
    away = float(np.sum(counts[seen] * np.sum((mu - declared.moment_mean) ** 2, axis=1)))  # Σ n_j ||μ_j − m||²
    if centers is not None and centers.ndim == 2 and "sum" in fields and centers.shape == sums.shape:
        to_centers = float(np.sum(counts[seen] * np.sum((mu - centers[seen]) ** 2, axis=1)))
    elif not fields["cost"].of and means is not None:
        to_centers = 0.0
    else:
        return None
    total = float(np.sum(declared.moment_scatter))
    implied = total + to_centers - away
    delta = coordinate_rounding(declared.low, declared.high, centers)
    slack = (
        float(np.sum(scatter_rounding(declared, _asked(request, declared))))
        + MOMENT_SLACK * (total + to_centers + away)
        + deviation_rounding(declared.points, to_centers + away, delta)
    )
    return implied_cost_violation(cost, implied, slack)


def _active(field, config: Mapping[str, Any] | None) -> bool:
    return field.when is None or (config or {}).get(field.when[0]) == field.when[1]
