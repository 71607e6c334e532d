"""FedDP-KMeans (fedcluster/algorithms/feddp_kmeans/model.py and strategy.py): device kernels,
the server-side math as pure functions, calibration and accounting of the strategy,
clipping enforced by the server, oracles against the non-private pipeline, and a whole
private run.

Noise scales per mechanism and σ_AGM values are tested in tests/unit/test_privacy.py; here
the strategy's use of them is."""

from __future__ import annotations

import math
from collections import Counter
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict

import dp_accounting
from dp_accounting.pld import pld_privacy_accountant
from fedcluster.algorithms.feddp_kmeans import device as feddp_device
from fedcluster.algorithms.feddp_kmeans import model as feddp_kmeans
from fedcluster.config import ConfigError, parse_run_config, with_defaults
from fedcluster.node_data import generated_server_points, pooled_points
from fedcluster.lloyd import LloydStatistics
from fedcluster.privacy import (
    SymmetricGaussianMechanism,
    analytic_gaussian_sigma,
    clip_rows_l2,
    gaussian_sigma_for,
    independent_generators,
    laplace_scale_for,
)
from fedcluster.kernel import DeviceData
from conftest import lloyd_step, write_npy_dir
from fedcluster.inprocess import run
from fedcluster.algorithms.feddp_kmeans.model import sphere_packing, top_eigenvectors

ROOT = Path(__file__).resolve().parents[2]
DELTA = 1e-6

SMALL = {
    "algorithm": "feddp-kmeans",
    "dataset": "feddp-mixture",
    "dim": 10,
    "k": 3,
    "num-points": 3000,
    "seed": 3,
    "reference": False,
    "init": "feddp",  # the paper's start (auto: the histogram of server-point candidates when Lloyd rounds follow)
}
NODES = 10


def small(tmp_path, **overrides):
    return {**SMALL, "output-dir": str(tmp_path / "out"), **overrides}


def rewrite_reply(message, reply, change):
    arrays = {k: v.numpy() for k, v in reply.content.array_records["arrays"].items()}
    content = RecordDict(
        {
            "arrays": ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in change(arrays).items()}),
            "metrics": MetricRecord(dict(reply.content.metric_records["metrics"])),
        }
    )
    return Message(content, reply_to=message)


# ------------------------------------------------------------------ device kernels
def test_data_point_kernels_clip_every_point_before_any_statistic():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 5)) * rng.uniform(0.1, 4, size=(200, 1))
    data = DeviceData(points=X, source="test")
    config = {"level": "data-point", "clip-norm": 2.0}
    clipped = clip_rows_l2(X, 2.0)
    assert np.linalg.norm(clipped, axis=1).max() <= 2.0 < np.linalg.norm(X, axis=1).max()

    outer, metrics = feddp_device.feddp_outer(data, {}, config)
    outer = feddp_kmeans.unpack_symmetric(outer["outer"], 5)
    np.testing.assert_allclose(outer, clipped.T @ clipped, atol=1e-10)
    assert metrics["num-examples"] == 200
    assert np.trace(outer) <= 200 * 4.0

    centers = rng.normal(size=(4, 5))
    stats, _ = feddp_device.feddp_lloyd(data, {"centers": centers}, config)
    labels = ((clipped[:, None] - centers[None]) ** 2).sum(-1).argmin(1)
    for j in range(4):
        np.testing.assert_allclose(stats["sums"][j], clipped[labels == j].sum(0), atol=1e-10)
        assert stats["counts"][j] == np.sum(labels == j)


def test_histogram_counts_nearest_projected_server_point():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(300, 6))
    V = np.linalg.qr(rng.normal(size=(6, 2)))[0]
    server = rng.normal(size=(7, 2))
    out, _ = feddp_device.feddp_histogram(
        DeviceData(points=X), {"projection": V, "server": server}, {"level": "data-point", "clip-norm": 100.0}
    )
    nearest = (((X @ V)[:, None] - server[None]) ** 2).sum(-1).argmin(1)
    np.testing.assert_array_equal(out["histogram"], np.bincount(nearest, minlength=7))


def test_projected_stats_margin_filter_and_client_mean_of_means():
    rng = np.random.default_rng(2)
    X = rng.normal(size=(400, 4)) * 3
    V = np.eye(4)[:, :2]
    nu = np.array([[-2.0, 0.0], [2.0, 0.0], [0.0, 3.0]])
    margin = 0.6
    P = X @ V
    d = np.sqrt(((P[:, None] - nu[None]) ** 2).sum(-1))
    labels = d.argmin(1)
    ordered = np.sort(d, axis=1)
    keep = ordered[:, 0] <= margin * ordered[:, 1]
    assert 0 < keep.sum() < 400

    config = {"level": "data-point", "clip-norm": 1e3, "margin": margin}
    out, metrics = feddp_device.feddp_projected_stats(DeviceData(points=X), {"projection": V, "centers": nu}, config)
    assert metrics["kept"] == keep.sum()
    for j in range(3):
        np.testing.assert_allclose(out["sums"][j], X[keep & (labels == j)].sum(0), atol=1e-10)
        assert out["counts"][j] == np.sum(keep & (labels == j))
    no_filter, _ = feddp_device.feddp_projected_stats(
        DeviceData(points=X), {"projection": V, "centers": nu}, {**config, "margin": 1.0}
    )
    assert no_filter["counts"].sum() == 400

    # client level: per-cluster means (zero rows where empty) and a 0/1 vector, clipped
    Y = X[labels != 2]
    config = {"level": "client", "clip": 1e6, "clip-l1": 100.0}
    out, _ = feddp_device.feddp_projected_stats(DeviceData(points=Y), {"projection": V, "centers": nu}, config)
    np.testing.assert_array_equal(out["nonempty"], [1.0, 1.0, 0.0])
    np.testing.assert_allclose(out["means"][0], Y[labels[labels != 2] == 0].mean(0))
    np.testing.assert_array_equal(out["means"][2], 0.0)
    tight = {"level": "client", "clip": 0.5, "clip-l1": 1.0}
    out, _ = feddp_device.feddp_projected_stats(DeviceData(points=Y), {"projection": V, "centers": nu}, tight)
    assert np.linalg.norm(out["means"]) <= 0.5 and np.abs(out["nonempty"]).sum() <= 1.0


def test_client_level_kernels_clip_the_whole_statistic():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(50, 5)) * 5
    data = DeviceData(points=X)
    out, _ = feddp_device.feddp_outer(data, {}, {"level": "client", "clip": 10.0})
    assert out["outer"].shape == (15,)  # the upper triangle of the 5 x 5 matrix
    outer = feddp_kmeans.unpack_symmetric(out["outer"], 5)
    assert np.linalg.norm(outer) <= 10.0 * (1 + 1e-12)
    np.testing.assert_allclose(
        outer, feddp_kmeans.outer_product(X) * 10.0 / np.linalg.norm(feddp_kmeans.outer_product(X))
    )
    stats, _ = feddp_device.feddp_lloyd(data, {"centers": X[:3]}, {"level": "client", "clip": 7.0, "clip-l1": 4.0})
    assert np.linalg.norm(stats["sums"]) <= 7.0 and stats["counts"].sum() <= 4.0
    with pytest.raises(ValueError, match="clipping bound"):
        feddp_device.feddp_lloyd(data, {"centers": X[:3]}, {"level": "client"})
    # step 1 with normalize: scaled UP or down to the bound (tiny data too), not clipped
    tiny = DeviceData(points=X * 1e-4)
    for device, bound in ((tiny, 1.0), (data, 1.0), (tiny, 1e-9)):
        plain, _ = feddp_device.feddp_outer(device, {}, {"level": "client", "clip": bound})
        scaled, _ = feddp_device.feddp_outer(device, {}, {"level": "client", "clip": bound, "normalize": True})
        raw = device.points.T @ device.points
        outer = feddp_kmeans.unpack_symmetric(scaled["outer"], 5)
        np.testing.assert_allclose(np.linalg.norm(outer), bound, rtol=1e-12)
        np.testing.assert_allclose(outer, raw * bound / np.linalg.norm(raw), rtol=1e-10)
        if np.linalg.norm(raw) < bound:  # clipping leaves it alone
            np.testing.assert_allclose(feddp_kmeans.unpack_symmetric(plain["outer"], 5), raw, rtol=1e-12)


