"""FedKMeans device side: ClientKMeans of Triebe & ... (2019), ALGORITHMS.md section 1.

The device starts from the global centers, runs ``epochs`` passes of mini-batch k-means
with learning rate ``beta`` and returns the per-cluster counts of its last epoch and its
updated centers. Alongside it reports the cost of the centers it RECEIVED on all of its
points (so the server gets the federated cost of the previous global model without an
extra round trip) and, per cluster, the sum of squared coordinates of the last epoch's
members (``sumsq``), from which the server estimates every cluster's spread for
reassignment without any point leaving the device.
"""

from __future__ import annotations

import numpy as np

from .lloyd import kmeans_cost, lloyd_statistics
from .registry import DeviceData, device_task
from .tasks import check_centers


def client_kmeans(
    X: np.ndarray,
    centers: np.ndarray,
    *,
    epochs: int = 1,
    batch_size: int | None = None,
    learning_rate: float = 1.0,
    rng: np.random.Generator | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ClientKMeans: local mini-batch k-means from ``centers``.

    For each epoch the per-cluster counts restart at zero, the data are shuffled into
    batches of ``batch_size`` (None or <= 0: one full batch), and for every batch b and
    cluster j with members in it::

        counts_j += batch_counts_j
        centers_j += learning_rate * (batch_counts_j / counts_j) * (batch_mean_j - centers_j)

    Returns ``(counts, centers, sumsq)`` of the LAST epoch, where ``sumsq`` (k x d) is the
    per-cluster sum of squared coordinates of the points assigned in that epoch.
    """
    if epochs < 1:
        raise ValueError(f"epochs must be >= 1, got {epochs}")
    if not 0 < learning_rate <= 1:
        raise ValueError(f"client learning rate must be in (0, 1], got {learning_rate}")
    X = np.asarray(X, dtype=np.float64)
    centers = np.array(centers, dtype=np.float64, copy=True)
    n = X.shape[0]
    k = centers.shape[0]
    full_batch = batch_size is None or batch_size <= 0 or batch_size >= n
    rng = rng if rng is not None else np.random.default_rng()
    counts = np.zeros(k)
    sumsq = np.zeros_like(centers)
    for _ in range(epochs):
        counts = np.zeros(k)
        sumsq = np.zeros_like(centers)
        if full_batch:
            batches = [X]
        else:
            order = rng.permutation(n)
            batches = [X[order[s : s + batch_size]] for s in range(0, n, batch_size)]
        for batch in batches:
            stats = lloyd_statistics(batch, centers, with_sumsq=True)
            seen = stats.counts > 0
            counts[seen] += stats.counts[seen]
            batch_means = stats.sums[seen] / stats.counts[seen, None]
            step = learning_rate * (stats.counts[seen] / counts[seen])
            centers[seen] += step[:, None] * (batch_means - centers[seen])
            sumsq += stats.sumsq
    return counts, centers, sumsq


@device_task("fedkmeans_train")
def fedkmeans_train(data: DeviceData, arrays: dict, config: dict):
    X = data.require_points()
    incoming = check_centers(X, arrays["centers"])
    batch_size = int(config.get("batch-size", 0))
    epochs = int(config.get("local-epochs", 1))
    rng = np.random.default_rng(int(config.get("seed", 0)))
    counts, centers, sumsq = client_kmeans(
        X,
        incoming,
        epochs=epochs,
        batch_size=batch_size,
        learning_rate=float(config.get("client-lr", 1.0)),
        rng=rng,
    )
    cost = kmeans_cost(X, incoming)
    return (
        {"centers": centers, "counts": counts, "sumsq": sumsq, "cost": np.array([cost])},
        {"num-examples": int(X.shape[0])},
    )
