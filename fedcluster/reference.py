"""The pooled central reference, for reporting only.

When the server can reconstruct the pooled data (generated datasets, or an ``npy-dir`` it
can read in a one-machine simulation) it runs scikit-learn's KMeans (k-means++,
n_init=10) on the pooled points and evaluates the federated centers on the same points,
so the run prints "federated cost vs central cost". The pooled data never leaves the
server process and plays no part in the algorithm.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .datasets import pooled_points
from .lloyd import kmeans_cost


def central_reference(
    config: dict[str, Any], num_clients: int, centers: np.ndarray | None, num_points: int | None = None,
    scaling: Any = None,
) -> dict[str, Any] | None:
    """Pooled central k-means cost beside the federated one, or None when unavailable.

    ``num_points`` is the number of points the federation reported; when the pooled data
    the server can rebuild has a different size, the nodes held something else and no
    reference is given. ``scaling`` (a standardized run, in the units the run clustered
    in: :class:`fedcluster.scaling.Scaling`): the pooled points and ``centers`` (in the
    run's standardized units) are compared after it, as a StandardScaler → KMeans pipeline.
    """
    if centers is None:
        return None
    pooled = pooled_points(config, num_clients)
    if pooled is None:
        return None
    X, _ = pooled
    if scaling is not None:
        X = scaling.apply(X)
    k = centers.shape[0]  # the run's k (a k-range run: the k it chose)
    if X.shape[0] < k or X.shape[1] != centers.shape[1]:
        return None
    if num_points is not None and X.shape[0] != num_points:
        # The nodes did not hold what the server can rebuild (e.g. a deployment whose
        # SuperNodes read their own files, or excluded nodes): no honest reference.
        return None
    from .metrics import central_kmeans

    _, central_total = central_kmeans(X, k, config["seed"], n_init=10)
    federated_total = kmeans_cost(X, centers)
    return {
        "num_points": int(X.shape[0]),
        "central_cost": central_total / X.shape[0],
        "federated_cost": federated_total / X.shape[0],
        "ratio": federated_total / central_total if central_total > 0 else None,
        "how": "scikit-learn KMeans(k-means++, n_init=10) on the pooled points; federated centers evaluated on the same points"
               + ("; both standardized by the run's scaling" if scaling is not None else ""),
    }
