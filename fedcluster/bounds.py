"""What a device has declared binds its later replies (server side, NumPy only).

A device's first valid reply in a run fixes its number of points ``n``; its data summary
(task ``data_summary``) fixes its bounding box ``[low, high]``. Every later reply is
checked against them, with the roles the protocol table gives its arrays
(:class:`fedcluster.protocol.ArrayField` ``role``):

- ``num-examples`` must equal ``n``; per-cluster ``count`` arrays must add up to ``n``
  (``Task.counts = "all"``) or to at most ``n`` (``"at-most"``: suppressed or filtered);
- a per-cluster ``sum`` lies within what its count of points inside the box can produce,
  ``count·low <= sum <= count·high``; a ``sumsq`` within ``[sum²/count, count·max(low², high²)]``;
- a ``mean`` (a center computed from the device's points) lies inside the box, or inside
  the box widened by the centers it was sent (``of``: ClientKMeans moves a received center
  towards its points, never beyond them);
- a ``cost`` of given centers lies within ``n`` times the largest squared distance from the
  box to the nearest center, and, with sums and counts, above ``Σ ||sum − count·c||²/count``
  (Jensen: no cluster scatters less than its mean's distance says).

A data summary with ``moments`` also fixes the device's per-feature sum ``S`` and sum of
squares ``Q`` (:func:`moments_violation`): later per-cluster statistics over all its points
must add up to them (sums to ``S``, sums of squares to ``Q``, counts times means to ``S``),
and a cost they determine must be that one: the cost of centers ``c`` is
``ΣQ − Σ_j (2 c_j·sum_j − count_j ||c_j||²)``, a local k-means cost ``ΣQ − Σ_j count_j ||mean_j||²``.
Statistics of given centers by nearest-center assignment put each cluster's mean in its
center's Voronoi cell (:func:`voronoi_violation`): the cell is convex.

What a device can still do inside these bounds: declare a false ``n``, box or moments in
its first replies (behave as a device holding other data), and report any statistic that
some set of ``n`` points with those moments in its box could produce: it can shift points
between clusters while the totals stay. Robust aggregation (``aggregation``) is what
limits the effect of that on the result.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from .protocol import NUM_EXAMPLES, Task

# Relative slack for rounding (sums of up to millions of float64 values).
RELATIVE_SLACK = 1e-8
# Relative slack of the moments checks, on n × the size of a coordinate (squared for sums of
# squares and costs): the device adds its points up in another order for each statistic.
MOMENT_SLACK = 1e-8


@dataclass
class Declared:
    """What one device declared: its points ``n`` and, once it sent a data summary, its
    bounding box."""

    points: float
    low: np.ndarray | None = None
    high: np.ndarray | None = None
    scaled: bool = False  # the box is in a standardized run's units (fedcluster.scaling)
    moment_sum: np.ndarray | None = None  # S, per feature (a data summary with moments)
    moment_sumsq: np.ndarray | None = None  # Q, per feature
    moment_scale: np.ndarray | None = None  # per feature, the size of a coordinate (for rounding slack)


def declaration(task: Task, arrays: Mapping[str, np.ndarray], metrics: Mapping[str, Any]) -> Declared | None:
    """What a device's first valid reply declares (None if it carries no point count)."""
    if NUM_EXAMPLES not in metrics:
        return None
    declared = Declared(float(metrics[NUM_EXAMPLES]))
    boxed = {f.role: arrays[f.name] for f in task.reply if f.role in ("box-min", "box-max") and f.name in arrays}
    if len(boxed) == 2:
        declared.low, declared.high = np.asarray(boxed["box-min"], float), np.asarray(boxed["box-max"], float)
        moments = {f.role: arrays[f.name] for f in task.reply if f.role in ("moment-sum", "moment-sumsq") and f.name in arrays}
        if len(moments) == 2:
            declared.moment_sum = np.asarray(moments["moment-sum"], float)
            declared.moment_sumsq = np.asarray(moments["moment-sumsq"], float)
            declared.moment_scale = np.maximum(np.abs(declared.low), np.abs(declared.high))
    return declared


def moments_violation(
    sums: np.ndarray, sumsq: np.ndarray | None, declared: Declared, what: str = "its per-cluster statistics"
) -> str | None:
    """Per-cluster sums (k, d) (and sums of squares) over ALL of a device's points that do
    not add up to the moments it declared (None when they do, up to rounding, or when it
    declared none)."""
    if declared.moment_sum is None:
        return None
    n, scale = max(declared.points, 1.0), declared.moment_scale
    gap = np.abs(np.sum(sums, axis=0) - declared.moment_sum)
    if np.any(gap > MOMENT_SLACK * n * scale + 1e-300):
        return f"{what} add up to another sum of its points than the one its data summary declared"
    if sumsq is not None and np.any(np.abs(np.sum(sumsq, axis=0) - declared.moment_sumsq) > sumsq_rounding(declared) + 1e-300):
        return f"{what} add up to another sum of squares of its points than the one its data summary declared"
    return None


