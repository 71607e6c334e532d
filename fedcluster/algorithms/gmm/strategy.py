"""Federated GMM: expectation-maximization of a Gaussian mixture over the devices' points
(Dempster, Laird & Rubin 1977; the M-step as scikit-learn's ``GaussianMixture``);
specification: docs/ALGORITHMS.md section 6.

    start   ``em-starts`` starts side by side: FedKMeans' start sets (by default unrefined;
            after ``kmeans-rounds`` of its rounds) topped up with draws of k of the devices'
            summary centers, then one hard E-step (``gmm-init = kmeans``); or k-means++ draws
            among the devices' means, then ``kmeans-rounds`` + 1 hard E-steps (``lloyd``)
    E-step  each device, on its own points: responsibilities r by log-sum-exp, and the sums
            N_k = Σ r, s_k = Σ r (x − μ_k), S_k = Σ r (x − μ_k)(x − μ_k)ᵀ, Σ log p(x)
    M-step  the server, from the sums alone: μ_k + s_k/N_k, S_k/N_k − δδᵀ + reg-covar·I, N_k/N
    stop    a start stops when its mean log-likelihood per point moves by less than
            ``em-tol``; after half of ``em-rounds`` only the leader goes on; the start of
            highest log-likelihood is returned (scikit-learn's ``n_init``)

Every E-step is a sum of the devices' replies (one message per device carries every live
start; its reply every start's sums): with ``secure-aggregation`` it reaches the server only
as that sum (:class:`fedcluster.server.secure_sum.SecureSum`). ``k-range`` fits
every k of the range in one run and keeps the mixture of lowest BIC."""

from __future__ import annotations

import math
from logging import INFO
from typing import Any

import numpy as np
from flwr.common.logger import log

from fedcluster.algorithms.fedkmeans.model import cost_tie
from fedcluster.algorithms.fedkmeans.strategy import FedKMeans
from fedcluster.config import k_range
from fedcluster.points import bounding_box
from fedcluster.server.base import FederationError, Reply
from fedcluster.server.messages import Inconsistent
from fedcluster.server.secure_sum import SecureSum

from .model import (
    Mixture,
    best_start,
    bic,
    distinct_starts,
    em_survivors,
    m_step,
    n_parameters,
    stacked_request,
    start_arrays,
    starts_ranges,
    starts_violation,
    start_count,
    summary_start,
    topped_up_starts,
    summed_statistics,
    unit_mixture,
)


LLOYD_ROUNDS = 9  # kmeans-rounds = -1 (auto) with gmm-init = lloyd


