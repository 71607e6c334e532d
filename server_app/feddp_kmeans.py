"""FedDP-KMeans: differentially private federated k-means with server-side data.

Scott et al., "Differentially Private Federated k-Means Clustering with Server-Side Data"
(2025); the working specification is ALGORITHMS.md section 3, which wins over the paper
and the authors' code where they differ. The strategy reads like the paper::

    FedDP-Init
      Step 1  clients send XᵢᵀXᵢ;  M̃ = Σ XᵢᵀXᵢ + symmetric N(0, σ1²);  V = top-k eigvecs(M̃)
      Step 2  clients get V, QV; send the histogram of their nearest projected server
              point;  h̃ = Σ hᵢ + Lap(b2);  weights = max(h̃, 0), drop < min-server-weight;
              ν = weighted k-means(QV, weights)                               (k x k)
      Step 3  clients get V, ν; assign xV to the nearest ν (margin filter); send sums and
              counts (data-point) or means and a non-empty vector (client level);
              C = (S + N(0, σ3²)) / max(N + Lap(b3), 1)
    FedDP-Lloyds (T = lloyd-rounds)
              clients get C; send full-space sums and counts; C ← S̃ / Ñ

Baselines (``init``): ``server-kmeans++`` (k-means++ seeding on the server data),
``server-lloyds`` (k-means on the server data, ``server-n-init`` starts),
``sphere-packing`` (Su et al. 2017: the largest feasible radius a, binary-searched). They
spend no budget on the initialization: the whole ε goes to FedDP-Lloyds.

Privacy (``privacy-level``)
---------------------------
``data-point``: every device clips its points to norm Δ (``clip-norm``; 0 = the radius of
the server data, as in the paper) before ANY step. Sensitivities: step 1 Δ² (Frobenius
norm of xxᵀ -- NOT Δ, which under-noises the step, as the authors' code does), step 2 1
(L1), step 3 / Lloyd sums Δ (L2) and counts 1 (L1).

``client``: every statistic a device sends is clipped as a whole on the device (L2 /
Frobenius for Gaussian-noised ones, L1 for Laplace-noised ones) to a bound that is a
hyperparameter: ``clip-outer`` (XᵀX), ``clip-histogram``, ``clip-means`` and
``clip-nonempty`` (step 3, mean of means), ``clip-sums`` and ``clip-counts`` (Lloyd). 0
derives the bound from Δ, k and ``client-max-points`` m as the worst case of a client with
m points of norm ≤ Δ: m·Δ², m, √k·Δ, k, m·Δ, m. With ``client-sampling-rate`` q < 1 every
step Poisson-samples the clients (each independently with probability q) and is accounted
as ``PoissonSampledDpEvent(q, ·)`` (amplification by subsampling).

The server validates every reply against these bounds (ReplySpec.check) and drops a
violator with a logged reason, never aggregating it.

Budget
------
``epsilon`` is the TARGET TOTAL ε at ``delta`` (PLD accountant over all steps): the
per-step noise is searched (:func:`fedcluster.privacy.calibrate_to_total`) so that the
composition of every step meets it, with relative shares from the paper's rule of thumb
(App. H.1; data-point [ε1, ε2, ε3G, ε3L] ∝ [0.2, 0.2, 0.45, 0.15], client [0.35, 0.1,
0.45, 0.1]) or ``budget-split`` ("w1,w2,w3g,w3l"). With lloyd-rounds T > 0, FedDP-Init
keeps (1 − ``lloyd-fraction``) of the shares and FedDP-Lloyds gets ``lloyd-fraction``,
split between sums and counts as in step 3 (baselines: all of it).
``step-epsilons`` ("e1,e2,e3g,e3l[,e4g,e4l]", the steps this run uses in that order;
baselines "e4g,e4l") instead calibrates each step on its own for its ε (σ_AGM for the
Gaussian ones, the T-fold composition for Lloyd) and reports the PLD total it amounts to.

``epsilon = inf`` (valid TOML: ``--run-config "epsilon=inf"``) adds no noise at all and
is the non-private pipeline (clipping is kept; with Δ ≥ the data radius it is a no-op);
``result.json["privacy"]["epsilon"]`` is then null (∞).

Noise is drawn from OS entropy unless ``noise-seed`` ≥ 0; every mechanism (and the client
sampling) has its own independent stream. ``seed`` seeds only the server's non-private
randomness (k-means on the server data, sphere packing).

Trust model and what is released: as in the paper's simulation, the server adds the noise
(central DP with a trusted aggregator, the role secure aggregation plays in a deployment);
everything the run writes about the clients' data -- centers, init centers, the projection
V, the noisy server weights and projected centers -- is covered by the (ε, δ) of
``result.json["privacy"]``. Two reports are NOT: ``final`` (the exact federated cost of the
final centers, ``evaluate-cost = true``; set it false in a real deployment) and the pooled
central ``reference``. The server data is never sent anywhere; clients receive only its
projection QV (step 2).
"""

