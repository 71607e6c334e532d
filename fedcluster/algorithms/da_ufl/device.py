"""The device kernels of this algorithm's tasks (``protocol.TASKS``): what runs on a
device, on its own points, NumPy only. The math they share with the server is in
:mod:`.model`."""

from __future__ import annotations

from typing import Any

import numpy as np

from fedcluster.kernel import DeviceData, device_task
from fedcluster.lloyd import nearest
from fedcluster.shared_kernels import matching_dimension
from fedcluster.task import named

from .model import _cached_labels, device_grid, grid_index, point_weights, train_som, weighted_gradient
from .protocol import TASKS


@device_task(named(TASKS, "som_codebook"))
def som_codebook(data: DeviceData, arrays: dict, config: dict[str, Any]):
    X = data.require_points()
    grid = device_grid(config["grid"], X.shape[0])
    codebook = train_som(X, grid, config["epochs"], np.random.default_rng(config["seed"]))
    return {"codebook": codebook}, {"num-examples": int(X.shape[0])}


@device_task(named(TASKS, "bin_counts"))
def bin_counts(data: DeviceData, arrays: dict, config: dict[str, Any]):
    X = data.require_points()
    if config["binning"] == "grid":
        low, high = matching_dimension(X, arrays["low"], "low"), matching_dimension(X, arrays["high"], "high")
        cells = config["bins"] ** X.shape[1]
        index = grid_index(X, low, high, config["bins"])
    else:
        codebook = matching_dimension(X, arrays["codebook"], "codebook")
        cells = codebook.shape[0]
        index = nearest(X, codebook)
    counts = np.bincount(index, minlength=cells).astype(np.float64)
    return {"counts": counts}, {"num-examples": int(X.shape[0])}


@device_task(named(TASKS, "daufl_step"))
def daufl_step(data: DeviceData, arrays: dict, config: dict[str, Any]):
    X = data.require_points()
    centers = matching_dimension(X, arrays["centers"])
    binning, bins = config["binning"], config["bins"]
    weight_of_bin = arrays["weights"]
    cells = {"uniform": 1, "grid": bins ** X.shape[1]}.get(binning, arrays.get("codebook", np.zeros((0, 0))).shape[0])
    if weight_of_bin.shape[0] != cells:
        raise ValueError(f"{weight_of_bin.shape[0]} bin weights for {cells} bins ({binning})")
    if binning == "codebook":
        matching_dimension(X, arrays["codebook"], "codebook")
    labels = _cached_labels(data, X, arrays["anchor"], config["outer"], config["xi-max"], config["seed"])
    gradient, weight = weighted_gradient(X, labels, point_weights(X, weight_of_bin, binning, arrays, bins), centers)
    changed = 0
    if "previous" in arrays:
        before = _cached_labels(
            data, X, arrays["previous"], config["previous-outer"], config["xi-max"], config["previous-seed"]
        )
        changed = int(np.count_nonzero(before != labels))
    return (
        {"gradient": gradient, "weight": weight, "changed": np.array([float(changed)])},
        {"num-examples": int(X.shape[0])},
    )