def test_feddp_kernels_need_only_numpy(tmp_path):
    script = textwrap.dedent(
        f"""
        import sys, importlib.abc
        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path, target=None):
                if name.split(".")[0] in ("scipy", "sklearn", "dp_accounting"):
                    raise ImportError(name + " is not installed on this device")
        sys.meta_path.insert(0, Block())
        sys.path.insert(0, {str(ROOT)!r})
        import numpy as np
        from fedcluster import protocol
        from fedcluster.device import DeviceData, kernels
        def call(task, arrays, cfg):  # only the config keys the protocol declares for the task
            declared = {{p.name for p in protocol.task(task).config}}
            return kernels()[task](data, arrays, {{k: v for k, v in cfg.items() if k in declared}})
        X = np.random.default_rng(0).normal(size=(40, 4))
        data = DeviceData(points=X)
        V = np.eye(4)[:, :2]
        for level, cfg in (("data-point", {{"clip-norm": 2.0}}), ("client", {{"clip": 5.0, "clip-l1": 3.0}})):
            cfg = {{"level": level, **cfg}}
            call("feddp_outer", {{}}, cfg)
            call("feddp_histogram", {{"projection": V, "server": X[:5] @ V}}, cfg)
            call("feddp_projected_stats", {{"projection": V, "centers": X[:3] @ V}}, {{**cfg, "margin": 0.8}})
            call("feddp_lloyd", {{"centers": X[:3]}}, cfg)
        print("OK")
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]


# ------------------------------------------------------------------ configuration
def test_config_keys_and_epsilon_inf():
    assert parse_run_config("epsilon=inf")["epsilon"] == math.inf
    config = with_defaults({"algorithm": "feddp-kmeans", "epsilon": math.inf})
    assert config["epsilon"] == math.inf
    with pytest.raises(ConfigError, match="privacy-level"):
        with_defaults({"privacy-level": "galaxy"})
    with pytest.raises(ConfigError, match="only accounted at privacy-level = 'client'"):
        with_defaults({"algorithm": "feddp-kmeans", "client-sampling-rate": 0.5})
    with pytest.raises(ConfigError, match=r"epsilon must be in \[0.001, 100\] or inf, got 0.0"):
        with_defaults({"epsilon": 0.0})


# ------------------------------------------------------------------ server-side math (pure functions)
def test_clipping_bounds_data_point_delta_squared_and_client_worst_case():
    point = feddp_kmeans.clipping_bounds("data-point", 11.0, k=10)
    assert point == {
        "step1": 121.0,
        "step2": 1.0,
        "step3_gaussian": 11.0,
        "step3_laplace": 1.0,
        "lloyd_gaussian": 11.0,
        "lloyd_laplace": 1.0,
    }
    client = feddp_kmeans.clipping_bounds("client", 2.0, k=9, client_max_points=50, chosen={"step1": 7.0, "step2": 0.0})
    assert client == {
        "step1": 7.0,
        "step2": 50.0,
        "step3_gaussian": 6.0,
        "step3_laplace": 9.0,
        "lloyd_gaussian": 100.0,
        "lloyd_laplace": 50.0,
    }
    # step 1 with no chosen bound: every device scales its XᵀX to norm 1 (sensitivity 1)
    assert feddp_kmeans.clipping_bounds("client", 2.0, k=9, client_max_points=50)["step1"] == 1.0
    # step 3 means: √k times the typical norm when given (never above √k·Δ)
    assert (
        feddp_kmeans.clipping_bounds("client", 2.0, k=9, client_max_points=50, typical_norm=1.5)["step3_gaussian"]
        == 4.5
    )
    assert (
        feddp_kmeans.clipping_bounds("client", 2.0, k=9, client_max_points=50, typical_norm=5.0)["step3_gaussian"]
        == 6.0
    )
    assert feddp_kmeans.server_typical_norm(
        np.array([[3.0, 4.0], [0.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    ) == pytest.approx(math.sqrt(27 / 4))
    assert feddp_kmeans.normalized_outer("client", 0.0) and not feddp_kmeans.normalized_outer("client", 7.0)
    assert not feddp_kmeans.normalized_outer("data-point", 0.0)


def test_step_weights_rule_of_thumb_lloyd_fraction_and_baselines():
    shares = feddp_kmeans.RULE_OF_THUMB["data-point"]
    init_only = feddp_kmeans.step_weights("feddp", 0, shares, lloyd_fraction=0.25)
    assert list(init_only) == list(feddp_kmeans.INIT_STEPS)
    assert list(init_only.values()) == pytest.approx([0.2, 0.2, 0.45, 0.15])
    with_lloyd = feddp_kmeans.step_weights("feddp", 2, shares, lloyd_fraction=0.25)
    assert list(with_lloyd.values()) == pytest.approx([0.15, 0.15, 0.3375, 0.1125, 0.1875, 0.0625])
    assert sum(with_lloyd.values()) == pytest.approx(1.0)
    assert feddp_kmeans.step_weights("server-lloyds", 2, shares, 0.25) == pytest.approx(
        {"lloyd_gaussian": 0.75, "lloyd_laplace": 0.25}
    )
    assert feddp_kmeans.step_weights("sphere-packing", 0, shares, 0.25) == {}


def test_device_noise_weights_split_the_lloyd_rounds_two_root_d_to_one():
    weights = feddp_kmeans.step_weights("histogram", 3, feddp_kmeans.RULE_OF_THUMB["data-point"], 0.25)
    split = feddp_kmeans.device_noise_weights(weights, 9)
    assert split["step2"] == weights["step2"] and sum(split.values()) == pytest.approx(1.0)
    assert split["lloyd_gaussian"] / split["lloyd_laplace"] == pytest.approx(6.0)
    assert feddp_kmeans.device_noise_weights({"step2": 1.0}, 9) == {"step2": 1.0}  # no Lloyd rounds: unchanged


def test_privacy_plan_per_step_is_each_step_calibrated_alone():
    bounds = feddp_kmeans.clipping_bounds("data-point", 3.0, k=4)
    weights = feddp_kmeans.step_weights("feddp", 2, feddp_kmeans.RULE_OF_THUMB["data-point"], 0.5)
    specs = feddp_kmeans.step_specs(weights, bounds, 2, None)
    assert [s.compositions for s in specs] == [1, 1, 1, 1, 2, 2]
    with pytest.raises(feddp_kmeans.BudgetExceeded, match="above epsilon=1"):  # they add up to more than 1
        feddp_kmeans.privacy_plan(specs, 1.0, DELTA, [0.1, 0.2, 0.3, 0.4, 0.5, 0.6])
    plan, mode = feddp_kmeans.privacy_plan(specs, 5.0, DELTA, [0.1, 0.2, 0.3, 0.4, 0.5, 0.6])
    assert mode == "per-step"
    assert plan["step1"].noise_scale == pytest.approx(9.0 * analytic_gaussian_sigma(0.1, DELTA), rel=1e-12)
    assert plan["step2"].noise_scale == pytest.approx(1 / 0.2, rel=1e-12)
    assert plan["lloyd_gaussian"].noise_scale == pytest.approx(
        gaussian_sigma_for(0.5, DELTA, 3.0, compositions=2), rel=1e-12
    )
    assert plan["lloyd_laplace"].noise_scale == pytest.approx(laplace_scale_for(0.6, 1.0, compositions=2), rel=1e-12)
    assert feddp_kmeans.privacy_plan([], 1.0, DELTA) == ({}, "no private step")
    noiseless, mode = feddp_kmeans.privacy_plan(specs, math.inf, DELTA)
    assert mode == "no noise (epsilon = inf)" and all(step.noise_scale == 0.0 for step in noiseless.values())


def test_noisy_aggregates_step3_lloyd_update_and_server_weights():
    sums = np.array([[4.0, 2.0], [3.0, 3.0], [1.0, -1.0]])
    counts = np.array([2.0, 0.5, -3.0])
    np.testing.assert_array_equal(feddp_kmeans.step3_centers(sums, counts), [[2.0, 1.0], [3.0, 3.0], [1.0, -1.0]])
    previous = np.array([[0.0, 0.0], [9.0, 9.0], [5.0, 5.0]])
    new, alive = feddp_kmeans.lloyd_update(previous, sums, counts)
    np.testing.assert_array_equal(alive, [True, False, False])
    np.testing.assert_array_equal(new, [[2.0, 1.0], [9.0, 9.0], [5.0, 5.0]])
    exact = np.array([2.0, 1.0, 0.0])  # with no noise it is the shared Lloyd update
    np.testing.assert_array_equal(
        feddp_kmeans.lloyd_update(previous, sums, exact)[0], LloydStatistics(sums, exact, 0.0).centers(previous)
    )

    weights, kept, kept_weights, fallback = feddp_kmeans.server_weights(np.array([5.0, -2.0, 0.5, 3.0]), 1.0, 2)
    np.testing.assert_array_equal(weights, [5.0, 0.0, 0.5, 3.0])
    np.testing.assert_array_equal(kept, [True, False, False, True])
    np.testing.assert_array_equal(kept_weights, [5.0, 3.0])
    assert not fallback
    _, kept, _, fallback = feddp_kmeans.server_weights(np.array([5.0, -2.0, 0.5, 3.0]), 4.0, 3)
    assert fallback
    np.testing.assert_array_equal(kept, [True, False, True, True])  # the three heaviest
    _, kept, kept_weights, _ = feddp_kmeans.server_weights(np.array([-1.0, -2.0, -3.0]), 1.0, 2)
    np.testing.assert_array_equal(kept, [True, True, False])
    np.testing.assert_array_equal(kept_weights, [1.0, 1.0])  # all zero: uniform


def test_reply_bound_checks_accept_clipped_replies_and_name_the_violation():
    rng = np.random.default_rng(4)
    X = clip_rows_l2(rng.normal(size=(30, 4)) * 3, 2.0)
    packed = feddp_kmeans.pack_symmetric(X.T @ X)
    assert feddp_kmeans.outer_violation(packed, 4, 30, "data-point", 2.0, 4.0) is None
    assert "trace" in feddp_kmeans.outer_violation(packed * 1.5, 4, 30, "data-point", 2.0, 4.0)
    norm = np.linalg.norm(X.T @ X)
    assert feddp_kmeans.outer_violation(packed, 4, 30, "client", 2.0, norm * 1.0000001) is None
    assert "Frobenius" in feddp_kmeans.outer_violation(packed, 4, 30, "client", 2.0, norm * 0.99)

    assert feddp_kmeans.histogram_violation(np.array([10.0, 20.0]), 30, "data-point", 1.0) is None
    assert "not a count" in feddp_kmeans.histogram_violation(np.array([10.0, 21.0]), 30, "data-point", 1.0)
    assert "L1 norm" in feddp_kmeans.histogram_violation(np.array([10.0, 21.0]), 30, "client", 30.0)

    labels = np.arange(30) % 3
    sums = np.stack([X[labels == j].sum(axis=0) for j in range(3)])
    counts = np.bincount(labels, minlength=3).astype(float)
    assert feddp_kmeans.lloyd_violation(sums, counts, 30, "data-point", 2.0, 0.0, 0.0) is None
    assert "not a count" in feddp_kmeans.lloyd_violation(sums, counts, 31, "data-point", 2.0, 0.0, 0.0)
    assert feddp_kmeans.sums_counts_violation(sums, counts, 31, 2.0, exact_total=False) is None  # margin filter
    too_long = sums.copy()
    too_long[1] *= 1.01 * counts[1] * 2.0 / np.linalg.norm(sums[1])  # norm 1 % above count·Δ
    assert "row 1" in feddp_kmeans.sums_counts_violation(too_long, counts, 30, 2.0, False)
    assert "'sums'" in feddp_kmeans.lloyd_violation(sums, counts, 30, "client", 2.0, 0.5, 30.0)
    assert "'counts'" in feddp_kmeans.lloyd_violation(sums, counts, 30, "client", 2.0, 1e3, 29.0)

    means, nonempty = sums / counts[:, None], np.ones(3)
    assert feddp_kmeans.means_violation(means, nonempty, 2.0 * math.sqrt(3), 3.0) is None
    assert "above 1" in feddp_kmeans.means_violation(means, nonempty * 2, 1e3, 1e3)
    assert "'means'" in feddp_kmeans.means_violation(means, nonempty, 0.1, 3.0)


# ------------------------------------------------------------------ calibration (strategy)
def test_step1_is_calibrated_to_delta_squared_in_data_point_mode(tmp_path):
    """Sensitivity of Σ xxᵀ is Δ² (Frobenius norm of xxᵀ), not Δ: the recorded step, the
    mechanism, and the noise that actually reached the eigen-decomposition all say so."""
    clip, seed = 3.0, 11
    result = run(
        small(
            tmp_path,
            **{
                "clip-norm": clip,
                "clip-center": "origin",
                "step-epsilons": "0.2,0.2,0.45,0.15",
                "epsilon": 10.0,
                "noise-seed": seed,
            },
        ),
        num_nodes=NODES,
    )
    steps = {s["name"]: s for s in result["privacy"]["steps"]}
    sigma1 = clip**2 * analytic_gaussian_sigma(0.2, DELTA)
    assert steps["step1"]["sensitivity"] == pytest.approx(clip**2)
    assert steps["step1"]["mechanism"] == "symmetric_gaussian"
    assert steps["step1"]["noise_std"] == pytest.approx(sigma1, rel=1e-9)
    assert steps["step1"]["epsilon"] == pytest.approx(0.2, rel=0.01)
    assert steps["step3_gaussian"]["sensitivity"] == pytest.approx(clip)
    assert steps["step3_gaussian"]["noise_std"] == pytest.approx(clip * analytic_gaussian_sigma(0.45, DELTA), rel=1e-9)
    assert steps["step2"]["noise_std"] == pytest.approx(math.sqrt(2) / 0.2, rel=1e-9)
    assert steps["step3_laplace"]["noise_std"] == pytest.approx(math.sqrt(2) / 0.15, rel=1e-9)

    # Re-draw the step-1 noise from its own stream: the released projection is the top
    # eigenvectors of (Σ XᵢᵀXᵢ on the clipped points + that noise).
    X = clip_rows_l2(pooled_points(result["config"], NODES)[0], clip)
    noise = SymmetricGaussianMechanism(sigma1, clip**2, independent_generators(seed, 7)[0]).noise((10, 10))
    expected = top_eigenvectors(X.T @ X + noise, 3)
    V = np.load(tmp_path / "out" / "projection.npy")
    np.testing.assert_allclose(V @ V.T, expected @ expected.T, atol=1e-8)
    # ... and not with noise scaled to Δ
    wrong = top_eigenvectors(X.T @ X + noise / clip, 3)
    assert not np.allclose(V @ V.T, wrong @ wrong.T, atol=1e-3)


@pytest.mark.parametrize("chosen", [0.0, 1050.0])
def test_client_level_step1_sums_normalized_outer_products_by_default(tmp_path, chosen):
    """Client level, clip-outer = 0: each device's XᵀX is scaled to Frobenius norm 1 and the
    noise has sensitivity 1; a chosen clip-outer clips at that bound instead. The released
    projection is recomputed from the pooled data by naive code and the re-drawn noise."""
    seed = 5
    result = run(
        small(
            tmp_path,
            **{
                "privacy-level": "client",
                "client-max-points": 300,
                "clip-outer": chosen,
                "clip-center": "origin",
                "step-epsilons": "0.5,0.2,0.45,0.15",
                "epsilon": 50.0,
                "noise-seed": seed,
            },
        ),
        num_nodes=NODES,
    )
    privacy = result["privacy"]
    step1 = next(s for s in privacy["steps"] if s["name"] == "step1")
    bound = chosen or 1.0
    assert step1["sensitivity"] == privacy["bounds"]["step1"] == bound
    assert privacy["step1_normalized"] is (chosen == 0.0)
    server = generated_server_points(result["config"])
    rms = math.sqrt(float(np.mean(np.sum(server**2, axis=1))))
    assert rms < privacy["clip_norm"]
    assert privacy["bounds"]["step3_gaussian"] == pytest.approx(math.sqrt(3) * rms, rel=1e-12)  # default clip-means
    sigma1 = bound * analytic_gaussian_sigma(0.5, DELTA)
    assert step1["noise_std"] == pytest.approx(sigma1, rel=1e-9)
    X, _ = pooled_points(result["config"], NODES)
    total = np.zeros((X.shape[1], X.shape[1]))
    for part in np.array_split(X, NODES):  # the in-process runner's equal contiguous shards
        outer = np.zeros_like(total)
        for row in part:
            outer += np.outer(row, row)
        norm = math.sqrt(float((outer**2).sum()))
        total += outer / norm if chosen == 0.0 else outer * min(1.0, chosen / norm)
    if chosen:  # some devices clipped, some not
        norms = [np.linalg.norm(part.T @ part) for part in np.array_split(X, NODES)]
        assert min(norms) < chosen < max(norms)
    noise = SymmetricGaussianMechanism(sigma1, bound, independent_generators(seed, 7)[0]).noise(total.shape)
    expected = top_eigenvectors(total + noise, 3)
    V = np.load(tmp_path / "out" / "projection.npy")
    np.testing.assert_allclose(V @ V.T, expected @ expected.T, atol=1e-8)


def test_target_total_epsilon_is_met_and_step1_share_uses_delta_squared(tmp_path):
    result = run(small(tmp_path, **{"clip-norm": 4.0, "epsilon": 0.8}), num_nodes=NODES)
    privacy = result["privacy"]
    assert privacy["level"] == "data-point" and privacy["delta"] == DELTA
    assert privacy["epsilon"] <= 0.8 and privacy["epsilon"] == pytest.approx(0.8, rel=0.01)
    shares = privacy["epsilon_shares"]
    assert shares["step3_gaussian"] / shares["step1"] == pytest.approx(0.45 / 0.20)  # rule of thumb
    step1 = next(s for s in privacy["steps"] if s["name"] == "step1")
    assert step1["noise_std"] == pytest.approx(16.0 * analytic_gaussian_sigma(shares["step1"], DELTA), rel=1e-9)


def hand_built_epsilon(steps, delta):
    """The PLD composition of the recorded steps, built directly with dp_accounting."""
    events = []
    for step in steps:
        if step["mechanism"] == "laplace":
            event = dp_accounting.LaplaceDpEvent(step["noise_std"] / math.sqrt(2) / step["sensitivity"])
        else:
            event = dp_accounting.GaussianDpEvent(step["noise_std"] / step["sensitivity"])
        if step["sampling_rate"] is not None:
            event = dp_accounting.PoissonSampledDpEvent(step["sampling_rate"], event)
        if step["compositions"] > 1:
            event = dp_accounting.SelfComposedDpEvent(event, step["compositions"])
        events.append(event)
    accountant = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
    accountant.compose(dp_accounting.ComposedDpEvent(events))
    return accountant.get_epsilon(delta)


@pytest.mark.parametrize(
    "overrides",
    [
        {"epsilon": 1.0, "lloyd-rounds": 2},
        {"epsilon": 3.0, "lloyd-rounds": 1, "privacy-level": "client", "client-sampling-rate": 0.5},
        {"epsilon": 2.0, "lloyd-rounds": 2, "init": "server-lloyds"},
    ],
)
def test_total_epsilon_equals_hand_built_pld_composition(tmp_path, overrides):
    result = run(small(tmp_path, **overrides), num_nodes=NODES)
    privacy = result["privacy"]
    names = [s["name"] for s in privacy["steps"]]
    if overrides.get("init") == "server-lloyds":
        assert names == ["lloyd_gaussian", "lloyd_laplace"]  # baselines spend nothing on init
    else:
        assert names == ["step1", "step2", "step3_gaussian", "step3_laplace", "lloyd_gaussian", "lloyd_laplace"]
    lloyd = [s for s in privacy["steps"] if s["name"].startswith("lloyd")]
    assert all(s["compositions"] == overrides["lloyd-rounds"] for s in lloyd)
    if overrides.get("privacy-level") == "client":
        assert all(s["sampling_rate"] == 0.5 for s in privacy["steps"])
        for step in privacy["steps"]:
            event = step["event"]
            if step["compositions"] > 1:
                assert event["type"] == "SelfComposedDpEvent" and event["count"] == step["compositions"]
                event = event["event"]
            assert event["type"] == "PoissonSampledDpEvent" and event["sampling_probability"] == 0.5
            assert event["event"]["type"] == ("LaplaceDpEvent" if step["mechanism"] == "laplace" else "GaussianDpEvent")
    hand = hand_built_epsilon(privacy["steps"], DELTA)
    assert privacy["epsilon"] == pytest.approx(hand, rel=1e-9)
    assert privacy["epsilon"] <= overrides["epsilon"]
    assert privacy["epsilon"] == pytest.approx(overrides["epsilon"], rel=0.01)


def test_noise_is_reproducible_only_with_a_noise_seed(tmp_path):
    config = small(tmp_path, epsilon=1.0)
    a = run({**config, "noise-seed": 5, "output-dir": str(tmp_path / "a")}, num_nodes=NODES)
    b = run({**config, "noise-seed": 5, "output-dir": str(tmp_path / "b")}, num_nodes=NODES)
    c = run({**config, "output-dir": str(tmp_path / "c")}, num_nodes=NODES)
    d = run({**config, "output-dir": str(tmp_path / "d")}, num_nodes=NODES)
    load = lambda r: np.load(Path(r["output_dir"]) / "server_weights.npy")  # noqa: E731
    np.testing.assert_array_equal(load(a), load(b))
    assert not np.array_equal(load(c), load(d))


# ------------------------------------------------------------------ clipping enforced by the server
@pytest.mark.parametrize("level", ["data-point", "client"])
def test_reply_above_its_clipping_bound_is_dropped_and_never_aggregated(tmp_path, level):
    """Node 1000 sends statistics 10x above what clipping allows (a device that does not
    clip, or a tampered reply): every phase drops it with a reason; with no noise the
    centers equal Lloyd on the OTHER nodes' data only."""

    def hook(node, message, reply):
        if node != 1000 or reply.has_error() or "feddp_" not in message.metadata.message_type:
            return reply
        return rewrite_reply(message, reply, lambda arrays: {k: v * 10 + 1.0 for k, v in arrays.items()})

    overrides = {
        "epsilon": math.inf,
        "init": "server-lloyds",
        "lloyd-rounds": 1,
        "clip-norm": 100.0,
        "privacy-level": level,
        "client-max-points": 300,
    }
    result = run(small(tmp_path, **overrides), num_nodes=NODES, reply_hook=hook)
    failures = result["rounds"][0]["failures"]
    assert [f["node"] for f in failures] == [1000]
    # caught by FedDP's clipping bound, or before it by the count the node declared
    assert "clipping bound" in failures[0]["reason"] or "more than the # points it declared" in failures[0]["reason"]
    # no exact count, norm or row index of a device reaches result.json at a privacy level
    text = (tmp_path / "out" / "result.json").read_text()
    reasons = [f["reason"] for r in result["rounds"] for f in r["failures"]] + [
        e["reason"] for e in result["nodes"]["exclusions"]
    ]
    assert reasons and not any(re.search(r"\d", reason) for reason in reasons), reasons
    assert all(reason in text for reason in reasons)
    assert result["rounds"][0]["replies"] == NODES - 1
    X = pooled_points(result["config"], NODES)[0]
    per_node = len(X) // NODES
    others = X[per_node:]
    init = np.load(tmp_path / "out" / "init_centers.npy")
    centers = np.load(tmp_path / "out" / "centers.npy")
    # client level: the worst-case bounds (m·Δ, m) leave honest replies unclipped here
    np.testing.assert_allclose(centers, lloyd_step(others, init), atol=1e-9)

    # the init steps of FedDP-Init are guarded the same way (Δ = the server data's radius:
    # at data-point level a sum over n points can only be checked against n·Δ, n·Δ²)
    overrides.update({"init": "feddp", "lloyd-rounds": 0, "clip-norm": 0.0, "overwrite": True})
    result = run(small(tmp_path, **overrides), num_nodes=NODES, reply_hook=hook)
    init_phases = [p for p in result["phases"] if p["phase"].startswith("init-")]
    assert len(init_phases) == 3
    assert [f["node"] for f in init_phases[0]["failures"]] == [1000]
    for phase in init_phases[1:]:  # out of the run after its first invalid reply: not asked again
        assert phase["failures"] == [] and phase["sent"] == NODES - 1, phase
    assert all(phase["replies"] == NODES - 1 for phase in init_phases)


def test_server_data_never_leaves_the_server(tmp_path):
    seen = []

    def hook(node, message, reply):
        for record in message.content.array_records.values():
            seen.extend(value.numpy() for value in record.values())
        return reply

    result = run(small(tmp_path, **{"epsilon": 1.0, "lloyd-rounds": 1}), num_nodes=NODES, reply_hook=hook)
    server = generated_server_points(result["config"])
    mean = server.mean(axis=0)  # clip-center = auto: the devices take their points around it
    assert result["init"]["clip_center"] == "server-mean"
    V = np.load(tmp_path / "out" / "projection.npy")
    assert any(
        a.shape == (server.shape[0], 3) and np.allclose(a, (server - mean) @ V) for a in seen
    )  # (Q − μ)V is sent
    assert any(a.shape == mean.shape and np.allclose(a, mean) for a in seen)  # and μ, the one summary of Q that leaves
    for array in seen:
        assert array.shape[0] != server.shape[0] or array.shape[-1] != server.shape[1]
        assert not any(np.allclose(array, point) for point in server[:5] if array.shape == point.shape)


def test_with_lloyd_rounds_at_data_point_level_auto_counts_the_devices_points_by_server_points(tmp_path):
    """init = auto, server data, data-point level, Lloyd rounds: the histogram start, its
    candidates the server's points (all of them here: fewer than 10·k) and, for the rest,
    points in the cube inscribed in the ball of radius Δ (test_histogram_candidates_...);
    relative Lloyd rounds follow. The server points are sent to the devices (recorded as
    server_candidates)."""
    sent = []

    def hook(node, message, reply):
        if message.metadata.message_type == "query.feddp_candidates":
            sent.append(message.content.array_records["arrays"]["candidates"].numpy())
        return reply

    base = {**small(tmp_path), "init": "auto", "num-points": 300, "epsilon": 1.0, "lloyd-rounds": 1, "noise-seed": 0}
    result = run(base, num_nodes=NODES, reply_hook=hook)
    server = generated_server_points(result["config"]) - generated_server_points(result["config"]).mean(axis=0)
    assert result["init"]["method"] == "histogram" and result["privacy"]["lloyd_update"] == "relative"
    assert sent and all(np.array_equal(a, sent[0]) for a in sent)
    candidates = sent[0]  # 160 server points: every one of the 10·k candidates is one of them, none twice
    assert candidates.shape == (30, 10) and result["init"]["server_candidates"] == 30
    assert all(sum(np.allclose(c, q) for q in server) == 1 for c in candidates)
    assert len({tuple(c) for c in candidates}) == 30
    paper = run({**base, "privacy-level": "client", "output-dir": str(tmp_path / "client")}, num_nodes=NODES)
    assert paper["init"]["method"] == "feddp"  # client level: FedDP-Init
    alone = run({**base, "lloyd-rounds": 0, "output-dir": str(tmp_path / "alone")}, num_nodes=NODES)
    assert alone["init"]["method"] == "feddp"  # no rounds to turn candidates into means: FedDP-Init


# ------------------------------------------------------------------ noisy counts
def test_noisy_counts_at_or_below_zero_never_give_inf_or_nan_centers(tmp_path):
    """ε so small that step 3's noisy counts go negative: centers = S̃ / max(Ñ, 1) stay
    finite, and so do the Lloyd rounds (clusters with Ñ < 1 keep their center)."""
    result = run(
        small(
            tmp_path, **{"step-epsilons": "1,1,1,0.0001,1,0.0001", "epsilon": 10.0, "lloyd-rounds": 2, "noise-seed": 0}
        ),
        num_nodes=NODES,
    )
    noisy = np.array(result["init"]["noisy_counts"])
    assert np.any(noisy <= 0), noisy  # the case under test really happened
    lloyd_counts = np.concatenate([r["noisy_counts"] for r in result["rounds"]])
    assert np.any(lloyd_counts < 1)
    for name in ("init_centers", "centers"):
        assert np.all(np.isfinite(np.load(tmp_path / "out" / f"{name}.npy")))
    assert math.isfinite(result["final"]["cost"])


# ------------------------------------------------------------------ no noise = non-private
def test_feddp_lloyds_without_noise_is_lloyd_exactly(tmp_path):
    result = run(
        small(tmp_path, **{"epsilon": math.inf, "init": "server-kmeans++", "lloyd-rounds": 3, "clip-norm": 1e3}),
        num_nodes=NODES,
    )
    assert result["privacy"]["epsilon"] is None  # ∞: not private
    X = pooled_points(result["config"], NODES)[0]
    expected = np.load(tmp_path / "out" / "init_centers.npy")
    for _ in range(3):
        expected = lloyd_step(X, expected)
    np.testing.assert_allclose(np.load(tmp_path / "out" / "centers.npy"), expected, atol=1e-9)
    assert result["final"]["cost"] == pytest.approx(((X[:, None] - expected[None]) ** 2).sum(-1).min(1).mean())


@pytest.mark.parametrize("center", ["origin", "server-mean"])
def test_feddp_init_without_noise_is_the_central_computation(tmp_path, center):
    """Every step of FedDP-Init with ε = ∞ equals its central counterpart on the pooled,
    clipped points (clip-norm defaults to the server data's radius, so clipping is real),
    taken around clip-center: the origin (the paper) or the server data's mean μ (every
    party works on x − μ; the centers come back + μ)."""
    result = run(small(tmp_path, **{"epsilon": math.inf, "margin": 0.9, "clip-center": center}), num_nodes=NODES)
    out = tmp_path / "out"
    clip = result["privacy"]["clip_norm"]
    server = generated_server_points(result["config"])
    mu = server.mean(axis=0) if center == "server-mean" else np.zeros(server.shape[1])
    server = server - mu
    assert clip == pytest.approx(np.linalg.norm(server, axis=1).max())
    X = pooled_points(result["config"], NODES)[0] - mu
    assert np.linalg.norm(X, axis=1).max() > clip  # some points really are clipped
    X = clip_rows_l2(X, clip)

    V = np.load(out / "projection.npy")
    central_V = top_eigenvectors(X.T @ X, 3)
    np.testing.assert_allclose(V @ V.T, central_V @ central_V.T, atol=1e-8)

    P, Q = X @ V, server @ V
    nearest = ((P[:, None] - Q[None]) ** 2).sum(-1).argmin(1)
    np.testing.assert_array_equal(np.load(out / "server_weights.npy"), np.bincount(nearest, minlength=len(server)))

    nu = np.load(out / "projected_centers.npy")
    d = np.sqrt(((P[:, None] - nu[None]) ** 2).sum(-1))
    ordered = np.sort(d, axis=1)
    keep = ordered[:, 0] <= 0.9 * ordered[:, 1]
    labels = d.argmin(1)
    expected = np.stack([X[keep & (labels == j)].mean(0) for j in range(3)])
    np.testing.assert_allclose(np.load(out / "init_centers.npy"), expected + mu, atol=1e-9)
    assert result["init"]["kept_by_margin"] == keep.sum()


# ------------------------------------------------------------------ baselines
def test_sphere_packing_respects_its_constraints_at_the_largest_radius_found():
    rng = np.random.default_rng(0)
    centers, a = sphere_packing(5, 4, 2.0, rng)
    assert a > 0
    corner = np.linalg.norm(2.0 - np.abs(centers), axis=1)
    assert np.all(corner >= a) and np.all(np.abs(centers) <= 2.0)
    gaps = np.linalg.norm(centers[:, None] - centers[None], axis=-1)[np.triu_indices(5, 1)]
    assert np.all(gaps >= 2 * a)
    # a clearly larger radius is infeasible within the attempts (the search went far)
    assert sphere_packing(5, 4, 2.0, np.random.default_rng(1))[1] == pytest.approx(a, rel=0.25)


@pytest.mark.parametrize("init", ["server-kmeans++", "server-lloyds", "sphere-packing"])
def test_baselines_run_and_spend_the_whole_budget_on_lloyd(tmp_path, init):
    result = run(small(tmp_path, **{"init": init, "epsilon": 2.0, "lloyd-rounds": 2}), num_nodes=NODES)
    assert result["init"]["method"] == init
    assert [s["name"] for s in result["privacy"]["steps"]] == ["lloyd_gaussian", "lloyd_laplace"]
    assert result["privacy"]["epsilon"] <= 2.0
    assert result["privacy"]["epsilon"] == pytest.approx(2.0, rel=0.01)
    assert math.isfinite(result["final"]["cost"]) and result["final"]["cost"] > 0


# ------------------------------------------------------------------ a whole private run
def test_paper_data_point_setting_reaches_the_optimum_at_small_epsilon(tmp_path):
    """App. G.1: d = 100, k = 10, 100 clients x 1000 points, Δ = 11; total ε = 0.5 at
    δ = 1e-6 (PLD, Δ² in step 1) lands within 1 % of the pooled k-means optimum."""
    result = run(
        {
            "algorithm": "feddp-kmeans",
            "dataset": "feddp-mixture",
            "dim": 100,
            "k": 10,
            "num-points": 100_000,
            "clip-norm": 11.0,
            "epsilon": 0.5,
            "reference": True,
            "output-dir": str(tmp_path / "out"),
        },
        num_nodes=100,
    )
    assert result["privacy"]["epsilon"] <= 0.5
    assert result["reference"]["ratio"] < 1.01, result["reference"]


def test_step_epsilons_above_the_epsilon_cap_are_refused_before_any_private_step(tmp_path):
    """Per-step ε values compose (PLD) to more than ``epsilon``: the run is refused with
    both numbers named, instead of silently spending the larger budget."""
    from fedcluster.server.base import FederationError

    with pytest.raises(FederationError, match=r"compose to a total ε of [0-9.]+ .*above epsilon=0.5"):
        run(small(tmp_path, **{"step-epsilons": "0.5,0.5,0.5,0.5", "epsilon": 0.5}), num_nodes=NODES)
    assert not (tmp_path / "out" / "centers.npy").exists()
    # the same steps under a cap that covers them run, and report a total within the cap
    result = run(
        small(tmp_path, **{"step-epsilons": "0.5,0.5,0.5,0.5", "epsilon": 3.0, "noise-seed": 0}), num_nodes=NODES
    )
    assert 0.5 < result["privacy"]["epsilon"] <= 3.0


def test_a_dimension_whose_second_moment_cannot_be_held_is_refused_before_any_work(tmp_path):
    """d = 100 000 with 2 rows per device: step 1's d × d second moment (74.5 GiB) is never
    allocated; the server refuses with the limit named, and so does a device asked anyway."""
    from fedcluster.server.base import FederationError

    d = 100_000
    rng = np.random.default_rng(0)
    data = tmp_path / "data"
    data.mkdir()
    for i in range(3):
        np.save(data / f"c{i}.npy", rng.normal(size=(2, d)))
    np.save(tmp_path / "server.npy", rng.normal(size=(4, d)))
    config = {
        "algorithm": "feddp-kmeans",
        "k": 2,
        "dataset": "npy-dir",
        "data-dir": str(data),
        "reference": False,
        "server-data": str(tmp_path / "server.npy"),
        "output-dir": str(tmp_path / "out"),
    }
    with pytest.raises(FederationError, match=f"dimension d={d} is above {feddp_kmeans.MAX_OUTER_DIMENSION}"):
        run(config, num_nodes=3)
    with pytest.raises(ValueError, match="74.5 GiB"):
        feddp_device.feddp_outer(
            DeviceData(points=rng.normal(size=(2, d))), {}, {"level": "data-point", "clip-norm": 1.0, "max-points": 0}
        )
    # without server data the histogram start's fallback, SpherePacking, has its limit too
    alone = {**config, "server-data": "", "dimension": d, "clip-norm": 1.0, "lloyd-rounds": 1}
    with pytest.raises(
        FederationError, match=f"dimension d={d} is above {feddp_kmeans.MAX_SPHERE_DIMENSION} for SpherePacking"
    ):
        run(alone, num_nodes=3)


def test_start_problem_names_each_starts_resource_limit():
    assert feddp_kmeans.start_problem("feddp", 5, 8192, True) is None
    assert "second moment" in feddp_kmeans.start_problem("feddp", 5, 8193, True)
    assert feddp_kmeans.start_problem("histogram", 100, 8000, True) is None  # 64 MB of candidates
    assert "limit 64 MB" in feddp_kmeans.start_problem("histogram", 100, 8001, True)
    assert feddp_kmeans.start_problem("histogram", 2, 40_000, True) is None  # server points fill in, no SpherePacking
    assert "SpherePacking" in feddp_kmeans.start_problem("histogram", 2, 40_000, False)
    assert "SpherePacking" in feddp_kmeans.start_problem("sphere-packing", 2, 40_000, True)
    assert feddp_kmeans.start_problem("server-kmeans++", 100, 10**6, True) is None


# ------------------------------------------------------------------ max-device-points
def test_max_device_points_bounds_a_device_that_claims_many_points(tmp_path):
    """Data-point level, no noise. Node 1000 claims 1000x its points in every reply, each
    statistic scaled to match (within n·Δ, n·Δ² of what it claims); in the Lloyd rounds it
    puts all its claimed points at Δ·e₁. Without a cap its claim is its weight and it puts a
    center to where it likes; with max-device-points = 2x an honest device, every reply claiming
    more than the cap allows is dropped and the result is the honest one without it."""
    factor = 1000

    def hook(node, message, reply):
        kind = message.metadata.message_type
        if node != 1000 or reply.has_error() or "feddp_" not in kind:
            return reply
        metrics = dict(reply.content.metric_records["metrics"])
        n = int(metrics["num-examples"])
        metrics["num-examples"] = n * factor

        def change(arrays):
            if kind == "query.feddp_lloyd":
                counts = np.zeros_like(arrays["counts"])
                counts[0] = n * factor
                sums = np.zeros_like(arrays["sums"])
                sums[0, 0] = counts[0] * clip_norm[0]
                return {"sums": sums, "counts": counts}
            return {key: value * factor for key, value in arrays.items()}

        forged = rewrite_reply(message, reply, change)
        return Message(
            RecordDict({"arrays": forged.content.array_records["arrays"], "metrics": MetricRecord(metrics)}),
            reply_to=message,
        )

    clip_norm, excluded, final_points = [], [], []

    def outcome(name, cap, attack):
        config = small(
            tmp_path,
            **{
                "epsilon": math.inf,
                "lloyd-rounds": 2,
                "max-device-points": cap,
                "clip-center": "origin",
                "output-dir": str(tmp_path / name),
            },
        )
        result = run(config, num_nodes=NODES, reply_hook=hook if attack else None)
        clip_norm[:] = [result["privacy"]["clip_norm"]]
        # a cap swaps points between neighbours: the accounting uses twice the sensitivity
        assert result["privacy"]["bounds"]["lloyd_gaussian"] == pytest.approx((2 if cap else 1) * clip_norm[0])
        X = pooled_points(result["config"], NODES)[0]
        C = np.load(tmp_path / name / "centers.npy")
        dropped = {p["phase"]: [f["node"] for f in p["failures"]] for p in result["phases"]}
        excluded[:] = [{int(node): reason for node, reason in result["nodes"]["excluded"].items()}]
        final_points[:] = [result["final"]["num_points"], len(X)]
        return ((X[:, None, :] - C[None]) ** 2).sum(-1).min(1).mean(), C, dropped

    honest, honest_centers, _ = outcome("honest", 0, False)
    _, capped_honest_centers, none_dropped = outcome("capped-honest", 600, False)
    np.testing.assert_array_equal(capped_honest_centers, honest_centers)  # 300 points each: nothing capped
    assert not any(none_dropped.values())
    attacked, attacked_centers, _ = outcome("attacked", 0, True)
    capped, capped_centers, dropped = outcome("capped", 600, True)
    target = np.zeros(attacked_centers.shape[1])
    target[0] = clip_norm[0]

    def nearest_to_target(C):
        return np.min(np.linalg.norm(C - target, axis=1)) / clip_norm[0]

    # measured: a center put 1.5e-5·Δ from where the liar wanted it, true cost 4.921 (honest
    # 4.610); capped: the nearest center 1.00·Δ away (honest run: 1.00·Δ), cost 4.610
    assert nearest_to_target(attacked_centers) < 0.01 and attacked > 1.05 * honest, (
        nearest_to_target(attacked_centers),
        attacked,
        honest,
    )
    assert nearest_to_target(capped_centers) > 0.5 and capped < 1.01 * honest, (
        nearest_to_target(capped_centers),
        capped,
        honest,
    )
    # its first reply is dropped and it is asked for nothing more: not its evaluation either
    # (a consistent liar's evaluation reply claims its points too and would skew the reported cost)
    first = next(phase for phase in dropped if dropped[phase])
    assert dropped[first] == [1000] and not any(dropped[phase] for phase in dropped if phase != first), dropped
    assert 1000 in excluded[0] and "was invalid" in excluded[0][1000]
    assert final_points[0] == final_points[1] * (NODES - 1) // NODES  # the other nodes' points only


def test_a_capped_device_uses_the_same_subset_in_every_step():
    X = np.arange(40.0).reshape(20, 2)
    data = DeviceData(points=X, source="test")
    config = {"level": "data-point", "clip-norm": 1e6, "max-points": 5}
    first = feddp_kmeans.private_points(data, {}, config)
    assert first.shape == (5, 2)
    assert np.array_equal(
        first, feddp_kmeans.private_points(DeviceData(points=X[::-1].copy(), source="again"), {}, config)[::-1]
    )
    rows = {tuple(row) for row in X}
    assert all(tuple(row) in rows for row in first) and len({tuple(r) for r in first}) == 5
    assert feddp_kmeans.private_points(data, {}, {**config, "max-points": 50}).shape == (
        20,
        2,
    )  # fewer than the cap: all


def _subset(X, cap):
    return sorted(map(tuple, X[feddp_kmeans.capped_rows(X, cap)]))


@pytest.mark.parametrize("seed", range(5))
def test_adding_one_point_changes_a_capped_subset_by_at_most_one_swap(seed):
    """The data-point accounting with a cap assumes neighbours' subsets differ by replacing
    one point (clipping_bounds(capped=True)); a subset drawn from a seed of (n, cap) would
    change almost wholly when n grows by one."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(60, 3))
    X = np.vstack([X, X[:10]])  # duplicate points too
    for cap in (1, 7, 30, 69, 70):
        before = _subset(X, cap)
        for _ in range(20):
            x = rng.normal(size=(1, 3)) if rng.random() < 0.7 else X[[rng.integers(len(X))]]
            grown = np.vstack([X, x])[rng.permutation(len(X) + 1)]
            after = _subset(grown, cap)
            assert len(after) == min(cap, len(X) + 1)
            removed = Counter(before) - Counter(after)
            added = Counter(after) - Counter(before)
            assert sum(removed.values()) <= 1 and sum(added.values()) <= 1, (cap, removed, added)
            assert set(added) <= {tuple(x[0])}


def test_a_cap_doubles_the_data_point_sensitivities():
    plain = feddp_kmeans.clipping_bounds("data-point", 3.0, k=4)
    capped = feddp_kmeans.clipping_bounds("data-point", 3.0, k=4, capped=True)
    assert capped == {
        "step1": pytest.approx(math.sqrt(2) * 9.0),
        "step2": 2.0,
        "step3_gaussian": 6.0,
        "step3_laplace": 2.0,
        "lloyd_gaussian": 6.0,
        "lloyd_laplace": 2.0,
    }
    assert (
        all(capped[step] >= plain[step] for step in plain) and capped["lloyd_gaussian"] == 2 * plain["lloyd_gaussian"]
    )
    # the worst swap reaches each bound: x, y of norm Δ (opposite in one cluster; orthogonal for xxᵀ)
    x, y = np.array([3.0, 0.0]), np.array([0.0, 3.0])
    assert np.linalg.norm(np.outer(x, x) - np.outer(y, y)) == pytest.approx(capped["step1"])
    assert np.linalg.norm(x - (-x)) == pytest.approx(capped["lloyd_gaussian"])
    assert feddp_kmeans.clipping_bounds(
        "client", 3.0, k=4, client_max_points=5, capped=True
    ) == feddp_kmeans.clipping_bounds("client", 3.0, k=4, client_max_points=5)

    assert feddp_kmeans.usable_points(300, "data-point", 600) == 300
    assert feddp_kmeans.usable_points(300000, "data-point", 600) == 600
    assert feddp_kmeans.usable_points(300000, "data-point", 0) == 300000
    assert feddp_kmeans.usable_points(300000, "client", 600) == 300000


# ------------------------------------------------------------------ without server-side data
def _separated_clients(seed=0):
    rng = np.random.default_rng(seed)
    means = np.array([[-3.0, 0.0], [3.0, 0.0], [0.0, 3.0]])
    X = np.vstack([m + 0.3 * rng.normal(size=(200, 2)) for m in means])
    return [X[i::4] for i in range(4)], X


@pytest.mark.parametrize("init", ["auto", "sphere-packing"])
def test_without_server_data_the_run_starts_from_a_histogram_or_sphere_packing_in_the_clipping_ball(init):
    """The dimension (the clients' arrays' width, public) and Δ = clip-norm are all that the
    data-free starts need: no server data (auto = the private histogram of data-independent
    candidates). Without noise the Lloyd rounds then find the clusters; at ε = 1 the ledger
    stays within the budget."""
    from sklearn.cluster import KMeans

    import fedcluster

    clients, X = _separated_clients()
    central = KMeans(3, n_init=10, random_state=0).fit(X).inertia_
    exact = fedcluster.DPFederatedKMeans(
        3, epsilon=math.inf, max_iter=8, random_state=0, run_config={"clip-norm": 4.0, "noise-seed": 1, "init": init}
    ).fit(clients)
    method = "histogram" if init == "auto" else init
    assert exact.result_["init"]["method"] == method and exact.result_["config"]["dimension"] == 2
    cost = ((X[:, None] - exact.cluster_centers_[None]) ** 2).sum(-1).min(1).sum()
    assert cost <= 1.01 * central, (cost, central)
    private = fedcluster.DPFederatedKMeans(
        3, epsilon=1.0, max_iter=3, random_state=0, run_config={"clip-norm": 4.0, "noise-seed": 1, "init": init}
    ).fit(clients)
    assert private.privacy_["epsilon"] <= 1.0 and np.isfinite(private.cluster_centers_).all()
    steps = [step["name"] for step in private.privacy_["steps"]]
    assert steps == (["step2"] if method == "histogram" else []) + ["lloyd_gaussian", "lloyd_laplace"]


def test_without_server_data_step_epsilons_name_the_histogram_and_the_lloyd_steps():
    # init = auto starts from the private histogram there: it and the Lloyd rounds spend ε,
    # and the config checks step-epsilons against the steps the run really has
    import fedcluster
    from fedcluster.config import ConfigError, with_defaults

    clients, _ = _separated_clients()
    model = fedcluster.DPFederatedKMeans(
        3,
        epsilon=1.0,
        max_iter=2,
        random_state=0,
        run_config={"clip-norm": 4.0, "noise-seed": 1, "step-epsilons": "0.1,0.5,0.3"},
    ).fit(clients)
    assert model.result_["init"]["method"] == "histogram" and model.privacy_["epsilon"] <= 1.0
    with pytest.raises(ConfigError, match="step-epsilons must give 3 positive values"):
        with_defaults(
            {
                "algorithm": "feddp-kmeans",
                "dataset": "npy-dir",
                "data-dir": "x",
                "lloyd-rounds": 2,
                "step-epsilons": "0.1,0.1,0.1,0.1,0.3,0.3",
            }
        )


@pytest.mark.parametrize(
    "config, named",
    [
        ({"lloyd-rounds": 2}, "clip-norm"),
        ({"clip-norm": 4.0}, "lloyd-rounds >= 1"),
        (
            {"clip-norm": 4.0, "lloyd-rounds": 2, "init": "server-lloyds"},
            "init='histogram', 'sphere-packing' or 'auto'",
        ),
    ],
)
def test_without_server_data_a_run_that_cannot_start_names_what_is_missing(tmp_path, config, named):
    from fedcluster.server.base import FederationError

    directory = write_npy_dir(tmp_path / "clients", _separated_clients()[0])
    with pytest.raises(FederationError, match=re.escape(named)):
        run(
            {
                "algorithm": "feddp-kmeans",
                "k": 3,
                "dataset": "npy-dir",
                "data-dir": str(directory),
                "dimension": 2,
                "output-dir": str(tmp_path / "o"),
                **config,
            },
            num_nodes=4,
        )


def test_data_free_starts_without_lloyd_rounds_are_refused_before_the_run():
    with pytest.raises(ConfigError, match="never saw the devices' data"):
        with_defaults({"algorithm": "feddp-kmeans", "init": "sphere-packing"})
    with pytest.raises(ConfigError, match="candidate points, not cluster means"):
        with_defaults({"algorithm": "feddp-kmeans", "init": "histogram"})


def test_histogram_start_without_noise_clusters_the_candidates_by_their_exact_counts(tmp_path):
    """ε = ∞: the histogram is each candidate's exact count of nearest pooled points (the
    candidates lie in the cube inscribed in the ball of radius Δ), and the histogram spends
    its share of the budget at finite ε."""
    directory = write_npy_dir(tmp_path / "clients", _separated_clients()[0])
    base = {
        "algorithm": "feddp-kmeans",
        "k": 3,
        "dataset": "npy-dir",
        "data-dir": str(directory),
        "dimension": 2,
        "clip-norm": 4.0,
        "lloyd-rounds": 1,
    }
    result = run({**base, "epsilon": math.inf, "output-dir": str(tmp_path / "o")}, num_nodes=4)
    candidates, weights = np.load(tmp_path / "o" / "candidates.npy"), np.load(tmp_path / "o" / "candidate_weights.npy")
    X = np.vstack(_separated_clients()[0])
    assert candidates.shape == (30, 2) and np.abs(candidates).max() <= 4.0 / math.sqrt(2)
    nearest = ((X[:, None] - candidates[None]) ** 2).sum(-1).argmin(1)
    np.testing.assert_array_equal(weights, np.bincount(nearest, minlength=30))
    assert result["init"]["method"] == "histogram" and result["init"]["candidates"] == 30
    # a fixed noise-seed: whether noise alone lifts a candidate above the threshold is chance
    private = run({**base, "epsilon": 1.0, "noise-seed": 0, "output-dir": str(tmp_path / "p")}, num_nodes=4)
    assert private["privacy"]["epsilon_shares"]["step2"] < private["privacy"]["epsilon_shares"]["lloyd_gaussian"]
    assert hand_built_epsilon(private["privacy"]["steps"], private["privacy"]["delta"]) <= 1.0 + 1e-3
    assert "fallback" not in private["init"] and private["init"]["candidates_kept"] >= 3
    # at ε = 0.01 the histogram's noise (b = 1/(0.1·0.01)) drowns 600 points: SpherePacking places the centers
    drowned = run({**base, "epsilon": 0.01, "noise-seed": 0, "output-dir": str(tmp_path / "q")}, num_nodes=4)
    init = drowned["init"]
    assert init["fallback"] == "sphere-packing" and init["filled"] == 3 - init["candidates_kept"] > 0


def test_histogram_candidates_are_server_points_then_points_drawn_in_the_cube():
    server = np.arange(14.0).reshape(7, 2) / 20
    candidates = feddp_kmeans.histogram_candidates(3, 2, 0.5, np.random.default_rng(0), server)
    assert candidates.shape == (30, 2)
    assert sorted(map(tuple, candidates[:7])) == sorted(map(tuple, server))  # all 7, each once
    assert np.abs(candidates[7:]).max() <= 0.5 and not np.isin(candidates[7:], server).all(axis=1).any()
    many = feddp_kmeans.histogram_candidates(
        3, 2, 0.5, np.random.default_rng(0), np.random.default_rng(1).random((100, 2))
    )
    assert len({tuple(c) for c in many}) == 30 and np.isin(many, np.random.default_rng(1).random((100, 2))).all()
    # without server data the draw is the data-independent one, unchanged
    np.testing.assert_array_equal(
        feddp_kmeans.histogram_candidates(3, 2, 0.5, np.random.default_rng(0)),
        np.random.default_rng(0).uniform(-0.5, 0.5, size=(30, 2)),
    )


def test_with_server_data_the_histogram_start_fills_missing_centers_from_the_servers_own_k_means():
    """Fewer than k candidates stand out of the noise: with server data the other centers are
    the server's k-means centers farthest from the supported candidates, not SpherePacking."""
    rng = np.random.default_rng(0)
    blobs = np.array([[-3.0, 0.0], [0.0, 3.0], [3.0, 0.0]])
    server = np.vstack([c + 0.1 * rng.normal(size=(20, 2)) for c in blobs])
    candidates = np.array([[-3.0, 0.1], [5.0, 5.0], [-5.0, -5.0]])
    counts = np.array([100.0, 0.0, 0.0])  # only the first stands out (b = 1: threshold ln 3)
    centers, record = feddp_kmeans.histogram_start(candidates, counts, 1.0, 3, 6.0, np.random.default_rng(1), 5, server)
    assert record["fallback"] == "server-lloyds" and record["filled"] == 2 and record["candidates_kept"] == 1
    np.testing.assert_array_equal(centers[0], candidates[0])
    # the two server blob means away from the supported candidate, not the one beside it
    gaps = np.linalg.norm(centers[1:, None] - blobs[None, [1, 2]], axis=-1)  # filled center × blob
    assert gaps.min(1).max() < 0.2 and set(gaps.argmin(1)) == {0, 1}
    assert np.linalg.norm(centers[1:] - blobs[0], axis=1).min() > 2
    packed, record = feddp_kmeans.histogram_start(candidates, counts, 1.0, 3, 6.0, np.random.default_rng(1), 5)
    assert record["fallback"] == "sphere-packing" and np.abs(packed).max() <= 6.0


