"""What every point-data algorithm shares, device and server side (NumPy only).

Device tasks (declared in :mod:`fedcluster.protocol`):

``data_summary``  size, dimension and bounding box of the device's points (with
                  ``moments``: their per-feature sums and scatter about their mean).
``lloyd_stats``   per-cluster sums, counts and cost of given centers (federated
                  evaluation, FedDP-Init step 3's cost report, ...).

Server helpers: :func:`majority_value` (the federation's dimension is the one most
nodes report), :func:`bounding_box`, :func:`center_shift`, :func:`duplicate_warning`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from .lloyd import lloyd_statistics, nearest
from .device import DeviceData, device_task


def matching_dimension(points: np.ndarray, array: np.ndarray, name: str = "centers") -> np.ndarray:
    """``array`` (already parsed by the protocol: float64, finite, of the declared rank)
    if its last dimension is the device's data dimension, else a ``ValueError``."""
    if array.shape[-1] != points.shape[1]:
        raise ValueError(
            f"the device's data has dimension {points.shape[1]} but the {name} have "
            f"dimension {array.shape[-1]}"
        )
    return array


def majority_value(values: Sequence[int]) -> int:
    """The value most entries have (ties: the smaller)."""
    if len(values) == 0:
        raise ValueError("no values to vote on")
    unique, counts = np.unique(np.asarray(values, dtype=np.int64), return_counts=True)
    return int(unique[np.argmax(counts)])


def bounding_box(lows: Sequence[np.ndarray], highs: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The federation's bounding box from the devices' per-coordinate minima and maxima."""
    return np.min(lows, axis=0), np.max(highs, axis=0)


def duplicate_warning(centers: np.ndarray) -> str | None:
    """What to say when some of the centers a run returns are the same point (the devices'
    points hold fewer distinct values than k: at 1e150 a spread of 1e134 is one value), or
    None when every center is its own."""
    k = centers.shape[0]
    duplicates = k - np.unique(centers, axis=0).shape[0]
    if not duplicates:
        return None
    return (f"{duplicates} of the k={k} centers coincide with another one: the devices' points hold fewer distinct "
            f"values than k (centers.npy keeps the duplicates; k={k - duplicates} describes these data as well)")


def center_shift(new: np.ndarray, old: np.ndarray) -> float:
    """How far a round moved the centers: the Frobenius norm of ``new - old``."""
    return float(np.sqrt(np.sum((new - old) ** 2)))


def feature_moments(X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per feature, the sum of the rows of ``X`` and the sum of their squared deviations from
    their mean, both taken about the first row (exact differences for data far from the
    origin, then the mean of those, then the deviations: the same numbers wherever the data
    lie, the sum rounded once at the size of the offset)."""
    shift = X[0]
    about = X - shift
    mean = about.mean(axis=0)
    deviation = about - mean
    return about.sum(axis=0) + X.shape[0] * shift, np.einsum("ij,ij->j", deviation, deviation)


@device_task("data_summary")
def data_summary(data: DeviceData, arrays: dict, config: dict):
    X = data.require_points()
    n, d = X.shape
    if n == 0:
        raise ValueError(f"the device holds no points ({data.source})")
    arrays = {"min": X.min(axis=0), "max": X.max(axis=0)}
    if config["moments"]:
        arrays["sum"], arrays["scatter"] = feature_moments(X)
    return arrays, {"num-examples": int(n), "dim": int(d)}


@device_task("lloyd_stats")
def lloyd_stats(data: DeviceData, arrays: dict, config: dict):
    X = data.require_points()
    stats = lloyd_statistics(X, matching_dimension(X, arrays["centers"]))
    return {"sums": stats.sums, "counts": stats.counts, "cost": np.array([stats.cost])}, {"num-examples": int(X.shape[0])}


LABELS_FOLDER = "fedcluster-labels"


def labels_path(source: str) -> Path:
    """Where a device's labels go: ``fedcluster-labels/<data file stem>.npy`` beside the data
    file (``a.csv`` -> ``a_csv.npy``), a sub-folder, so an ``npy-dir`` listing never takes
    them for data."""
    data_file = Path(source)
    name = data_file.stem if data_file.suffix == ".npy" else f"{data_file.stem}_{data_file.suffix.lstrip('.')}"
    return data_file.parent / LABELS_FOLDER / f"{name}.npy"


@device_task("write_labels")
def write_labels(data: DeviceData, arrays: dict, config: dict):
    """Nearest-center labels of the device's own points, saved beside its data file (the
    latest run's labels replace earlier ones); a device without a data file (generated data)
    writes nothing. Only the flag ``written`` leaves the device."""
    X = data.require_points()
    labels = nearest(X, matching_dimension(X, arrays["centers"])).astype(np.int64)
    if not data.source or not Path(data.source).is_file():
        return {"written": np.array([0.0])}, {"num-examples": int(X.shape[0])}
    target = labels_path(data.source)
    target.parent.mkdir(exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    with open(partial, "wb") as handle:
        np.save(handle, labels)
    partial.replace(target)
    return {"written": np.array([1.0])}, {"num-examples": int(X.shape[0])}
