"""DA-UFL: dual-averaging federated k-means with bin or SOM weights (Algorithm 1).

Servetnyk, Fung & Han, "Unsupervised Federated Learning for Unbalanced Data" (2020);
working specification docs/ALGORITHMS.md §2 (the recentred dual-averaging update and
ξ drawn per point and per cluster). Variants by run-config ``weighting``:

- ``som`` (UFLSOM, default): every agent trains a small SOM and sends its codebook; the
  server concatenates them into P and broadcasts P; a point's bin is its nearest vector.
- ``bin`` (UFLBin): the bins are the cells of a ``bins``^d grid over the federated
  bounding box (refused above ``max-bins`` cells: use ``som``).
- ``uniform`` (UFLUni): w_j = 1/J; the SOM phases still run, for the initialization only.

Then: bin counts → w_jb = c_jb / Σ_j c_jb; k-means++ on the codebook / cell centers
weighted by total counts; outer loop t1 (perturbed labels, fixed during the iteration;
stop when no agent changed a label) around the inner dual-averaging loop t2 (z ← z + Σ_j
g_j, m = m^(0) − η z / W, stop when no center moves more than ε_glo × the bounding-box
diagonal). Each agent gets its own ξ seed per outer iteration; the device is stateless.
"""

from __future__ import annotations

from logging import INFO
from typing import Any

import numpy as np
from flwr.common.logger import log

from fedcluster.bounds import declared_scatter, moments_violation, voronoi_violation
from fedcluster.point_tasks import bounding_box
from fedcluster.da_ufl import (
    implied_statistics,
    TooManyBins,
    bin_weights,
    box_overshoot,
    centers_problem,
    combine_gradients,
    diagonal,
    dual_averaging_update,
    frobenius,
    grid_cells,
    grid_centers,
    init_candidates,
    is_grid,
    max_move,
    som_grid,
)

from .base import FederatedStrategy, FederationError, sum_arrays


