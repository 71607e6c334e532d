"""FedDP-KMeans' privacy bookkeeping: the plan (the noise of every step), what a device
clips to, the noise and the ledger, the per-level checks of every reply, what result.json
reports and what it does not cover. A mixin of :class:`fedcluster.algorithms.feddp_kmeans.strategy.FedDPKMeans`
(state: ``level``, ``bounds``, ``plan``, ``mechanisms``, ``ledger``, ``clip_norm``)."""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

import numpy as np

import fedcluster.privacy
import fedcluster.protocol
from fedcluster.algorithms.feddp_kmeans import model as feddp_kmeans
from fedcluster.config import number_list

from fedcluster.server.base import FederationError, Reply

_NUMBER = re.compile(r"\d+(?:\.\d*)?(?:[eE][-+]?\d+)?")


class FedDPPrivacy:
    """Plan, noise, ledger and reply checks of a private run."""

    @property
    def distributed(self) -> bool:
        """Whether the devices add the noise (secure aggregation with ``secagg-noise = devices``)."""
        return self.secagg.enabled and self.config["secagg-noise"] == "devices"

    def secagg_noise_model(self) -> str:
        """The secure-aggregation threat model's words on who adds the noise."""
        if self.distributed:
            return "each device adds its share of the noise before masking, so no sum reaches the server without it"
        return "the server adds the noise to that exact sum (central DP)"

    def plan_privacy(self, server: np.ndarray | None, k: int) -> None:
        """The clipping bounds of every step, the noise plan, each step's mechanism with its
        own random stream, the sampling stream and the ledger."""
        cfg = self.config
        chosen = {step: cfg[key] for step, key in feddp_kmeans.CLIENT_BOUND_KEYS.items()}
        self.typical_norm = feddp_kmeans.server_typical_norm(server) if server is not None else None
        self.bounds = feddp_kmeans.clipping_bounds(
            self.level,
            self.clip_norm,
            k,
            cfg.client_max_points,
            chosen,
            self.typical_norm,
            capped=cfg.max_device_points > 0,
        )
        self.lloyd_update = feddp_kmeans.lloyd_mode(cfg.lloyd_update, self.level, self.init_method)
        self.radius = None
        if self.lloyd_update == "relative":  # one point moves a cluster's sum by at most r (2r: a swap under a cap)
            self.radius = feddp_kmeans.lloyd_radius(cfg.lloyd_radius, self.clip_norm, k, self.members.dimension)
            self.bounds["lloyd_gaussian"] = self.radius * (2 if cfg.max_device_points > 0 else 1)
        self.secure_points = feddp_kmeans.secure_points(self.level, cfg.max_device_points, cfg.client_max_points)
        if self.secagg.enabled:  # one session of keys serves the histogram and every Lloyd round
            self.secagg.planned = int(self.init_method == "histogram") + self.lloyd_rounds
        if self.secagg.enabled and not self.distributed:  # the server's noise covers the rounding too
            self.bounds = feddp_kmeans.secure_bounds(
                self.bounds, self.secure_points, self.radius or self.clip_norm, k, self.members.dimension
            )
        self.normalize_outer = feddp_kmeans.normalized_outer(self.level, cfg.clip_outer)
        self.plan = self.privacy_plan()
        streams = fedcluster.privacy.independent_generators(self.noise_seed(), len(feddp_kmeans.STEPS) + 1)
        self.mechanisms = {
            name: step.mechanism_instance(streams[feddp_kmeans.STEPS[name][1]]) for name, step in self.plan.items()
        }
        self.sampling_rng = streams[feddp_kmeans.SAMPLING_STREAM]
        self.ledger = self.new_ledger()

    def privacy_plan(self) -> dict[str, Any]:
        """The noise of every step (fedcluster.algorithms.feddp_kmeans.model.privacy_plan); the run config
        has already checked how budget-split, lloyd-fraction and step-epsilons combine.
        Noise added by the devices: Skellam releases (fedcluster.privacy.skellam)."""
        cfg = self.config
        shares = (
            number_list(cfg.budget_split, "budget-split")
            if cfg.budget_split
            else feddp_kmeans.RULE_OF_THUMB[self.level]
        )
        weights = feddp_kmeans.step_weights(self.init_method, self.lloyd_rounds, list(shares), cfg.lloyd_fraction)
        if self.distributed:
            self.budget_mode = "no noise (epsilon = inf)" if math.isinf(cfg.epsilon) else "target-total"
            weights = (
                weights if cfg.budget_split else feddp_kmeans.device_noise_weights(weights, self.members.dimension)
            )
            return feddp_kmeans.device_noise_plan(
                weights,
                self.bounds,
                self.lloyd_rounds,
                self.secure_points,
                self.radius or self.clip_norm,
                cfg.k,
                self.members.dimension,
                cfg.epsilon,
                cfg.delta,
            )
        q = cfg.client_sampling_rate
        sampling = q if self.level == "client" and q < 1 else None
        specs = feddp_kmeans.step_specs(weights, self.bounds, self.lloyd_rounds, sampling)
        step_epsilons = None
        if specs and cfg.step_epsilons:
            step_epsilons = list(number_list(cfg.step_epsilons, "step-epsilons"))
            assert [s.name for s in specs] == list(feddp_kmeans.step_names(cfg)), (
                "config and plan disagree on the steps"
            )
        try:
            plan, self.budget_mode = feddp_kmeans.privacy_plan(specs, cfg.epsilon, cfg.delta, step_epsilons)
        except feddp_kmeans.BudgetExceeded as exc:
            raise FederationError(str(exc)) from None
        return plan

    def client_config(self, gaussian: str | None = None, laplace: str | None = None) -> dict[str, Any]:
        """What a device needs to clip: Δ for its points (data-point level), or the bounds
        of the statistics it sends (client level: ``clip`` L2, ``clip-l1`` L1)."""
        if self.level == "data-point":
            return {"level": "data-point", "clip-norm": self.clip_norm, "max-points": self.config.max_device_points}
        config: dict[str, Any] = {"level": "client"}
        if gaussian is not None:
            config["clip"] = self.bounds[gaussian]
        if laplace is not None:
            config["clip-l1"] = self.bounds[laplace]
        return config

    def noise_seed(self) -> int | np.random.SeedSequence:
        """``noise-seed``; by default (-1) a seed drawn from the run folder's secret: unknown
        outside the folder, the same in a resumed run, so the releases it repeats are the
        same values (fedcluster.server.run_folder)."""
        if self.config.noise_seed >= 0:
            return self.config.noise_seed
        return np.random.SeedSequence(list(self.server_random("noise").integers(2**32, size=8)))

    def noisy(self, name: str, value: np.ndarray) -> np.ndarray:
        """``value`` + the noise of step ``name`` (its own mechanism and stream), entered in
        the folder's privacy ledger before it can leave the server
        (:class:`fedcluster.server.run_folder.ReleaseLog`; with the devices' noise the release was
        entered before they were asked: :meth:`devices_release`)."""
        mechanism = self.mechanisms[name]
        released = mechanism.add(value)
        if not self.distributed:
            step = self.plan[name]
            self.results.folder.releases.release(
                name,
                {
                    "mechanism": mechanism.name,
                    "scale": mechanism.scale,
                    "sensitivity": mechanism.sensitivity,
                    "sampling_rate": step.sampling_rate,
                    "delta": self.config.delta if step.mechanism != "laplace" else None,
                },
                released,
            )
        return released

    def devices_release(self, task: str, *names: str) -> None:
        """The devices are about to be asked for a sum of ``task`` they add their noise to: its
        releases are entered in the folder's privacy ledger when the server asks for the
        unmasking (:meth:`secagg_unmasking`), not before: a masked sum never unmasked — the
        crash or the dropouts came first, and a resumed run's devices no longer hold its
        seeds — is no release."""
        self.unmask_releases = names if self.distributed else ()

    unmask_releases: tuple[str, ...] = ()

    def secagg_unmasking(self) -> None:
        """The server is about to ask for the shares that unmask the current sum: from then on it
        may learn the sum, so its releases go to the ledger first — unless the journal replays
        that unmasking (the devices are not asked again), when the ledger already has them. A
        resumed run that must set up again a sum whose unmasking the first attempt had begun
        enters it again ("again": spent twice, the devices' noise drawn afresh; the first
        attempt may have received the shares, and the server cannot tell whether it did)."""
        names, self.unmask_releases = self.unmask_releases, ()
        replayed = self.results.journal.ahead(fedcluster.protocol.task("secagg_unmask").message_type)
        for name in names:
            if replayed and self.results.folder.releases.matches_replay(name):
                continue
            release = self.plan[name].release
            self.results.folder.releases.release(
                name, {"mechanism": "skellam", **dataclasses.asdict(release), "compositions": 1}, None
            )

    def new_ledger(self):
        if self.distributed:
            from fedcluster.privacy import skellam

            return skellam.SkellamLedger(self.level)
        return fedcluster.privacy.PrivacyLedger(self.level)

    def noise_shares(self, devices: int) -> float:
        """How much wider the noise of a sum of ``devices`` devices' shares is than planned
        (√(devices / t) with the devices' noise, each adding v / t; else 1)."""
        if not self.distributed or not devices:
            return 1.0
        return math.sqrt(devices / self.secagg.session.threshold)

    def device_noise(self, *names: str) -> dict[str, tuple[float, float]] | None:
        """Noise added by the devices: each secured step's variance (grid steps) and grid
        levels, by its summed array; None when the server adds the noise."""
        if not self.distributed:
            return None
        return {
            feddp_kmeans.SECURED_STEPS[name][0]: (self.plan[name].release.variance, self.plan[name].levels)
            for name in names
        }

    def record(self, name: str, compositions: int = 1) -> None:
        step = self.plan[name]
        if self.distributed:  # the release was planned with its compositions
            self.ledger.record(step.release)
            return
        self.ledger.record(
            name,
            self.mechanisms[name],
            compositions=compositions,
            sampling_rate=step.sampling_rate,
            delta=self.config.delta if step.mechanism != "laplace" else None,
        )

    def public_reason(self, reason: str) -> str:
        """Failure and exclusion reasons reach result.json without their numbers: a
        device's exact point count, a row index or a statistic's norm would be data the
        privacy guarantee does not cover (the server's log keeps them)."""
        return _NUMBER.sub("#", reason)

    def not_covered(self) -> dict[str, str]:
        """Every part of result.json computed from device data WITHOUT noise, with why."""
        listed = {"reference": "the pooled central k-means (simulation only: the server reads every client's data)"}
        if self.config.evaluate_cost:
            listed["final"] = (
                "the exact federated cost and point count of the final centers (evaluate-cost=true; set false in "
                "deployment)"
            )
        if self.config.margin < 1 and self.init_method == "feddp":
            listed["init.kept_by_margin"] = "the exact number of points step 3's margin filter kept (margin < 1)"
        if self.config.public_points > 0:
            listed["lloyd_rounds"] = (
                "chosen from the clients' exact number of points (config public-points), which "
                "this choice treats as public: a neighbouring dataset may get another number of rounds"
            )
            listed["config.public-points"] = "the clients' exact number of points"
        return listed

    def privacy_report(self) -> dict[str, Any]:
        delta = self.config.delta
        if self.distributed:  # every release holds the noise of at least the threshold of devices
            self.ledger.devices = min((s.threshold for s in self.secagg.history), default=0)
        report = self.ledger.to_dict(delta)
        report.update(
            {
                "target_epsilon": self.config.epsilon if not self.config.step_epsilons else None,
                "budget_mode": self.budget_mode,
                "epsilon_shares": {name: step.epsilon_share for name, step in self.plan.items()},
                "clip_norm": self.clip_norm,
                "server_typical_norm": self.typical_norm,
                "bounds": {name: self.bounds[name] for name in self.plan},
                "step1_normalized": self.normalize_outer,
                "client_sampling_rate": self.config.client_sampling_rate if self.level == "client" else 1.0,
                "init": self.init_method,
                "lloyd_rounds": self.lloyd_rounds,
                "lloyd_update": self.lloyd_update,
                "lloyd_radius": self.radius,
                "not_covered": self.not_covered(),
                "secure_aggregation": self.secagg.record() if self.secagg.enabled else None,
            }
        )
        extra = self.results.folder.releases.extra() if self.results.folder is not None else []
        if extra:  # releases from this folder the run's own ledger does not count: they are spent all the same
            with_them = epsilon_with(self.ledger, extra, delta)
            report["releases_beyond_this_run"] = {
                "count": len(extra),
                "epsilon_with_them": with_them,
                "why": "an unfinished or earlier run in this folder released them (privacy-ledger.jsonl), or the "
                "devices "
                "added their noise again after a resume",
            }
            self.warn(
                f"this folder's privacy ledger holds {len(extra)} release(s) beyond this run's: epsilon over "
                f"everything released from it is {with_them:.4g} (this run's alone: {report['epsilon']})"
            )
        return report

    # ------------------------------------------------------------------ reply checks
    def usable(self, reply: Reply) -> int:
        """Points the reply's statistics may stand for: its declared n, capped by
        ``max-device-points`` at data-point level."""
        return feddp_kmeans.usable_points(reply.num_examples, self.level, self.config.max_device_points)

    def check_outer(self, reply: Reply) -> str | None:
        return feddp_kmeans.outer_violation(
            reply.arrays["outer"],
            self.members.dimension,
            self.usable(reply),
            self.level,
            self.clip_norm,
            self.bounds["step1"],
        )

    def check_histogram(self, reply: Reply) -> str | None:
        return feddp_kmeans.histogram_violation(
            reply.arrays["histogram"], self.usable(reply), self.level, self.bounds["step2"]
        )

    def check_sums(self, reply: Reply) -> str | None:
        return feddp_kmeans.sums_counts_violation(
            reply.arrays["sums"], reply.arrays["counts"], self.usable(reply), self.clip_norm, exact_total=False
        )

    def check_means(self, reply: Reply) -> str | None:
        return feddp_kmeans.means_violation(
            reply.arrays["means"], reply.arrays["nonempty"], self.bounds["step3_gaussian"], self.bounds["step3_laplace"]
        )

    def check_lloyd(self, reply: Reply) -> str | None:
        per_point = self.clip_norm if self.radius is None else self.radius  # a relative update's displacements
        return feddp_kmeans.lloyd_violation(
            reply.arrays["sums"],
            reply.arrays["counts"],
            self.usable(reply),
            self.level,
            per_point,
            self.bounds["lloyd_gaussian"],
            self.bounds["lloyd_laplace"],
        )