from __future__ import annotations

import math
from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.common.logger import log

from fedcluster.data import load_points
from fedcluster.datasets import generated_server_points
from fedcluster.feddp import packed_diagonal, packed_frobenius, packed_size, unpack_symmetric
from fedcluster.lloyd import kmeans, kmeans_plus_plus
from fedcluster.privacy import (
    CalibratedStep,
    PrivacyLedger,
    StepSpec,
    calibrate_to_total,
    gaussian_sigma_for,
    independent_generators,
    laplace_scale_for,
)

from .base import FederatedStrategy, FederationError, Reply, ReplySpec

INIT_METHODS = ("feddp", "server-kmeans++", "server-lloyds", "sphere-packing")

# Every private step, its mechanism, and the fixed index of its own random stream (so a
# noise-seed reproduces the same noise whichever steps a run uses). Index 6: sampling.
STEPS = {
    "step1": ("symmetric_gaussian", 0),
    "step2": ("laplace", 1),
    "step3_gaussian": ("gaussian", 2),
    "step3_laplace": ("laplace", 3),
    "lloyd_gaussian": ("gaussian", 4),
    "lloyd_laplace": ("laplace", 5),
}
SAMPLING_STREAM = 6
INIT_STEPS = ("step1", "step2", "step3_gaussian", "step3_laplace")
LLOYD_STEPS = ("lloyd_gaussian", "lloyd_laplace")

# App. H.1 rule of thumb, fractions of ε_init = ε1 + ε2 + ε3G + ε3L.
RULE_OF_THUMB = {"data-point": (0.20, 0.20, 0.45, 0.15), "client": (0.35, 0.10, 0.45, 0.10)}

# Replies are checked against their bound with this relative slack (float rounding).
_SLACK = 1e-9

SPHERE_ATTEMPTS = 1000
SPHERE_SEARCH_STEPS = 40


