"""FedKMeans: federated mini-batch k-means with weighted centroid averaging.

Triebe et al., "Federated K-Means" (2019); the working specification is
docs/ALGORITHMS.md section 1, which this strategy follows line by line:

    Λ_t = Σ_i Λ^(i)                                   (per-cluster counts)
    Γ*  = Σ_i Λ^(i) Γ^(i) / Λ_t  where Λ_t > 0        (weighted centroid average)
    v   = μ v + (1 − μ)(Γ* − Γ_{t−1})  if μ > 0  else  Γ* − Γ_{t−1}
    Γ_t = Γ_{t−1} + α v

A cluster no sampled client saw keeps its center (and its momentum is reset).

Reassignment (ρ, R): a cluster whose round count stays below ρ × (the round's total
count) for R consecutive rounds is re-seeded by SPLITTING the currently largest cluster
along its direction of largest spread: the two centers move to ``c ± 0.8·σ·e`` where e is
the coordinate axis of largest variance and σ its standard deviation (0.8 ≈ √(2/π), the
mean offset of each half of a Gaussian cut through its centre). The variance comes from
per-cluster sums of squares that the clients report with their update, so no data point
ever leaves a device. Works in any dimension (the authors' box re-draw only suits 1-D).

Initialization (``init``):

- ``auto``/``local-summaries`` (default): each node runs a small local k-means and sends
  its local centers with their counts (clusters with fewer than ``init-min-count`` points
  are suppressed, so no single point leaves a device); with ``init-coarse`` (default) it
  also sends, in the same round trip, a coarse summary with ceil(sqrt(k)) local centers
  (a device that holds few clusters splits each of them k ways in the fine summary, which
  misleads k-means on the summaries; the coarse one keeps them whole). The server runs
  ``init-server-starts`` weighted k-means++ + Lloyd solutions on each summary, keeps the
  ``init-candidates`` of lowest cost on that summary, scores all kept candidates on every
  node's data in ONE federated round, and keeps the best: the federated analogue of
  scikit-learn's ``n_init``. Robust on non-IID data.
- ``random-box``: data-free; candidates uniform in the federated bounding box (from the
  min/max summary), scored the same way.
- ``server-kmeans++``: k-means++ candidates on server-side data (run-config
  ``server-data``, a .npy file on the server), scored the same way.
- ``kfed``: the k-FED centers (one extra round: local k'-means on every device and the
  server's farthest-point merge, ``server_app/kfed.py``).
"""

from __future__ import annotations

from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.common.logger import log

from fedcluster.common import bounding_box, center_shift
from fedcluster.data import load_points
from fedcluster.fedkmeans import (
    ServerState,
    box_candidates,
    coarse_summary_k,
    k_range_candidates,
    k_range_report,
    orphaned_clusters,
    reassign_starved,
    server_update,
    summary_candidates,
    train_cost_mismatch,
)
from fedcluster.config import k_range
from fedcluster.robust import aggregate_centers
from fedcluster.lloyd import kmeans_plus_plus

from .base import FederatedStrategy, FederationError, Reply, sum_arrays, sum_metric


K_RANGE_MAX_BYTES = 64 * 10**6  # the k-range scoring message to every device


FULL_BATCH = {"local-epochs": 1, "batch-size": 0, "client-lr": 1.0}  # a train reply = Lloyd statistics
COARSE_STREAM = 7  # random stream of the coarse summaries (init-coarse), apart from the server's generator


def summary_points(replies: list[Reply], dimension: int) -> tuple[np.ndarray, np.ndarray]:
    """The devices' local summaries stacked: (summary centers, their counts)."""
    if not replies:
        return np.zeros((0, dimension)), np.zeros(0)
    return np.concatenate([r.arrays["centers"] for r in replies]), np.concatenate([r.arrays["counts"] for r in replies])