def sumsq_rounding(declared: Declared) -> np.ndarray:
    """Per feature, how far a sum of squares over all of a device's points may differ from
    the declared one by rounding alone (the points added in another order; in a standardized
    run the declared one is a difference of large numbers)."""
    scale = declared.moment_scale if declared.moment_scale is not None else 0.0
    return MOMENT_SLACK * max(float(declared.points), 1.0) * np.square(scale)


def voronoi_violation(means: np.ndarray, counts: np.ndarray, centers: np.ndarray, ratio: float = 1.0,
                      scatter: float = 0.0) -> str | None:
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
    size = (mu**2).sum(axis=1)[:, None] + (centers**2).sum(axis=1)[None, :]
    allowed = ratio**2 * gaps + (ratio**2 - 1.0) * scatter / counts[seen][:, None]
    nearer = allowed + RELATIVE_SLACK * (size + gaps + allowed) + 1e-300 < own[:, None]
    if np.any(nearer):
        row = int(np.flatnonzero(nearer.any(axis=1))[0])
        return (f"the mean of the points it assigned to center {int(seen[row])} lies nearer center "
                f"{int(np.argmax(nearer[row]))}: not a nearest-center assignment")
    return None


def declared_scatter(declared: Declared) -> float | None:
    """Σ ||x − mean||² over the device's points, from its declared moments (None without)."""
    if declared.moment_sum is None:
        return None
    return max(float(np.sum(declared.moment_sumsq - declared.moment_sum**2 / max(declared.points, 1.0))), 0.0)


def implied_cost_violation(cost: float, implied_minus_q: float, declared: Declared) -> str | None:
    """A cost that the declared sum of squares and the reply's own statistics fix
    (``ΣQ + implied_minus_q``) but that is another number."""
    if declared.moment_sumsq is None:
        return None
    implied = float(np.sum(declared.moment_sumsq)) + implied_minus_q
    if abs(cost - implied) > float(np.sum(sumsq_rounding(declared))) + 1e-300:
        return f"its cost {cost:.10g} is not the one its statistics and declared sum of squares imply ({implied:.10g})"
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
        return f"num-examples {metrics[NUM_EXAMPLES]} differs from the {n:g} points the node declared in its first reply"
    fields = {f.role: f for f in task.reply if f.role and f.name in arrays and _active(f, config)}
    sets = [f for f in fields.values() if f.shape[:1] == ("m",) and f.role != "cost"]
    if sets:
        for index in range(arrays[sets[0].name].shape[0]):
            part = {name: value[index] for name, value in arrays.items()}
            part.update({f.name: arrays[f.name][index:index + 1] for f in fields.values() if f.role == "cost"})
            asked = {name: (value[index] if value.ndim == 3 else value) for name, value in request.items()}
            reason = _violation(fields, task.counts, part, asked, declared)
            if reason:
                return f"set {index}: {reason}" if len(arrays[sets[0].name]) > 1 else reason
        return None
    return _violation(fields, task.counts, arrays, request, declared)


