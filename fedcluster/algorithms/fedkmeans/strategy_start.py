"""FedKMeans' start: the candidate center sets scored on every device in one round
(``init``), the ``n-init`` starts trained side by side, and ``k-range`` (choosing k
instead of training). A mixin of :class:`fedcluster.algorithms.fedkmeans.strategy.FedKMeans`.

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
  server's farthest-point merge, ``fedcluster/algorithms/kfed/strategy.py``)."""

from __future__ import annotations

from logging import INFO
from typing import Any

import numpy as np
from flwr.common.logger import log

from fedcluster.data import load_points
from fedcluster.algorithms.fedkmeans.model import (
    box_candidates,
    k_range_candidates,
    k_range_report,
    set_count,
    start_sets,
    summary_candidates,
    summary_seeds,
)
from fedcluster.lloyd import kmeans_plus_plus

from fedcluster.server.base import FederationError, Reply

K_RANGE_MAX_BYTES = 64 * 10**6  # the k-range scoring message to every device
COARSE_STREAM = 7  # random stream of the coarse summaries (init-coarse), apart from the server's generator
SEED_STREAM = 11  # random stream of the unrefined start draws (n-init), apart from the server's generator


def summary_points(replies: list[Reply], dimension: int) -> tuple[np.ndarray, np.ndarray]:
    """The devices' local summaries stacked: (summary centers, their counts)."""
    if not replies:
        return np.zeros((0, dimension)), np.zeros(0)
    return np.concatenate([r.arrays["centers"] for r in replies]), np.concatenate([r.arrays["counts"] for r in replies])


