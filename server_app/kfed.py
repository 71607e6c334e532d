"""k-FED: one-shot federated clustering.

Dennis, Li & Smith, "Heterogeneity for the Win: One-Shot Federated Clustering" (ICML 2021);
working specification docs/ALGORITHMS.md section 4. One round of communication:

1. every device runs the Awasthi–Sheffet local k'-means on its own data and sends its k'
   local centers with their counts (``kfed_local``; one message of k'·d floats up);
2. the server picks the centers of one seeded device, adds the device center farthest from
   the chosen set until it has k, and runs Lloyd over all device centers from there
   (count-weighted; one round as in the paper or to convergence as in the authors' code;
   ``fedcluster.kfed.kfed_merge``);
3. the induced clustering: a point takes the global cluster of its local center.

Devices that fail or time out are simply absent. A device that was not part of the run
joins later for free: it runs step 1 on its own data and maps its local centers to the
nearest stored global centers (``fedcluster-kfed-assign``), O(k·k') distances, nobody
else involved. The run stores ``centers.npy`` (k x d), ``device_centers.npy`` (all device
centers stacked), ``device_counts.npy``, ``device_nodes.npy`` (the node each row came
from) and ``device_assignment.npy`` (the global cluster of each device center).

k' per device: run-config ``k-prime`` (0 = the paper's rule ⌈√k⌉); a SuperNode may
override it with ``--node-config 'k-prime=4'``.
"""

from __future__ import annotations

from logging import INFO
from typing import Any

import numpy as np
from flwr.common.logger import log

from fedcluster.kfed import TooFewCenters, default_k_prime, kfed_merge, left_out_by_node

from .base import FederatedStrategy, FederationError


def collect_device_centers(strategy: FederatedStrategy, phase: str = "kfed-local") -> tuple[list, list, list]:
    """The k-FED device phase: every active node's local centers and counts.

    Works with or without a preceding ``discover_dimension``: the federation's dimension
    is then the one most replies have, and nodes with another are excluded.
    Returns ``(nodes, centers, counts)`` lists, one entry per valid device.
    """
    config = strategy.config
    replies = strategy.broadcast(
        "kfed_local",
        strategy.active_nodes,
        config={"k-prime": default_k_prime(config["k"], config["k-prime"]), "n-init": config["kfed-device-restarts"]},
        seeded=True,
        phase=phase,
    )
    if not replies:
        raise FederationError("no device returned local centers")
    if strategy.dimension is None:
        replies = strategy.vote_dimension(replies, lambda reply: reply.arrays["centers"].shape[1])
    return (
        [r.node_id for r in replies],
        [r.arrays["centers"] for r in replies],
        [r.arrays["counts"] for r in replies],
    )


def merge_device_centers(strategy: FederatedStrategy, centers: list, counts: list, k: int) -> tuple[np.ndarray, list, np.ndarray]:
    """Server steps of k-FED on the collected device centers (clear error when k is too big):
    global centers, per-device assignment, and the mask of the device centers the merge kept
    (``kfed-min-devices``)."""
    config = strategy.config
    try:
        return kfed_merge(
            centers,
            counts,
            k,
            strategy.rng,
            weighting=config["kfed-weighting"],
            to_convergence=config["kfed-to-convergence"],
            n_init=config["kfed-server-starts"],
            min_devices=config["kfed-min-devices"],
            return_kept=True,
        )
    except TooFewCenters as exc:
        raise FederationError(
            f"{exc}; k-prime={default_k_prime(config['k'], config['k-prime'])} per device, {len(centers)} devices replied"
        ) from None


class KFed(FederatedStrategy):
    """k-FED (Dennis et al. 2021): one round of communication, farthest-point merge.

    Run-config parameters: ``k``, ``k-prime``, ``kfed-weighting`` (``count`` | ``uniform`` |
    ``capped-count``), ``kfed-min-devices`` (devices a global cluster needs, 1 = the paper),
    ``kfed-to-convergence``, ``kfed-server-starts`` (1 = the paper's single farthest-point
    start), ``kfed-device-restarts`` (1 = the paper's single local run), ``kfed-evaluate``
    (an extra, non-algorithmic round that measures the federated cost of the result).
    """

    name = "kfed"

    def run(self) -> dict[str, Any]:
        k = self.config["k"]
        self.begin_round(1)
        nodes, centers, counts = collect_device_centers(self)
        global_centers, assignment, kept = merge_device_centers(self, centers, counts, k)
        sent = int(sum(c.shape[0] for c in centers))
        node_of_row = np.concatenate([np.full(c.shape[0], n, dtype=np.uint64) for n, c in zip(nodes, centers)])
        left_out = left_out_by_node(node_of_row, kept)
        if left_out:
            log(INFO, "[fedcluster] k-FED left out %d device centers of %d devices: their global clusters gathered "
                "fewer than kfed-min-devices=%d devices", int((~kept).sum()), len(left_out), self.config["kfed-min-devices"])
        self.end_round(devices=len(nodes), device_centers=sent)
        log(INFO, "[fedcluster] k-FED merged %d device centers from %d devices into k=%d", sent, len(nodes), k)
        outcome: dict[str, Any] = {
            "centers": global_centers,
            "arrays": {
                "device_centers": np.concatenate(centers),
                "device_counts": np.concatenate(counts),
                "device_nodes": node_of_row,
                "device_assignment": np.concatenate([np.asarray(a, dtype=np.int64) for a in assignment]),
            },
            "kfed": {"k_prime": default_k_prime(k, self.config["k-prime"]), "devices": len(nodes), "left_out": left_out},
        }
        if self.config["kfed-evaluate"]:
            total, points = self.evaluate(global_centers)
            outcome["final"] = {"cost": total / points, "total_cost": total, "num_points": points}
            log(INFO, "[fedcluster] k-FED cost per point %.6g on %d points", total / points, points)
        return outcome