class FedDPKMeans(FederatedStrategy):
    """FedDP-KMeans (Scott et al. 2025): FedDP-Init + FedDP-Lloyds, and its baselines.

    Run-config parameters: ``k``, ``init`` (``auto`` = ``feddp``, ``server-kmeans++``,
    ``server-lloyds``, ``sphere-packing``), ``privacy-level``, ``epsilon``, ``delta``,
    ``step-epsilons``, ``budget-split``, ``lloyd-rounds``, ``lloyd-fraction``,
    ``clip-norm``, ``client-max-points``, ``clip-outer``, ``clip-histogram``,
    ``clip-means``, ``clip-nonempty``, ``clip-sums``, ``clip-counts``,
    ``client-sampling-rate``, ``margin``, ``min-server-weight``, ``server-n-init``,
    ``noise-seed``, ``evaluate-cost``, ``server-data`` (see the module docstring).
    """

    name = "feddp-kmeans"

    def run(self) -> dict[str, Any]:
        cfg = self.config
        k = int(cfg["k"])
        self.level = cfg["privacy-level"]
        self.init_method = "feddp" if cfg["init"] == "auto" else cfg["init"]
        if self.init_method not in INIT_METHODS:
            raise FederationError(
                f"feddp-kmeans: unknown init {cfg['init']!r}; choose auto (= feddp), {', '.join(INIT_METHODS)}"
            )
        self.lloyd_rounds = int(cfg["lloyd-rounds"])
        # The dimension is public and comes from the server data; no phase 0 is needed
        # (and no client summary such as a bounding box ever reaches the server).
        server = self.server_points()
        self.dimension = int(server.shape[1])
        if k > server.shape[0] and self.init_method != "sphere-packing":
            raise FederationError(f"k={k} is larger than the {server.shape[0]} server points")
        self.clip_norm = float(cfg["clip-norm"]) or float(np.max(np.linalg.norm(server, axis=1)))
        if not self.clip_norm > 0:
            raise FederationError("clip-norm is 0 and the server data has radius 0: set clip-norm")
        self.bounds = self.clipping_bounds(k)
        self.plan = self.privacy_plan()
        seed = int(cfg["noise-seed"])
        streams = independent_generators(seed if seed >= 0 else None, len(STEPS) + 1)
        self.mechanisms = {name: step.mechanism_instance(streams[STEPS[name][1]]) for name, step in self.plan.items()}
        self.sampling_rng = streams[SAMPLING_STREAM]
        self.ledger = PrivacyLedger(self.level.replace("-", "_"))

        arrays: dict[str, np.ndarray] = {}
        if self.init_method == "feddp":
            initial, init_record, arrays = self.feddp_init(server, k)
        else:
            initial, init_record = self.server_init(server, k)
        if self.lloyd_rounds == 0 and self.init_method != "feddp":
            log(WARNING, "[fedcluster] init=%s with lloyd-rounds=0 never uses client data", self.init_method)
        centers = self.feddp_lloyds(initial, self.lloyd_rounds)

        privacy = self.privacy_report()
        outcome: dict[str, Any] = {
            "centers": centers,
            "arrays": {"init_centers": initial, **arrays},
            "init": init_record,
            "privacy": privacy,
        }
        if cfg["evaluate-cost"]:
            total_cost, num_points = self.evaluate(centers)
            outcome["final"] = {
                "cost": total_cost / num_points,
                "total_cost": total_cost,
                "num_points": num_points,
                "private": False,
                "note": "exact federated cost of the final centers: a report outside the DP guarantee",
            }
            log(INFO, "[fedcluster] feddp-kmeans final cost per point %.6g on %d points", total_cost / num_points, num_points)
        eps = privacy["epsilon"]
        log(INFO, "[fedcluster] feddp-kmeans total epsilon %s at delta %g (%s level)",
            "inf" if eps is None or not math.isfinite(eps) else f"{eps:.4g}", cfg["delta"], self.level)
        return outcome

    # ------------------------------------------------------------------ set-up
    def server_points(self) -> np.ndarray:
        """The server's own data Q (n_s x d): ``server-data`` (.npy) or the dataset's
        generator. It never leaves the server (clients only ever get QV)."""
        path = self.config["server-data"]
        points = load_points(path) if path else generated_server_points(self.config)
        if points is None:
            raise FederationError(
                "feddp-kmeans needs server-side data: run-config server-data (an absolute path to "
                "a .npy on the server) or dataset='feddp-mixture' (which generates it)"
            )
        points = np.asarray(points, dtype=np.float64)
        if points.ndim != 2 or points.shape[0] == 0:
            raise FederationError(f"server data must be a non-empty (n, d) array, got shape {points.shape}")
        return points

    def clipping_bounds(self, k: int) -> dict[str, float]:
        """Sensitivity of every step (the clipping bound the device enforces)."""
        delta = self.clip_norm
        if self.level == "data-point":
            return {
                "step1": delta**2, "step2": 1.0, "step3_gaussian": delta, "step3_laplace": 1.0,
                "lloyd_gaussian": delta, "lloyd_laplace": 1.0,
            }
        cfg = self.config
        m = float(cfg["client-max-points"])
        return {
            "step1": float(cfg["clip-outer"]) or m * delta**2,
            "step2": float(cfg["clip-histogram"]) or m,
            "step3_gaussian": float(cfg["clip-means"]) or math.sqrt(k) * delta,
            "step3_laplace": float(cfg["clip-nonempty"]) or float(k),
            "lloyd_gaussian": float(cfg["clip-sums"]) or m * delta,
            "lloyd_laplace": float(cfg["clip-counts"]) or m,
        }

    def step_weights(self) -> dict[str, float]:
        """Relative ε share of every step this run uses."""
        cfg = self.config
        if cfg["budget-split"]:
            try:
                split = [float(x) for x in cfg["budget-split"].split(",")]
            except ValueError:
                split = []
            if len(split) != 4 or not all(w > 0 and math.isfinite(w) for w in split):
                raise FederationError(f"budget-split must be four positive numbers 'w1,w2,w3g,w3l', got {cfg['budget-split']!r}")
        else:
            split = list(RULE_OF_THUMB[self.level])
        gaussian, laplace = split[2], split[3]
        lloyd = {"lloyd_gaussian": gaussian / (gaussian + laplace), "lloyd_laplace": laplace / (gaussian + laplace)}
        if self.init_method != "feddp":
            return lloyd if self.lloyd_rounds > 0 else {}
        fraction = float(cfg["lloyd-fraction"]) if self.lloyd_rounds > 0 else 0.0
        weights = {name: (1.0 - fraction) * w / sum(split) for name, w in zip(INIT_STEPS, split)}
        if self.lloyd_rounds > 0:
            if fraction <= 0:
                raise FederationError("lloyd-rounds > 0 needs lloyd-fraction > 0 (the Lloyd rounds' share of epsilon)")
            weights.update({name: fraction * w for name, w in lloyd.items()})
        return weights

    def privacy_plan(self) -> dict[str, CalibratedStep]:
        """The noise of every step: calibrated to the target total ε (PLD), or per step
        from ``step-epsilons``, or zero for ``epsilon = inf``."""
        cfg = self.config
        weights = self.step_weights()
        delta = float(cfg["delta"])
        q = float(cfg["client-sampling-rate"])
        sampling = q if self.level == "client" and q < 1 else None
        specs = [
            StepSpec(
                name, STEPS[name][0], weight, sensitivity=self.bounds[name],
                compositions=self.lloyd_rounds if name in LLOYD_STEPS else 1, sampling_rate=sampling,
            )
            for name, weight in weights.items()
        ]
        self.budget_mode = "target-total"
        if not specs:
            self.budget_mode = "no private step"
            return {}
        if cfg["step-epsilons"]:
            self.budget_mode = "per-step"
            try:
                values = [float(x) for x in cfg["step-epsilons"].split(",")]
            except ValueError:
                values = []
            if len(values) != len(specs) or not all(v > 0 for v in values):
                raise FederationError(
                    f"step-epsilons must give {len(specs)} positive values, one per step of this run in the "
                    f"order {', '.join(s.name for s in specs)}; got {cfg['step-epsilons']!r}"
                )
            return {spec.name: _calibrate_alone(spec, eps, delta) for spec, eps in zip(specs, values)}
        epsilon = float(cfg["epsilon"])
        if math.isinf(epsilon):
            self.budget_mode = "no noise (epsilon = inf)"
        calibration = calibrate_to_total(epsilon, delta, specs)
        return {step.name: step for step in calibration.steps}

    # ------------------------------------------------------------------ messaging helpers
    def client_config(self, gaussian: str | None = None, laplace: str | None = None) -> dict[str, Any]:
        """What a device needs to clip: Δ for its points (data-point level), or the bounds
        of the statistics it sends (client level: ``clip`` L2, ``clip-l1`` L1)."""
        if self.level == "data-point":
            return {"level": "data-point", "clip-norm": self.clip_norm}
        config: dict[str, Any] = {"level": "client"}
        if gaussian is not None:
            config["clip"] = self.bounds[gaussian]
        if laplace is not None:
            config["clip-l1"] = self.bounds[laplace]
        return config

    def participants(self) -> list[int]:
        """Everyone, or a Poisson sample (each node with probability q) at client level."""
        q = float(self.config["client-sampling-rate"])
        nodes = self.active_nodes
        if self.level != "client" or q >= 1:
            return nodes
        picked = self.sampling_rng.random(len(nodes)) < q
        return [node for node, keep in zip(nodes, picked) if keep]

    def gather(self, task: str, arrays: dict[str, np.ndarray], config: dict[str, Any], spec: ReplySpec, phase: str) -> list[Reply]:
        nodes = self.participants()
        if not nodes:
            log(WARNING, "[fedcluster] %s: the Poisson sample is empty; the aggregate is noise only", phase)
            self.phases.append({"phase": phase, "task": f"query.{task}", "round": None, "sent": 0, "replies": 0,
                                "failures": [], "bytes_down": 0, "bytes_up": 0, "seconds": 0.0})
            return []
        return self.broadcast(task, nodes, arrays=arrays, config=config, spec=spec, phase=phase)

    def noisy(self, name: str, value: np.ndarray) -> np.ndarray:
        """``value`` + the noise of step ``name`` (its own mechanism and stream)."""
        return self.mechanisms[name].add(value)

    def record(self, name: str, compositions: int = 1) -> None:
        step = self.plan[name]
        self.ledger.record_mechanism(
            name, self.mechanisms[name], compositions=compositions, sampling_rate=step.sampling_rate,
            delta=float(self.config["delta"]) if step.mechanism != "laplace" else None,
        )

    # ------------------------------------------------------------------ FedDP-Init
    def feddp_init(self, server: np.ndarray, k: int) -> tuple[np.ndarray, dict[str, Any], dict[str, np.ndarray]]:
        d = self.dimension
        components = min(k, d)

        # Step 1: the data subspace from the noisy Σ XᵢᵀXᵢ.
        replies = self.gather(
            "feddp_outer", {}, self.client_config("step1"),
            ReplySpec(shapes={"outer": (packed_size(d),)}, check=self.check_outer), "init-step1-outer-product",
        )
        packed = np.zeros(packed_size(d))
        for reply in replies:
            packed += reply.arrays["outer"]
        outer = unpack_symmetric(packed, d)
        noisy_outer = self.noisy("step1", outer)
        self.record("step1")
        projection = top_eigenvectors(noisy_outer, components)

        # Step 2: weights of the projected server points; weighted k-means on them.
        server_projected = server @ projection
        replies = self.gather(
            "feddp_histogram", {"projection": projection, "server": server_projected},
            self.client_config(laplace="step2"),
            ReplySpec(shapes={"histogram": (server.shape[0],)}, nonnegative=("histogram",), check=self.check_histogram),
            "init-step2-server-weights",
        )
        histogram = np.zeros(server.shape[0])
        for reply in replies:
            histogram += reply.arrays["histogram"]
        weights = np.maximum(self.noisy("step2", histogram), 0.0)
        self.record("step2")
        kept = weights >= float(self.config["min-server-weight"])
        if kept.sum() < k:
            log(WARNING, "[fedcluster] only %d server points have weight >= %g: keeping the %d heaviest",
                int(kept.sum()), self.config["min-server-weight"], k)
            kept = np.zeros_like(kept)
            kept[np.argsort(-weights, kind="stable")[:k]] = True
        kept_weights = weights[kept] if weights[kept].sum() > 0 else np.ones(int(kept.sum()))
        projected_centers, _ = kmeans(
            server_projected[kept], k, self.rng, kept_weights, n_init=int(self.config["server-n-init"])
        )

        # Step 3: centers in the original space from projected assignments.
        if self.level == "data-point":
            spec = ReplySpec(shapes={"sums": (k, "d"), "counts": (k,)}, nonnegative=("counts",), check=self.check_sums)
        else:
            spec = ReplySpec(shapes={"means": (k, "d"), "nonempty": (k,)}, nonnegative=("nonempty",), check=self.check_means)
        replies = self.gather(
            "feddp_projected_stats", {"projection": projection, "centers": projected_centers},
            {**self.client_config("step3_gaussian", "step3_laplace"), "margin": float(self.config["margin"])},
            spec, "init-step3-centers",
        )
        sums_key, counts_key = ("sums", "counts") if self.level == "data-point" else ("means", "nonempty")
        sums, counts = np.zeros((k, d)), np.zeros(k)
        for reply in replies:
            sums += reply.arrays[sums_key]
            counts += reply.arrays[counts_key]
        noisy_sums = self.noisy("step3_gaussian", sums)
        noisy_counts = self.noisy("step3_laplace", counts)
        self.record("step3_gaussian")
        self.record("step3_laplace")
        centers = noisy_sums / np.maximum(noisy_counts, 1.0)[:, None]
        record = {
            "method": "feddp",
            "components": components,
            "server_points": int(server.shape[0]),
            "server_points_kept": int(kept.sum()),
            "noisy_counts": noisy_counts,
            "kept_by_margin": int(sum(int(r.metrics.get("kept", 0)) for r in replies)),
        }
        arrays = {"projection": projection, "server_weights": weights, "projected_centers": projected_centers}
        return centers, record, arrays

    # ------------------------------------------------------------------ baselines
    def server_init(self, server: np.ndarray, k: int) -> tuple[np.ndarray, dict[str, Any]]:
        method = self.init_method
        if method == "server-kmeans++":
            return kmeans_plus_plus(server, k, self.rng), {"method": method}
        if method == "server-lloyds":
            centers, cost = kmeans(server, k, self.rng, n_init=int(self.config["server-n-init"]))
            return centers, {"method": method, "server_cost": cost / server.shape[0]}
        radius = float(np.max(np.linalg.norm(server, axis=1)))
        centers, a = sphere_packing(k, self.dimension, radius, self.rng)
        return centers, {"method": method, "cube_half_width": radius, "radius_a": a}

    # ------------------------------------------------------------------ FedDP-Lloyds
    def feddp_lloyds(self, centers: np.ndarray, rounds: int) -> np.ndarray:
        k = centers.shape[0]
        centers = np.array(centers, dtype=np.float64, copy=True)
        spec = ReplySpec(shapes={"sums": (k, "d"), "counts": (k,)}, nonnegative=("counts",), check=self.check_lloyd)
        for t in range(1, rounds + 1):
            self.begin_round(t)
            replies = self.gather(
                "feddp_lloyd", {"centers": centers}, self.client_config("lloyd_gaussian", "lloyd_laplace"),
                spec, "lloyd",
            )
            sums, counts = np.zeros_like(centers), np.zeros(k)
            for reply in replies:
                sums += reply.arrays["sums"]
                counts += reply.arrays["counts"]
            noisy_sums = self.noisy("lloyd_gaussian", sums)
            noisy_counts = self.noisy("lloyd_laplace", counts)
            # A cluster whose noisy count is below 1 keeps its center (post-processing;
            # Lloyd's own convention for an empty cluster, so no noise = Lloyd exactly).
            alive = noisy_counts >= 1.0
            new = centers.copy()
            new[alive] = noisy_sums[alive] / noisy_counts[alive, None]
            shift = float(np.sqrt(np.sum((new - centers) ** 2)))
            centers = new
            self.end_round(center_shift=shift, kept_centers=int((~alive).sum()), noisy_counts=noisy_counts)
            log(INFO, "[fedcluster] lloyd round %d/%d: %d replies, shift %.4g", t, rounds, len(replies), shift)
        if rounds > 0:
            self.record("lloyd_gaussian", compositions=rounds)
            self.record("lloyd_laplace", compositions=rounds)
        return centers

    def evaluate(self, centers: np.ndarray) -> tuple[float, int]:
        """Exact federated cost of ``centers`` on every node's raw data (a report)."""
        k = centers.shape[0]
        replies = self.broadcast(
            "lloyd_stats", self.active_nodes, arrays={"centers": centers},
            spec=ReplySpec(shapes={"sums": (k, "d"), "counts": (k,), "cost": (1,)}, nonnegative=("counts", "cost")),
            phase="final-evaluation",
        )
        return float(sum(r.arrays["cost"][0] for r in replies)), int(sum(r.arrays["counts"].sum() for r in replies))

    def privacy_report(self) -> dict[str, Any]:
        delta = float(self.config["delta"])
        report = self.ledger.to_dict(delta)
        report.update({
            "target_epsilon": float(self.config["epsilon"]) if not self.config["step-epsilons"] else None,
            "budget_mode": self.budget_mode,
            "epsilon_shares": {name: step.epsilon_share for name, step in self.plan.items()},
            "clip_norm": self.clip_norm,
            "bounds": {name: self.bounds[name] for name in self.plan},
            "client_sampling_rate": float(self.config["client-sampling-rate"]) if self.level == "client" else 1.0,
            "init": self.init_method,
            "lloyd_rounds": self.lloyd_rounds,
            "not_covered": ["final (evaluate-cost)", "reference"],
        })
        return report

    # ------------------------------------------------------------------ reply checks
    # Each returns a reason to drop the reply when a statistic exceeds what the device's
    # clipping allows (so a device that did not clip, or a tampered reply, never counts).
    def check_outer(self, reply: Reply) -> str | None:
        packed, d = reply.arrays["outer"], self.dimension
        if self.level == "data-point":
            n = reply.num_examples
            diagonal = packed_diagonal(packed, d)
            trace = float(diagonal.sum())
            if np.any(diagonal < 0) or trace > n * self.clip_norm**2 * (1 + _SLACK):
                return (f"array 'outer' exceeds the clipping bound: trace {trace:.6g} > "
                        f"num-examples·Δ² = {n}·{self.clip_norm:.6g}²")
            return None
        norm, bound = packed_frobenius(packed, d), self.bounds["step1"]
        if norm > bound * (1 + _SLACK):
            return f"array 'outer' exceeds the clipping bound: Frobenius norm {norm:.6g} > {bound:.6g}"
        return None

    def check_histogram(self, reply: Reply) -> str | None:
        histogram = reply.arrays["histogram"]
        if self.level == "data-point":
            if np.any(histogram != np.round(histogram)) or float(histogram.sum()) != reply.num_examples:
                return f"array 'histogram' is not a count of the node's {reply.num_examples} points (clipping bound: one count per point)"
            return None
        return _over_l1("histogram", histogram, self.bounds["step2"])

    def check_sums(self, reply: Reply) -> str | None:
        return self._check_sums_counts(reply, exact_total=False)

    def check_lloyd(self, reply: Reply) -> str | None:
        if self.level == "client":
            return _over_l2("sums", reply.arrays["sums"], self.bounds["lloyd_gaussian"]) or _over_l1(
                "counts", reply.arrays["counts"], self.bounds["lloyd_laplace"]
            )
        return self._check_sums_counts(reply, exact_total=True)

    def _check_sums_counts(self, reply: Reply, exact_total: bool) -> str | None:
        sums, counts = reply.arrays["sums"], reply.arrays["counts"]
        n = reply.num_examples
        total = float(counts.sum())
        if np.any(counts != np.round(counts)) or total > n or (exact_total and total != n):
            return f"array 'counts' is not a count of the node's {n} points (clipping bound: one count per point)"
        norms = np.linalg.norm(sums, axis=1)
        if np.any(norms > counts * self.clip_norm * (1 + _SLACK) + 1e-12):
            j = int(np.argmax(norms - counts * self.clip_norm))
            return (f"array 'sums' exceeds the clipping bound: row {j} has norm {norms[j]:.6g} > "
                    f"count·Δ = {counts[j]:.0f}·{self.clip_norm:.6g}")
        return None

    def check_means(self, reply: Reply) -> str | None:
        nonempty = reply.arrays["nonempty"]
        if np.any(nonempty > 1 + _SLACK):
            return "array 'nonempty' has an entry above 1"
        return _over_l2("means", reply.arrays["means"], self.bounds["step3_gaussian"]) or _over_l1(
            "nonempty", nonempty, self.bounds["step3_laplace"]
        )