def epsilon_with(ledger: Any, entries: list[dict[str, Any]], delta: float) -> float:
    """ε at ``delta`` of a run's ``ledger`` composed with further releases from its folder's
    privacy ledger (:class:`fedcluster.server.run_folder.ReleaseLog` entries): the run's own
    accountant where they are of its kind (composed exactly), the two totals added where
    not (basic composition: an upper bound)."""
    from fedcluster.privacy import skellam

    central = [e for e in entries if e.get("mechanism") in fedcluster.privacy.MECHANISMS]
    devices = [e for e in entries if e.get("mechanism") == "skellam"]
    releases = [
        skellam.SkellamRelease(**{f.name: e[f.name] for f in dataclasses.fields(skellam.SkellamRelease)})
        for e in devices
    ]
    if isinstance(ledger, skellam.SkellamLedger):
        total = skellam.epsilon([*ledger.releases, *releases], delta)
        rest = _central_epsilon(central, delta)
    else:
        combined = fedcluster.privacy.PrivacyLedger(ledger.level)
        combined.steps = list(ledger.steps)
        for e in central:
            _record(combined, e)
        total, rest = combined.epsilon(delta), skellam.epsilon(releases, delta)
    return float(total + rest)


def _central_epsilon(entries: list[dict[str, Any]], delta: float) -> float:
    ledger = fedcluster.privacy.PrivacyLedger("data-point")
    for e in entries:
        _record(ledger, e)
    return ledger.epsilon(delta)


def _record(ledger: Any, entry: dict[str, Any]) -> None:
    mechanism = fedcluster.privacy.MECHANISMS[entry["mechanism"]](entry["scale"], entry["sensitivity"])
    ledger.record(entry.get("step", ""), mechanism, sampling_rate=entry.get("sampling_rate"), delta=entry.get("delta"))
