"""The device kernels of this algorithm's tasks (``protocol.TASKS``): what runs on a
device, on its own points, NumPy only. The math they share with the server is in
:mod:`.model`."""

from __future__ import annotations

from typing import Any

import numpy as np

from fedcluster.kernel import DeviceData, device_task
from fedcluster.task import named

from .model import auto_local_means, local_kprime_means
from .protocol import TASKS


@device_task(named(TASKS, "kfed_local"))
def kfed_local(data: DeviceData, arrays: dict[str, np.ndarray], config: dict[str, Any]):
    """Device task ``kfed_local``: k-FED step 1 (local k'-means) on this device's points.

    Config (declared in :mod:`fedcluster.protocol`, parsed before this runs): ``k-prime``
    (0: the device chooses, :func:`auto_local_means`, up to ``k``), ``k``, ``seed``,
    ``n-init`` (device restarts; 1 = the paper), ``seeding`` (``core`` = the paper) and
    ``max-iter``. Returns the local centers, their counts and the local k'-means cost.
    """
    A = data.require_points()
    k_prime = config["k-prime"]
    # A SuperNode may set its own k' (--node-config 'k-prime=4'); it wins over the run's.
    node_k_prime = data.extra.get("node-config", {}).get("k-prime")
    if node_k_prime not in (None, "", 0):
        try:
            k_prime = int(node_k_prime)
        except (TypeError, ValueError):
            raise ValueError(f"this node's node-config k-prime must be a whole number, got {node_k_prime!r}") from None
        if k_prime < 1:
            raise ValueError(f"this node's node-config k-prime must be at least 1, got {node_k_prime!r}")
    options = dict(max_iter=config["max-iter"], n_init=config["n-init"], seeding=config["seeding"])
    rng = np.random.default_rng(config["seed"])
    if k_prime == 0:
        centers, counts, labels = auto_local_means(A, config["k"], rng, **options)
    else:
        centers, counts, labels = local_kprime_means(A, k_prime, rng, **options)
    cost = float(np.sum((A - centers[labels]) ** 2)) if A.shape[0] else 0.0
    return {"centers": centers, "counts": counts, "cost": np.array([cost])}, {"num-examples": int(A.shape[0])}