def test_farthest_fill_takes_the_pool_rows_farthest_from_those_chosen():
    pool = np.array([[0.0, 0.0], [1.0, 0.0], [10.0, 0.0], [5.0, 0.0]])
    np.testing.assert_array_equal(
        feddp_kmeans.farthest_fill(np.array([[0.0, 0.0]]), pool, 3), [[0.0, 0.0], [10.0, 0.0], [5.0, 0.0]]
    )
    np.testing.assert_array_equal(feddp_kmeans.farthest_fill(np.empty((0, 2)), pool, 2), [[0.0, 0.0], [10.0, 0.0]])


def test_sphere_packing_keeps_the_given_centers_and_places_the_others_away_from_them():
    fixed = np.array([[0.5, 0.5], [-0.5, 0.5]])
    centers, a = sphere_packing(4, 2, 1.0, np.random.default_rng(0), fixed=fixed)
    np.testing.assert_array_equal(centers[:2], fixed)
    assert a > 0 and np.abs(centers).max() <= 1.0
    gaps = np.linalg.norm(centers[:, None] - centers[None], axis=-1)[np.triu_indices(4, 1)]
    assert gaps[1:].min() >= 2 * a - 1e-12  # every pair with a drawn center (the given pair is as given)
    plain, _ = sphere_packing(4, 2, 1.0, np.random.default_rng(0))
    again, _ = sphere_packing(4, 2, 1.0, np.random.default_rng(0), fixed=None)
    np.testing.assert_array_equal(plain, again)


