"""Declared sizes are binding (issue: no device can steer a run): one device of three lies
believably; its reply is dropped with the reason, and the result is the honest one."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, Error, Message, MetricRecord

from fedcluster.inprocess import run

CONFIG = {"k": 3, "num-rounds": 4, "num-points": 900, "dim": 3, "reference": False, "tol": 0.0}


def lie(victim: int, task: str, change_arrays=None, change_metrics=None):
    def hook(node, message, reply):
        if node != victim or reply.has_error() or message.metadata.message_type != task:
            return reply
        record = reply.content.array_records["arrays"]
        if change_arrays is not None:
            arrays = change_arrays({name: record[name].numpy() for name in record})
            for name, value in arrays.items():
                record[name] = Array(np.ascontiguousarray(value))
        if change_metrics is not None:
            metrics = dict(reply.content.metric_records["metrics"])
            reply.content.metric_records["metrics"] = MetricRecord(change_metrics(metrics))
        return reply

    return hook


def fail(victim: int, task: str):
    """The same device simply failing the same task: the oracle a dropped liar must match."""

    def hook(node, message, reply):
        if node == victim and message.metadata.message_type == task:
            return Message(Error(code=2, reason="failed"), reply_to=message)
        return reply

    return hook


def reasons(result, phase=None):
    return [f["reason"] for p in result["phases"] if phase in (None, p["phase"]) for f in p["failures"]]


def moved_center(arrays):
    arrays["centers"][0] += 1e3
    return arrays


CASES = {
    "inflated counts": (
        "train.fedkmeans_train",
        lambda a: {**a, "counts": a["counts"] * 1e4},
        None,
        "counts add up to",
    ),
    "moved center": ("train.fedkmeans_train", moved_center, None, "'centers' row 0 lies outside"),
    "other point count": ("train.fedkmeans_train", None, lambda m: {**m, "num-examples": 10**9}, "differs from the"),
    "lying evaluation (too low)": (
        "query.lloyd_stats",
        lambda a: {**a, "cost": np.array([1e-3])},
        None,
        "under-reported",
    ),
    "lying evaluation (too high)": ("query.lloyd_stats", lambda a: {**a, "cost": np.array([1e12])}, None, "can cost"),
    "scores from nowhere": ("query.score_candidates", lambda a: {**a, "costs": a["costs"] * 1e9}, None, "can cost"),
}


def shifted(config, folder, offset):
    """``config``'s generated points moved by ``offset`` (1e9: a Unix-time feature), as files."""
    from conftest import write_npy_dir
    from fedcluster.config import with_defaults
    from fedcluster.node_data import generated_partition

    full = dict(with_defaults(config))
    parts = [generated_partition(full, i, 3)[0] + offset for i in range(3)]
    return {**config, "dataset": "npy-dir", "data-dir": str(write_npy_dir(folder, parts))}


@pytest.mark.parametrize("offset", [0.0, 1e9], ids=["near", "far"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_one_lying_device_is_dropped_and_the_result_stays_honest(tmp_path, case, offset):
    """Also with every point 1e9 from the origin: the checks' slack is the data's spread and
    the coordinates' rounding, so the same lies are caught and nothing else is."""
    task, arrays, metrics, reason = CASES[case]
    config = shifted(CONFIG, tmp_path / "data", offset) if offset else CONFIG
    absent = run({**config, "output-dir": str(tmp_path / "absent")}, num_nodes=3, reply_hook=fail(1001, task))
    hostile = run(
        {**config, "output-dir": str(tmp_path / "hostile")}, num_nodes=3, reply_hook=lie(1001, task, arrays, metrics)
    )
    found = reasons(hostile)
    assert found and all(reason in r for r in found), found
    # the lie changed nothing: the run is exactly the one in which that device failed the task
    assert hostile["final"] == absent["final"]
    centers = np.load(tmp_path / "hostile" / "centers.npy")
    assert np.array_equal(centers, np.load(tmp_path / "absent" / "centers.npy"))
    if offset:  # and that run is right: its cost is its centers' (about the offset, no cancellation)
        X = np.concatenate([np.load(f) for f in sorted((tmp_path / "data").glob("*.npy"))]) - offset
        true = float(((X[:, None] - (centers - offset)[None]) ** 2).sum(-1).min(1).sum())
        assert hostile["final"]["total_cost"] == pytest.approx(true, rel=1e-9)


def test_kfed_device_with_counts_of_a_billion_is_dropped(tmp_path):
    config = {"algorithm": "kfed", "k": 4, "num-points": 800, "dim": 3, "reference": False, "output-dir": str(tmp_path)}
    hook = lie(1001, "query.kfed_local", lambda a: {**a, "counts": a["counts"] * 10**9})
    # kfed_local is each node's FIRST reply: it declares the point count, so inflated counts
    # there are bound by num-examples instead (counts must add up to it)
    result = run(config, num_nodes=4, reply_hook=hook)
    assert any("counts add up to" in r for r in reasons(result)), reasons(result)
    assert result["kfed"]["devices"] == 3


def test_a_bounding_box_upside_down_is_refused(tmp_path):
    def flip(arrays):
        return {"min": arrays["max"] + 1.0, "max": arrays["min"]}

    result = run({**CONFIG, "output-dir": str(tmp_path)}, num_nodes=3, reply_hook=lie(1002, "query.data_summary", flip))
    assert "1002" in result["nodes"]["excluded"]
    assert any("minimum above its maximum" in r for r in reasons(result, "data-summary"))


@pytest.mark.parametrize("algorithm", ["fedkmeans", "da-ufl"])
def test_a_flag_feature_constant_on_some_devices_drops_no_honest_reply(algorithm):
    """uci/yeast's shape: a flag feature that is 0 on every point of some devices and 0 or
    0.83 on others, beside features far from the origin. The devices' statistics, taken
    about the centers' reference, round like the centers' size in the flag; the checks must
    not take that for a lie (before: honest devices dropped every round, or taken out)."""
    import warnings

    import fedcluster

    rng = np.random.default_rng(8)
    clients = []
    for i in range(8):
        n = 60
        X = np.column_stack([rng.normal(5.0 + (i % 3), 0.3, n), rng.normal(7.0, 0.5, n), np.zeros(n)])
        if i % 2:
            X[rng.random(n) < 0.3, 2] = 0.83
        clients.append(X)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fedcluster.FederatedRunWarning)
        model = fedcluster.FederatedKMeans(4, algorithm=algorithm, random_state=0).fit(clients)
    refused = [(p["phase"], f["reason"]) for p in model.result_["phases"] for f in p["failures"]]
    assert not refused, refused[:3]