class DAUFL(FederatedStrategy):
    """DA-UFL (Servetnyk et al. 2020): UFLBin, UFLSOM, UFLUni.

    Run-config parameters: ``k``, ``weighting`` (bin | som | uniform), ``xi-max`` (ξ_max),
    ``eta`` (η), ``eps-glo`` (ε_glo, relative to the bounding-box diagonal), ``bins``,
    ``max-bins``, ``som-grid``, ``som-epochs``, ``init-restarts``, ``outer-iterations``,
    ``inner-iterations``.
    """

    name = "da-ufl"

    def run(self) -> dict[str, Any]:
        cfg = self.config
        k = cfg.k
        if cfg.weighting == "bin":
            summaries, soms = self.discover_dimension(), None
        else:  # the SOM codebooks need nothing from the server: they travel with the data summary
            summaries, (soms,) = self.survey(self.som_request())
        low, high = bounding_box([r.arrays["min"] for r in summaries], [r.arrays["max"] for r in summaries])
        nodes = [r.node_id for r in summaries]
        # Phases 1 and 2 (Algorithm 1, steps 1-3): bins and the agents' weights.
        binning, bin_arrays, representatives = self.make_bins(low, high, soms)
        counts, agents = self.count_bins(nodes, binning, bin_arrays, representatives.shape[0])
        weights = bin_weights(counts) if cfg.weighting != "uniform" else None
        # Step 4: k-means++ on the bin representatives weighted by total counts; the
        # agents' own points choose among the distinct optima found there (one round).
        try:
            candidates = init_candidates(representatives, counts, k, self.rng, cfg.init_restarts, cfg.init_candidates)
        except ValueError as exc:
            raise FederationError(f"initialization: {exc}") from None
        initial, init_record = self.choose_start(candidates)
        centers, outer_done = self.train(agents, initial, binning, bin_arrays, weights, (low, high))
        total_cost, num_points = self.evaluate(centers, phase="final-evaluation")
        log(INFO, "[fedcluster] da-ufl (%s) converged in %d outer iterations; cost/pt %.6g", cfg.weighting, outer_done, total_cost / num_points)
        return {
            "centers": centers,
            "arrays": {"init_centers": initial, "bin_counts": counts, "bin_representatives": representatives},
            "init": init_record,
            "da_ufl": {
                "weighting": cfg.weighting,
                "bins": int(representatives.shape[0]),
                "agents": len(nodes),
                "outer_iterations": outer_done,
                "converged": bool(self.rounds and self.rounds[-1]["labels_changed"] == 0),
            },
            "final": {"cost": total_cost / num_points, "total_cost": total_cost, "num_points": num_points},
        }

    def choose_start(self, candidates: np.ndarray) -> tuple[np.ndarray, dict[str, Any]]:
        """The start of the dual averaging: the only candidate, or the one the agents'
        points make cheapest (``score_candidates``: the cost of each set, summed)."""
        if candidates.shape[0] == 1:
            return candidates[0], {"candidates": 1, "chosen": 0}
        totals, points = self.score_candidates(candidates, phase="init-scoring")
        costs = totals / max(points, 1)
        chosen = int(np.argmin(costs))
        log(INFO, "[fedcluster] da-ufl init: %d candidates scored by the agents, the cheapest on the bins is %s",
            candidates.shape[0], "chosen" if chosen == 0 else f"{costs[0] / costs[chosen]:.4g}× the chosen one")
        return candidates[chosen], {"candidates": int(candidates.shape[0]), "chosen": chosen, "costs": costs.tolist()}

    def step(self, replies: list, centers: np.ndarray, anchor: np.ndarray, z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The dual-averaging step from ``replies``: the new z and centers."""
        if not replies:
            return z, centers
        gradient, weight = combine_gradients(centers, np.stack([r.arrays["gradient"] for r in replies]),
                                             np.stack([r.arrays["weight"] for r in replies]),
                                             self.config.aggregation, self.config.trim_fraction)
        return z + gradient, dual_averaging_update(anchor, z + gradient, weight, self.config.eta)

    def checked_step(self, replies: list, centers: np.ndarray, anchor: np.ndarray, z: np.ndarray,
                     box: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`step`, with the server's own state checked after it
        (:func:`fedcluster.da_ufl.centers_problem`). When the step would break it, the
        replies that caused it are found by leaving them out one at a time (the one whose
        absence helps most, until the step is sound: at most half of them), dropped, and
        their senders taken out of the run; honest senders are never blamed, since a step
        without the culprits is sound by the same test."""
        new_z, new = self.step(replies, centers, anchor, z)
        problem = centers_problem(new, *box)
        culprits: list[int] = []
        while problem and len(culprits) < len(replies) // 2:
            rest = [r for r in replies if r.node_id not in culprits]
            scored = []
            for reply in rest:
                _, trial = self.step([r for r in rest if r is not reply], centers, anchor, z)
                sound = centers_problem(trial, *box) is None
                scored.append((not sound, box_overshoot(trial, *box), reply.node_id))
            culprits.append(min(scored)[2])
            new_z, new = self.step([r for r in replies if r.node_id not in culprits], centers, anchor, z)
            problem = centers_problem(new, *box)
        if problem:
            raise FederationError(f"the daufl-step replies move the centers {problem} even without "
                                  f"{len(culprits)} of them: no sound step is left")
        for node in culprits:
            self.exclude(node, "its daufl-step reply would have moved the centers outside the federation's "
                               "bounding box (a step no points produce)")
        return new_z, new

    # -------------------------------------------------------------- phases 1 and 2
    def moments_check(self, centers: np.ndarray, anchor: np.ndarray, point_weight: float, ratio: float):
        """Every point weighs the same (``weighting = uniform``): an agent's step reply
        implies the sums of its points per cluster, which must add up to the sum its data
        summary declared (:func:`fedcluster.bounds.moments_violation`), its weights to its
        points times the weight, and each cluster's mean must be one its labels allow: each
        point is within ``ratio`` = 1 + ξ_max / t1 of its nearest ``anchor`` center
        (:func:`fedcluster.bounds.voronoi_violation`)."""
        def check(reply) -> str | None:
            declared = self.declared.get(reply.node_id)
            if declared is None or declared.moment_sum is None:
                return None
            weight = reply.arrays["weight"]
            if abs(float(weight.sum()) - point_weight * declared.points) > 1e-8 * point_weight * max(declared.points, 1.0):
                return "its weights do not add up to its declared points times the weight of a point"
            sums, counts, means = implied_statistics(centers, reply.arrays["gradient"], weight, point_weight)
            return (moments_violation(sums, None, declared, "the sums its gradients imply")
                    or voronoi_violation(means, counts, anchor, ratio, declared_scatter(declared)))

        return check

    def som_request(self) -> dict[str, Any]:
        cfg = self.config
        grid = cfg.som_grid or som_grid(cfg.k)

        def square(reply) -> str | None:  # a device with fewer points than grid² trains a smaller square grid
            units = reply.arrays["codebook"].shape[0]
            return None if is_grid(units, grid) else f"its codebook has {units} units, not a square grid of at most {grid} × {grid}"

        return dict(task="som_codebook", config={"grid": grid, "epochs": cfg.som_epochs},
                    seeded=True, check=square, phase="som-codebooks")

    def make_bins(self, low: np.ndarray, high: np.ndarray, soms: list | None) -> tuple[str, dict, np.ndarray]:
        """The bins: a grid over the bounding box (bin) or the concatenated SOM codebooks
        ``soms`` (som, uniform). Returns (binning, arrays that define it, bin representatives)."""
        cfg = self.config
        if cfg.weighting == "bin":
            try:
                grid_cells(cfg.bins, self.dimension, cfg.max_bins)
            except TooManyBins as exc:
                raise FederationError(f"run-config bins={cfg['bins']} with d={self.dimension}: {exc}") from None
            return "grid", {"low": low, "high": high}, grid_centers(low, high, cfg.bins)
        if not soms:
            raise FederationError("no device returned a SOM codebook")
        codebook = np.concatenate([r.arrays["codebook"] for r in soms])
        return "codebook", {"codebook": codebook}, codebook

    def count_bins(self, nodes: list[int], binning: str, bin_arrays: dict, cells: int) -> tuple[np.ndarray, list[int]]:
        """Every agent's points per bin, (J, q) in node order, and those agents; a node
        that fails here is excluded (its weights would be unknown)."""
        replies = self.broadcast(
            "bin_counts",
            nodes,
            arrays=bin_arrays,
            config={"binning": binning, "bins": self.config.bins},
            sizes={"q": cells},
            phase="bin-counts",
        )
        answered = {r.node_id for r in replies}
        for node in nodes:
            if node not in answered:
                self.exclude(node, "its bin counts are missing (no valid reply, or away when they were collected): "
                                   "the weights of every step need them")
        return np.stack([r.arrays["counts"] for r in replies]), [r.node_id for r in replies]

    # -------------------------------------------------------------- outer and inner loops
    def train(
        self,
        agents: list[int],
        centers: np.ndarray,
        binning: str,
        bin_arrays: dict,
        weights: np.ndarray | None,
        box: tuple[np.ndarray, np.ndarray],
    ) -> tuple[np.ndarray, int]:
        cfg = self.config
        row = {node: i for i, node in enumerate(agents)}  # the rows of ``weights``
        k = centers.shape[0]
        eps = cfg.eps_glo * diagonal(*box)
        step_binning = "uniform" if weights is None else binning
        uniform = np.full(1, 1.0 / len(agents))

        def bin_weight_of(node: int) -> np.ndarray:
            return uniform if weights is None else weights[row[node]]

        previous, previous_seed = None, 0
        t1 = 0
        for t1 in range(1, cfg.outer_iterations + 1):
            self.begin_round(t1)
            seed = self.phase_seed()  # ξ of this outer iteration (each agent mixes in its partition)
            anchor, z = centers, np.zeros_like(centers)
            changed, move, t2 = None, None, 0
            for t2 in range(1, cfg.inner_iterations + 1):
                first = t2 == 1 and previous is not None
                replies = self.broadcast(
                    "daufl_step",
                    [node for node in agents if node not in self.excluded],
                    arrays={"centers": centers, "anchor": anchor, **({"previous": previous} if first else {}),
                            **(bin_arrays if step_binning != "uniform" else {})},
                    config={"binning": step_binning, "bins": cfg.bins, "outer": t1, "xi-max": cfg.xi_max, "seed": seed,
                            **({"previous-outer": t1 - 1, "previous-seed": previous_seed} if first else {})},
                    per_node=lambda node: ({"weights": bin_weight_of(node)}, None),
                    sizes={"k": k},
                    check=self.moments_check(centers, anchor, uniform[0], 1.0 + cfg.xi_max / t1)
                    if step_binning == "uniform" else None,
                    phase="daufl-step",
                )
                if first:
                    changed = sum_arrays(replies, "changed")[0]
                z, new = self.checked_step(replies, centers, anchor, z, box)
                move = max_move(new, centers)
                centers = new
                if move <= eps or changed == 0:
                    break
            self.end_round(inner_iterations=t2, labels_changed=changed, last_move=move, z_norm=frobenius(z))
            log(INFO, "[fedcluster] da-ufl outer %d: %d inner steps, labels changed %s, last move %.3g", t1, t2, changed, move)
            if changed == 0:
                break
            previous, previous_seed = anchor, seed
        return centers, t1