def test_significant_candidates_stand_above_what_the_noise_alone_reaches():
    rng = np.random.default_rng(0)
    b, s = 20.0, 200
    noise_only = [feddp_kmeans.significant_candidates(rng.laplace(0, b, s), b).sum() for _ in range(200)]
    assert np.mean(noise_only) < 1.0  # about one false candidate in two histograms, at most
    counts = np.zeros(s)
    counts[:5] = 400.0
    kept = feddp_kmeans.significant_candidates(counts + rng.laplace(0, b, s), b)
    assert kept[:5].all() and kept[5:].sum() <= 2
    np.testing.assert_array_equal(
        feddp_kmeans.significant_candidates(np.array([0.0, 3.0, 0.0]), 0.0), [False, True, False]
    )


# ------------------------------------------------------------------ relative Lloyd updates
def test_relative_lloyd_kernel_sums_clipped_displacements():
    rng = np.random.default_rng(4)
    X = rng.normal(size=(300, 3)) * 2
    centers = rng.normal(size=(4, 3))
    data = DeviceData(points=X, source="test")
    stats, metrics = feddp_device.feddp_lloyd(
        data, {"centers": centers}, {"level": "data-point", "clip-norm": 3.0, "radius": 0.7}
    )
    clipped = clip_rows_l2(X, 3.0)
    labels = ((clipped[:, None] - centers[None]) ** 2).sum(-1).argmin(1)
    moves = clip_rows_l2(clipped - centers[labels], 0.7)
    assert np.linalg.norm(clipped - centers[labels], axis=1).max() > 0.7  # the radius really clips
    np.testing.assert_allclose(stats["sums"], np.stack([moves[labels == j].sum(0) for j in range(4)]), atol=1e-12)
    np.testing.assert_array_equal(stats["counts"], np.bincount(labels, minlength=4))
    assert metrics["num-examples"] == 300
    # a relative reply is checked against count x radius, not count x clip-norm
    assert feddp_kmeans.lloyd_violation(stats["sums"], stats["counts"], 300, "data-point", 0.7, 0.7, 1.0) is None
    assert "exceeds the clipping bound" in feddp_kmeans.lloyd_violation(
        stats["sums"] * 1.5 + 0.7 * stats["counts"][:, None], stats["counts"], 300, "data-point", 0.7, 0.7, 1.0
    )
    with pytest.raises(ValueError, match="data-point level"):
        feddp_device.feddp_lloyd(
            data, {"centers": centers}, {"level": "client", "clip": 5.0, "clip-l1": 5.0, "radius": 0.7}
        )


