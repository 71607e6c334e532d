"""Combining per-device statistics robustly (server side, NumPy only).

One rule for every center-based algorithm: each device's per-cluster MEAN (a FedKMeans
device's updated centers; a DA-UFL agent's implied mean ``m_k − g_k / W_k``) with the
weight behind it (count, or weighted count) is combined per cluster and coordinate by
``mean`` (the papers' weighted average), ``trimmed-mean`` or ``median`` (as Flower's
FedTrimmedAvg / FedMedian do for model parameters, here per cluster over the devices that
saw it). See docs/security.md, "Untrusted devices", for what each guarantees.
"""

from __future__ import annotations

import numpy as np

from .config import AGGREGATION

AGGREGATIONS = AGGREGATION.allowed.options


def aggregate_centers(
    centers: np.ndarray, counts: np.ndarray, method: str = "mean", trim: float = 0.1
) -> tuple[np.ndarray, np.ndarray]:
    """Combine the devices' centers (m, k, d) with their counts (m, k) into ``(Λ_t,
    Σ Λ Γ)`` for :func:`server_update`.

    ``mean``: the paper's count-weighted average (every device, every count).
    ``trimmed-mean``: per cluster and coordinate, of the m_j devices that saw the cluster
    the ``t = min(ceil(trim·m_j), (m_j − 1) // 2)`` smallest and t largest values are
    dropped (by device, as Flower's FedTrimmedAvg, so a large count cannot buy a way
    back in) and the rest count-weighted. ``median``: per cluster and coordinate, the
    median of the m_j devices' values (FedMedian), weighted by the total count.
    Guarantee: when at most t of a cluster's m_j devices lie (median: fewer than half),
    every coordinate of its aggregated center lies within the range of the honest
    devices' values for it. Clusters seen by one or two devices are not protected.
    """
    if method not in AGGREGATIONS:
        raise ValueError(f"aggregation must be one of {', '.join(AGGREGATIONS)}, got {method!r}")
    centers = np.asarray(centers, dtype=np.float64)
    counts = np.asarray(counts, dtype=np.float64)
    if method == "mean":
        return np.sum(counts, axis=0), np.sum(counts[:, :, None] * centers, axis=0)
    m, k, d = centers.shape
    totals = np.zeros(k)
    weighted = np.zeros((k, d))
    for j in range(k):
        seen = counts[:, j] > 0
        values, weights = centers[seen, j, :], counts[seen, j]
        if values.shape[0] == 0:
            continue
        if method == "median":
            totals[j] = weights.sum()
            weighted[j] = totals[j] * np.median(values, axis=0)
            continue
        t = min(int(np.ceil(trim * values.shape[0])), (values.shape[0] - 1) // 2)
        order = np.argsort(values, axis=0, kind="stable")[t : values.shape[0] - t]  # (kept, d)
        kept_values = np.take_along_axis(values, order, axis=0)
        kept_weights = weights[order]  # per coordinate, the weights of the kept devices
        mass = kept_weights.sum(axis=0)  # (d,)
        mean = (kept_weights * kept_values).sum(axis=0) / mass
        totals[j] = mass.mean()
        weighted[j] = totals[j] * mean
    return totals, weighted
