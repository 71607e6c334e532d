"""FedDP-KMeans: differentially private federated k-means with server-side data.

Scott et al. 2025; docs/ALGORITHMS.md §3 (it wins over the paper and the authors' code). The
phases, in the order this strategy runs them::

    FedDP-Init
      Step 1  clients send XᵢᵀXᵢ;  M̃ = Σ XᵢᵀXᵢ + symmetric N(0, σ1²);  V = top-k eigvecs(M̃)
      Step 2  clients get V, QV; send the histogram of their nearest projected server
              point;  h̃ = Σ hᵢ + Lap(b2);  ν = weighted k-means(QV, max(h̃, 0))
      Step 3  clients get V, ν; send projected-assignment sums and counts (data-point)
              or means and a non-empty vector (client);  C = (S + N) / max(N + Lap, 1)
    FedDP-Lloyds (T = lloyd-rounds): clients get C; send sums and counts;  C ← S̃ / Ñ

Other starts (``init``): ``histogram`` (the devices' noisy counts of their nearest candidates), ``server-kmeans++``,
``server-lloyds``, ``sphere-packing``. The math: ``fedcluster/algorithms/feddp_kmeans/model.py``,
``fedcluster/privacy/``."""

from __future__ import annotations

import math
from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.common.logger import log

from fedcluster.algorithms.feddp_kmeans import model as feddp_kmeans
from fedcluster.points import center_shift
from fedcluster.data import load_points
from fedcluster.node_data import generated_server_points
from fedcluster.lloyd import kmeans, kmeans_plus_plus

from fedcluster.server.base import FederatedStrategy, FederationError, Reply
from fedcluster.algorithms.feddp_kmeans.strategy_privacy import FedDPPrivacy
from fedcluster.server.secure_sum import SecureSum