def test_relative_lloyd_update_moves_at_most_the_radius_and_stays_in_the_ball():
    centers = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 1.9]])
    sums = np.array([[30.0, 0.0], [0.2, 0.1], [0.0, 5.0]])
    counts = np.array([10.0, 0.4, 10.0])  # the second cluster's noisy count is below 1: it keeps its center
    new, alive = feddp_kmeans.relative_lloyd_update(centers, sums, counts, radius=0.5, clip_norm=2.0)
    np.testing.assert_array_equal(alive, [True, False, True])
    np.testing.assert_allclose(new[0], [0.5, 0.0])  # a move of 3 clipped to the radius
    np.testing.assert_array_equal(new[1], centers[1])
    np.testing.assert_allclose(new[2], [0.0, 2.0])  # 1.9 + 0.5 brought back into the ball of radius 2


@pytest.mark.parametrize("radius", [0.4, 1e3])
def test_relative_lloyds_without_noise_are_the_clipped_central_steps(tmp_path, radius):
    """ε = ∞: each round is c ← c + clip(mean of the clipped displacements of c's points, r),
    on the pooled points (clip-norm large enough that no point is clipped); with a radius no
    displacement reaches, that is Lloyd's step exactly."""
    result = run(
        small(
            tmp_path,
            **{
                "epsilon": math.inf,
                "init": "server-kmeans++",
                "lloyd-rounds": 3,
                "clip-norm": 1e3,
                "lloyd-update": "relative",
                "lloyd-radius": radius,
            },
        ),
        num_nodes=NODES,
    )
    assert result["privacy"]["lloyd_update"] == "relative" and result["privacy"]["lloyd_radius"] == pytest.approx(
        radius
    )
    X = pooled_points(result["config"], NODES)[0]
    expected = np.load(tmp_path / "out" / "init_centers.npy")
    lloyd = expected.copy()
    for _ in range(3):
        labels = ((X[:, None] - expected[None]) ** 2).sum(-1).argmin(1)
        moves = clip_rows_l2(X - expected[labels], radius)
        expected = expected + clip_rows_l2(np.stack([moves[labels == j].mean(0) for j in range(len(expected))]), radius)
        lloyd = lloyd_step(X, lloyd)
    centers = np.load(tmp_path / "out" / "centers.npy")
    np.testing.assert_allclose(centers, expected, atol=1e-9)
    if radius > 100:
        np.testing.assert_allclose(centers, lloyd, atol=1e-9)
    else:
        assert np.abs(centers - lloyd).max() > 1e-3  # the radius changed the steps


