"""k-FED: one-shot federated clustering.

Dennis, Li & Smith, "Heterogeneity for the Win: One-Shot Federated Clustering" (ICML 2021);
working specification docs/ALGORITHMS.md section 4. One round of communication:

1. every device runs the Awasthi–Sheffet local k'-means on its own data and sends its k'
   local centers with their counts (``kfed_local``; one message of k'·d floats up);
2. the server picks the centers of one seeded device, adds the device center farthest from
   the chosen set until it has k, and runs Lloyd over all device centers from there
   (count-weighted; one round as in the paper or to convergence as in the authors' code;
   ``fedcluster.algorithms.kfed.model.kfed_merge``);
3. the induced clustering: a point takes the global cluster of its local center.

Devices away, late or connected since step 1 was sent are asked again in up to three
round trips (still one message of local centers each), and so are the devices away or
late for the evaluation; a device still absent then, or whose reply was dropped, is simply
absent. A device that was not part of the run joins later for free: it runs step 1 on its own data and maps its local
centers to the
nearest stored global centers (``fedcluster-kfed-assign``), O(k·k') distances, nobody
else involved. The run stores ``centers.npy`` (k x d), ``device_centers.npy`` (all device
centers stacked), ``device_counts.npy``, ``device_nodes.npy`` (the node each row came
from) and ``device_assignment.npy`` (the global cluster of each device center).

k' per device: run-config ``k-prime``; 0 (default) lets every device choose from its own
data, up to k (``fedcluster.algorithms.kfed.model.auto_local_means``); the paper's rule is ⌈√k⌉. A SuperNode
may set its own with ``--node-config 'k-prime=4'``. With ``kfed-evaluate`` the run reports
how much the induced clustering costs over nearest-center labels of the same centers
(``kfed.induced_over_nearest``) and warns when a given k' was too small.
"""

from __future__ import annotations

import statistics
from logging import INFO
from typing import Any

import numpy as np
from flwr.common.logger import log

from fedcluster.algorithms.kfed.model import (
    TooFewCenters,
    default_k_prime,
    induced_over_nearest,
    kfed_merge,
    left_out_by_node,
    score_range,
    score_violation,
)
from fedcluster.points import duplicate_warning

from fedcluster.server.base import FederatedStrategy, FederationError, sum_arrays, sum_metric
from fedcluster.server.messages import Inconsistent


# A given k-prime is called too small when k-FED's induced clustering costs this much more
# than nearest-center labels of the same global centers (chosen with bench/real_data.py).
INDUCED_WARNING = 1.2


def collect_device_centers(
    strategy: FederatedStrategy, phase: str = "kfed-local", costs: list | None = None
) -> tuple[list, list, list]:
    """The k-FED device phase: every active node's local centers and counts.

    Works with or without a preceding ``discover_dimension``: the federation's dimension
    is then the one most replies have, and nodes with another are excluded. Devices away
    when it is sent, late, or connected since are asked again (``ask_again``): each still
    sends its local centers once.
    Returns ``(nodes, centers, counts)`` lists, one entry per valid device.
    """
    config = strategy.config
    request = dict(
        task="kfed_local",
        config={"k-prime": config.k_prime, "k": config.k, "n-init": config.kfed_device_restarts},
        seeded=True,
        phase=phase,
    )
    replies = strategy.broadcast(**request, nodes=strategy.active_nodes)
    if not replies:
        raise FederationError(f"phase {phase!r}: no device returned local centers (every one away)")
    if strategy.members.dimension is None:
        replies = strategy.vote_dimension(replies, lambda reply: reply.arrays["centers"].shape[1])
    replies = strategy.ask_again(request, replies)  # devices away, late or newly connected: one shot each
    if costs is not None:
        costs.extend(float(r.arrays["cost"][0]) for r in replies)
    return (
        [r.node_id for r in replies],
        [r.arrays["centers"] for r in replies],
        [r.arrays["counts"] for r in replies],
    )


def merge_device_centers(
    strategy: FederatedStrategy, centers: list, counts: list, k: int, candidates: int = 1
) -> tuple:
    """Server steps of k-FED on the collected device centers (clear error when k is too big):
    global centers, per-device assignment, and the mask of the device centers the merge kept
    (``kfed-min-devices``); with ``candidates`` > 1, ``([(centers, assignment), ...], kept)``:
    the distinct groupings, cheapest on the device centers first."""
    config = strategy.config
    try:
        return kfed_merge(
            centers,
            counts,
            k,
            strategy.rng,
            weighting=config.kfed_weighting,
            to_convergence=config.kfed_to_convergence,
            n_init=config.kfed_server_starts,
            min_devices=config.kfed_min_devices,
            return_kept=True,
            candidates=candidates,
        )
    except TooFewCenters as exc:
        raise FederationError(
            f"{exc}; k-prime={default_k_prime(config['k'], config['k-prime'])} per device, {len(centers)} devices "
            "replied"
        ) from None


