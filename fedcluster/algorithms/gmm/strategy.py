"""Federated GMM: expectation-maximization of a Gaussian mixture over the devices' points
(Dempster, Laird & Rubin 1977; the M-step as scikit-learn's ``GaussianMixture``);
specification: docs/ALGORITHMS.md section 6.

    start   FedKMeans' start and rounds (``gmm-init = kmeans``), or hard E-steps from the
            devices' moments (``lloyd``), then one hard E-step: the first mixture
    E-step  each device, on its own points: responsibilities r by log-sum-exp, and the sums
            N_k = Σ r, s_k = Σ r (x − μ_k), S_k = Σ r (x − μ_k)(x − μ_k)ᵀ, Σ log p(x)
    M-step  the server, from the sums alone: μ_k + s_k/N_k, S_k/N_k − δδᵀ + reg-covar·I, N_k/N
    stop    when the mean log-likelihood per point moves by less than ``em-tol``

Every E-step is a sum of the devices' replies: with ``secure-aggregation`` it reaches the
server only as that sum (:class:`fedcluster.server.secure_sum.SecureSum`). ``k-range`` fits
every k of the range in one run and keeps the mixture of lowest BIC."""

from __future__ import annotations

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
    bic,
    estep_violation,
    m_step,
    n_parameters,
    secure_ranges,
    summary_start,
    summed_statistics,
    unit_mixture,
)


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
        hard = cfg.kmeans_rounds if start == "lloyd" else 1
        self.secagg.planned = len(ks) * (hard + cfg.em_rounds + 1)  # a run that stops early leaves keys unused
        fits = []
        for k in ks:
            means = self.kmeans_start(k, local, coarse) if start == "kmeans" else self.moments_start(k, summaries)
            fits.append(self.fit(k, means, hard, start))
        best = min(range(len(fits)), key=lambda i: fits[i]["bic"]) if len(ks) > 1 else 0
        mixture, final = fits[best]["mixture"], fits[best]["final"]
        outcome: dict[str, Any] = {
            "centers": mixture.means,
            "arrays": {"weights": mixture.weights, "covariances": mixture.covariances},
            "init": {"method": start, "hard_steps": hard},
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
    def kmeans_start(self, k: int, local, coarse) -> np.ndarray:
        """FedKMeans' start (its scored candidates) and ``kmeans-rounds`` of its rounds: the
        cheapest centers it measured."""
        starts, _ = self.initialize(k, self.low, self.high, local, coarse)
        if self.config.kmeans_rounds == 0:
            return starts[0]
        last = self.train(starts, self.config.kmeans_rounds)
        return self.best_seen[4] if self.best_seen is not None else last.centers

    def moments_start(self, k: int, summaries: list[Reply]) -> np.ndarray:
        """Means drawn from what the data summaries declared (:func:`start_means`)."""
        counts = [float(r.num_examples) for r in summaries]
        sums, scatters = [r.arrays["sum"] for r in summaries], [r.arrays["scatter"] for r in summaries]
        return summary_start(counts, sums, scatters, k, self.rng)

    # ------------------------------------------------------------------ EM
    def fit(self, k: int, means: np.ndarray, hard: int, start: str) -> dict[str, Any]:
        """Hard E-steps from ``means`` (the first mixture), EM rounds until ``em-tol``, and a
        last E-step that scores the mixture returned."""
        cfg = self.config
        d = self.members.dimension
        mixture = unit_mixture(means, cfg.covariance_type)
        for step in range(hard):
            stats = self.estep(mixture, True, f"{'lloyd' if start == 'lloyd' else 'kmeans-labels'}")
            if stats is not None:
                mixture = m_step(
                    stats["counts"], stats["sums"], stats["second"], mixture.means, cfg.covariance_type, cfg.reg_covar
                )
        lower_bound, converged, iterations = float("-inf"), False, 0
        for iterations in range(1, cfg.em_rounds + 1):
            self.begin_round(len(self.results.rounds) + 1)
            stats = self.estep(mixture, False, "em")
            if stats is None:  # a secure sum outside the devices' ranges: this update is skipped
                self.end_round(stage="em", k=k, skipped=True)
                continue
            previous, lower_bound = lower_bound, stats["loglik"] / stats["points"]
            mixture = m_step(
                stats["counts"], stats["sums"], stats["second"], mixture.means, cfg.covariance_type, cfg.reg_covar
            )
            change = lower_bound - previous
            self.end_round(stage="em", k=k, log_likelihood=lower_bound, change=change, points=stats["points"])
            log(INFO, "[fedcluster] EM round %d (k=%d): mean log-likelihood %.8g", iterations, k, lower_bound)
            if abs(change) < cfg.em_tol:
                converged = True
                break
        if not converged:
            self.warn(f"EM (k={k}) did not converge in em-rounds={cfg.em_rounds} rounds (em-tol={cfg.em_tol:g})")
        scored = self.estep(mixture, False, "final-evaluation")
        if scored is None:
            raise FederationError(f"phase 'final-evaluation': {self.secagg.failure}")
        points = int(round(scored["points"]))
        total = float(scored["loglik"])
        final = {
            "k": k,
            "covariance_type": cfg.covariance_type,
            "num_points": points,
            "log_likelihood": total / scored["points"],
            "total_log_likelihood": total,
            "lower_bound": float(lower_bound),
            "converged": converged,
            "n_iter": iterations,
            "n_parameters": n_parameters(k, d, cfg.covariance_type),
        }
        final["bic"] = bic(total, points, k, d, cfg.covariance_type)
        return {"mixture": mixture, "final": final, "bic": final["bic"]}

    def estep(self, mixture: Mixture, hard: bool, phase: str) -> dict[str, Any] | None:
        """The summed E-step statistics of ``mixture`` over the active devices (each reply
        checked against its declarations in a plain run; a secure sum clipped to public
        ranges), or None for a secure sum outside the ranges."""
        second = "outer" if mixture.full else "squares"
        names = ("counts", "sums", second, "loglik")
        declared = self.members.declared
        points = max([declared[n].points for n in self.active_nodes if n in declared] or [1.0])
        ranges = {name: value for name, value in secure_ranges(mixture, self.low, self.high, points).items()}
        ranges = {name: ranges[name] for name in names}

        def check(reply: Reply) -> str | None:
            reason = estep_violation(reply.arrays, mixture, declared.get(reply.node_id))
            return Inconsistent(reason) if reason else None

        total, summed = self.secagg.summed(
            "gmm_estep",
            self.active_nodes,
            mixture.request(),
            {"full": mixture.full, "hard": hard},
            {"k": mixture.means.shape[0]},
            check,
            phase,
            ranges,
        )
        if not summed:
            raise FederationError(f"phase {phase!r}: no device's statistics reached the server")
        if total is None:
            return None
        return summed_statistics(total, second)