def test_without_server_data_the_lloyd_rounds_are_relative_with_the_radius_as_sensitivity():
    """The default without server data: relative updates with r = 0.5·Δ/k^(1/d) (with server
    data too, Δ then its radius), which is the Gaussian step's sensitivity in the ledger; the
    Lloyd sums and counts keep the paper's shares, 3 : 1 (central DP); the start lies in the
    cube inscribed in the ball of radius Δ; every ε recomputed from the ledger's events stays
    within the budget."""
    import fedcluster

    clients, X = _separated_clients()
    model = fedcluster.DPFederatedKMeans(
        3, epsilon=1.0, max_iter=3, random_state=0, run_config={"clip-norm": 4.0, "noise-seed": 1}
    ).fit(clients)
    privacy = model.privacy_
    radius = 0.5 * 4.0 / 3 ** (1 / 2)
    assert privacy["lloyd_update"] == "relative" and privacy["lloyd_radius"] == pytest.approx(radius)
    assert privacy["bounds"]["lloyd_gaussian"] == pytest.approx(radius)
    lloyd = next(step for step in privacy["steps"] if step["name"] == "lloyd_gaussian")
    assert lloyd["sensitivity"] == pytest.approx(radius)
    assert lloyd["compositions"] == 3 and hand_built_epsilon(privacy["steps"], privacy["delta"]) <= 1.0 + 1e-3
    shares = privacy["epsilon_shares"]
    assert shares["lloyd_gaussian"] / shares["lloyd_laplace"] == pytest.approx(3.0)  # not the devices' noise's 2√d : 1
    assert model.result_["init"]["cube_half_width"] == pytest.approx(4.0 / math.sqrt(2))
    with_server = fedcluster.DPFederatedKMeans(
        3, epsilon=1.0, max_iter=2, random_state=0, run_config={"noise-seed": 1}
    ).fit(clients, server_data=X[::10])
    assert with_server.result_["init"]["method"] == "histogram"  # auto: candidates from the server points
    assert with_server.privacy_["lloyd_update"] == "relative"
    served_radius = with_server.privacy_["clip_norm"] * 0.5 / 3 ** (1 / 2)  # Δ: the server data's radius
    assert with_server.privacy_["lloyd_radius"] == pytest.approx(served_radius)
    paper = fedcluster.DPFederatedKMeans(
        3, epsilon=1.0, max_iter=2, random_state=0, run_config={"noise-seed": 1, "init": "feddp"}
    ).fit(clients, server_data=X[::10])
    assert paper.privacy_["lloyd_update"] == "absolute" and paper.privacy_["lloyd_radius"] is None