class FedKMeans(FederatedStrategy):
    """Federated mini-batch k-means (Triebe et al. 2019).

    Run-config parameters: ``k``, ``num-rounds`` (T), ``fraction`` (C), ``local-epochs``
    (E), ``batch-size`` (B, 0 = full batch), ``client-lr`` (β), ``server-lr`` (α),
    ``momentum`` (μ), ``reassign-threshold`` (ρ), ``reassign-patience`` (R), ``init``,
    ``init-candidates``, ``init-server-starts``, ``init-min-count``, ``eval-every``, ``tol``.
    """

    name = "fedkmeans"

    def run(self) -> dict[str, Any]:
        k = self.config["k"]
        bounds = k_range(self.config["k-range"]) if self.config["k-range"] else None
        local = coarse = None
        if bounds or self.config["init"] in ("auto", "local-summaries"):
            # The local summaries the start needs travel with the data summary: one round trip.
            requests = [self.local_summary_request(bounds[1] if bounds else k)]
            coarse_k = coarse_summary_k(k)
            if not bounds and self.config["init-coarse"] and coarse_k < k:
                requests.append(self.local_summary_request(coarse_k, phase="init-coarse-summaries", stream=COARSE_STREAM))
            summaries, groups = self.survey(*requests)
            local = summary_points(groups[0], self.dimension)
            coarse = summary_points(groups[1], self.dimension) if len(groups) > 1 else None
        else:
            summaries = self.discover_dimension()
        total = sum(r.num_examples for r in summaries)
        low, high = bounding_box([r.arrays["min"] for r in summaries], [r.arrays["max"] for r in summaries])
        if bounds:
            return self.choose_k(bounds, total, low, high, local)
        if k > total:
            raise FederationError(f"k={k} is larger than the {total} points held by the federation")
        initial, init_record = self.initialize(k, low, high, local, coarse)
        centers = self.train(initial, self.config["num-rounds"])
        total_cost, num_points = self.evaluate(centers, phase="final-evaluation")
        if self.rounds and self.rounds[-1].get("cost") is None:
            self.rounds[-1]["cost"] = total_cost / num_points
        final_cost = total_cost / num_points
        if self.config["fraction"] < 1 and self.config["eval-every"] > 0:
            self.consider_best(final_cost, self.rounds[-1]["round"], centers, num_points)
        log(INFO, "[fedcluster] fedkmeans final cost per point %.6g on %d points", final_cost, num_points)
        outcome = {
            "centers": centers,
            "arrays": {"init_centers": initial},
            "init": init_record,
            "final": {"cost": final_cost, "total_cost": total_cost, "num_points": num_points},
        }
        best = self.best_seen  # set by train; None unless partial participation measured rounds
        if best is not None:
            # The evaluated rounds measured every node: keep the best centers seen as well.
            outcome["arrays"]["best_centers"] = best[2]
            outcome["best_seen"] = {"round": best[1], "cost": best[0], "final_over_best": final_cost / best[0]}
            if final_cost > 1.01 * best[0]:
                log(WARNING, "[fedcluster] final cost %.6g is %.1f%% above the best seen (round %d, %.6g): "
                    "best_centers.npy holds those centers", final_cost, 100 * (final_cost / best[0] - 1), best[1], best[0])
        return outcome

    def cost_check(self, incoming: np.ndarray):
        """Full batch, one local epoch: a training reply's cost must be the one its other
        arrays imply (:func:`fedcluster.fedkmeans.train_cost_mismatch`); else no check."""
        cfg = self.config
        if cfg["batch-size"] != 0 or cfg["local-epochs"] != 1:
            return None
        beta = cfg["client-lr"]
        return lambda reply: train_cost_mismatch(incoming, reply.arrays["centers"], reply.arrays["counts"],
                                                 reply.arrays["sumsq"], float(reply.arrays["cost"][0]), beta)

    def consider_best(self, cost: float, round_number: int, centers: np.ndarray, points: int) -> None:
        """Keep the lowest cost per point, its round and its centers, among measurements
        over as many points as the best one: a round where a node's reply was lost covers
        fewer points and is not comparable (it could look cheaper than it is)."""
        best = self.best_seen
        if best is None or points > best[3] or (points == best[3] and cost < best[0]):
            self.best_seen = (cost, round_number, centers.copy(), points)

    def choose_k(self, bounds: tuple[int, int], total: int, low: np.ndarray, high: np.ndarray,
                 local: tuple[np.ndarray, np.ndarray]) -> dict[str, Any]:
        """``k-range``: local summaries once, every k's candidates built here, all scored in
        ONE federated round; the elbow and the Calinski–Harabasz choice (no training)."""
        first, last = bounds
        if last > total:
            raise FederationError(f"k-range {first}:{last} asks for more clusters than the {total} points held")
        ks = list(range(first, last + 1))
        m = self.config["init-candidates"]
        size = (len(ks) * m + 1) * last * self.dimension * 8
        if size > K_RANGE_MAX_BYTES:
            raise FederationError(
                f"k-range {first}:{last} with init-candidates={m} in d={self.dimension} would send "
                f"{size / 1e6:.0f} MB to every device (limit {K_RANGE_MAX_BYTES / 1e6:.0f} MB): narrow the range "
                f"or lower init-candidates"
            )
        points, weights = local
        if points.shape[0] < last:
            self.warn(f"only {points.shape[0]} summary centers for k up to {last}: the larger k use random-box candidates")
        candidates = k_range_candidates(points, weights, ks, m, low, high, self.rng)
        self.begin_round(1)
        costs = self.score(candidates, phase="k-range-scoring")
        report = k_range_report(ks, m, costs, total)
        self.end_round(candidates=int(candidates.shape[0]))
        chosen = report["calinski_harabasz_k"]
        index = ks.index(chosen)
        log(INFO, "[fedcluster] k-range %d:%d: elbow at k=%d, Calinski-Harabasz picks k=%d (cost/pt %.6g)",
            first, last, report["elbow_k"], chosen, report["cost"][index])
        for k, cost, ch in zip(ks, report["cost"], report["calinski_harabasz"]):
            log(INFO, "[fedcluster]   k=%-4d cost/pt %-12.6g CH %.6g", k, cost, ch)
        return {
            "centers": candidates[report["best_candidate"][index]][:chosen],
            "k_range": report,
            "final": {"cost": report["cost"][index], "total_cost": report["cost"][index] * total, "num_points": total, "k": chosen},
        }

    # -------------------------------------------------------------- initialization
    def initialize(
        self,
        k: int,
        low: np.ndarray,
        high: np.ndarray,
        local: tuple[np.ndarray, np.ndarray] | None = None,
        coarse: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Candidate center sets by ``init``, scored on every node in one round; best wins.
        ``local``: the devices' summaries (points, weights), for the summary starts;
        ``coarse``: their summaries at ceil(sqrt(k)) local clusters (``init-coarse``)."""
        cfg = self.config
        method = cfg["init"]
        m = cfg["init-candidates"]
        if method in ("auto", "local-summaries"):
            points, weights = local  # collected with the data summary (run)
            if points.shape[0] < k:
                log(INFO, "[fedcluster] only %d summary centers for k=%d: random-box candidates", points.shape[0], k)
            starts = cfg["init-server-starts"]
            candidates = summary_candidates(points, weights, k, m, low, high, self.rng, starts)
            if coarse is not None and coarse[0].shape[0] >= k:
                # Devices that hold few clusters split each of them k ways in the fine summary;
                # the coarse one keeps them whole. Both kinds compete in the same scoring round.
                # Their own random stream: the fine candidates and everything after them
                # draw exactly what they would without init-coarse.
                stream = np.random.default_rng([cfg["seed"], COARSE_STREAM])
                candidates = np.concatenate([candidates, summary_candidates(*coarse, k, m, low, high, stream, starts)])
        elif method == "kfed":
            # k-FED as initializer: one extra round that often saves many.
            from .kfed import collect_device_centers, merge_device_centers

            _, device_centers, device_counts = collect_device_centers(self, phase="init-kfed")
            candidates = merge_device_centers(self, device_centers, device_counts, k)[0][None]
            m = 1
        elif method == "random-box":
            candidates = box_candidates(k, m, low, high, self.rng)
        else:  # server-kmeans++ (the config guarantees server-data is set)
            server_points = load_points(cfg["server-data"])
            if server_points.shape[1] != self.dimension:
                raise FederationError(
                    f"server-data {cfg['server-data']} has dimension {server_points.shape[1]}, "
                    f"the federation's is {self.dimension}"
                )
            candidates = np.stack([kmeans_plus_plus(server_points, k, self.rng) for _ in range(m)])
        costs = self.score(candidates)
        best = int(np.argmin(costs))
        m = candidates.shape[0]
        log(INFO, "[fedcluster] init %s: best of %d candidates, cost %.6g", method, m, costs[best])
        return candidates[best].copy(), {"method": method, "candidates": m, "candidate_costs": costs.tolist(), "best": best}

    def local_summary_request(self, k: int, phase: str = "init-local-summaries", stream: int | bool = True) -> dict[str, Any]:
        """The ``local_summary`` query; with a ``stream`` number its device seeds come from
        that random stream instead of the server's generator (:meth:`node_seeds`)."""
        return dict(task="local_summary", config={"k": k, "min-count": self.config["init-min-count"]}, seeded=stream,
                    phase=phase)

    def score(self, candidates: np.ndarray, phase: str = "init-scoring") -> np.ndarray:
        """Total cost of every candidate center set (m, k, d) in one federated round."""
        replies = self.broadcast(
            "score_candidates",
            self.active_nodes,
            arrays={"candidates": candidates},
            sizes={"m": candidates.shape[0], "k": candidates.shape[1]},
            phase=phase,
        )
        return sum_arrays(replies, "costs")

    # -------------------------------------------------------------- training
    def train(self, centers: np.ndarray, rounds: int) -> np.ndarray:
        """``rounds`` FedKMeans rounds from ``centers``; returns the final global centers."""
        cfg = self.config
        k = centers.shape[0]
        everyone = cfg["fraction"] >= 1.0
        state = ServerState.start(centers)
        client_config = {
            "local-epochs": cfg["local-epochs"],
            "batch-size": cfg["batch-size"],
            "client-lr": cfg["client-lr"],
        }
        latest: dict[int, Reply] = {}  # per node: its latest valid training reply
        self.best_seen: tuple[float, int, np.ndarray, int] | None = None  # (cost, round, centers, points)
        for t in range(1, rounds + 1):
            self.begin_round(t)
            nodes = self.sample(cfg["fraction"])
            present = set(self.active_nodes)
            train = dict(task="fedkmeans_train", nodes=nodes, arrays={"centers": centers}, config=client_config,
                         seeded=True, sizes={"k": k}, phase="train", check=self.cost_check(centers))
            # Under partial participation the centers of round t-1 are measured in round t's
            # round trip: the sampled nodes' training replies carry their cost, the others
            # are asked for it in the same push (no extra broadcast; results unchanged).
            every = cfg["eval-every"]
            measure = not everyone and every > 0 and t > 1 and (t - 1) % every == 0
            sampled = set(nodes)
            unsampled = [n for n in self.active_nodes if n not in sampled]
            others = unsampled if measure else []
            # server-memory starts from every node: in round 1 the nodes not sampled send the
            # full-batch statistics of the starting centers in the same round trip, so the
            # first updates do not pull every center towards the few nodes drawn first.
            seeding = unsampled if cfg["server-memory"] and not everyone and t == 1 else []
            requests = {"train": train}
            if others:
                requests["measure"] = dict(task="lloyd_stats", nodes=others, arrays={"centers": centers},
                                           sizes={"k": k}, phase="evaluation")
            if seeding:
                requests["seed"] = dict(train, nodes=seeding, config=FULL_BATCH, phase="memory", min_replies=0)
            # SuperNodes that connected since the start are asked for their data summary in
            # the same round trip and may be sampled from the next round on.
            joining = self.newcomers()
            if joining:
                requests["join"] = self.join_request(joining)
            if len(requests) > 1:
                got = dict(zip(requests, self.broadcast_together(*requests.values())))
            else:
                got = {"train": self.broadcast(**train)}
            replies, measured = got["train"], got.get("measure", [])
            if joining:
                self.admit_newcomers(got["join"])
            latest.update({r.node_id: r for r in got.get("seed", [])})
            latest.update({r.node_id: r for r in replies})
            left = present - set(self.active_nodes)  # NODE_UNAVAILABLE or silent too long
            orphans = orphaned_clusters({n: r.arrays["counts"] for n, r in latest.items()}, left)
            for node in left:
                latest.pop(node, None)
            # server-memory: every node's latest statistics, the unsampled ones as they last
            # reported (incremental Lloyd); with every node sampled, exactly this round's.
            pool = [latest[n] for n in sorted(latest)] if cfg["server-memory"] else replies
            counts, weighted = aggregate_centers(
                np.stack([r.arrays["centers"] for r in pool]),
                np.stack([r.arrays["counts"] for r in pool]),
                cfg["aggregation"],
                cfg["trim-fraction"],
            )
            new, target = server_update(centers, counts, weighted, state, cfg["server-lr"], cfg["momentum"])
            reassigned = reassign_starved(
                new, counts, sum_arrays(pool, "sumsq"), target, state,
                cfg["reassign-threshold"], cfg["reassign-patience"], orphans,
            )
            shift = center_shift(new, centers)
            # The train replies carry the cost of the centers they received (Γ_{t−1}):
            # with every node sampled that is the global cost of the previous round.
            received_cost = float(sum_arrays(replies, "cost")[0])
            received_points = int(sum_metric(replies))
            if everyone and t > 1 and self.rounds[-1].get("cost") is None:
                self.rounds[-1]["cost"] = received_cost / max(received_points, 1)
            if measure:  # measured may be empty: every active node was sampled
                total = received_cost + sum(float(r.arrays["cost"][0]) for r in measured)
                points = received_points + sum(int(r.arrays["counts"].sum()) for r in measured)
                self.rounds[-1]["cost"] = total / max(points, 1)
                self.consider_best(total / max(points, 1), t - 1, centers, points)
            centers = new
            record = self.end_round(
                cost=None,
                sampled_nodes=len(nodes),
                sampled_cost_of_received=received_cost / max(received_points, 1),
                center_shift=shift,
                empty_clusters=int((counts <= 0).sum()),
                reassigned=reassigned,
                orphaned=orphans,
            )
            log(
                INFO,
                "[fedcluster] round %d/%d: %d/%d replies, cost/pt of received centers %.6g, shift %.3g%s",
                t,
                rounds,
                record["replies"],
                record["sent"],
                record["sampled_cost_of_received"],
                shift,
                f", reassigned {reassigned}" if reassigned else "",
            )
            if cfg["tol"] > 0 and shift <= cfg["tol"] and not reassigned:
                log(INFO, "[fedcluster] centers moved %.3g <= tol=%g: stopping after round %d", shift, cfg["tol"], t)
                break
        return centers
