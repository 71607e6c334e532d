"""FedDP-KMeans device kernels (Scott et al. 2025; ALGORITHMS.md section 3). NumPy only.

Every kernel receives the privacy level and its clipping bounds in the message config and
applies them ON THE DEVICE, before anything leaves it:

- ``level = "data-point"``: the device's points are clipped to Euclidean norm
  ``clip-norm`` (Δ) once, before ANY statistic is computed (:func:`private_points`); the
  statistics themselves are plain sums, whose per-point sensitivity follows from Δ.
- ``level = "client"``: the raw points are used, and every statistic is clipped as a whole
  before it is sent -- Frobenius norm ``clip`` for the Gaussian-noised one, L1 norm
  ``clip-l1`` for the Laplace-noised one (:mod:`fedcluster.clipping`). Step 3 then sends a
  mean of means: per-cluster means (zero rows for empty clusters) and a 0/1 vector of
  non-empty clusters.

Tasks (the server side is ``server_app/feddp_kmeans.py``):

``feddp_outer``            Step 1: XᵀX, sent as its upper triangle incl. the diagonal
                           (d(d+1)/2 values, row by row: :func:`pack_symmetric`).
``feddp_histogram``        Step 2: for every projected server point (rows of ``server``,
                           n_s x k), how many of the device's projected points XV have it
                           as their nearest one.
``feddp_projected_stats``  Step 3: assignment by nearest projected center ν in the
                           projected space XV, with the optional margin filter (keep x only
                           when ||xV − ν_r|| ≤ margin·||xV − ν_s|| for every s ≠ r; margin 1
                           keeps everything); per-cluster sums of the ORIGINAL points and
                           counts (data-point) or means and the non-empty vector (client).
``feddp_lloyd``            FedDP-Lloyds: assignment by nearest center in the full space;
                           per-cluster sums and counts (clipped as a whole at client level).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np

from .clipping import clip_l1, clip_l2, clip_rows_l2
from .lloyd import add_rows_by_label, assign, squared_distances

# Rows per distance block in the margin filter (bounded memory for any device size).
_CHUNK = 1 << 15
from .registry import DeviceData, device_task

DATA_POINT = "data-point"
CLIENT = "client"
LEVELS = (DATA_POINT, CLIENT)


def _level(config: dict[str, Any]) -> str:
    level = str(config.get("level", DATA_POINT))
    if level not in LEVELS:
        raise ValueError(f"unknown privacy level {level!r}; expected one of {LEVELS}")
    return level


def _bound(config: dict[str, Any], key: str) -> float:
    if key not in config:
        raise ValueError(f"the message config has no clipping bound {key!r}")
    value = float(config[key])
    if not value > 0:
        raise ValueError(f"clipping bound {key!r} must be > 0, got {value}")
    return value


def private_points(data: DeviceData, config: dict[str, Any]) -> np.ndarray:
    """The points a FedDP kernel may use: clipped to norm Δ = ``clip-norm`` at data-point
    level (computed once per Δ and cached on the device), the raw points at client level."""
    X = np.asarray(data.require_points(), dtype=np.float64)
    if X.shape[0] == 0:
        raise ValueError(f"the device holds no points ({data.source})")
    if _level(config) == CLIENT:
        return X
    delta = _bound(config, "clip-norm")
    key = ("feddp-clipped", delta)
    cached = data.extra.get(key)
    if cached is None or cached.shape != X.shape:
        cached = clip_rows_l2(X, delta)
        data.extra[key] = cached
    return cached


def _matrix(arrays: dict[str, np.ndarray], name: str, columns: int | None = None) -> np.ndarray:
    if name not in arrays:
        raise ValueError(f"the message has no array {name!r}")
    value = np.asarray(arrays[name], dtype=np.float64)
    if value.ndim != 2:
        raise ValueError(f"{name} must be a 2-D array, got shape {value.shape}")
    if columns is not None and value.shape[1] != columns:
        raise ValueError(f"{name} has {value.shape[1]} columns, expected {columns}")
    if not np.all(np.isfinite(value)):
        raise ValueError(f"{name} contains NaN or inf")
    return value


def _projection(arrays: dict[str, np.ndarray], d: int) -> np.ndarray:
    V = _matrix(arrays, "projection")
    if V.shape[0] != d:
        raise ValueError(f"the device's data has dimension {d} but the projection has {V.shape[0]} rows")
    return V


def outer_product(X: np.ndarray) -> np.ndarray:
    """XᵀX (only its upper triangle is ever sent)."""
    return X.T @ X


@lru_cache(maxsize=8)
def _triangle(d: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Row and column indices of the upper triangle of a d x d matrix, and the packed
    positions of its diagonal."""
    rows, cols = np.triu_indices(d)
    return rows, cols, np.flatnonzero(rows == cols)


def pack_symmetric(matrix: np.ndarray) -> np.ndarray:
    """The upper triangle (with the diagonal) of a symmetric d x d matrix, row by row."""
    rows, cols, _ = _triangle(matrix.shape[0])
    return np.ascontiguousarray(matrix[rows, cols])