# ---------------------------------------------------------------------- helpers
def _over_l2(name: str, value: np.ndarray, bound: float) -> str | None:
    norm = float(np.linalg.norm(value.ravel()))
    if norm > bound * (1 + _SLACK):
        return f"array {name!r} exceeds the clipping bound: L2 norm {norm:.6g} > {bound:.6g}"
    return None


def _over_l1(name: str, value: np.ndarray, bound: float) -> str | None:
    norm = float(np.abs(value).sum())
    if norm > bound * (1 + _SLACK):
        return f"array {name!r} exceeds the clipping bound: L1 norm {norm:.6g} > {bound:.6g}"
    return None


def _calibrate_alone(spec: StepSpec, epsilon: float, delta: float) -> CalibratedStep:
    """One step calibrated on its own for ``epsilon`` (its T-fold, sampled use)."""
    if spec.mechanism == "laplace":
        noise = laplace_scale_for(epsilon, spec.sensitivity, spec.compositions, spec.sampling_rate)
        step_delta = None
    else:
        noise = gaussian_sigma_for(epsilon, delta, spec.sensitivity, spec.compositions, spec.sampling_rate)
        step_delta = delta
    return CalibratedStep(
        name=spec.name, mechanism=spec.mechanism, sensitivity=float(spec.sensitivity), noise_scale=noise,
        epsilon_share=epsilon, delta=step_delta, compositions=spec.compositions, sampling_rate=spec.sampling_rate,
    )


