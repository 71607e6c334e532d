"""FedKMeans: federated mini-batch k-means with weighted centroid averaging.

Triebe et al., "Federated K-Means" (2019); the working specification is
ALGORITHMS.md section 1, which this strategy follows line by line:

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
  are suppressed, so no single point leaves a device). The server draws
  ``init-candidates`` weighted k-means++ + Lloyd solutions on these summaries, scores all
  candidates on every node's data in ONE federated round, and keeps the best: the
  federated analogue of scikit-learn's ``n_init``. Robust on non-IID data.
- ``random-box``: data-free; candidates uniform in the federated bounding box (from the
  min/max summary), scored the same way.
- ``server-kmeans++``: k-means++ candidates on server-side data (run-config
  ``server-data``, a .npy file on the server), scored the same way.
- ``kfed``: the k-FED centers (one extra round: local k'-means on every device and the
  server's farthest-point merge, ``server_app/kfed.py``).
"""

from __future__ import annotations

from logging import INFO
from typing import Any

import numpy as np
from flwr.common.logger import log

from fedcluster.data import load_points
from fedcluster.lloyd import kmeans_plus_plus, lloyd

from .base import FederatedStrategy, FederationError, Reply, ReplySpec

SPLIT_OFFSET = 0.8


class FedKMeans(FederatedStrategy):
    """Federated mini-batch k-means (Triebe et al. 2019).

    Run-config parameters: ``k``, ``num-rounds`` (T), ``fraction`` (C), ``local-epochs``
    (E), ``batch-size`` (B, 0 = full batch), ``client-lr`` (β), ``server-lr`` (α),
    ``momentum`` (μ), ``reassign-threshold`` (ρ), ``reassign-patience`` (R), ``init``,
    ``init-candidates``, ``init-min-count``, ``eval-every``, ``tol``.
    """

    name = "fedkmeans"

    def run(self) -> dict[str, Any]:
        cfg = self.config
        k = int(cfg["k"])
        summaries = self.discover_dimension()
        self.check_k(summaries, k)
        low = np.min([r.arrays["min"] for r in summaries], axis=0)
        high = np.max([r.arrays["max"] for r in summaries], axis=0)
        initial, init_record = self.initialize(k, low, high)
        centers = self.train(initial, cfg["num-rounds"])
        total_cost, num_points = self.evaluate(centers, phase="final-evaluation")
        if self.rounds and self.rounds[-1].get("cost") is None:
            self.rounds[-1]["cost"] = total_cost / num_points
        log(INFO, "[fedcluster] fedkmeans final cost per point %.6g on %d points", total_cost / num_points, num_points)
        return {
            "centers": centers,
            "arrays": {"init_centers": initial},
            "init": init_record,
            "final": {"cost": total_cost / num_points, "total_cost": total_cost, "num_points": num_points},
        }

    # -------------------------------------------------------------- building blocks
    def check_k(self, summaries: list[Reply], k: int) -> int:
        total = sum(r.num_examples for r in summaries)
        if k > total:
            raise FederationError(f"k={k} is larger than the {total} points held by the federation")
        return total

    def evaluate(self, centers: np.ndarray, phase: str = "evaluation") -> tuple[float, int]:
        """Federated cost of ``centers`` on every active node: (total cost, points)."""
        k = centers.shape[0]
        replies = self.broadcast(
            "lloyd_stats",
            self.active_nodes,
            arrays={"centers": centers},
            spec=ReplySpec(shapes={"sums": (k, "d"), "counts": (k,), "cost": (1,)}, nonnegative=("counts", "cost")),
            phase=phase,
        )
        total = float(sum(r.arrays["cost"][0] for r in replies))
        points = int(sum(r.arrays["counts"].sum() for r in replies))
        return total, points

    def score(self, candidates: np.ndarray, phase: str = "init-scoring") -> np.ndarray:
        """Total cost of every candidate center set (m, k, d) in one federated round."""
        m = candidates.shape[0]
        replies = self.broadcast(
            "score_candidates",
            self.active_nodes,
            arrays={"candidates": candidates},
            spec=ReplySpec(shapes={"costs": (m,)}, nonnegative=("costs",)),
            phase=phase,
        )
        return np.sum([r.arrays["costs"] for r in replies], axis=0)

    def initialize(self, k: int, low: np.ndarray, high: np.ndarray) -> tuple[np.ndarray, dict[str, Any]]:
        cfg = self.config
        method = cfg["init"]
        m = max(1, int(cfg["init-candidates"]))
        if method in ("auto", "local-summaries"):
            points, weights = self.local_summaries(k)
            candidates = []
            if points.shape[0] >= k:
                for _ in range(m):
                    seed = kmeans_plus_plus(points, k, self.rng, weights)
                    candidates.append(lloyd(points, seed, weights, max_iter=100)[0])
            else:
                log(INFO, "[fedcluster] only %d summary centers for k=%d: random-box candidates", points.shape[0], k)
            while len(candidates) < m:
                candidates.append(self.rng.uniform(low, high, size=(k, low.size)))
        elif method == "kfed":
            # k-FED as initializer: one extra round that often saves many (issue 4).
            from .kfed import collect_device_centers, merge_device_centers

            _, device_centers, device_counts = collect_device_centers(self, phase="init-kfed")
            candidates = [merge_device_centers(self, device_centers, device_counts, k)[0]]
            m = 1
        elif method == "random-box":
            candidates = [self.rng.uniform(low, high, size=(k, low.size)) for _ in range(m)]
        elif method == "server-kmeans++":
            if not cfg["server-data"]:
                raise FederationError("init='server-kmeans++' needs run-config server-data (a .npy path)")
            server_points = load_points(cfg["server-data"])
            if server_points.shape[1] != self.dimension:
                raise FederationError(
                    f"server-data {cfg['server-data']} has dimension {server_points.shape[1]}, "
                    f"the federation's is {self.dimension}"
                )
            candidates = [kmeans_plus_plus(server_points, k, self.rng) for _ in range(m)]
        else:
            raise FederationError(
                f"unknown init {method!r}; choose auto, local-summaries, kfed, random-box or server-kmeans++"
            )
        candidates = np.stack(candidates)
        costs = self.score(candidates)
        best = int(np.argmin(costs))
        log(INFO, "[fedcluster] init %s: best of %d candidates, cost %.6g", method, m, costs[best])
        return candidates[best].copy(), {
            "method": method,
            "candidates": m,
            "candidate_costs": costs.tolist(),
            "best": best,
        }

    def local_summaries(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        cfg = self.config
        seeds = {node: int(self.rng.integers(2**31)) for node in self.active_nodes}
        replies = self.broadcast(
            "local_summary",
            self.active_nodes,
            config={"k": k, "min-count": int(cfg["init-min-count"])},
            per_node=lambda node: (None, {"seed": seeds[node]}),
            spec=ReplySpec(shapes={"centers": (None, "d"), "counts": (None,)}, nonnegative=("counts",)),
            phase="init-local-summaries",
        )
        replies = [r for r in replies if r.arrays["centers"].shape[0] == r.arrays["counts"].shape[0]]
        if not replies:
            return np.zeros((0, self.dimension)), np.zeros(0)
        points = np.concatenate([r.arrays["centers"] for r in replies])
        weights = np.concatenate([r.arrays["counts"] for r in replies])
        return points, weights

    def train(self, centers: np.ndarray, rounds: int) -> np.ndarray:
        """``rounds`` FedKMeans rounds from ``centers``; returns the final global centers."""
        cfg = self.config
        k, d = centers.shape
        alpha, mu = float(cfg["server-lr"]), float(cfg["momentum"])
        rho, patience = float(cfg["reassign-threshold"]), int(cfg["reassign-patience"])
        everyone = cfg["fraction"] >= 1.0
        velocity = np.zeros_like(centers)
        below = np.zeros(k, dtype=int)
        spec = ReplySpec(
            shapes={"centers": (k, "d"), "counts": (k,), "sumsq": (k, "d"), "cost": (1,)},
            nonnegative=("counts", "sumsq", "cost"),
        )
        client_config = {
            "local-epochs": int(cfg["local-epochs"]),
            "batch-size": int(cfg["batch-size"]),
            "client-lr": float(cfg["client-lr"]),
        }
        for t in range(1, rounds + 1):
            self.begin_round(t)
            nodes = self.sample(cfg["fraction"])
            seeds = {node: int(self.rng.integers(2**31)) for node in nodes}
            replies = self.broadcast(
                "fedkmeans_train",
                nodes,
                arrays={"centers": centers},
                config=client_config,
                per_node=lambda node: (None, {"seed": seeds[node]}),
                kind="train",
                spec=spec,
                phase="train",
            )
            counts = np.sum([r.arrays["counts"] for r in replies], axis=0)
            weighted = np.sum([r.arrays["counts"][:, None] * r.arrays["centers"] for r in replies], axis=0)
            sumsq = np.sum([r.arrays["sumsq"] for r in replies], axis=0)
            seen = counts > 0
            target = centers.copy()
            target[seen] = weighted[seen] / counts[seen, None]
            step = target - centers
            velocity = mu * velocity + (1 - mu) * step if mu > 0 else step
            velocity[~seen] = 0.0
            new = centers + alpha * velocity
            new[~seen] = centers[~seen]
            reassigned = self.reassign(new, counts, sumsq, target, below, rho, patience)
            shift = float(np.sqrt(np.sum((new - centers) ** 2)))
            # The train replies carry the cost of the centers they received (Γ_{t−1}):
            # with every node sampled that is the global cost of the previous round.
            received_cost = float(sum(r.arrays["cost"][0] for r in replies))
            received_points = int(sum(r.num_examples for r in replies))
            if everyone and t > 1 and self.rounds[-1].get("cost") is None:
                self.rounds[-1]["cost"] = received_cost / max(received_points, 1)
            centers = new
            cost = None
            every = int(cfg["eval-every"])
            if not everyone and every > 0 and t % every == 0:
                total, points = self.evaluate(centers, phase="evaluation")
                cost = total / points
            record = self.end_round(
                cost=cost,
                sampled_nodes=len(nodes),
                sampled_cost_of_received=received_cost / max(received_points, 1),
                center_shift=shift,
                empty_clusters=int((~seen).sum()),
                reassigned=reassigned,
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

    def reassign(
        self,
        centers: np.ndarray,
        counts: np.ndarray,
        sumsq: np.ndarray,
        means: np.ndarray,
        below: np.ndarray,
        rho: float,
        patience: int,
    ) -> list[int]:
        """Re-seed clusters that stayed below ``rho`` of the round's mass for ``patience``
        rounds by splitting the largest cluster (in place on ``centers``/``below``)."""
        if rho <= 0 or patience <= 0:
            return []
        total = counts.sum()
        below[:] = np.where(counts < rho * total, below + 1, 0)
        moved = []
        sizes = counts.astype(float).copy()
        for j in np.flatnonzero(below >= patience):
            big = int(np.argmax(sizes))
            if sizes[big] <= 0 or big == j:
                continue
            variance = np.maximum(sumsq[big] / sizes[big] - means[big] ** 2, 0.0)
            axis = int(np.argmax(variance))
            offset = SPLIT_OFFSET * np.sqrt(variance[axis])
            base = centers[big].copy()
            centers[j] = base
            centers[j, axis] += offset
            centers[big, axis] -= offset
            sizes[big] /= 2
            sizes[j] = sizes[big]
            below[j] = 0
            moved.append(int(j))
        return moved