@pytest.mark.parametrize("cap", [0, 600])
def test_a_relative_reply_beyond_count_times_radius_is_dropped_and_a_cap_doubles_the_sensitivity(tmp_path, cap):
    """A device whose relative sums exceed count·r (but not count·Δ: the absolute bound) is
    dropped by the server's check of every reply; with max-device-points the accounting
    uses 2r (neighbours then differ by a swapped point)."""
    radius = 0.3

    def hook(node, message, reply):
        if node != 1000 or reply.has_error() or message.metadata.message_type != "query.feddp_lloyd":
            return reply

        def change(arrays):
            sums = arrays["sums"].copy()
            sums[0] = 0.0
            sums[0, 0] = 1.5 * radius * arrays["counts"][0]  # within count·Δ, beyond count·r
            return {"sums": sums, "counts": arrays["counts"]}

        return rewrite_reply(message, reply, change)

    config = small(
        tmp_path,
        **{
            "epsilon": 1.0,
            "noise-seed": 0,
            "init": "server-kmeans++",
            "lloyd-rounds": 2,
            "lloyd-update": "relative",
            "lloyd-radius": radius,
            "max-device-points": cap,
        },
    )
    result = run(config, num_nodes=NODES, reply_hook=hook)
    assert radius * 1.5 < result["privacy"]["clip_norm"]
    assert result["privacy"]["bounds"]["lloyd_gaussian"] == pytest.approx((2 if cap else 1) * radius)
    lloyd = [p for p in result["phases"] if p["phase"] == "lloyd"]
    failures = [f for p in lloyd for f in p["failures"]]
    assert len(lloyd) == 2 and failures and {f["node"] for f in failures} == {1000}
    assert all("exceeds the clipping bound" in f["reason"] for f in failures)


