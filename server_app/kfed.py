"""k-FED: one-shot federated clustering.

Dennis, Li & Smith, "Heterogeneity for the Win: One-Shot Federated Clustering" (ICML 2021);
working specification ALGORITHMS.md section 4. One round of communication:

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

import math
from logging import INFO
from typing import Any

import numpy as np
from flwr.common.logger import log

from fedcluster.kfed import kfed_merge

from .base import FederatedStrategy, FederationError, ReplySpec


def default_k_prime(config: dict[str, Any]) -> int:
    """Run-config ``k-prime``, or the paper's rule k' = ⌈√k⌉ when it is 0."""
    return int(config["k-prime"]) or int(math.ceil(math.sqrt(int(config["k"]))))


def collect_device_centers(strategy: FederatedStrategy, phase: str = "kfed-local") -> tuple[list, list, list]:
    """The k-FED device phase: every active node's local centers and counts.

    Works with or without a preceding ``discover_dimension``: the federation's dimension
    is then the most common one among the replies, and nodes with another are excluded.
    Returns ``(nodes, centers, counts)`` lists, one entry per valid device.
    """
    config = strategy.config
    k_prime = default_k_prime(config)
    seeds = {node: int(strategy.rng.integers(2**31)) for node in strategy.active_nodes}
    dimension = "d" if strategy.dimension is not None else None
    replies = strategy.broadcast(
        "kfed_local",
        strategy.active_nodes,
        config={"k-prime": k_prime, "n-init": int(config["kfed-device-restarts"])},
        per_node=lambda node: (None, {"seed": seeds[node]}),
        spec=ReplySpec(shapes={"centers": (None, dimension), "counts": (None,)}, nonnegative=("counts",)),
        phase=phase,
    )
    replies = [r for r in replies if r.arrays["centers"].shape[0] == r.arrays["counts"].shape[0]]
    if not replies:
        raise FederationError("no device returned local centers")
    if strategy.dimension is None:
        dims = np.array([r.arrays["centers"].shape[1] for r in replies])
        values, counts = np.unique(dims, return_counts=True)
        strategy.dimension = int(values[np.argmax(counts)])
        for reply in replies:
            if reply.arrays["centers"].shape[1] != strategy.dimension:
                strategy.exclude(
                    reply.node_id,
                    f"its data has dimension {reply.arrays['centers'].shape[1]}, the federation's is {strategy.dimension}",
                )
        replies = [r for r in replies if r.arrays["centers"].shape[1] == strategy.dimension]
    return (
        [r.node_id for r in replies],
        [r.arrays["centers"] for r in replies],
        [r.arrays["counts"] for r in replies],
    )


def merge_device_centers(strategy: FederatedStrategy, centers: list, counts: list, k: int) -> tuple[np.ndarray, list]:
    """Server steps of k-FED on the collected device centers (clear error when k is too big)."""
    config = strategy.config
    total = sum(c.shape[0] for c in centers)
    if k > total:
        raise FederationError(
            f"k={k} is larger than the {total} local centers the devices returned "
            f"(k-prime={default_k_prime(config)} per device, {len(centers)} devices): raise k-prime or lower k"
        )
    return kfed_merge(
        centers,
        counts,
        k,
        strategy.rng,
        weighting=config["kfed-weighting"],
        to_convergence=bool(config["kfed-to-convergence"]),
        n_init=int(config["kfed-server-starts"]),
    )


class KFed(FederatedStrategy):
    """k-FED (Dennis et al. 2021): one round of communication, farthest-point merge.

    Run-config parameters: ``k``, ``k-prime``, ``kfed-weighting`` (``count`` | ``uniform``),
    ``kfed-to-convergence``, ``kfed-server-starts`` (1 = the paper's single farthest-point
    start), ``kfed-device-restarts`` (1 = the paper's single local run), ``kfed-evaluate``
    (an extra, non-algorithmic round that measures the federated cost of the result).
    """

    name = "kfed"

    def run(self) -> dict[str, Any]:
        k = int(self.config["k"])
        self.begin_round(1)
        nodes, centers, counts = collect_device_centers(self)
        global_centers, assignment = merge_device_centers(self, centers, counts, k)
        self.end_round(devices=len(nodes), device_centers=int(sum(c.shape[0] for c in centers)))
        log(INFO, "[fedcluster] k-FED merged %d device centers from %d devices into k=%d", sum(c.shape[0] for c in centers), len(nodes), k)
        outcome: dict[str, Any] = {
            "centers": global_centers,
            "arrays": {
                "device_centers": np.concatenate(centers),
                "device_counts": np.concatenate(counts),
                "device_nodes": np.concatenate([np.full(c.shape[0], n, dtype=np.uint64) for n, c in zip(nodes, centers)]),
                "device_assignment": np.concatenate([np.asarray(a, dtype=np.int64) for a in assignment]),
            },
            "kfed": {"k_prime": default_k_prime(self.config), "devices": len(nodes)},
        }
        if self.config["kfed-evaluate"]:
            replies = self.broadcast(
                "lloyd_stats",
                self.active_nodes,
                arrays={"centers": global_centers},
                spec=ReplySpec(shapes={"sums": (k, "d"), "counts": (k,), "cost": (1,)}, nonnegative=("counts", "cost")),
                phase="evaluation",
            )
            total = float(sum(r.arrays["cost"][0] for r in replies))
            points = int(sum(r.arrays["counts"].sum() for r in replies))
            outcome["final"] = {"cost": total / points, "total_cost": total, "num_points": points}
            log(INFO, "[fedcluster] k-FED cost per point %.6g on %d points", total / points, points)
        return outcome
