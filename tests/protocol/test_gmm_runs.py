"""Federated GMM through the in-process runner (fedcluster/algorithms/gmm): scikit-learn's
mixture on easy data, a lying device named and excluded, secure aggregation equal to the
plain run with no reply revealing a device's statistics and a dropout after masking, BIC over
a k-range, and the guide's worked example."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Array, Error, Message
from flwr.common.constant import ErrorCode
from sklearn.mixture import GaussianMixture

from conftest import write_npy_dir
from fedcluster import FederatedGaussianMixture
from fedcluster.config import with_defaults
from fedcluster.device import run_task
from fedcluster.inprocess import run
from fedcluster.node_data import device_data
from fedcluster.secagg import device as secagg

NODES = 6


def clients(seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    means = np.array([[0.0, 0.0, 0.0], [6.0, 0.0, 1.0], [0.0, 6.0, -1.0]])
    scales = [np.diag([1.0, 0.5, 1.0]), np.array([[1.0, 0.6, 0], [0, 1.0, 0], [0, 0, 0.5]]), np.eye(3) * 1.5]
    parts = []
    for i in range(NODES):
        rows = [rng.normal(size=(80, 3)) @ scales[j] + means[j] for j in (i % 3, (i + 1) % 3)]
        parts.append(np.concatenate(rows))
    return parts


@pytest.mark.parametrize("covariance_type", ["full", "diag", "spherical"])
def test_the_estimator_finds_scikit_learns_mixture(covariance_type):
    parts = clients()
    X = np.concatenate(parts)
    model = FederatedGaussianMixture(3, covariance_type=covariance_type, random_state=0).fit(parts)
    central = GaussianMixture(3, covariance_type=covariance_type, n_init=5, random_state=0).fit(X)
    order = [int(np.argmin(np.linalg.norm(central.means_ - m, axis=1))) for m in model.means_]
    assert sorted(order) == [0, 1, 2]
    np.testing.assert_allclose(model.means_, central.means_[order], atol=0.05)
    np.testing.assert_allclose(model.weights_, central.weights_[order], atol=0.01)
    assert model.covariances_.shape == central.covariances_.shape
    assert model.precisions_cholesky_.shape == central.precisions_cholesky_.shape
    assert abs(model.score(X) - central.score(X)) < 1e-3
    assert model.converged_ and 1 <= model.n_iter_ <= 100 and np.isfinite(model.lower_bound_)
    np.testing.assert_allclose(model.predict_proba(X).sum(1), 1.0)
    assert [len(labels) for labels in model.labels_] == [len(p) for p in parts]
    ems = [r for r in model.history_ if r.get("stage") == "em"]
    # n_iter_ is the EM rounds of the start returned (scikit-learn's: of the best fit); other
    # starts side by side may run longer. Its round n_iter_ recorded its lower bound.
    assert len(ems) >= model.n_iter_
    best = model.result_["final"].get("start")
    last = ems[model.n_iter_ - 1]
    recorded = last["starts"][best] if best is not None else last["log_likelihood"]
    assert recorded == pytest.approx(model.lower_bound_)


def config(tmp_path, name, **overrides):
    data = tmp_path / "data"
    if not data.exists():
        write_npy_dir(data, clients())
    return {
        "algorithm": "gmm",
        "k": 3,
        "seed": 1,
        "dataset": "npy-dir",
        "data-dir": str(data),
        "reference": False,
        "output-dir": str(tmp_path / name),
        **overrides,
    }


def test_a_device_that_inflates_its_statistics_is_named_and_excluded(tmp_path):
    """Node 1002 doubles its E-step sums about the means in the third EM round (its counts
    still add up): its implied means leave its box or its moments no longer add up, the
    run names it, takes it out and completes on the others."""
    seen = []

    def hook(node, message, reply):
        if node == 1002 and message.metadata.message_type == "query.gmm_estep" and not reply.has_error():
            seen.append(node)
            if len(seen) == 3:
                arrays = reply.content.array_records["arrays"]
                arrays["sums"] = Array(arrays["sums"].numpy() * 2 + 3.0)
        return reply

    result = run(config(tmp_path, "liar"), num_nodes=NODES, reply_hook=hook)
    excluded = result["nodes"]["exclusions"]
    assert [e["node"] for e in excluded] == [1002], excluded
    failures = [f for p in result["phases"] for f in p["failures"]]
    assert [(f["node"], f["kind"]) for f in failures] == [(1002, "inconsistent")]
    assert result["final"]["num_points"] == 5 * 160


def test_a_device_whose_responsibilities_miss_points_is_dropped(tmp_path):
    def hook(node, message, reply):
        if node == 1001 and message.metadata.message_type == "query.gmm_estep" and not reply.has_error():
            arrays = reply.content.array_records["arrays"]
            arrays["counts"] = Array(arrays["counts"].numpy() * 0.5)
        return reply

    result = run(config(tmp_path, "counts"), num_nodes=NODES, reply_hook=hook)
    reasons = [f["reason"] for p in result["phases"] for f in p["failures"] if f["node"] == 1001]
    assert reasons and "counts add up to" in reasons[0]
    assert 1001 in [e["node"] for e in result["nodes"]["exclusions"]]


def test_secure_aggregation_gives_the_plain_mixture(tmp_path):
    plain = run(config(tmp_path, "plain", **{"gmm-init": "lloyd"}), num_nodes=NODES)
    secure = run(config(tmp_path, "secure", **{"secure-aggregation": True}), num_nodes=NODES)
    assert secure["init"]["method"] == "lloyd"
    for name in ("centers", "weights", "covariances"):
        np.testing.assert_allclose(
            np.load(tmp_path / "secure" / f"{name}.npy"),
            np.load(tmp_path / "plain" / f"{name}.npy"),
            rtol=1e-6,
            atol=1e-9,
        )
    assert secure["final"]["log_likelihood"] == pytest.approx(plain["final"]["log_likelihood"], rel=1e-9)
    assert secure["final"]["n_iter"] == plain["final"]["n_iter"]
    record = secure["final"]["secure_aggregation"]
    assert record["sessions"] == 1 and record["out_of_range"] == []


def test_no_reply_of_a_secure_run_reveals_a_devices_statistics(tmp_path):
    """Every E-step reply of a secure run is masked: no metric but the partition, and no
    array equal or near the device's plain statistics, in floats or fixed point; the only
    other replies are the data summary and the secure-aggregation stages."""
    received, requests = [], []
    run_config = with_defaults(config(tmp_path, "secure", **{"secure-aggregation": True, "kmeans-rounds": 2}))

    def hook(node, message, reply):
        received.append((node, message.metadata.message_type, reply))
        if message.metadata.message_type == "query.secure_gmm_estep":
            requests.append((node, message, reply))
        return reply

    run(dict(run_config), num_nodes=NODES, reply_hook=hook)
    kinds = {kind for _, kind, _ in received}
    assert kinds == {
        "query.data_summary",
        "query.secagg_setup",
        "query.secagg_share_keys",
        "query.secure_gmm_estep",
        "query.secagg_unmask",
    }
    assert len(requests) >= NODES * 4
    in_band = total = 0
    for node, message, reply in requests:
        assert set(reply.content.metric_records["metrics"]) == {"partition"}
        masked = {k: v.numpy() for k, v in reply.content.array_records["arrays"].items() if not k.startswith("secagg-")}
        request = {k: v.numpy() for k, v in message.content.array_records["arrays"].items()}
        settings = {k: v for k, v in message.content.config_records["config"].items() if not k.startswith("secagg-")}
        data = device_data(run_config, {"partition-id": node - 1000, "num-partitions": NODES})
        plain, _ = run_task(
            "gmm_estep", data, {k: v for k, v in request.items() if not k.startswith("secagg-")}, settings
        )
        ranges = dict(zip(("counts", "sums", "outer", "loglik"), request["secagg-ranges"]))
        for name in ("counts", "sums", "outer", "loglik"):
            value = masked[name]
            assert value.dtype == np.uint64 and value.shape == plain[name].shape
            assert not np.allclose(value.astype(np.float64), plain[name], rtol=1e-3)
            fixed = secagg.quantize(plain[name], ranges[name]).astype(np.uint64) & np.uint64(secagg.MODULUS - 1)
            assert not np.any(value == fixed), (node, name)
            small = np.minimum(value, np.uint64(secagg.MODULUS) - value) <= secagg.HALF_LEVELS
            in_band, total = in_band + int(small.sum()), total + value.size
    assert in_band <= total // 100


def test_a_device_that_drops_after_masking_leaves_a_completed_run(tmp_path):
    """Node 1003 fails its first unmasking: its masked statistics are in that sum, its seed
    rebuilt from the others' shares; the run completes with the plain run's mixture."""
    failed = []

    def hook(node, message, reply):
        if node == 1003 and message.metadata.message_type == "query.secagg_unmask" and not failed:
            failed.append(node)
            return Message(Error(code=2, reason="gone"), reply_to=message)
        return reply

    secure = run(config(tmp_path, "secure", **{"secure-aggregation": True}), num_nodes=NODES, reply_hook=hook)
    plain = run(config(tmp_path, "plain", **{"gmm-init": "lloyd"}), num_nodes=NODES)
    assert failed and any(f["node"] == 1003 for p in secure["phases"] for f in p["failures"])
    np.testing.assert_allclose(
        np.load(tmp_path / "secure" / "centers.npy"), np.load(tmp_path / "plain" / "centers.npy"), rtol=1e-6
    )
    assert secure["final"]["num_points"] == plain["final"]["num_points"] == NODES * 160


def test_k_range_picks_the_number_of_components_by_bic(tmp_path):
    result = run(config(tmp_path, "range", **{"k-range": "2:5"}), num_nodes=NODES)
    report = result["bic_range"]
    assert report["k"] == [2, 3, 4, 5] and report["chosen_k"] == 3
    assert report["bic"][1] == min(report["bic"])
    assert np.load(tmp_path / "range" / "centers.npy").shape == (3, 3)
    X = np.concatenate(clients())
    central = [GaussianMixture(k, n_init=3, random_state=0).fit(X).bic(X) for k in report["k"]]
    assert int(np.argmin(central)) == 1
    from fedcluster.tools.plot import plot_run

    pytest.importorskip("matplotlib")
    drawn = plot_run(tmp_path / "range")
    assert any(path.endswith("bic.png") for path in drawn["written"])


@pytest.mark.parametrize("offset", [1e6, 1e9, 1e12], ids=lambda o: f"{o:g}")
def test_a_shifted_federation_gives_the_unshifted_mixture(tmp_path, offset):
    """Every moment travels about the current means: the data shifted by ``offset`` give
    the same mixture moved by it, the same log-likelihood, and no honest device dropped."""
    base = run(config(tmp_path, "base"), num_nodes=NODES)
    shifted_dir = write_npy_dir(tmp_path / "shifted", [p + offset for p in clients()])
    shifted = run({**config(tmp_path, "moved"), "data-dir": str(shifted_dir)}, num_nodes=NODES)
    assert not [f for p in shifted["phases"] for f in p["failures"]] and not shifted["nodes"]["exclusions"]
    means = np.load(tmp_path / "moved" / "centers.npy") - offset
    reference = np.load(tmp_path / "base" / "centers.npy")
    order = [int(np.argmin(np.linalg.norm(reference - m, axis=1))) for m in means]  # the start may order them otherwise
    assert sorted(order) == [0, 1, 2]
    np.testing.assert_allclose(means, reference[order], atol=1e-3)
    covariances = np.load(tmp_path / "base" / "covariances.npy")[order]
    np.testing.assert_allclose(np.load(tmp_path / "moved" / "covariances.npy"), covariances, rtol=1e-3, atol=1e-3)
    assert shifted["final"]["log_likelihood"] == pytest.approx(base["final"]["log_likelihood"], abs=1e-3)


def test_the_gmm_guide_runs_as_written(capsys):
    page = (Path(__file__).resolve().parents[2] / "docs" / "guide" / "gmm.md").read_text()
    code = re.search(r"```python\n(.*?)```", page, re.S).group(1)
    scope = {}
    exec(compile(code, "docs/guide/gmm.md", "exec"), scope)
    model, central, pooled = scope["model"], scope["central"], scope["pooled"]
    assert abs(model.score(pooled) - central.score(pooled)) < 5e-3
    assert scope["proba"].shape == (len(scope["clients"][0]), 3)
    assert scope["chooser"].bic_range_["chosen_k"] == 3
    np.testing.assert_allclose(np.sort(scope["secure"].weights_), np.sort(model.weights_), atol=0.02)


def test_a_round_over_other_devices_than_the_last_is_no_evidence_of_convergence(tmp_path):
    """Node 1001's reply to the second EM round is lost in transit. That round's lower bound
    is over one device fewer than the first round's: their difference compares two
    data sets, and even an em-tol every change passes must not end EM there (the mixture
    returned would be an M-step without one device). EM ends at the first round whose
    devices are the last round's: round 4."""
    seen = []

    def hook(node, message, reply):
        config = message.content.config_records.get("config", {})
        if node == 1001 and message.metadata.message_type == "query.gmm_estep" and not config.get("hard", True):
            seen.append(node)
            if len(seen) == 2:
                return Message(Error(code=ErrorCode.MESSAGE_UNAVAILABLE, reason="lost in transit"), reply_to=message)
        return reply

    result = run(config(tmp_path, "lost", **{"em-tol": 1e6, "em-starts": 1}), num_nodes=NODES, reply_hook=hook)
    ems = [r for r in result["rounds"] if r.get("stage") == "em"]
    total = result["final"]["num_points"]
    points = [r["points"] for r in ems]
    assert len(points) == 4 and points[1] < total - 1, points
    assert [points[0], points[2], points[3]] == pytest.approx([total] * 3), points
    assert result["final"]["converged"] and result["final"]["n_iter"] == 4