def test_the_estimators_rounds_from_the_points_are_listed_outside_the_guarantee():
    import fedcluster

    clients, X = _separated_clients()
    chosen = fedcluster.DPFederatedKMeans(
        3, epsilon=1.0, random_state=0, run_config={"clip-norm": 4.0, "noise-seed": 1}
    ).fit(clients)
    expected = feddp_kmeans.lloyd_rounds_for(len(X), 3, 2, 1.0, 1e-6)
    assert chosen.privacy_["lloyd_rounds"] == expected and chosen.result_["config"]["public-points"] == len(X)
    assert "lloyd_rounds" in chosen.privacy_["not_covered"] and "config.public-points" in chosen.privacy_["not_covered"]
    given = fedcluster.DPFederatedKMeans(
        3, epsilon=1.0, max_iter=3, random_state=0, run_config={"clip-norm": 4.0, "noise-seed": 1}
    ).fit(clients)
    assert given.privacy_["lloyd_rounds"] == 3 and "lloyd_rounds" not in given.privacy_["not_covered"]


def test_lloyd_rounds_follow_the_budget_and_the_points():
    rounds = feddp_kmeans.lloyd_rounds_for
    assert rounds(150, 3, 4, 0.1, 1e-3) == 2  # little signal: the fewest rounds
    assert rounds(100_000, 100, 2, 1.0, 1e-6) == 7 and rounds(10, 3, 2, math.inf, 1e-6) == 7
    grid = [rounds(n, 10, 4, eps, 1e-5) for n in (1000, 3000, 10_000, 30_000) for eps in (0.25, 1.0)]
    assert grid == sorted(grid) or all(
        rounds(n, 10, 4, 0.25, 1e-5) <= rounds(n, 10, 4, 1.0, 1e-5) for n in (1000, 3000, 10_000)
    )
    assert [rounds(n, 10, 4, 1.0, 1e-5) for n in (1000, 3000, 10_000, 30_000)] == sorted(
        rounds(n, 10, 4, 1.0, 1e-5) for n in (1000, 3000, 10_000, 30_000)
    )
    assert rounds(3000, 10, 4, 1.0, 1e-5) > 2  # in between, from the formula, not a clamp


def test_relative_update_at_client_level_is_refused_before_the_run():
    with pytest.raises(ConfigError, match="data-point level update"):
        with_defaults({"algorithm": "feddp-kmeans", "privacy-level": "client", "lloyd-update": "relative"})


# ------------------------------------------------------------------ clip-center
def test_clipping_around_the_server_mean_makes_the_run_blind_to_where_the_data_sit():
    """With clip-center = auto (the server data's mean) moving every point, the server data
    included, by the same offset moves the result by exactly that offset (same seeds, same
    noise): the offset costs nothing. Around the origin (the paper) the same offset costs
    clipping and noise: the result is worse."""
    import fedcluster

    rng = np.random.default_rng(3)
    means = rng.normal(scale=4.0, size=(3, 2))
    points = np.concatenate([m + rng.normal(size=(200, 2)) for m in means])
    rng.shuffle(points)
    server, clients = points[:60], np.array_split(points[60:], 4)
    offset = np.array([300.0, -200.0])

    def fit(center, shift):
        model = fedcluster.DPFederatedKMeans(
            3, epsilon=2.0, max_iter=2, random_state=0, run_config={"clip-center": center, "noise-seed": 7}
        )
        return model.fit([c + shift for c in clients], server_data=server + shift).cluster_centers_ - shift

    def cost(centers):
        return float(((points[:, None] - centers[None]) ** 2).sum(-1).min(1).mean())

    here, there = fit("auto", 0.0), fit("auto", offset)
    np.testing.assert_allclose(there, here, atol=1e-9 * np.abs(offset).max())
    far = fit("origin", offset)
    assert cost(far) > 1.5 * cost(here), (cost(far), cost(here))


def test_clip_center_server_mean_without_server_data_is_refused(tmp_path):
    import fedcluster

    clients = [np.random.default_rng(i).normal(size=(30, 2)) for i in range(3)]
    with pytest.raises(Exception, match="clip-center='server-mean' needs server-side data"):
        fedcluster.DPFederatedKMeans(
            2, epsilon=1.0, max_iter=2, run_config={"clip-center": "server-mean", "clip-norm": 5.0}
        ).fit(clients)
