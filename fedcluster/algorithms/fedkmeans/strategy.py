"""FedKMeans: federated mini-batch k-means with weighted centroid averaging.

Triebe et al., "Federated K-Means" (2019); the working specification is
docs/ALGORITHMS.md section 1, which this strategy follows line by line:

    Λ_t = Σ_i Λ^(i)                                   (per-cluster counts)
    Γ*  = Σ_i Λ^(i) Γ^(i) / Λ_t  where Λ_t > 0        (weighted centroid average)
    v   = μ v + (1 − μ)(Γ* − Γ_{t−1})  if μ > 0  else  Γ* − Γ_{t−1}
    Γ_t = Γ_{t−1} + α v

A cluster no sampled client saw keeps its center (and its momentum is reset).

Reassignment (ρ, R): a cluster starved for R rounds is re-seeded by splitting the largest
one along its direction of largest spread (:func:`fedcluster.algorithms.fedkmeans.model.reassign_starved`);
the start (``init``, ``n-init``, ``k-range``): :mod:`fedcluster.algorithms.fedkmeans.strategy_start`.
"""

from __future__ import annotations

import math
from logging import INFO
from typing import Any

import numpy as np
from flwr.common.logger import log

from fedcluster.points import bounding_box, center_shift, duplicate_warning
from fedcluster.algorithms.fedkmeans.model import (
    CenterSet,
    Memory,
    ServerState,
    Undo,
    coarse_summary_k,
    cost_tie,
    last_versus_best,
    reassign_starved,
    keep_sets,
    replies_scatter,
    reseed_allowed,
    server_update,
)
from fedcluster.config import k_range
from fedcluster.robust import aggregate_centers

from fedcluster.server.base import FederatedStrategy, FederationError, Reply
from fedcluster.server.messages import one_set
from fedcluster.algorithms.fedkmeans.strategy_measure import FedKMeansMeasure
from fedcluster.algorithms.fedkmeans.strategy_start import COARSE_STREAM, FedKMeansStart, summary_points


FULL_BATCH = {"local-epochs": 1, "batch-size": 0, "client-lr": 1.0}  # a train reply = Lloyd statistics
LAST_WORSE_WARNING = 0.01  # the last centers cost this much more than those returned: a warning, else a log line


