"""The device kernels of this algorithm's tasks (``protocol.TASKS``): what runs on a
device, on its own points, NumPy only. The math they share with the server is in
:mod:`.model`."""

from __future__ import annotations

import numpy as np

from fedcluster.kernel import DeviceData, device_task
from fedcluster.lloyd import assign
from fedcluster.lloyd import kmeans
from fedcluster.lloyd import kmeans_cost
from fedcluster.shared_kernels import matching_dimension
from fedcluster.task import named

from .model import client_kmeans, client_steps
from .protocol import TASKS


# ------------------------------------------------------------------------ device tasks
@device_task(named(TASKS, "fedkmeans_train"))
def fedkmeans_train(data: DeviceData, arrays: dict, config: dict):
    """ClientKMeans from every set of global centers (m, k, d) in the request; per set its
    counts, updated centers, scatters and the cost of the centers received."""
    X = data.require_points()
    incoming = matching_dimension(X, arrays["centers"])
    one_pass = config["local-epochs"] == 1 and (config["batch-size"] <= 0 or config["batch-size"] >= X.shape[0])
    if one_pass:  # one full batch: the step's own pass fixes the cost of the centers received
        counts, centers, scatter, cost = client_steps(X, incoming, config["client-lr"])
        return {"centers": centers, "counts": counts, "scatter": scatter, "cost": cost}, {
            "num-examples": int(X.shape[0])
        }
    rng = np.random.default_rng(config["seed"])
    out = {
        "centers": np.empty_like(incoming),
        "counts": np.empty(incoming.shape[:2]),
        "scatter": np.empty_like(incoming),
        "cost": np.empty(incoming.shape[0]),
    }
    for s, centers in enumerate(incoming):
        out["counts"][s], out["centers"][s], out["scatter"][s] = client_kmeans(
            X,
            centers,
            epochs=config["local-epochs"],
            batch_size=config["batch-size"],
            learning_rate=config["client-lr"],
            rng=rng,
        )
        out["cost"][s] = kmeans_cost(X, centers)
    return out, {"num-examples": int(X.shape[0])}


@device_task(named(TASKS, "local_summary"))
def local_summary(data: DeviceData, arrays: dict, config: dict):
    X = data.require_points()
    n = X.shape[0]
    if config["k"] >= n:  # every point can be its own center: the distinct points, cost 0
        centers, counts = exact_summary(X)
    else:
        rng = np.random.default_rng(config["seed"])
        centers, _ = kmeans(X, config["k"], rng, n_init=config["n-init"], max_iter=100)
        labels, _ = assign(X, centers)
        counts = np.bincount(labels, minlength=config["k"]).astype(np.float64)
    keep = counts >= config["min-count"]
    return {"centers": centers[keep], "counts": counts[keep]}, {"num-examples": int(n)}


def exact_summary(X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The k-means of ``X`` with at least as many clusters as points: each distinct point its
    own center (in sorted order), its count how often it occurs; the cost is 0 and no
    restart can do better."""
    centers, counts = np.unique(np.asarray(X, dtype=np.float64), axis=0, return_counts=True)
    return centers, counts.astype(np.float64)
