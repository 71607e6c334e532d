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

What a device can still do inside these bounds: declare a false ``n`` or a false box in its
first reply (that only widens what it may later claim), and report any statistic that some
set of ``n`` points in its box could produce: it can move a cluster's sum anywhere inside
``count × box`` and shift points between clusters. Robust aggregation
(``aggregation``) is what limits the effect of that on the result.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from .protocol import NUM_EXAMPLES, Task

# Relative slack for rounding (sums of up to millions of float64 values).
RELATIVE_SLACK = 1e-8


@dataclass
class Declared:
    """What one device declared: its points ``n`` and, once it sent a data summary, its
    bounding box."""

    points: float
    low: np.ndarray | None = None
    high: np.ndarray | None = None
    scaled: bool = False  # the box is in a standardized run's units (fedcluster.scaling)


def declaration(task: Task, arrays: Mapping[str, np.ndarray], metrics: Mapping[str, Any]) -> Declared | None:
    """What a device's first valid reply declares (None if it carries no point count)."""
    if NUM_EXAMPLES not in metrics:
        return None
    declared = Declared(float(metrics[NUM_EXAMPLES]))
    boxed = {f.role: arrays[f.name] for f in task.reply if f.role in ("box-min", "box-max") and f.name in arrays}
    if len(boxed) == 2:
        declared.low, declared.high = np.asarray(boxed["box-min"], float), np.asarray(boxed["box-max"], float)
    return declared


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
    return None


def _active(field, config: Mapping[str, Any] | None) -> bool:
    return field.when is None or (config or {}).get(field.when[0]) == field.when[1]