def unpack_symmetric(packed: np.ndarray, d: int) -> np.ndarray:
    """Inverse of :func:`pack_symmetric`."""
    rows, cols, _ = _triangle(d)
    matrix = np.zeros((d, d))
    matrix[rows, cols] = packed
    matrix[cols, rows] = packed
    return matrix


def packed_diagonal(packed: np.ndarray, d: int) -> np.ndarray:
    """The diagonal of a packed symmetric matrix."""
    return packed[_triangle(d)[2]]


def packed_frobenius(packed: np.ndarray, d: int) -> float:
    """Frobenius norm of the symmetric matrix a packed triangle stands for."""
    diagonal = packed_diagonal(packed, d)
    return float(np.sqrt(max(2.0 * float(packed @ packed) - float(diagonal @ diagonal), 0.0)))


def packed_size(d: int) -> int:
    return d * (d + 1) // 2


def nearest_histogram(projected: np.ndarray, server_projected: np.ndarray) -> np.ndarray:
    """Counts, per row of ``server_projected``, of the rows of ``projected`` nearest to it
    (ties: the lowest index)."""
    labels, _ = assign(projected, server_projected)
    return np.bincount(labels, minlength=server_projected.shape[0]).astype(np.float64)


def margin_assignment(projected: np.ndarray, centers: np.ndarray, margin: float) -> tuple[np.ndarray, np.ndarray]:
    """Nearest center of every projected point, and which points pass the margin filter
    ``||p − ν_r|| ≤ margin · ||p − ν_s||`` for all s ≠ r (``margin >= 1``: all pass)."""
    if margin >= 1.0 or centers.shape[0] < 2:
        labels, _ = assign(projected, centers)
        return labels, np.ones(labels.shape[0], dtype=bool)
    n = projected.shape[0]
    labels = np.empty(n, dtype=np.int64)
    keep = np.empty(n, dtype=bool)
    for start in range(0, n, _CHUNK):
        d2 = squared_distances(projected[start : start + _CHUNK], centers)
        rows = np.arange(d2.shape[0])
        lab = np.argmin(d2, axis=1)
        nearest = d2[rows, lab]
        d2[rows, lab] = np.inf
        labels[start : start + _CHUNK] = lab
        keep[start : start + _CHUNK] = nearest <= (margin * margin) * d2.min(axis=1)
    return labels, keep


def sums_and_counts(X: np.ndarray, labels: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    sums = np.zeros((k, X.shape[1]))
    add_rows_by_label(sums, labels, X)
    return sums, np.bincount(labels, minlength=k).astype(np.float64)


def cluster_means(sums: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-cluster means (zero rows where empty) and the 0/1 non-empty indicator."""
    nonempty = counts > 0
    means = np.zeros_like(sums)
    means[nonempty] = sums[nonempty] / counts[nonempty, None]
    return means, nonempty.astype(np.float64)


@device_task("feddp_outer")
def feddp_outer(data: DeviceData, arrays: dict, config: dict):
    X = private_points(data, config)
    outer = outer_product(X)
    if _level(config) == CLIENT:
        outer = clip_l2(outer, _bound(config, "clip"))
    return {"outer": pack_symmetric(outer)}, {"num-examples": int(X.shape[0]), "dim": int(X.shape[1])}


@device_task("feddp_histogram")
def feddp_histogram(data: DeviceData, arrays: dict, config: dict):
    X = private_points(data, config)
    V = _projection(arrays, X.shape[1])
    server = _matrix(arrays, "server", V.shape[1])
    histogram = nearest_histogram(X @ V, server)
    if _level(config) == CLIENT:
        histogram = clip_l1(histogram, _bound(config, "clip-l1"))
    return {"histogram": histogram}, {"num-examples": int(X.shape[0])}


@device_task("feddp_projected_stats")
def feddp_projected_stats(data: DeviceData, arrays: dict, config: dict):
    X = private_points(data, config)
    V = _projection(arrays, X.shape[1])
    centers = _matrix(arrays, "centers", V.shape[1])
    k = centers.shape[0]
    labels, keep = margin_assignment(X @ V, centers, float(config.get("margin", 1.0)))
    sums, counts = sums_and_counts(X[keep], labels[keep], k)
    if _level(config) == CLIENT:
        means, nonempty = cluster_means(sums, counts)
        return (
            {"means": clip_l2(means, _bound(config, "clip")), "nonempty": clip_l1(nonempty, _bound(config, "clip-l1"))},
            {"num-examples": int(X.shape[0]), "kept": int(keep.sum())},
        )
    return {"sums": sums, "counts": counts}, {"num-examples": int(X.shape[0]), "kept": int(keep.sum())}


@device_task("feddp_lloyd")
def feddp_lloyd(data: DeviceData, arrays: dict, config: dict):
    X = private_points(data, config)
    centers = _matrix(arrays, "centers", X.shape[1])
    labels, _ = assign(X, centers)
    sums, counts = sums_and_counts(X, labels, centers.shape[0])
    if _level(config) == CLIENT:
        sums = clip_l2(sums, _bound(config, "clip"))
        counts = clip_l1(counts, _bound(config, "clip-l1"))
    return {"sums": sums, "counts": counts}, {"num-examples": int(X.shape[0])}
