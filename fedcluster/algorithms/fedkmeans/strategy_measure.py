"""What FedKMeans measures of its centers and which it returns: every round's cost of the
centers the devices received (exact when it covers every active device), the pool of the
cheapest estimates under partial participation, the final evaluation (held against what
each device stated in training, with the recovery from a liar it catches), and the best
centers measured. A mixin of :class:`fedcluster.algorithms.fedkmeans.strategy.FedKMeans`."""

from __future__ import annotations

from logging import INFO
from typing import Any

import numpy as np
from flwr.common.logger import log

from fedcluster.algorithms.fedkmeans.model import (
    sets_to_check,
    CenterSet,
    cheapest_estimates,
    evaluation_statement,
    implied_means,
    lloyd_step,
    partitions_violations,
    scores_violation,
    stated_in_reply,
    train_cost_mismatch,
    whole_partition,
)
from fedcluster.bounds import moments_violation, voronoi_violation
from fedcluster.cell_moments import cell_moments_violation

from fedcluster.server.base import FederationError, Reply, sum_arrays, sum_metric
from fedcluster.server.messages import BatchCheck, Inconsistent

RECOVERY_STEPS, RECOVERY_GAIN = 5, 1e-6  # after a liar is caught at the end: Lloyd steps while they gain
ESTIMATED_POOL = 4  # partial participation: the centers with the cheapest sampled estimates, scored at the end


