"""The device kernels of this algorithm's tasks (``protocol.TASKS``): what runs on a
device, on its own points, NumPy only. The math they share with the server is in
:mod:`.model`."""

from __future__ import annotations

import numpy as np

from fedcluster.kernel import DeviceData, device_task
from fedcluster.lloyd import LloydStatistics
from fedcluster.lloyd import assign
from fedcluster.lloyd import label_sums
from fedcluster.privacy.clipping import CLIENT
from fedcluster.privacy.clipping import clip_l1
from fedcluster.privacy.clipping import clip_l2
from fedcluster.privacy.clipping import clip_rows_l2
from fedcluster.privacy.clipping import scale_l2
from fedcluster.shared_kernels import matching_dimension
from fedcluster.task import named

from .model import (
    _bound,
    _histogram_reply,
    _projection,
    held,
    margin_assignment,
    outer_dimension_problem,
    outer_product,
    pack_symmetric,
    private_points,
)
from .protocol import TASKS


@device_task(named(TASKS, "feddp_outer"))
def feddp_outer(data: DeviceData, arrays: dict, config: dict):
    X = private_points(data, arrays, config)
    problem = outer_dimension_problem(X.shape[1])
    if problem:  # refused before the allocation, whatever the server asked
        raise ValueError(problem)
    outer = outer_product(X)
    if config["level"] == CLIENT:  # scaled to the bound (the default) or clipped to it
        outer = (scale_l2 if config.get("normalize") else clip_l2)(outer, _bound(config, "clip"))
    return {"outer": pack_symmetric(outer)}, {"num-examples": held(data), "dim": int(X.shape[1])}


@device_task(named(TASKS, "feddp_histogram"))
def feddp_histogram(data: DeviceData, arrays: dict, config: dict):
    X = private_points(data, arrays, config)
    return _histogram_reply(data, X @ _projection(arrays, X.shape[1]), arrays["server"], config)


@device_task(named(TASKS, "feddp_candidates"))
def feddp_candidates(data: DeviceData, arrays: dict, config: dict):
    """The histogram start: how many of the device's points have each candidate (server
    points, or points drawn independently of any data) as their nearest (step 2's
    statistic, in the data's own space)."""
    X = private_points(data, arrays, config)
    return _histogram_reply(data, X, matching_dimension(X, arrays["candidates"], "candidates"), config)


@device_task(named(TASKS, "feddp_projected_stats"))
def feddp_projected_stats(data: DeviceData, arrays: dict, config: dict):
    X = private_points(data, arrays, config)
    V = _projection(arrays, X.shape[1])
    centers = arrays["centers"]
    k = centers.shape[0]
    labels, keep = margin_assignment(X @ V, centers, config["margin"])
    sums, counts = label_sums(X[keep], labels[keep], k)
    if config["level"] == CLIENT:  # the mean of means: zero rows where empty, and which are not
        means = LloydStatistics(sums, counts, 0.0).centers(np.zeros_like(sums))
        nonempty = (counts > 0).astype(np.float64)
        return (
            {"means": clip_l2(means, _bound(config, "clip")), "nonempty": clip_l1(nonempty, _bound(config, "clip-l1"))},
            {"num-examples": held(data), "kept": int(keep.sum())},
        )
    return {"sums": sums, "counts": counts}, {"num-examples": held(data), "kept": int(keep.sum())}


@device_task(named(TASKS, "feddp_lloyd"))
def feddp_lloyd(data: DeviceData, arrays: dict, config: dict):
    """Per-cluster sums and counts of the device's (clipped) points; with ``radius`` (a
    relative update, data-point level) the sums are of each point's displacement from its
    center, clipped to norm ``radius``: one point then moves a sum by at most ``radius``."""
    X = private_points(data, arrays, config)
    centers = matching_dimension(X, arrays["centers"])
    labels, _ = assign(X, centers)
    radius = config.get("radius")
    if radius is not None:
        if config["level"] == CLIENT:
            raise ValueError("a relative Lloyd update (radius) is a data-point level statistic")
        sums, counts = label_sums(clip_rows_l2(X - centers[labels], radius), labels, centers.shape[0])
        return {"sums": sums, "counts": counts}, {"num-examples": held(data)}
    sums, counts = label_sums(X, labels, centers.shape[0])
    if config["level"] == CLIENT:
        sums = clip_l2(sums, _bound(config, "clip"))
        counts = clip_l1(counts, _bound(config, "clip-l1"))
    return {"sums": sums, "counts": counts}, {"num-examples": held(data)}
