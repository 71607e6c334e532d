"""The device kernels of the shared tasks (:mod:`fedcluster.shared_tasks`), NumPy only:

``data_summary``      size, dimension and bounding box of the device's points (with
                      ``moments``: their per-feature sums and scatter about their mean);
``lloyd_stats``       per-cluster sums, counts and cost of given centers (a federated
                      evaluation);
``score_candidates``  the cost of each of m candidate center sets;
``write_labels``      nearest-center labels saved beside the device's data file;
``identify``          nothing of the data (a resumed run matches nodes by their partition).

The server's helpers on point data are in :mod:`fedcluster.points`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedcluster.task import named
from fedcluster.shared_tasks import TASKS
from fedcluster.kernel import DeviceData, TaskResult, device_task
from fedcluster.lloyd import column_extremes, lloyd_statistics, nearest, nearest_of_sets, rows_per_chunk


def matching_dimension(points: np.ndarray, array: np.ndarray, name: str = "centers") -> np.ndarray:
    """``array`` (already parsed by the protocol: float64, finite, of the declared rank)
    if its last dimension is the device's data dimension, else a ``ValueError``."""
    if array.shape[-1] != points.shape[1]:
        raise ValueError(
            f"the device's data has dimension {points.shape[1]} but the {name} have dimension {array.shape[-1]}"
        )
    return array


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


@device_task(named(TASKS, "data_summary"))
def data_summary(data: DeviceData, arrays: dict, config: dict):
    X = data.require_points()
    n, d = X.shape
    if n == 0:
        raise ValueError(f"the device holds no points ({data.source})")
    low, high = column_extremes(X)
    arrays = {"min": low, "max": high}
    if config["moments"]:
        arrays["sum"], arrays["scatter"] = feature_moments(X)
    return arrays, {"num-examples": int(n), "dim": int(d)}


@device_task(named(TASKS, "lloyd_stats"))
def lloyd_stats(data: DeviceData, arrays: dict, config: dict):
    X = data.require_points()
    stats = lloyd_statistics(X, matching_dimension(X, arrays["centers"]))
    return {"sums": stats.sums, "counts": stats.counts, "cost": np.array([stats.cost])}, {
        "num-examples": int(X.shape[0])
    }


LABELS_FOLDER = "fedcluster-labels"


def labels_path(source: str) -> Path:
    """Where a device's labels go: ``fedcluster-labels/<data file stem>.npy`` beside the data
    file (``a.csv`` -> ``a_csv.npy``), a sub-folder, so an ``npy-dir`` listing never takes
    them for data."""
    data_file = Path(source)
    name = data_file.stem if data_file.suffix == ".npy" else f"{data_file.stem}_{data_file.suffix.lstrip('.')}"
    return data_file.parent / LABELS_FOLDER / f"{name}.npy"


@device_task(named(TASKS, "write_labels"))
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


@device_task(named(TASKS, "score_candidates"))
def score_candidates(data: DeviceData, arrays: dict, config: dict):
    X = data.require_points()
    candidates = matching_dimension(X, arrays["candidates"], "candidate centers")
    m, k, d = candidates.shape
    # The nearest center within each candidate, then each row's own difference from it (a
    # point on its center costs 0).
    costs = np.zeros(m)
    step = rows_per_chunk(X.shape[0], m * max(k, d))
    sets = np.arange(m)
    for start in range(0, X.shape[0], step):
        Xc = X[start : start + step]
        labels = nearest_of_sets(Xc, candidates)  # (rows, m)
        deviation = Xc[:, None, :] - candidates[sets[None, :], labels]  # (rows, m, d)
        costs += np.einsum("rmd,rmd->m", deviation, deviation)
    return {"costs": costs}, {"num-examples": int(X.shape[0])}


@device_task(named(TASKS, "identify"))
def identify(data: DeviceData, arrays: dict, config: dict) -> TaskResult:
    """Nothing of the data: :func:`fedcluster.device.run_task` adds the partition every
    reply states."""
    return {}, {}