class FedKMeansMeasure:
    """Measurements and the best centers (state: ``estimated``, ``best_seen``, ``sets``)."""

    def measure(
        self, center_set: "CenterSet", replies: list[Reply], measured: tuple[float, int], measuring: bool, t: int
    ) -> dict[str, Any]:
        """What round ``t`` measured of the centers ``center_set`` received (Γ_{t−1}): their
        cost per point over the nodes that reported it and whether that was every active
        node (``exact``: then it may become the best centers measured, and it decides
        whether a re-seed of the previous round stays)."""
        sampled_cost = float(sum(float(r.arrays["cost"][0]) for r in replies))
        sampled_points = int(sum_metric(replies))
        cost, points = sampled_cost + measured[0], sampled_points + measured[1]
        active = self.members.active_points()
        exact = measuring and points > 0 and points >= active
        report = {
            "cost": cost / max(points, 1),
            "points": points,
            "exact": exact,
            "sampled_cost": sampled_cost / max(sampled_points, 1),
        }
        center_set.cost = report["cost"]
        if exact:
            self.consider_best(report["cost"], t - 1, center_set, points)
        elif sampled_points > 0 and self.config.fraction < 1.0 and not self.memory_bounds:
            self.estimated = cheapest_estimates(
                self.estimated,
                (report["sampled_cost"], t - 1, center_set.index, center_set.centers.copy()),
                ESTIMATED_POOL,
            )
        return report

    def bound_unmeasured(self, live: list, reports: list[dict[str, Any]], t: int) -> None:
        """A round that measured only a sample ranks its sets by what the server knows of
        every node without asking: the memory bound of each set's new centers
        (:meth:`fedcluster.algorithms.fedkmeans.model.CenterSet.memory_bound`, an upper bound of their cost
        on every node in memory). It replaces the sampled estimate in ``reports`` and enters
        the pool the final evaluation scores."""
        if not self.memory_bounds:
            return
        for center_set, report in zip(live, reports):
            bound = None if report["exact"] else center_set.memory_bound()
            if bound is not None:
                report["cost"] = center_set.cost = bound
                entry = (bound, t, center_set.index, center_set.centers.copy())
                self.estimated = cheapest_estimates(self.estimated, entry, ESTIMATED_POOL)

    def final_evaluation(self, last: "CenterSet", phase: str = "final-evaluation") -> tuple[float, int, list[Reply]]:
        """The last centers' cost on every active node (``lloyd_stats``) and, in the same
        round trip, under partial participation, every node's cost of the centers that the
        sampled devices' replies estimated cheapest (:attr:`estimated`): an exact measurement
        of each, which may make it the best (:meth:`consider_best`). With nodes away, the
        best centers measured so far cover points the final evaluation cannot: they are
        scored again beside the last ones, on the same points. Every reply is held against
        the partitions its device stated in training (:meth:`statement_check`). Returns the
        total cost, the points and the ``lloyd_stats`` replies."""
        k = last.centers.shape[0]
        requests = [
            dict(
                task="lloyd_stats",
                nodes=self.active_nodes,
                arrays={"centers": last.centers},
                sizes={"k": k},
                phase=phase,
                check=self.statement_check(last.centers),
            )
        ]
        pool = [entry for entry in self.estimated if entry[3] is not None]
        rescore = self.best_seen is not None and len(self.present(self.active_nodes)) < len(self.active_nodes)
        if rescore:
            pool.append(self.best_seen[:3] + (self.best_seen[4],))
        if pool:
            candidates = np.stack([entry[3] for entry in pool])
            requests.append(
                dict(
                    task="score_candidates",
                    nodes=self.active_nodes,
                    arrays={"candidates": candidates},
                    sizes={"m": len(pool), "k": k},
                    phase="final-candidates",
                    check=self.statement_check(candidates, scores=True),
                )
            )
        got = self.broadcast_together(*requests)
        total_cost, num_points = float(sum_arrays(got[0], "cost")[0]), int(sum_arrays(got[0], "counts").sum())
        if pool and int(sum_metric(got[1])) == num_points:  # over the same points: comparable
            self.best_seen = None if rescore else self.best_seen  # measured again below, on these points
            costs = sum_arrays(got[1], "costs")
            for (_, round_number, index, centers), cost in zip(pool, costs):
                self.consider_best(float(cost) / num_points, round_number, self.sets[index], num_points, centers)
        return total_cost, num_points, got[0]

    def recover(self, last: "CenterSet", replies: list[Reply], caught: list[int]) -> tuple[float, int]:
        """The final evaluation proved ``caught`` lied in training (its evaluation contradicts
        its training replies), so what its statistics did to the centers is undone by Lloyd
        steps from the other nodes' evaluation replies (:func:`fedcluster.algorithms.fedkmeans.model.lloyd_step`),
        each measured in one more round trip, while it lowers the cost (at most
        ``RECOVERY_STEPS``). Earlier measurements counted the liar's points: no longer
        comparable. Returns the cost and points of the centers kept, which become ``last``'s."""
        self.best_seen, self.estimated = None, []
        log(
            INFO,
            "[fedcluster] the final evaluation caught node(s) %s lying in training: Lloyd steps without them",
            ", ".join(map(str, caught)),
        )
        replies = [r for r in replies if r.node_id not in caught]  # caught by its scores, its lloyd_stats passed
        if not replies:
            raise FederationError(f"the final evaluation excluded node(s) {caught}: no other node's evaluation is left")
        total_cost, num_points = float(sum_arrays(replies, "cost")[0]), int(sum_arrays(replies, "counts").sum())
        before, steps = total_cost / num_points, 0
        while steps < RECOVERY_STEPS:
            kept = last.centers
            last.centers = lloyd_step(
                np.stack([r.arrays["counts"] for r in replies]),
                np.stack([r.arrays["sums"] for r in replies]),
                kept,
                self.config.aggregation,
                self.config.trim_fraction,
            )
            cost, points, stepped = self.final_evaluation(last, phase="recovery-evaluation")
            if (
                points != num_points or cost > total_cost
            ):  # costlier, or not on the same points: keep the centers before
                last.centers = kept
                break
            steps, gain, total_cost, replies = steps + 1, total_cost - cost, cost, stepped
            if gain <= RECOVERY_GAIN * cost:
                break
        self.recovered = {
            "caught": caught,
            "cost_before": before,
            "cost_after": total_cost / num_points,
            "steps": steps,
        }
        log(
            INFO,
            "[fedcluster] recovery: cost per point %.6g -> %.6g in %d Lloyd step(s)",
            before,
            total_cost / num_points,
            steps,
        )
        return total_cost, num_points

    def statement_check(self, centers: np.ndarray, scores: bool = False) -> BatchCheck:
        """An evaluation reply (``lloyd_stats`` of ``centers``, or ``score_candidates`` of the
        (m, k, d) ``centers`` with ``scores``) must fit the partition of its points the
        device's last accepted training reply stated and its declared moments
        (:func:`fedcluster.algorithms.fedkmeans.model.partitions_violations`, :func:`scores_violation`; a
        :class:`BatchCheck`: a pull's replies together): an
        honest device's nearest-center cost of fixed points never exceeds what any other
        partition of them costs. A contradiction proves a liar, which leaves the run."""

        def many(replies: list[Reply]) -> list[str | None]:
            declared = [self.members.declared.get(r.node_id) for r in replies]
            earlier = [self.stated_partitions.get(r.node_id, []) for r in replies]
            wholes = [whole_partition(one) for one in declared]
            reasons: list[str | None] = [None] * len(replies)
            if scores:
                for r, reply in enumerate(replies):
                    reasons[r] = scores_violation(reply.arrays["costs"], centers, earlier[r], wholes[r])
            else:  # every reply's evaluation against its own history, all in the same few array passes
                stated = [
                    evaluation_statement(reply.arrays, centers, declared[r], earlier[r])
                    for r, reply in enumerate(replies)
                ]
                asked = [r for r in range(len(replies)) if stated[r]]
                found = partitions_violations(
                    [([stated[r]], earlier[r], wholes[r]) for r in asked], names=[["its evaluation"]] * len(asked)
                )
                for r, reason in zip(asked, found):
                    reasons[r] = reason
            return [Inconsistent(reason) if reason else None for reason in reasons]

        return BatchCheck(many)

    def consider_best(
        self, cost: float, round_number: int, center_set: "CenterSet", points: int, centers: np.ndarray | None = None
    ) -> None:
        """Keep the lowest cost per point with its round, set and centers, among
        measurements over as many points as the best one: a round where a node's reply was
        lost covers fewer points and is not comparable (it could look cheaper than it is).
        ``centers``: the centers measured (default: the set's current ones)."""
        best = self.best_seen  # a tie goes to the later measurement: the last centers, unless others are cheaper
        tie = getattr(self, "cost_tie", 0.0)  # costs within rounding of the data's spread are one cost
        if best is None or points > best[3] or (points == best[3] and cost <= best[0] * (1 + 1e-12) + tie):
            measured = center_set.centers if centers is None else centers
            self.best_seen = (cost, round_number, center_set.index, points, measured.copy())

    def cost_check(self, incoming: np.ndarray, sent: dict[str, Any]) -> BatchCheck | None:
        """Full batch, one local epoch (else no check; ``incoming``: the (m, k, d) centers
        sent with the client config ``sent``): a training reply's costs are the ones its
        other arrays imply (``train_cost_mismatch``), each cluster's mean lies in its center's Voronoi cell and its
        scatter within what the cell can hold
        (``cell_moments_violation``), its sums add up to its declared moments, and all its
        partitions, with its last reply's, could come from one fixed set of points
        (``partitions_violation``). A :class:`BatchCheck`: the replies of a pull are
        screened and their partitions compared together (``sets_to_check``,
        ``partitions_violations``), each against its own node's declarations and history."""
        if sent["batch-size"] != 0 or sent["local-epochs"] != 1:
            return None
        beta = sent["client-lr"]
        m = incoming.shape[0]

        def set_reason(a: dict[str, np.ndarray], s: int, declared) -> str | None:
            """Set ``s`` of one reply, which the screen could not pass: the checks themselves."""
            reason = train_cost_mismatch(
                incoming[s], a["centers"][s], a["counts"][s], a["scatter"][s], float(a["cost"][s]), beta
            )
            means = implied_means(incoming[s], a["centers"][s], beta)
            reason = reason or voronoi_violation(means, a["counts"][s], incoming[s])
            if not reason and declared is not None:
                reason = moments_violation(
                    a["counts"][s][:, None] * means,
                    a["scatter"][s],
                    declared,
                    counts=a["counts"][s],
                    about=[incoming[s]],
                )
            return (f"set {s}: {reason}" if m > 1 else reason) if reason else None

        def screened(replies: list[Reply], declared: list, reasons: list) -> None:
            """Every reply's sets screened at once; the sets it cannot pass checked one by one."""
            a = {f: np.concatenate([r.arrays[f] for r in replies]) for f in ("centers", "counts", "scatter", "cost")}
            every = np.concatenate([incoming] * len(replies))
            flagged = sets_to_check(
                every,
                a["centers"],
                a["counts"],
                a["scatter"],
                a["cost"],
                beta,
                [one for one in declared for _ in range(m)],
            )
            for flat in flagged:  # each reply's in order: its first refused set names it
                r, s = divmod(int(flat), m)
                if reasons[r] is None:
                    reasons[r] = set_reason(replies[r].arrays, s, declared[r])

        def in_cells(reply: Reply, declared) -> str | None:
            """Every set of one reply at once: cheap certificates pass most clusters together."""
            b = reply.arrays
            means = np.stack([implied_means(incoming[s], b["centers"][s], beta) for s in range(m)])
            found = cell_moments_violation(means, b["counts"], b["scatter"], incoming, declared.low, declared.high)
            return (f"set {found[0]}: {found[1]}" if m > 1 else found[1]) if found else None

        def many(replies: list[Reply]) -> list[str | None]:
            declared = [self.members.declared.get(r.node_id) for r in replies]
            reasons: list[str | None] = [None] * len(replies)
            screened(replies, declared, reasons)
            for r, reply in enumerate(replies):
                if reasons[r] is None and declared[r] is not None:
                    reasons[r] = in_cells(reply, declared[r])
            left = [r for r in range(len(replies)) if reasons[r] is None]
            stated = {r: stated_in_reply(incoming, replies[r].arrays, beta) for r in left}
            earlier = {r: self.stated_partitions.get(replies[r].node_id, []) for r in left}  # its last accepted reply's
            found = partitions_violations([(stated[r], earlier[r], whole_partition(declared[r])) for r in left])
            for r, reason in zip(left, found):  # a reply caught keeps its node's history (more caught no more)
                self.stated_partitions[replies[r].node_id] = earlier[r] if reason else stated[r][:1]
                reasons[r] = Inconsistent(reason) if reason else None  # a proven liar leaves the run
            return reasons

        return BatchCheck(many)