class FedKMeansStart:
    """Initialization and ``k-range`` (state: the strategy's ``config``, ``rng``, ``dimension``)."""

    def choose_k(
        self,
        bounds: tuple[int, int],
        total: int,
        low: np.ndarray,
        high: np.ndarray,
        local: tuple[np.ndarray, np.ndarray],
    ) -> dict[str, Any]:
        """``k-range``: local summaries once, every k's candidates built here, all scored in
        ONE federated round; the elbow and the Calinski–Harabasz choice (no training)."""
        first, last = bounds
        if last > total:
            raise FederationError(f"k-range {first}:{last} asks for more clusters than the {total} points held")
        ks = list(range(first, last + 1))
        m = self.config.init_candidates
        size = (len(ks) * m + 1) * last * self.members.dimension * 8
        if size > K_RANGE_MAX_BYTES:
            raise FederationError(
                f"k-range {first}:{last} with init-candidates={m} in d={self.members.dimension} would send "
                f"{size / 1e6:.0f} MB to every device (limit {K_RANGE_MAX_BYTES / 1e6:.0f} MB): narrow the range "
                f"or lower init-candidates"
            )
        points, weights = local
        if points.shape[0] < last:
            self.warn(
                f"only {points.shape[0]} summary centers for k up to {last}: the larger k use random-box candidates"
            )
        candidates = k_range_candidates(points, weights, ks, m, low, high, self.rng)
        self.begin_round(1)
        costs, _ = self.score_candidates(candidates, phase="k-range-scoring")
        report = k_range_report(ks, m, costs, total)
        self.end_round(candidates=int(candidates.shape[0]))
        chosen = report["calinski_harabasz_k"]
        index = ks.index(chosen)
        log(
            INFO,
            "[fedcluster] k-range %d:%d: elbow at k=%d, Calinski-Harabasz picks k=%d (cost/pt %.6g)",
            first,
            last,
            report["elbow_k"],
            chosen,
            report["cost"][index],
        )
        for k, cost, ch in zip(ks, report["cost"], report["calinski_harabasz"]):
            log(INFO, "[fedcluster]   k=%-4d cost/pt %-12.6g CH %.6g", k, cost, ch)
        return {
            "centers": candidates[report["best_candidate"][index]][:chosen],
            "k_range": report,
            "final": {
                "cost": report["cost"][index],
                "total_cost": report["cost"][index] * total,
                "num_points": total,
                "k": chosen,
            },
        }

    # -------------------------------------------------------------- initialization
    def initialize(
        self,
        k: int,
        low: np.ndarray,
        high: np.ndarray,
        local: tuple[np.ndarray, np.ndarray] | None = None,
        coarse: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> tuple[list[np.ndarray], dict[str, Any]]:
        """Candidate center sets by ``init``, scored on every node in one round; the
        ``n-init`` starts of the sets trained side by side (:func:`start_sets`).
        ``local``: the devices' summaries (points, weights), for the summary starts;
        ``coarse``: their summaries at ceil(sqrt(k)) local clusters (``init-coarse``)."""
        cfg = self.config
        method = cfg.init
        m = cfg.init_candidates
        sets = set_count(cfg.n_init, k, self.members.dimension)
        seeds = np.zeros((0, k, self.members.dimension))
        if method in ("auto", "local-summaries"):
            points, weights = local  # collected with the data summary (run)
            if points.shape[0] < k:
                log(INFO, "[fedcluster] only %d summary centers for k=%d: random-box candidates", points.shape[0], k)
            starts = cfg.init_server_starts
            candidates = summary_candidates(points, weights, k, m, low, high, self.rng, starts)
            if coarse is not None and coarse[0].shape[0] >= k:
                # Devices that hold few clusters split each of them k ways in the fine summary;
                # the coarse one keeps them whole. Both kinds compete in the same scoring round.
                # Their own random stream: the fine candidates and everything after them
                # draw exactly what they would without init-coarse.
                stream = np.random.default_rng([cfg.seed, COARSE_STREAM])
                candidates = np.concatenate([candidates, summary_candidates(*coarse, k, m, low, high, stream, starts)])
            # Unrefined draws for the other sets: their own stream as well.
            seeds = summary_seeds(
                points, weights, k, sets - 1, low, high, np.random.default_rng([cfg.seed, SEED_STREAM])
            )
        elif method == "kfed":
            # k-FED as initializer: one extra round that often saves many.
            from fedcluster.algorithms.kfed.strategy import collect_device_centers, merge_device_centers

            _, device_centers, device_counts = collect_device_centers(self, phase="init-kfed")
            candidates = merge_device_centers(self, device_centers, device_counts, k)[0][None]
        elif method == "random-box":
            candidates = box_candidates(k, m, low, high, self.rng)
        else:  # server-kmeans++ (the config guarantees server-data is set)
            server_points = load_points(cfg.server_data)
            if server_points.shape[1] != self.members.dimension:
                raise FederationError(
                    f"server-data {cfg['server-data']} has dimension {server_points.shape[1]}, "
                    f"the federation's is {self.members.dimension}"
                )
            candidates = np.stack([kmeans_plus_plus(server_points, k, self.rng) for _ in range(m)])
        refined = candidates.shape[0]
        candidates = np.concatenate([candidates, seeds])
        costs, _ = self.score_candidates(candidates, phase="init-scoring")
        chosen = start_sets(costs, sets, range(refined, candidates.shape[0]))
        log(
            INFO,
            "[fedcluster] init %s: %d candidates scored, best cost %.6g; %d center set(s) start",
            method,
            candidates.shape[0],
            costs[chosen[0]],
            len(chosen),
        )
        record = {
            "method": method,
            "candidates": refined,
            "candidate_costs": costs[:refined].tolist(),
            "best": chosen[0],
            "sets": len(chosen),
            "start_costs": costs[chosen].tolist(),
            "seeds": int(seeds.shape[0]),
        }
        return [candidates[i].copy() for i in chosen], record

    def local_summary_request(
        self, k: int, phase: str = "init-local-summaries", stream: int | bool = True
    ) -> dict[str, Any]:
        """The ``local_summary`` query; with a ``stream`` number its device seeds come from
        that random stream instead of the server's generator (:meth:`phase_seed`)."""
        return dict(
            task="local_summary", config={"k": k, "min-count": self.config.init_min_count}, seeded=stream, phase=phase
        )