def top_eigenvectors(matrix: np.ndarray, count: int) -> np.ndarray:
    """The eigenvectors of the ``count`` largest eigenvalues of a symmetric matrix, as
    columns, largest first."""
    from scipy.linalg import eigh

    d = matrix.shape[0]
    _, vectors = eigh(matrix, subset_by_index=[d - count, d - 1])
    return np.ascontiguousarray(vectors[:, ::-1])


def sphere_packing(k: int, d: int, radius: float, rng: np.random.Generator) -> tuple[np.ndarray, float]:
    """SpherePacking initialization (Su et al. 2017; ALGORITHMS.md section 3, App. G.3).

    For a radius a, center j is drawn uniformly from the cube [−r, r]^d until it is at
    least a away from every corner of the cube (the nearest corner of c is sign(c)·r, at
    distance ||r − |c|||) and at least 2a away from every earlier center; 1000 attempts per
    center, else a is infeasible. The LARGEST feasible a is found by binary search (the
    authors' code stops at the first feasible one). Returns ``(centers, a)``.
    """
    def attempt(a: float) -> np.ndarray | None:
        centers = np.empty((k, d))
        for j in range(k):
            candidates = rng.uniform(-radius, radius, size=(SPHERE_ATTEMPTS, d))
            ok = np.linalg.norm(radius - np.abs(candidates), axis=1) >= a
            if j > 0:
                gaps = np.sqrt(np.maximum(
                    np.einsum("ij,ij->i", candidates, candidates)[:, None]
                    - 2 * candidates @ centers[:j].T + np.einsum("ij,ij->i", centers[:j], centers[:j])[None], 0.0))
                ok &= np.all(gaps >= 2 * a, axis=1)
            hits = np.flatnonzero(ok)
            if hits.size == 0:
                return None
            centers[j] = candidates[hits[0]]
        return centers

    low, high = 0.0, radius * math.sqrt(d)
    best = attempt(0.0)
    for _ in range(SPHERE_SEARCH_STEPS):
        middle = 0.5 * (low + high)
        found = attempt(middle)
        if found is None:
            high = middle
        else:
            low, best = middle, found
    return best, low
