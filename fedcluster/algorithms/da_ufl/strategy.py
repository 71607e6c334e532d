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
An agent that misses a step counts as it last answered (:mod:`fedcluster.algorithms.da_ufl.strategy_agents`).
"""

from __future__ import annotations

from logging import INFO
from typing import Any

import numpy as np
from flwr.common.logger import log

from fedcluster.bounds import declared_scatter, moments_violation, voronoi_violation
from fedcluster.points import bounding_box
from fedcluster.algorithms.da_ufl.model import (
    implied_mean_violation,
    restated_violation,
    weighted_step_violation,
    implied_statistics,
    TooManyBins,
    centers_problem,
    diagonal,
    frobenius,
    grid_cells,
    grid_centers,
    init_candidates,
    inner_step,
    is_grid,
    max_move,
    som_grid,
)

from fedcluster.server.base import FederatedStrategy, FederationError
from fedcluster.algorithms.da_ufl.strategy_agents import Agents
from fedcluster.server.messages import Inconsistent


class DAUFL(Agents, FederatedStrategy):
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
        summaries, soms = self.gather_summaries(summaries, soms)
        boxes = [self.members.declared[r.node_id] for r in summaries]  # in the run's units (standardize)
        low, high = bounding_box([b.low for b in boxes], [b.high for b in boxes])
        self.start_agents((low, high))
        # Phases 1 and 2 (Algorithm 1, steps 1-3): bins and the agents' weights.
        binning, bin_arrays, representatives = self.make_bins(low, high, soms)
        count_request = self.count_request(binning, bin_arrays, representatives.shape[0])
        self.gather_counts(count_request, [r.node_id for r in summaries if r.node_id not in self.members.excluded])
        counts = self.counts_array()
        self.point_weight = 1.0 / counts.shape[0]  # uniform: w_j = 1/J of the agents counted first
        # Step 4: k-means++ on the bin representatives weighted by total counts; the
        # agents' own points choose among the distinct optima found there (one round).
        try:
            candidates = init_candidates(representatives, counts, k, self.rng, cfg.init_restarts, cfg.init_candidates)
        except ValueError as exc:
            raise FederationError(f"initialization: {exc}") from None
        initial, init_record = self.choose_start(candidates)
        centers, outer_done, settled = self.train(initial, count_request, binning, bin_arrays)
        total_cost, num_points = self.evaluate(centers, phase="final-evaluation")
        log(
            INFO,
            "[fedcluster] da-ufl (%s) converged in %d outer iterations; cost/pt %.6g",
            cfg.weighting,
            outer_done,
            total_cost / num_points,
        )
        return {
            "centers": centers,
            "arrays": {
                "init_centers": initial,
                "bin_counts": self.counts_array(),
                "bin_representatives": representatives,
            },
            "init": init_record,
            "da_ufl": {
                "weighting": cfg.weighting,
                "bins": int(representatives.shape[0]),
                "agents": len(self.counted()),
                "outer_iterations": outer_done,
                "converged": settled,
            },
            "final": {"cost": total_cost / num_points, "total_cost": total_cost, "num_points": num_points},
        }

    def choose_start(self, candidates: np.ndarray) -> tuple[np.ndarray, dict[str, Any]]:
        """The start of the dual averaging: the only candidate, or the one the agents'
        points make cheapest (``score_candidates``: the cost of each set, summed)."""
        if candidates.shape[0] == 1:
            return candidates[0], {"candidates": 1, "chosen": 0}
        totals, points = self.score_candidates(candidates, phase="init-scoring")
        if points == 0:  # every agent away: the cheapest on the bins
            log(
                INFO,
                "[fedcluster] da-ufl init: no agent connected to score the %d candidates; the cheapest on the bins "
                "starts",
                candidates.shape[0],
            )
            return candidates[0], {"candidates": int(candidates.shape[0]), "chosen": 0}
        costs = totals / points
        chosen = int(np.argmin(costs))
        log(
            INFO,
            "[fedcluster] da-ufl init: %d candidates scored by the agents, the cheapest on the bins is %s",
            candidates.shape[0],
            "chosen" if chosen == 0 else f"{costs[0] / costs[chosen]:.4g}× the chosen one",
        )
        return candidates[chosen], {"candidates": int(candidates.shape[0]), "chosen": chosen, "costs": costs.tolist()}

    def step_check(self, centers: np.ndarray, anchor: np.ndarray, uniform: bool, ratio: float, outer: int):
        """A step reply's check. Its implied means must lie in the box its sender declared
        (:func:`fedcluster.algorithms.da_ufl.model.implied_mean_violation`): no points of its produce
        another, so a reply outside proves a lie and takes the sender out; so does a reply
        whose weighted sums differ from those its sender sent earlier in the same outer
        iteration (:func:`fedcluster.algorithms.da_ufl.model.restated_violation`: its labels and weights
        are fixed for it). Then :meth:`moments_check` (``uniform`` weights) or
        :meth:`weighted_check` (bin or SOM weights)."""
        more = (
            self.moments_check(centers, anchor, self.point_weight, ratio)
            if uniform
            else self.weighted_check(centers, anchor, ratio)
        )

        def check(reply) -> str | None:
            declared = self.members.declared.get(reply.node_id)
            if declared is not None and declared.low is not None:
                reason = implied_mean_violation(
                    centers, reply.arrays["gradient"], reply.arrays["weight"], declared.low, declared.high
                )
                if reason:
                    return Inconsistent(reason)
            held = self.statistics.get(reply.node_id)
            if held is not None and held.outer == outer:  # the same labels and weights
                reason = restated_violation(
                    centers, reply.arrays["gradient"], reply.arrays["weight"], held.at, held.gradient, held.weight
                )
                if reason:
                    return Inconsistent(reason)
            return more(reply)

        return check

    def weighted_check(self, centers: np.ndarray, anchor: np.ndarray, ratio: float):
        """Bin or SOM weights: what the server sent and holds of an agent (its bins'
        weights and counts, its scatter) bounds its step reply as moments do for uniform
        weights (:func:`fedcluster.algorithms.da_ufl.model.weighted_step_violation`)."""

        def check(reply) -> str | None:
            node = reply.node_id
            declared, table, counts = self.members.declared.get(node), self.table.get(node), self.bin_counts.get(node)
            if declared is None or declared.moment_sum is None or table is None or counts is None:
                return None
            return weighted_step_violation(
                centers,
                reply.arrays["gradient"],
                reply.arrays["weight"],
                anchor,
                ratio,
                table,
                counts,
                declared_scatter(declared),
            )

        return check

    # -------------------------------------------------------------- phases 1 and 2
    def moments_check(self, centers: np.ndarray, anchor: np.ndarray, point_weight: float, ratio: float):
        """Every point weighs the same (``weighting = uniform``): an agent's step reply
        implies the sums of its points per cluster, which must add up to the sum its data
        summary declared (:func:`fedcluster.bounds.moments_violation`), its weights to its
        points times the weight, and each cluster's mean must be one its labels allow: each
        point is within ``ratio`` = 1 + ξ_max / t1 of its nearest ``anchor`` center
        (:func:`fedcluster.bounds.voronoi_violation`)."""

        def check(reply) -> str | None:
            declared = self.members.declared.get(reply.node_id)
            if declared is None or declared.moment_sum is None:
                return None
            weight = reply.arrays["weight"]
            if abs(float(weight.sum()) - point_weight * declared.points) > 1e-8 * point_weight * max(
                declared.points, 1.0
            ):
                return "its weights do not add up to its declared points times the weight of a point"
            sums, counts, means = implied_statistics(centers, reply.arrays["gradient"], weight, point_weight)
            return moments_violation(
                sums, None, declared, "the sums its gradients imply", about=[centers]
            ) or voronoi_violation(means, counts, anchor, ratio, declared_scatter(declared))

        return check

    def som_request(self) -> dict[str, Any]:
        cfg = self.config
        grid = cfg.som_grid or som_grid(cfg.k)

        def square(reply) -> str | None:  # a device with fewer points than grid² trains a smaller square grid
            units = reply.arrays["codebook"].shape[0]
            return (
                None
                if is_grid(units, grid)
                else f"its codebook has {units} units, not a square grid of at most {grid} × {grid}"
            )

        return dict(
            task="som_codebook",
            config={"grid": grid, "epochs": cfg.som_epochs},
            seeded=True,
            check=square,
            phase="som-codebooks",
        )

    def make_bins(self, low: np.ndarray, high: np.ndarray, soms: list | None) -> tuple[str, dict, np.ndarray]:
        """The bins: a grid over the bounding box (bin) or the concatenated SOM codebooks
        ``soms`` (som, uniform). Returns (binning, arrays that define it, bin representatives)."""
        cfg = self.config
        if cfg.weighting == "bin":
            try:
                grid_cells(cfg.bins, self.members.dimension, cfg.max_bins)
            except TooManyBins as exc:
                raise FederationError(f"run-config bins={cfg['bins']} with d={self.members.dimension}: {exc}") from None
            return "grid", {"low": low, "high": high}, grid_centers(low, high, cfg.bins)
        if not soms:
            raise FederationError("no device returned a SOM codebook")
        codebook = np.concatenate([r.arrays["codebook"] for r in soms])
        return "codebook", {"codebook": codebook}, codebook

    def count_request(self, binning: str, bin_arrays: dict, cells: int) -> dict[str, Any]:
        """The bin-counts query (a :meth:`broadcast` request without ``nodes``): every
        agent's points per bin. An agent away when it is first sent is asked again with
        the steps (``catch_up_requests``) and takes part once its counts are in."""
        return dict(
            task="bin_counts",
            arrays=bin_arrays,
            config={"binning": binning, "bins": self.config.bins},
            sizes={"q": cells},
            phase="bin-counts",
        )

    # -------------------------------------------------------------- outer and inner loops
    def train(
        self, centers: np.ndarray, count_request: dict[str, Any], binning: str, bin_arrays: dict
    ) -> tuple[np.ndarray, int, bool]:
        """The outer loop (labels, t1) around the inner dual-averaging loop (t2). Every
        step's update uses every agent's statistics the server holds (``remember``): an
        agent that did not answer this step counts as it last answered (docs/ALGORITHMS.md
        §2, "Agents that come and go"). Returns the centers, the outer iterations run and
        whether the labels settled."""
        cfg = self.config
        eps = cfg.eps_glo * diagonal(*self.box)
        step_binning = "uniform" if cfg.weighting == "uniform" else binning
        shared = bin_arrays if step_binning != "uniform" else {}
        t1, settled = 0, False
        for t1 in range(1, cfg.outer_iterations + 1):
            self.begin_round(t1)
            seed = self.phase_seed()  # ξ of this outer iteration (each agent mixes in its partition)
            self.renew_weights(cfg.weighting == "uniform")
            anchor = origin = centers
            z = np.zeros_like(centers)
            changed, reported, move, t2 = 0, 0, None, 0
            for t2 in range(1, cfg.inner_iterations + 1):
                replies, left = self.step_round(centers, anchor, shared, step_binning, t1, seed, count_request)
                now, entered = self.remember(replies, centers, t1, anchor, seed)
                changed, reported = changed + now + left, reported + entered
                if entered or left:  # the objective changed: the dual averaging starts again from here
                    origin, z = centers, np.zeros_like(centers)
                new = self.inner_update(origin, z, centers, t1, t2)
                if new is not None:
                    z, new = new
                    move, centers = max_move(new, centers), new
                settled = changed == 0 and reported >= max(1, self.required_replies(len(self.table)))
                if move is None or move <= eps or settled:
                    break
            self.end_round(
                inner_iterations=t2,
                labels_changed=changed,
                agents_reported=reported,
                last_move=move,
                z_norm=frobenius(z),
            )
            log(
                INFO,
                "[fedcluster] da-ufl outer %d: %d inner steps, labels changed %s, last move %s",
                t1,
                t2,
                changed,
                move,
            )
            if settled:
                break
        return centers, t1, settled

    def step_round(
        self,
        centers: np.ndarray,
        anchor: np.ndarray,
        shared: dict,
        step_binning: str,
        outer: int,
        seed: int,
        count_request: dict[str, Any],
    ) -> tuple[list, int]:
        """One inner step's round trip: the step to every agent weighted in this outer
        iteration, with the catch-up requests (``catch_up_requests``). Returns the valid
        step replies and the points whose statistics left the objective (their agent out
        of the run). A dropped reply is an absence: its agent's last statistics stay."""
        cfg = self.config
        step = dict(
            task="daufl_step",
            nodes=[node for node in self.active_nodes if node in self.table],
            arrays={"centers": centers, "anchor": anchor, **shared},
            config={"binning": step_binning, "bins": cfg.bins, "outer": outer, "xi-max": cfg.xi_max, "seed": seed},
            per_node=lambda node: self.step_request(node, outer),
            sizes={"k": centers.shape[0]},
            check=self.step_check(centers, anchor, step_binning == "uniform", 1.0 + cfg.xi_max / outer, outer),
            phase="daufl-step",
        )
        requests = {"step": step, **self.catch_up_requests(count_request)}
        got = dict(zip(requests, self.broadcast_together(*requests.values())))
        self.catch_up(got)
        return got["step"], self.forget({node for node in self.statistics if node in self.members.excluded})

    def inner_update(
        self, origin: np.ndarray, z: np.ndarray, centers: np.ndarray, outer: int, step: int
    ) -> tuple[np.ndarray, np.ndarray] | None:
        """The dual-averaging step over the held statistics (``(z, centers)``; None when
        the server holds none yet). Each one passed ``step_check``, so the new centers are
        weighted means of points inside the federation's box; should they not be, the run
        stops saying so, blaming no agent."""
        held = self.held()
        if held is None:
            return None
        z, new = inner_step(
            origin, z, centers, *held, self.config.eta, self.config.aggregation, self.config.trim_fraction
        )
        problem = centers_problem(new, *self.box)
        if problem:
            raise FederationError(
                f"phase 'daufl-step' (outer iteration {outer}, step {step}): the agents' statistics, "
                f"each within its agent's box, move the centers {problem}"
            )
        return z, new