class FedKMeans(FedKMeansStart, FedKMeansMeasure, FederatedStrategy):
    """Federated mini-batch k-means (Triebe et al. 2019); its run-config keys: the
    ``fedkmeans`` section of docs/reference.md (T, C, E, B, β, α, μ, ρ, R of the paper)."""

    name = "fedkmeans"

    def run(self) -> dict[str, Any]:
        k = self.config.k
        bounds = k_range(self.config.k_range) if self.config.k_range else None
        summaries, local, coarse = self.summaries(k, bounds)
        total = sum(r.num_examples for r in summaries)
        self.cost_tie = cost_tie([self.members.declared.get(r.node_id) for r in summaries])  # rounding: the same cost
        low, high = bounding_box([r.arrays["min"] for r in summaries], [r.arrays["max"] for r in summaries])
        if bounds:
            return self.choose_k(bounds, total, low, high, local)
        if k > total:
            raise FederationError(f"k={k} is larger than the {total} points held by the federation")
        starts, init_record = self.initialize(k, low, high, local, coarse)
        last = self.train(starts, self.config.num_rounds)
        first = len(self.results.phases)
        total_cost, num_points, replies = self.final_evaluation(last)
        if self.results.rounds and self.results.rounds[-1].get("cost") is None:
            self.results.rounds[-1]["cost"] = total_cost / num_points
        final_round = self.results.rounds[-1]["round"] if self.results.rounds else 0
        caught = sorted(
            {f["node"] for p in self.results.phases[first:] for f in p["failures"] if f["kind"] == "inconsistent"}
        )
        if caught:
            total_cost, num_points = self.recover(last, replies, caught)
        self.consider_best(total_cost / num_points, final_round, last, num_points)
        cost, best_round, best_set, points, centers = self.best_seen
        log(INFO, "[fedcluster] fedkmeans final cost per point %.6g on %d points", cost, points)
        outcome = {
            "centers": centers,
            "arrays": {"init_centers": self.starts[best_set]},
            "init": init_record,
            "final": {
                "cost": cost,
                "total_cost": cost * points,
                "num_points": points,
                "round": best_round,
                "set": best_set,
            },
        }
        if self.recovered:
            outcome["recovery"] = self.recovered
        extras, text, loud = last_versus_best(
            total_cost / num_points,
            final_round,
            last.index,
            cost,
            best_round,
            best_set,
            len(self.starts) > 1,
            LAST_WORSE_WARNING,
            last_centers=last.centers,
            best_centers=centers,
            tie=self.cost_tie,
        )
        if extras:  # the centers returned are the cheapest measured, not the last: say so, keep the last
            outcome["arrays"]["last_centers"] = last.centers
            outcome.update(extras)
            self.warn(text) if loud else log(INFO, "[fedcluster] %s", text)
        duplicates = duplicate_warning(centers)
        if duplicates:
            self.warn(duplicates)
        return outcome

    def summaries(self, k: int, bounds: tuple[int, int] | None) -> tuple[list[Reply], Any, Any]:
        """The data summaries and, where the start needs them (``init``, ``k-range``), the
        devices' local summaries (and coarse ones: ``init-coarse``), in one round trip."""
        if not (bounds or self.config.init in ("auto", "local-summaries")):
            return self.discover_dimension(), None, None
        requests = [self.local_summary_request(bounds[1] if bounds else k)]
        coarse_k = coarse_summary_k(k)
        if not bounds and self.config.init_coarse and coarse_k < k:
            requests.append(self.local_summary_request(coarse_k, phase="init-coarse-summaries", stream=COARSE_STREAM))
        summaries, groups = self.survey(*requests)
        local = summary_points(groups[0], self.members.dimension)
        coarse = summary_points(groups[1], self.members.dimension) if len(groups) > 1 else None
        return summaries, local, coarse

    # -------------------------------------------------------------- training
    def train(self, starts: list[np.ndarray] | np.ndarray, rounds: int) -> "CenterSet":
        """``rounds`` FedKMeans rounds of every center set in ``starts`` side by side (one
        message per node and round carries them all); a set that can no longer win stops,
        and after half of the rounds only the cheapest trains on. Returns the last set
        standing; ``self.best_seen`` holds the cheapest centers measured on every node."""
        cfg = self.config
        live = self.start_training(starts)
        deadline = max(1, math.ceil(rounds / 2))
        for t in range(1, rounds + 1):
            live = self.train_round(live, t, rounds, deadline)
            if self.fixed:  # every set standing is a fixed point: more rounds would repeat this one
                log(INFO, "[fedcluster] the centers are a fixed point of the rounds: stopping after round %d", t)
                break
            if cfg.tol > 0 and all(c.shift <= cfg.tol and not c.moved for c in live):
                log(INFO, "[fedcluster] centers moved at most tol=%g: stopping after round %d", cfg.tol, t)
                break
        return min(live, key=lambda c: c.cost)

    def start_training(self, starts: list[np.ndarray] | np.ndarray) -> list["CenterSet"]:
        """The center sets of ``starts`` and what the server keeps of training from here."""
        cfg = self.config
        starts = [starts] if isinstance(starts, np.ndarray) and starts.ndim == 2 else starts
        self.starts = [np.array(c, dtype=np.float64) for c in starts]
        live = [CenterSet(i, c.copy(), ServerState.start(c)) for i, c in enumerate(self.starts)]
        for center_set in live:
            center_set.memory.reserve(self.active_nodes)  # sums over the memory in node order (newcomers last)
        self.sets = {c.index: c for c in live}
        self.estimated = []  # (estimated cost per point, round, set, centers): the cheapest few, partial participation
        self.best_seen = None  # best: (cost, round, set, points, centers)
        self.stated_partitions: dict[int, list] = {}  # per node: [(cost, centers, partition)] of its last reply
        self.recovered: dict[str, Any] | None = None  # what the recovery from a liar caught at the end did
        self.memory_bounds = cfg.server_memory and cfg.batch_size == 0 and cfg.local_epochs == 1
        return live

    def train_round(self, live: list["CenterSet"], t: int, rounds: int, deadline: int) -> list["CenterSet"]:
        """Round ``t``: the exchange, each set measured and updated, the sets that train on."""
        cfg = self.config
        self.begin_round(t)
        nodes = self.sample(cfg.fraction)
        present = set(self.active_nodes)
        got, measured_round = self.exchange(live, nodes, t)
        left = present - set(self.active_nodes)  # NODE_UNAVAILABLE or silent too long
        if left:  # earlier measurements covered points that are gone: no longer comparable
            self.best_seen = None
        reports = []
        for center_set in live:
            center_set.incoming, measured = got[center_set.index]
            reports.append(self.measure(center_set, center_set.incoming, measured, measured_round, t))
        for center_set, report in zip(live, reports):
            self.update(center_set, report, left, t, rounds)
        self.bound_unmeasured(live, reports, t)
        finished = t >= deadline or t == rounds
        # Only a full-batch round over every node fixes a set for good (a partial one
        # leaves other nodes' statistics to come): only then does a stalled set stop.
        final = cfg.fraction >= 1.0 and cfg.batch_size == 0 and all(r["exact"] for r in reports)
        keep = keep_sets([r["cost"] for r in reports], [final and c.stalled for c in live], finished)
        # a newcomer's statistics (it joined this round, or waits to) can still move the centers
        self.fixed = (
            cfg.stop_when_fixed
            and final
            and all(live[i].stalled for i in keep)
            and not self.joined
            and not self.newcomers()
        )
        leader = min(keep, key=lambda i: reports[i]["cost"])
        if t > 1 and self.results.rounds[-1].get("cost") is None and reports[leader]["exact"]:
            self.results.rounds[-1]["cost"] = reports[leader]["cost"]
        record = self.end_round(
            cost=None,
            sampled_nodes=len(nodes),
            **live[leader].record(reports[leader]),
            **({"sets": [c.record(r) for c, r in zip(live, reports)]} if len(live) > 1 else {}),
        )
        for i in set(range(len(live))) - set(keep):  # a set that stops needs no memory of the devices
            live[i].memory = Memory(*live[i].centers.shape)
        log(
            INFO,
            "[fedcluster] fedkmeans round %d of at most %d: centers moved %.3g%s%s",  # beside the round's line
            t,
            rounds,
            record["center_shift"],
            f", reassigned {record['reassigned']}" if record["reassigned"] else "",
            f", {len(keep)} of {len(reports)} sets train on" if len(reports) > 1 else "",
        )
        return [live[i] for i in keep]

    def exchange(self, live: list["CenterSet"], nodes: list[int], t: int) -> tuple[dict[int, tuple], bool]:
        """Round ``t``'s one round trip: every live set's ``fedkmeans_train`` to the sampled
        ``nodes``; in round 1 with ``server-memory`` the others send the statistics of the
        starts (so the first updates do not pull every center towards the few nodes drawn
        first), in an ``eval-every`` round they score the sets; newcomers send their data
        summary (and may be sampled from the next round on). Returns per set ``(training
        replies, (unsampled nodes' total cost, their points))`` and whether this round
        measured every node."""
        everyone = self.config.fraction >= 1.0
        requests, measuring, others = self.round_requests(live, nodes, t)
        joining = self.newcomers()
        self.joined = bool(joining)
        if joining:
            requests["join"] = self.join_request(joining)
        first = len(self.results.phases)
        got = dict(zip(requests, self.broadcast_together(*requests.values())))
        if joining:
            self.admit_newcomers(got["join"])
        got["train"] = self.refill(dict(requests["train"], min_replies=None), got["train"], first)
        measure, out = got.get("measure", []), {}
        dropped = {
            f["node"]
            for p in self.results.phases[first:]
            if p["phase"] == "train"
            for f in p["failures"]
            if f["kind"] == "invalid"
        }  # its old statistics too
        for position, center_set in enumerate(live):
            center_set.forget(dropped)
            center_set.remember([one_set(r, position) for r in got.get("seed", [])], center_set.centers)  # FULL_BATCH
            costs = (sum(float(r.arrays["costs"][position]) for r in measure), sum(r.num_examples for r in measure))
            out[center_set.index] = ([one_set(r, position) for r in got["train"]], costs)
        return out, everyone or measuring or not others

    def round_requests(
        self, live: list["CenterSet"], nodes: list[int], t: int
    ) -> tuple[dict[str, dict[str, Any]], bool, bool]:
        """Round ``t``'s requests (:meth:`exchange`), whether it measures the unsampled
        nodes (``eval-every``) and whether any node is left out of the sample."""
        cfg = self.config
        everyone = cfg.fraction >= 1.0
        client_config = {"local-epochs": cfg.local_epochs, "batch-size": cfg.batch_size, "client-lr": cfg.client_lr}
        every = cfg.eval_every
        measuring = not everyone and every > 0 and t > 1 and (t - 1) % every == 0
        sampled = set(nodes)
        others = len(nodes) < len(self.active_nodes)  # the sample is drawn from the active nodes
        unsampled = [n for n in self.active_nodes if n not in sampled] if others and (t == 1 or measuring) else []
        stacked = np.stack([c.centers for c in live])
        train = dict(
            task="fedkmeans_train",
            nodes=nodes,
            arrays={"centers": stacked},
            config=client_config,
            seeded=True,
            sizes={"m": len(live), "k": stacked.shape[1]},
            phase="train",
            check=self.cost_check(stacked, client_config),
            min_replies=0,
        )  # the quorum: refill
        requests: dict[str, dict[str, Any]] = {"train": train}
        if cfg.server_memory and not everyone and t == 1 and unsampled:
            requests["seed"] = dict(
                train,
                nodes=unsampled,
                config=FULL_BATCH,
                phase="memory",
                min_replies=0,
                check=self.cost_check(stacked, FULL_BATCH),
            )
        if measuring and unsampled:
            requests["measure"] = dict(
                task="score_candidates",
                nodes=unsampled,
                arrays={"candidates": stacked},
                sizes={"m": len(live), "k": stacked.shape[1]},
                phase="evaluation",
                check=self.statement_check(stacked, scores=True),
            )
        return requests, measuring, others

    def update(self, center_set: "CenterSet", report: dict[str, Any], left: set[int], t: int, rounds: int) -> None:
        """The paper's server step for one set (docs/ALGORITHMS.md §1) from its latest
        statistics, with reassignment; a re-seed that the round's measurement shows made the
        set costlier is undone first (the set goes on from its centers without it)."""
        cfg = self.config
        replies = center_set.incoming
        if (
            center_set.undo is not None
            and report["exact"]
            and report["cost"] > center_set.undo.cost_before * (1 + 1e-9)
        ):
            center_set.revert(report["cost"])
            center_set.forget(left)  # the memory as before the re-seed, without the nodes gone since
            log(
                INFO,
                "[fedcluster] round %d: the re-seed of cluster(s) %s in set %d raised the cost to %.6g (from %.6g): "
                "undone",
                t,
                center_set.undone,
                center_set.index,
                report["cost"],
                center_set.undo_cost_before,
            )
            return
        center_set.settle()
        full = cfg.batch_size == 0 and cfg.local_epochs == 1  # a reply then states a partition
        center_set.remember(replies, center_set.centers if full else None, cfg.client_lr)
        orphans = center_set.memory.orphaned(left)
        center_set.forget(left)
        # server-memory: every node's latest statistics, the unsampled ones as they last
        # reported (incremental Lloyd); with every node sampled, exactly this round's.
        if cfg.server_memory:
            counts, weighted = center_set.memory.aggregate(cfg.aggregation, cfg.trim_fraction)
            scatter = center_set.memory.total_scatter()
        else:
            counts, weighted = aggregate_centers(
                np.stack([r.arrays["centers"] for r in replies]),
                np.stack([r.arrays["counts"] for r in replies]),
                cfg.aggregation,
                cfg.trim_fraction,
            )
            scatter = replies_scatter(replies, center_set.centers if full else None, cfg.client_lr)
        old = center_set.centers
        new, target = server_update(old, counts, weighted, center_set.state, cfg.server_lr, cfg.momentum)
        # A re-seed needs a later round to measure it: never in the last round, and a
        # non-empty cluster only when the next round measures every node.
        measurable = t < rounds and (cfg.fraction >= 1.0 or (cfg.eval_every > 0 and t % cfg.eval_every == 0))
        allowed = reseed_allowed(counts, center_set.protected, t < rounds, measurable)
        before = new.copy()
        moved = reassign_starved(
            new, counts, scatter, center_set.state, cfg.reassign_threshold, cfg.reassign_patience, orphans, allowed
        )
        if moved:
            center_set.hold(Undo(before, report["cost"] if report["exact"] else float("inf"), moved))
        center_set.step(new, counts, moved, orphans, center_shift(new, old))