def _violation(fields: dict, task_counts: str, arrays: Mapping[str, np.ndarray], request: Mapping[str, np.ndarray],
               declared: Declared) -> str | None:
    n = declared.points
    counts = arrays[fields["count"].name] if "count" in fields else None
    if counts is not None and task_counts:
        total = float(np.sum(counts))
        slack = RELATIVE_SLACK * max(n, 1.0)
        if task_counts == "all" and abs(total - n) > slack:
            return f"its counts add up to {total:g}, not to the {n:g} points it declared"
        if task_counts == "at-most" and total > n + slack:
            return f"its counts add up to {total:g}, more than the {n:g} points it declared"
    if declared.low is None:
        return None
    low, high = declared.low, declared.high
    # Only arrays in the box's own space are bound by it (not, e.g., projected ones).
    fields = {role: f for role, f in fields.items() if role == "count" or arrays[f.name].shape[-1:] == low.shape
              or (role == "cost" and request.get(f.of, np.zeros(0)).shape[-1:] == low.shape)}
    magnitude = np.maximum(np.abs(low), np.abs(high))
    if "sum" in fields and counts is not None:
        sums = arrays[fields["sum"].name]
        slack = RELATIVE_SLACK * counts[:, None] * magnitude + 1e-300
        outside = (sums < counts[:, None] * low - slack) | (sums > counts[:, None] * high + slack)
        if np.any(outside):
            row = int(np.flatnonzero(outside.any(axis=1))[0])
            return (
                f"array {fields['sum'].name!r} row {row} lies outside what {counts[row]:g} points inside "
                f"the node's declared bounding box can add up to"
            )
    if "sumsq" in fields and counts is not None:
        sumsq = arrays[fields["sumsq"].name]
        top = counts[:, None] * magnitude**2
        if np.any(sumsq > top * (1 + RELATIVE_SLACK) + 1e-300):
            row = int(np.flatnonzero((sumsq > top * (1 + RELATIVE_SLACK) + 1e-300).any(axis=1))[0])
            return f"array {fields['sumsq'].name!r} row {row} is larger than {counts[row]:g} points inside the declared box allow"
    if "mean" in fields:
        means = arrays[fields["mean"].name]
        lo, hi = low, high
        source = fields["mean"].of
        if source and source in request:
            lo, hi = np.minimum(low, request[source]), np.maximum(high, request[source])
        slack = RELATIVE_SLACK * np.maximum(np.abs(lo), np.abs(hi)) + 1e-300
        rows = np.ones(means.shape[0], dtype=bool) if counts is None else counts > 0
        outside = ((means < lo - slack) | (means > hi + slack)).any(axis=1) & rows
        if np.any(outside):
            row = int(np.flatnonzero(outside)[0])
            return f"array {fields['mean'].name!r} row {row} lies outside the node's declared bounding box"
    if "cost" in fields and fields["cost"].of in request:
        costs = np.atleast_1d(arrays[fields["cost"].name])
        centers = request[fields["cost"].of]
        sets = centers[None] if centers.ndim == 2 else centers
        far = np.maximum((low - sets) ** 2, (high - sets) ** 2).sum(axis=2).min(axis=1)  # per center set
        slack = RELATIVE_SLACK * n * float(np.sum(magnitude**2)) + 1e-300
        above = costs > n * far * (1 + RELATIVE_SLACK) + slack
        if np.any(above):
            index = int(np.flatnonzero(above)[0])
            return (
                f"array {fields['cost'].name!r} entry {index} ({costs[index]:g}) is more than {n:g} points inside the "
                f"declared bounding box can cost ({n * far[index]:g})"
            )
        if "sum" in fields and counts is not None and centers.ndim == 2:
            sums = arrays[fields["sum"].name]
            used = counts > 0
            floor = float(np.sum(np.sum((sums[used] - counts[used, None] * centers[used]) ** 2, axis=1) / counts[used]))
            if costs[0] < floor * (1 - RELATIVE_SLACK) - slack:
                return (
                    f"array {fields['cost'].name!r} ({costs[0]:g}) is below what its own sums and counts imply "
                    f"({floor:g}): the cost was under-reported"
                )
    if "sum" in fields and counts is not None and task_counts == "all" and "cost" in fields:
        centers = request.get(fields["cost"].of) if fields["cost"].of else None
        sums = arrays[fields["sum"].name]
        if centers is not None and centers.shape == sums.shape:
            reason = voronoi_violation(sums / np.maximum(counts, 1e-300)[:, None], counts, centers)
            if reason:
                return reason
    if declared.moment_sum is not None and counts is not None and task_counts == "all":
        return _moments(fields, arrays, request, counts, declared)
    return None


def _moments(fields: dict, arrays: Mapping[str, np.ndarray], request: Mapping[str, np.ndarray], counts: np.ndarray,
             declared: Declared) -> str | None:
    """Statistics over all of a device's points against its declared moments: sums (or
    counts × means of its own points) and sums of squares add up to them; the cost of given
    centers (with sums) or of its own means is the one they fix."""
    if declared.moment_sum.shape != declared.low.shape:
        return None
    sums = arrays[fields["sum"].name] if "sum" in fields else None
    means = arrays[fields["mean"].name] if "mean" in fields and not fields["mean"].of else None
    if sums is None and means is not None:
        sums = counts[:, None] * means
    if sums is None:
        return None
    sumsq = arrays[fields["sumsq"].name] if "sumsq" in fields else None
    reason = moments_violation(sums, sumsq, declared)
    if reason or "cost" not in fields:
        return reason
    cost = float(np.atleast_1d(arrays[fields["cost"].name])[0])
    centers = request.get(fields["cost"].of) if fields["cost"].of else None
    if centers is not None and centers.ndim == 2 and "sum" in fields and centers.shape == sums.shape:
        rest = -float(np.sum(2 * np.einsum("jd,jd->j", centers, sums) - counts * np.einsum("jd,jd->j", centers, centers)))
    elif not fields["cost"].of and means is not None:
        rest = -float(np.sum(counts * np.einsum("jd,jd->j", means, means)))
    else:
        return None
    return implied_cost_violation(cost, rest, declared)


def _active(field, config: Mapping[str, Any] | None) -> bool:
    return field.when is None or (config or {}).get(field.when[0]) == field.when[1]
