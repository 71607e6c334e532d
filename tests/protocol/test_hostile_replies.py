"""A device's reply is untrusted input: whatever one node sends, the run goes on without
it and result.json says why (whole runs through the in-process runner)."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, MetricRecord

from fedcluster.inprocess import run

HOSTILE = {
    "strings": lambda a: np.full(a.shape, "x"),
    "complex": lambda a: a.astype(np.complex128) * 1j,
    "wrong shape": lambda a: np.ones(a.shape + (2,)),
    "nan": lambda a: np.full(a.shape, np.nan),
}


def tamper(victim: int, make_array=None, metrics=None, task: str | None = None):
    def hook(node, message, reply):
        if node != victim or reply.has_error() or (task and message.metadata.message_type != task):
            return reply
        content = reply.content
        if make_array is not None:
            record = content.array_records["arrays"]
            for name in list(record):
                record[name] = Array(make_array(record[name].numpy()))
        if metrics is not None:
            content.metric_records["metrics"] = MetricRecord(metrics)
        return reply

    return hook


@pytest.mark.parametrize("task", [None, "train.fedkmeans_train"])
@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_array_drops_the_node_not_the_run(tmp_path, case, task):
    config = {"k": 3, "num-rounds": 2, "num-points": 600, "dim": 3, "output-dir": str(tmp_path), "reference": False}
    result = run(config, num_nodes=3, reply_hook=tamper(victim=1001, make_array=HOSTILE[case], task=task))
    failures = [f for phase in result["phases"] for f in phase["failures"]]
    assert failures and all(str(f["node"]) == "1001" for f in failures)
    assert result["final"]["cost"] > 0 and np.isfinite(result["final"]["cost"])
    if task is None:  # every reply hostile: its data summary is unusable, the node leaves the run
        assert "1001" in result["nodes"]["excluded"] and result["phases"][-1]["replies"] == 2
    else:  # only its training replies: dropped from every round, evaluated at the end
        assert [r["replies"] for r in result["rounds"]] == [2, 2] and result["phases"][-1]["replies"] == 3


@pytest.mark.parametrize("bad", [float("nan"), -5, float("inf")])
def test_a_hostile_num_examples_drops_the_node_not_the_run(tmp_path, bad):
    config = {"k": 3, "num-rounds": 2, "num-points": 600, "dim": 3, "output-dir": str(tmp_path), "reference": False}
    result = run(config, num_nodes=3, reply_hook=tamper(victim=1002, metrics={"num-examples": bad, "dim": 3}))
    reasons = {f["reason"] for phase in result["phases"] for f in phase["failures"]}
    assert any("num-examples" in reason for reason in reasons), reasons
    assert np.isfinite(result["final"]["cost"])
