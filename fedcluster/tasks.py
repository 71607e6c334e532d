"""Device tasks shared by several algorithms (NumPy only).

``data_summary``      size, dimension and bounding box of the device's points.
``lloyd_stats``       Lloyd statistics of given centers (FedDP-Lloyds, evaluation, ...).
``score_candidates``  k-means cost of several candidate center sets in one pass.
``local_summary``     a local k-means summary (centers + counts) used to seed the
                      global initialization; clusters smaller than ``min-count`` points
                      are suppressed so a lone point never leaves the device as a center.
"""

from __future__ import annotations

import numpy as np

from .lloyd import assign, kmeans, lloyd_statistics, squared_distances
from .registry import DeviceData, device_task


def check_centers(points: np.ndarray, centers: np.ndarray, name: str = "centers") -> np.ndarray:
    """Validate that ``centers`` is a finite (k, d) array matching the device's dimension."""
    centers = np.asarray(centers, dtype=np.float64)
    if centers.ndim != 2:
        raise ValueError(f"{name} must be a 2-D (k, d) array, got shape {centers.shape}")
    if centers.shape[1] != points.shape[1]:
        raise ValueError(
            f"the device's data has dimension {points.shape[1]} but the {name} have "
            f"dimension {centers.shape[1]}"
        )
    if not np.all(np.isfinite(centers)):
        raise ValueError(f"{name} contain NaN or inf")
    return centers


@device_task("data_summary")
def data_summary(data: DeviceData, arrays: dict, config: dict):
    X = data.require_points()
    n, d = X.shape
    if n == 0:
        raise ValueError(f"the device holds no points ({data.source})")
    return (
        {"min": X.min(axis=0), "max": X.max(axis=0)},
        {"num-examples": int(n), "dim": int(d)},
    )


@device_task("lloyd_stats")
def lloyd_stats(data: DeviceData, arrays: dict, config: dict):
    X = data.require_points()
    centers = check_centers(X, arrays["centers"])
    stats = lloyd_statistics(X, centers, with_sumsq=bool(config.get("sumsq", False)))
    out = {"sums": stats.sums, "counts": stats.counts, "cost": np.array([stats.cost])}
    if stats.sumsq is not None:
        out["sumsq"] = stats.sumsq
    return out, {"num-examples": int(X.shape[0])}


@device_task("score_candidates")
def score_candidates(data: DeviceData, arrays: dict, config: dict):
    X = data.require_points()
    candidates = np.asarray(arrays["candidates"], dtype=np.float64)
    if candidates.ndim != 3:
        raise ValueError(f"candidates must be (m, k, d), got shape {candidates.shape}")
    m, k, d = candidates.shape
    check_centers(X, candidates.reshape(m * k, d), "candidate centers")
    # One distance pass against all m*k centers, then the minimum within each candidate.
    costs = np.zeros(m)
    step = max(1, (1 << 20) // max(m * k, 1))
    flat = candidates.reshape(m * k, d)
    for start in range(0, X.shape[0], step):
        block = squared_distances(X[start : start + step], flat).reshape(-1, m, k)
        costs += block.min(axis=2).sum(axis=0)
    return {"costs": costs}, {"num-examples": int(X.shape[0])}


@device_task("local_summary")
def local_summary(data: DeviceData, arrays: dict, config: dict):
    X = data.require_points()
    k = int(config["k"])
    min_count = int(config.get("min-count", 2))
    rng = np.random.default_rng(int(config.get("seed", 0)))
    n = X.shape[0]
    k_local = min(k, n)
    centers, _ = kmeans(X, k_local, rng, n_init=int(config.get("n-init", 1)), max_iter=100)
    labels, _ = assign(X, centers)
    counts = np.bincount(labels, minlength=k_local).astype(np.float64)
    keep = counts >= max(min_count, 1)
    return (
        {"centers": centers[keep], "counts": counts[keep]},
        {"num-examples": int(n)},
    )