class FedDPKMeans(FedDPPrivacy, FederatedStrategy):
    """FedDP-KMeans (Scott et al. 2025): FedDP-Init + FedDP-Lloyds, and its baselines.
    Run-config parameters: ``fedcluster.algorithms.feddp_kmeans.model.KEYS`` (docs/reference.md)."""

    name = "feddp-kmeans"
    private = True  # refuses to start while the same job is unfinished beside it (fedcluster.server.run_folder)
    exclude_invalid = True  # a device that broke a bound is asked for nothing else, its evaluation included

    def __init__(self, grid, config) -> None:
        super().__init__(grid, config)
        self.secagg = SecureSum(
            config,
            self.transport,
            self.members,
            self.results,  # its plan's hooks (FedDPPrivacy)
            noise_model=self.secagg_noise_model,
            unmasking=self.secagg_unmasking,
        )

    def run(self) -> dict[str, Any]:
        cfg, k = self.config, self.config.k
        self.level = cfg.privacy_level
        self.lloyd_rounds = cfg.lloyd_rounds
        # The dimension is public (the server data's, or agreed in advance); no phase 0: no box reaches the server.
        server = self.setup(k)
        self.plan_privacy(server, k)
        initial, init_record, arrays = self.start(server, k)
        centers = self.feddp_lloyds(initial, self.lloyd_rounds)
        return self.outcome(centers, initial, init_record, arrays)

    def setup(self, k: int) -> np.ndarray | None:
        """The server's data around the public ``origin`` (None without); the start, dimension, clip norm: checked."""
        cfg = self.config
        server = self.server_points()
        self.origin, problem = feddp_kmeans.clip_origin(cfg.clip_center, server)
        if problem:
            raise FederationError(problem)
        if unplaced := feddp_kmeans.clip_center_warning(cfg.clip_center, server):  # said, never silent
            self.warn(unplaced)
        if (
            self.origin is not None and server is not None
        ):  # every party works around it: devices on x - origin, the server on its data too
            server = server - self.origin
        self.server = server
        self.init_method = feddp_kmeans.start_method(cfg.init, server is not None, self.level, self.lloyd_rounds)
        self.members.dimension, problem = feddp_kmeans.public_dimension(
            server, cfg.dimension, cfg.clip_norm, self.init_method, self.lloyd_rounds
        )
        if problem:
            raise FederationError(problem)
        problem = feddp_kmeans.start_problem(self.init_method, k, self.members.dimension, server is not None)
        if problem:
            raise FederationError(problem)
        if server is not None and k > server.shape[0] and self.init_method not in feddp_kmeans.DATA_FREE_STARTS:
            raise FederationError(f"k={k} is larger than the {server.shape[0]} server points")
        self.clip_norm = cfg.clip_norm or feddp_kmeans.data_radius(server)
        if not self.clip_norm > 0:
            raise FederationError("clip-norm is 0 and the server data has radius 0: set clip-norm")
        return server

    def start(self, server: np.ndarray | None, k: int) -> tuple[np.ndarray, dict[str, Any], dict[str, np.ndarray]]:
        """The initial centers by ``init``, their record and the arrays the start keeps."""
        arrays: dict[str, np.ndarray] = {}
        if self.init_method == "feddp":
            initial, init_record, arrays = self.feddp_init(server, k)
        elif self.init_method == "histogram":
            initial, init_record, arrays = self.histogram_init(k)
        else:
            initial, init_record = self.server_init(server, k)
        if self.lloyd_rounds == 0 and self.init_method != "feddp":
            log(WARNING, "[fedcluster] init=%s with lloyd-rounds=0 never uses client data", self.init_method)
        return initial, init_record, arrays

    def outcome(
        self, centers: np.ndarray, initial: np.ndarray, init_record: dict[str, Any], arrays: dict[str, np.ndarray]
    ) -> dict[str, Any]:
        """The outcome in the data's own coordinates with the privacy report (``evaluate-cost``: the exact cost)."""
        cfg = self.config
        privacy = self.privacy_report()
        if self.origin is not None:  # back to the data's own coordinates
            centers, initial = centers + self.origin, initial + self.origin
            if "candidates" in arrays:
                arrays["candidates"] = arrays["candidates"] + self.origin
        init_record["clip_center"] = feddp_kmeans.clip_center_name(cfg.clip_center, self.origin)
        outcome: dict[str, Any] = {
            "centers": centers,
            "arrays": {"init_centers": initial, **arrays},
            "init": init_record,
            "privacy": privacy,
        }
        if cfg.evaluate_cost:
            total_cost, num_points = self.evaluate(centers, phase="final-evaluation")
            outcome["final"] = {
                "cost": total_cost / num_points,
                "total_cost": total_cost,
                "num_points": num_points,
                "private": False,
                "note": "exact federated cost of the final centers: a report outside the DP guarantee",
            }
            log(
                INFO,
                "[fedcluster] feddp-kmeans final cost per point %.6g on %d points",
                total_cost / num_points,
                num_points,
            )
        eps = privacy["epsilon"]
        log(
            INFO,
            "[fedcluster] feddp-kmeans total epsilon %s at delta %g (%s level)",
            "inf" if eps is None or not math.isfinite(eps) else f"{eps:.4g}",
            cfg.delta,
            self.level,
        )
        return outcome

    # ------------------------------------------------------------------ set-up
    def server_points(self) -> np.ndarray | None:
        """The server's own data Q (n_s x d): ``server-data`` (.npy) or the dataset's
        generator; None without. FedDP-Init sends the devices its projection QV and mean, the histogram start
        up to 10·k of its points."""
        path = self.config.server_data
        points = load_points(path) if path else generated_server_points(self.config)
        if points is None:
            return None
        points = np.asarray(points, dtype=np.float64)
        if points.ndim != 2 or points.shape[0] == 0:
            raise FederationError(f"server data must be a non-empty (n, d) array, got shape {points.shape}")
        return points

    # ------------------------------------------------------------------ messaging helpers
    def participants(self) -> list[int]:
        """Everyone, or a Poisson sample (each node with probability q) at client level."""
        q = self.config.client_sampling_rate
        nodes = self.active_nodes
        if self.level != "client" or q >= 1:
            return nodes
        picked = self.sampling_rng.random(len(nodes)) < q
        return [node for node, keep in zip(nodes, picked) if keep]

    def gather(
        self, task: str, arrays: dict[str, np.ndarray], config: dict[str, Any], sizes: dict[str, int], check, phase: str
    ) -> list[Reply]:
        """Broadcast to the participants, with the public ``origin`` their points are taken
        around (when not the origin); an empty Poisson sample gives no reply (the aggregate
        is then noise only)."""
        request = arrays if self.origin is None else {**arrays, "origin": self.origin}
        nodes = self.participants()
        if not nodes:
            log(WARNING, "[fedcluster] %s: the Poisson sample is empty; the aggregate is noise only", phase)
        return self.broadcast(task, nodes, arrays=request, config=config, sizes=sizes, check=check, phase=phase)

    # ------------------------------------------------------------------ FedDP-Init
    def feddp_init(self, server: np.ndarray, k: int) -> tuple[np.ndarray, dict[str, Any], dict[str, np.ndarray]]:
        d = self.members.dimension
        components = min(k, d)

        # Step 1: the data subspace from the noisy Σ XᵢᵀXᵢ.
        step1_config = self.client_config("step1")
        if self.normalize_outer:
            step1_config["normalize"] = True
        replies = self.gather(
            "feddp_outer",
            {},
            step1_config,
            {"p": feddp_kmeans.packed_size(d)},
            self.check_outer,
            "init-step1-outer-product",
        )
        packed = np.zeros(feddp_kmeans.packed_size(d))
        for reply in replies:
            packed += reply.arrays["outer"]
        noisy_outer = self.noisy("step1", feddp_kmeans.unpack_symmetric(packed, d))
        self.record("step1")
        projection = feddp_kmeans.top_eigenvectors(noisy_outer, components)

        # Step 2: weights of the projected server points; weighted k-means on them.
        server_projected = server @ projection
        replies = self.gather(
            "feddp_histogram",
            {"projection": projection, "server": server_projected},
            self.client_config(laplace="step2"),
            {"s": server.shape[0]},
            self.check_histogram,
            "init-step2-server-weights",
        )
        histogram = np.zeros(server.shape[0])
        for reply in replies:
            histogram += reply.arrays["histogram"]
        min_weight = self.config.min_server_weight
        weights, kept, kept_weights, fallback = feddp_kmeans.server_weights(
            self.noisy("step2", histogram), min_weight, k
        )
        self.record("step2")
        if fallback:
            log(
                WARNING,
                "[fedcluster] only %d server points have weight >= %g: keeping the %d heaviest",
                int((weights >= min_weight).sum()),
                min_weight,
                k,
            )
        projected_centers, _ = kmeans(
            server_projected[kept], k, self.rng, kept_weights, n_init=self.config.server_n_init
        )

        # Step 3: centers in the original space from projected assignments.
        check = self.check_sums if self.level == "data-point" else self.check_means
        replies = self.gather(
            "feddp_projected_stats",
            {"projection": projection, "centers": projected_centers},
            {**self.client_config("step3_gaussian", "step3_laplace"), "margin": self.config.margin},
            {"k": k},
            check,
            "init-step3-centers",
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
        centers = feddp_kmeans.step3_centers(noisy_sums, noisy_counts)
        record = {
            "method": "feddp",
            "components": components,
            "server_points": int(server.shape[0]),
            "server_points_kept": int(kept.sum()),
            "noisy_counts": noisy_counts,
        }
        if self.config.margin < 1:  # an exact count: released only with the filter on, and listed
            record["kept_by_margin"] = int(sum(int(r.metrics.get("kept", 0)) for r in replies))
        arrays = {"projection": projection, "server_weights": weights, "projected_centers": projected_centers}
        return centers, record, arrays

    # ------------------------------------------------------------------ no server data
    def histogram_init(self, k: int) -> tuple[np.ndarray, dict[str, Any], dict[str, np.ndarray]]:
        """A start from one private summary: the devices' histogram of their points' nearest
        candidates (server points, which the devices then see, and data-independent points;
        task ``feddp_candidates``; step 2's noise and sensitivity), then
        :func:`fedcluster.algorithms.feddp_kmeans.model.histogram_start`."""
        half_width = self.clip_norm / math.sqrt(self.members.dimension)
        candidates = feddp_kmeans.histogram_candidates(k, self.members.dimension, half_width, self.rng, self.server)
        request = (
            {"candidates": candidates} if self.origin is None else {"candidates": candidates, "origin": self.origin}
        )
        self.devices_release("feddp_candidates", "step2")
        total, devices = self.secagg.summed(
            "feddp_candidates",
            self.participants(),
            request,
            self.client_config(laplace="step2"),
            {"s": candidates.shape[0]},
            self.check_histogram,
            "init-histogram",
            {"histogram": self.secure_points},
            self.device_noise("step2"),
        )
        weights = self.noisy("step2", np.zeros(candidates.shape[0]) + (0 if total is None else total["histogram"]))
        self.record("step2")
        spread = self.plan["step2"].noise_scale * self.noise_shares(len(devices))
        centers, record = feddp_kmeans.histogram_start(
            candidates, weights, spread, k, half_width, self.rng, self.config.server_n_init, self.server
        )
        record["server_candidates"] = 0 if self.server is None else min(self.server.shape[0], candidates.shape[0])
        if "fallback" in record:
            log(
                WARNING,
                "[fedcluster] only %d of %d candidates' noisy counts stand out of the noise: %s places the "
                "other %d centers",
                record["candidates_kept"],
                candidates.shape[0],
                record["fallback"],
                record["filled"],
            )
        arrays = {"candidates": candidates, "candidate_weights": weights}
        return centers, record, arrays

    # ------------------------------------------------------------------ baselines
    def server_init(self, server: np.ndarray, k: int) -> tuple[np.ndarray, dict[str, Any]]:
        method = self.init_method
        if method == "server-kmeans++":
            return kmeans_plus_plus(server, k, self.rng), {"method": method}
        if method == "server-lloyds":
            centers, cost = kmeans(server, k, self.rng, n_init=self.config.server_n_init)
            return centers, {"method": method, "server_cost": cost / server.shape[0]}
        # the server data's radius; without server data, the cube inscribed in the ball of
        # radius Δ that holds every point a device uses (its corners on the sphere: the cube
        # [−Δ, Δ]^d would put nearly every center outside the ball in high d)
        radius = (
            feddp_kmeans.data_radius(server)
            if server is not None
            else self.clip_norm / math.sqrt(self.members.dimension)
        )
        centers, a = feddp_kmeans.sphere_packing(k, self.members.dimension, radius, self.rng)
        return centers, {"method": method, "cube_half_width": radius, "radius_a": a}

    # ------------------------------------------------------------------ FedDP-Lloyds
    def feddp_lloyds(self, centers: np.ndarray, rounds: int) -> np.ndarray:
        k = centers.shape[0]
        centers = np.array(centers, dtype=np.float64, copy=True)
        for t in range(1, rounds + 1):
            self.begin_round(t)
            config = self.client_config("lloyd_gaussian", "lloyd_laplace")
            if self.radius is not None:
                config["radius"] = self.radius
            request = {"centers": centers} if self.origin is None else {"centers": centers, "origin": self.origin}
            ranges = feddp_kmeans.secure_ranges(self.secure_points, self.radius or self.clip_norm)
            self.devices_release("feddp_lloyd", "lloyd_gaussian", "lloyd_laplace")
            total, replies = self.secagg.summed(
                "feddp_lloyd",
                self.participants(),
                request,
                config,
                {"k": k},
                self.check_lloyd,
                "lloyd",
                ranges,
                self.device_noise("lloyd_gaussian", "lloyd_laplace"),
            )
            if total is None:  # a secure sum no honest devices could give: this round's update is skipped
                self.end_round(center_shift=0.0, kept_centers=k, noisy_counts=np.zeros(k))
                continue
            noisy_sums = self.noisy("lloyd_gaussian", np.zeros_like(centers) + total["sums"])
            noisy_counts = self.noisy("lloyd_laplace", np.zeros(k) + total["counts"])
            if self.radius is not None:
                new, alive = feddp_kmeans.relative_lloyd_update(
                    centers, noisy_sums, noisy_counts, self.radius, self.clip_norm
                )
            else:
                new, alive = feddp_kmeans.lloyd_update(centers, noisy_sums, noisy_counts)
            shift = center_shift(new, centers)
            centers = new
            self.end_round(center_shift=shift, kept_centers=int((~alive).sum()), noisy_counts=noisy_counts)
            log(INFO, "[fedcluster] lloyd round %d/%d: %d replies, shift %.4g", t, rounds, len(replies), shift)
        if rounds > 0:
            self.record("lloyd_gaussian", compositions=rounds)
            self.record("lloyd_laplace", compositions=rounds)
        return centers