# kfed-evaluate: how many of the merge's distinct groupings the devices score (chosen with
# bench/real_data.py).
MERGE_CANDIDATES = 10
# The guarded groupings (KFed.guarded_groupings) run this share of kfed-server-starts: they
# are a fallback against a hostile device, not the best merge of an honest run.
GUARDED_SHARE = 10


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
        k = self.config.k
        if self.config.standardize:  # the per-feature moments first: one more round trip
            self.discover_dimension()
        self.begin_round(1)
        costs: list[float] = []
        nodes, centers, counts = collect_device_centers(self, costs=costs)
        scored = self.config.kfed_evaluate
        if scored:  # the merge's cheapest distinct groupings: the devices choose among them (below)
            merged, kept, guarded = self.merges(centers, counts, k)
            global_centers, assignment = merged[0]
        else:
            global_centers, assignment, kept = merge_device_centers(self, centers, counts, k)
        k_primes = [int(c.shape[0]) for c in centers]
        self.end_round(devices=len(nodes), device_centers=int(sum(k_primes)))
        log(
            INFO,
            "[fedcluster] k-FED merged %d device centers from %d devices into k=%d (k' per device %d..%d)",
            int(sum(k_primes)),
            len(nodes),
            k,
            min(k_primes),
            max(k_primes),
        )
        if scored:
            # kfed-evaluate: the candidates are scored on the devices' own points in the
            # evaluation round; the cheapest there is the result, its cost exact.
            (nodes, centers, counts, costs), (merged, kept, guarded), candidate_costs, points = self.scored_merges(
                (nodes, centers, counts, costs), (merged, kept, guarded), k
            )
            chosen = int(np.argmin(candidate_costs))
            global_centers, assignment = merged[chosen]
            total = float(candidate_costs[chosen])
        node_of_row = np.concatenate([np.full(c.shape[0], n, dtype=np.uint64) for n, c in zip(nodes, centers)])
        left_out = left_out_by_node(node_of_row, kept)
        if left_out:
            log(
                INFO,
                "[fedcluster] k-FED left out %d device centers of %d devices: their global clusters gathered "
                "fewer than kfed-min-devices=%d devices",
                int((~kept).sum()),
                len(left_out),
                self.config.kfed_min_devices,
            )
        k_primes = [int(c.shape[0]) for c in centers]
        outcome: dict[str, Any] = {
            "centers": global_centers,
            "arrays": {
                "device_centers": np.concatenate(centers),
                "device_counts": np.concatenate(counts),
                "device_nodes": node_of_row,
                "device_assignment": np.concatenate([np.asarray(a, dtype=np.int64) for a in assignment]),
            },
            "kfed": {
                "k_prime": self.config.k_prime or "chosen by each device, up to k",
                "device_k_prime": {"min": min(k_primes), "median": statistics.median(k_primes), "max": max(k_primes)},
                "devices": len(nodes),
                "left_out": left_out,
            },
        }
        if scored:
            outcome["final"] = {"cost": total / points, "total_cost": total, "num_points": points}
            outcome["kfed"]["candidates"] = {
                "scored": len(merged),
                "chosen": chosen,
                "costs": (candidate_costs / points).tolist(),
                "guarded": len(guarded),
            }
            if chosen >= len(merged) - len(guarded):
                log(INFO, "[fedcluster] k-FED: the devices chose a guarded grouping (capped counts)")
            ratio = induced_over_nearest(centers, counts, costs, assignment, global_centers, total)
            outcome["kfed"]["induced_over_nearest"] = ratio
            log(
                INFO,
                "[fedcluster] k-FED cost per point %.6g on %d points (induced clustering %.4g× that)",
                total / points,
                points,
                ratio,
            )
            given = self.config.k_prime
            if given and given < k and ratio > INDUCED_WARNING:
                self.warn(
                    f"k-prime={given} looks too small for how these devices' data are clustered: k-FED's induced "
                    f"clustering (each point takes its local center's cluster) costs {ratio:.2f}× what the same "
                    f"centers cost with every point at its nearest, so local clusters span several global ones. "
                    f"Leave k-prime unset (each device then chooses, up to k={k}) or raise it"
                )
        duplicates = duplicate_warning(global_centers)
        if duplicates:
            self.warn(duplicates)
        return outcome

    def scored_merges(self, devices: tuple[list, list, list, list], merges: tuple, k: int) -> tuple:
        """The merges' candidates scored by the devices (:meth:`score_merges`). A device
        whose scores contradict its local centers has lied in one or the other: it leaves
        the run, and the merges are made again without its centers. Returns the devices
        kept ``(nodes, centers, counts, costs)``, their merges ``(merged, kept, guarded)``,
        the candidates' total costs and the points that scored them."""
        nodes, centers, counts, costs = devices
        merged, kept, guarded = merges
        while True:
            stacked = np.stack([c for c, _ in merged])
            declared = {node: (c, n, cost) for node, c, n, cost in zip(nodes, centers, counts, costs)}

            def within_declaration(reply) -> str | None:  # a device's costs bounded by its own local summary
                if reply.node_id not in declared:
                    return None
                floors, bounds = score_range(*declared[reply.node_id], stacked)
                reason = score_violation(reply.arrays["costs"], bounds, floors)
                return Inconsistent(reason) if reason else None

            candidate_costs, points = self.score_merges(stacked, within_declaration)
            staying = [i for i, node in enumerate(nodes) if node not in self.members.excluded]
            if len(staying) == len(nodes):
                return (nodes, centers, counts, costs), (merged, kept, guarded), candidate_costs, points
            log(
                INFO,
                "[fedcluster] k-FED: merging again without the local centers of %d device(s) whose "
                "scores contradict them",
                len(nodes) - len(staying),
            )
            nodes, centers, counts, costs = ([values[i] for i in staying] for values in (nodes, centers, counts, costs))
            if not nodes:
                raise FederationError("phase 'evaluation': every device's scores contradict its local centers")
            merged, kept, guarded = self.merges(centers, counts, k)

    def merges(self, centers: list, counts: list, k: int) -> tuple[list, np.ndarray, list]:
        """The candidates the devices score: the merge's cheapest distinct groupings and
        the guarded ones (:meth:`guarded_groupings`); the mask of the device centers the
        run's merge kept; the guarded candidates."""
        merged, kept = merge_device_centers(self, centers, counts, k, candidates=MERGE_CANDIDATES)
        guarded = self.guarded_groupings(centers, counts, k)
        return merged + guarded, kept, guarded

    def score_merges(self, stacked: np.ndarray, check) -> tuple[np.ndarray, int]:
        """Every device's total cost of every candidate (``score_candidates``) and their
        points; the devices away or late are asked again (``ask_again``): the choice must
        be made on every merged device's points, else a merge that misses the clusters of
        the devices away looks cheapest on the others. (A device that stays silent is left
        out, never counted by what it declared: a liar could then inflate it.)"""
        request = dict(
            task="score_candidates",
            arrays={"candidates": stacked},
            sizes={"m": stacked.shape[0], "k": stacked.shape[1]},
            phase="evaluation",
            check=check,
        )
        replies = self.ask_again(request, self.broadcast(**request, nodes=self.active_nodes), admit=False)
        if not replies:
            raise FederationError(
                "phase 'evaluation': no device answered (every one away): the merges' costs are unknown"
            )
        return sum_arrays(replies, "costs"), int(sum_metric(replies))

    def guarded_groupings(self, centers: list, counts: list, k: int) -> list[tuple[np.ndarray, list]]:
        """Two more candidates for the devices to score, merged as if the robust options
        were on: capped counts (no device weighs more than the median one), and capped
        counts with clusters of at least two devices. A device that inflates its counts or
        sends a far center steers the plain merge; the other devices' points then find the
        guarded grouping cheaper. An honest run loses nothing: the devices keep the cheapest
        candidate, and these are only more of them. (Turned on as defaults these options
        cost honest runs on real data: docs/results/real-data-robust-options.md.)"""
        chosen = (self.config.kfed_weighting, self.config.kfed_min_devices)
        out = []
        for min_devices in (1, 2):
            if chosen == ("capped-count", min_devices):
                continue  # the run's own merge is this one
            try:
                found, assignment, _ = kfed_merge(
                    centers,
                    counts,
                    k,
                    self.rng,
                    weighting="capped-count",
                    to_convergence=self.config.kfed_to_convergence,
                    n_init=max(1, self.config.kfed_server_starts // GUARDED_SHARE),
                    min_devices=min_devices,
                    return_kept=True,
                )
            except TooFewCenters:
                continue  # fewer clusters shared by two devices than k: no such grouping
            out.append((found, assignment))
        return out