class FederatedGMM(FedKMeans):
    """Federated EM of a Gaussian mixture; its run-config keys: the ``gmm`` section of
    docs/reference.md. A FedKMeans for its start (``gmm-init = kmeans``)."""

    name = "gmm"
    exclude_invalid = True  # EM sums every device's points each round: a device whose reply fails leaves the run

    def __init__(self, grid, config) -> None:
        super().__init__(grid, config)
        self.secagg = SecureSum(config, self.transport, self.members, self.results)

    def run(self) -> dict[str, Any]:
        cfg = self.config
        ks = list(range(k_range(cfg.k_range)[0], k_range(cfg.k_range)[1] + 1)) if cfg.k_range else [cfg.k]
        start = cfg.gmm_init if cfg.gmm_init != "auto" else ("lloyd" if self.secagg.enabled else "kmeans")
        if start == "kmeans":
            summaries, local, coarse = self.summaries(max(ks), None)
        else:
            summaries, local, coarse = self.discover_dimension(), None, None
        total = sum(r.num_examples for r in summaries)
        if max(ks) > total:
            raise FederationError(f"k={max(ks)} is larger than the {total} points held by the federation")
        self.cost_tie = cost_tie([self.members.declared.get(r.node_id) for r in summaries])
        self.low, self.high = bounding_box([r.arrays["min"] for r in summaries], [r.arrays["max"] for r in summaries])
        rounds = cfg.kmeans_rounds if cfg.kmeans_rounds >= 0 else (LLOYD_ROUNDS if start == "lloyd" else 0)
        hard = rounds + 1 if start == "lloyd" else 1  # the last hard E-step gives the first mixtures
        self.secagg.planned = len(ks) * (hard + cfg.em_rounds + 1)  # a run that stops early leaves keys unused
        fits = []
        for k in ks:
            count = start_count(cfg.em_starts, k, self.members.dimension, cfg.covariance_type)
            if start == "kmeans":
                means = self.kmeans_start(k, local, coarse, count, rounds)
            else:
                means = self.moments_start(k, summaries, count)
            fits.append(self.fit(k, means, hard, start))
        best = min(range(len(fits)), key=lambda i: fits[i]["bic"]) if len(ks) > 1 else 0
        mixture, final = fits[best]["mixture"], fits[best]["final"]
        outcome: dict[str, Any] = {
            "centers": mixture.means,
            "arrays": {"weights": mixture.weights, "covariances": mixture.covariances},
            "init": {"method": start, "hard_steps": hard, "starts": fits[best]["starts"]},
            "final": final,
        }
        if len(ks) > 1:
            outcome["bic_range"] = {
                "k": ks,
                "bic": [f["bic"] for f in fits],
                "log_likelihood": [f["final"]["log_likelihood"] for f in fits],
                "n_parameters": [f["final"]["n_parameters"] for f in fits],
                "chosen_k": ks[best],
            }
            log(INFO, "[fedcluster] k-range: BIC picks k=%d", ks[best])
        if self.secagg.enabled:
            final["secure_aggregation"] = self.secagg.record()
        return outcome

    # ------------------------------------------------------------------ the start
    def kmeans_start(self, k: int, local, coarse, count: int, rounds: int) -> list[np.ndarray]:
        """FedKMeans' start (its scored candidates and k-means++ draws on the devices'
        summaries, its ``n-init`` center sets) and ``kmeans-rounds`` of its rounds, the sets
        side by side: the cheapest centers measured, then the other sets' last centers by
        their last measured cost; the first ``count`` distinct ones."""
        starts, _ = self.initialize(k, self.low, self.high, local, coarse)
        if rounds > 0:
            last = self.train(starts, rounds)
            best = self.best_seen[4] if self.best_seen is not None else last.centers
            starts = [best, *(c.centers for c in sorted(self.sets.values(), key=lambda c: c.cost))]
        if local is None or local[0].shape[0] < k:
            return [starts[i] for i in distinct_starts(starts)][:count]
        return topped_up_starts(starts, count, *local, self.rng)

    def moments_start(self, k: int, summaries: list[Reply], count: int) -> list[np.ndarray]:
        """``count`` draws of means from what the data summaries declared (:func:`start_means`)."""
        counts = [float(r.num_examples) for r in summaries]
        sums, scatters = [r.arrays["sum"] for r in summaries], [r.arrays["scatter"] for r in summaries]
        return [summary_start(counts, sums, scatters, k, self.rng) for _ in range(count)]

    # ------------------------------------------------------------------ EM
    def fit(self, k: int, starts: list[np.ndarray], hard: int, start: str) -> dict[str, Any]:
        """Hard E-steps from every start's means (the first mixtures; a start that reaches
        another's means leaves), EM rounds of the starts side by side (:func:`em_survivors`),
        and a last E-step that scores the mixture of highest log-likelihood."""
        cfg = self.config
        d = self.members.dimension
        mixtures = [unit_mixture(means, cfg.covariance_type) for means in starts]
        for _ in range(hard):
            steps, _ = self.estep(mixtures, True, "lloyd" if start == "lloyd" else "kmeans-labels")
            if steps is not None:
                mixtures = [self.maximized(stats, mixture) for stats, mixture in zip(steps, mixtures)]
        mixtures = [mixtures[i] for i in distinct_starts([mixture.means for mixture in mixtures])]
        count = len(mixtures)
        lower, change = [float("-inf")] * count, [float("inf")] * count
        converged, iterations = [False] * count, [0] * count
        live, deadline, t = list(range(count)), max(1, math.ceil(cfg.em_rounds / 2)), 0
        devices_before = None  # the devices whose statistics the previous EM round summed
        while live and t < cfg.em_rounds:
            t += 1
            self.begin_round(len(self.results.rounds) + 1)
            steps, devices = self.estep([mixtures[i] for i in live], False, "em")
            if steps is None:  # a secure sum outside the devices' ranges: this update is skipped
                self.end_round(stage="em", k=k, skipped=True)
                continue
            # A change between rounds over different devices' points (a reply lost, a device
            # gone) compares two data sets, not two mixtures: no evidence of convergence.
            same_data, devices_before = devices == devices_before, devices
            for i, stats in zip(live, steps):
                previous, lower[i] = lower[i], stats["loglik"] / stats["points"]
                mixtures[i], change[i], iterations[i] = self.maximized(stats, mixtures[i]), lower[i] - previous, t
                converged[i] = same_data and abs(change[i]) < cfg.em_tol
            leader = best_start(lower)
            extra = {"starts": [float(v) for v in lower], "live": len(live)} if count > 1 else {}
            self.end_round(
                stage="em", k=k, log_likelihood=lower[leader], change=change[leader], points=steps[0]["points"], **extra
            )
            log(INFO, "[fedcluster] EM round %d (k=%d): mean log-likelihood %.8g", t, k, lower[leader])
            live = em_survivors(live, converged, lower, t >= deadline)
        best = best_start(lower)
        if not converged[best]:
            self.warn(f"EM (k={k}) did not converge in em-rounds={cfg.em_rounds} rounds (em-tol={cfg.em_tol:g})")
        mixture = mixtures[best]
        scored, _ = self.estep([mixture], False, "final-evaluation")
        if scored is None:
            raise FederationError(f"phase 'final-evaluation': {self.secagg.failure}")
        points = int(round(scored[0]["points"]))
        total = float(scored[0]["loglik"])
        final = {
            "k": k,
            "covariance_type": cfg.covariance_type,
            "num_points": points,
            "log_likelihood": total / scored[0]["points"],
            "total_log_likelihood": total,
            "lower_bound": float(lower[best]),
            "converged": converged[best],
            "n_iter": iterations[best],
            "n_parameters": n_parameters(k, d, cfg.covariance_type),
        }
        if count > 1:
            final["start"], final["start_lower_bounds"] = best, [float(v) for v in lower]
        final["bic"] = bic(total, points, k, d, cfg.covariance_type)
        return {"mixture": mixture, "final": final, "bic": final["bic"], "starts": count}

    def maximized(self, stats: dict[str, Any], mixture: Mixture) -> Mixture:
        cfg = self.config
        return m_step(
            stats["counts"], stats["sums"], stats["second"], mixture.means, cfg.covariance_type, cfg.reg_covar
        )

    def estep(
        self, mixtures: list[Mixture], hard: bool, phase: str
    ) -> tuple[list[dict[str, Any]] | None, frozenset[int]]:
        """The summed E-step statistics of every mixture (the starts side by side, one
        message per device) over the active devices (each reply checked start by start
        against its declarations in a plain run; a secure sum clipped to public ranges),
        or None for a secure sum outside the ranges; and the devices summed."""
        full = mixtures[0].full
        second = "outer" if full else "squares"
        names = ("counts", "sums", second, "loglik")
        declared = self.members.declared
        points = max([declared[n].points for n in self.active_nodes if n in declared] or [1.0])
        ranges = starts_ranges(mixtures, self.low, self.high, points)
        ranges = {name: ranges[name] for name in names}

        def check(reply: Reply) -> str | None:
            reason = starts_violation(reply.arrays, mixtures, declared.get(reply.node_id))
            return Inconsistent(reason) if reason else None

        total, summed = self.secagg.summed(
            "gmm_estep",
            self.active_nodes,
            stacked_request(mixtures),
            {"full": full, "hard": hard},
            {"m": len(mixtures), "k": mixtures[0].means.shape[0]},
            check,
            phase,
            ranges,
        )
        if not summed:
            raise FederationError(f"phase {phase!r}: no device's statistics reached the server")
        if total is None:
            return None, frozenset(summed)
        return [summed_statistics(start_arrays(total, i), second) for i in range(len(mixtures))], frozenset(summed)
