"""A node that is gone leaves the run: NODE_UNAVAILABLE at once, silence after
``max-missed-phases`` phases; it is not sent to again, the result says who left, when and
why, the summary says what the result covers, and a cluster only it fed is re-seeded at
once (whole runs through the in-process runner)."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Error, Message
from flwr.common.constant import ErrorCode

from conftest import write_npy_dir
from fedcluster.inprocess import run

TRAIN = "train.fedkmeans_train"


def three_blobs_one_per_node(tmp_path, extra_blob_on_node0=False):
    """Node i holds blob i only (far apart); node 0 may also hold a fourth blob."""
    rng = np.random.default_rng(3)
    means = np.array([[0.0, 0.0], [50.0, 0.0], [0.0, 50.0], [50.0, 50.0]])
    parts = [means[i] + rng.normal(size=(60, 2)) for i in range(3)]
    if extra_blob_on_node0:
        parts[0] = np.vstack([parts[0], means[3] + rng.normal(size=(60, 2))])
    return write_npy_dir(tmp_path / "data", parts), means


def gone_from_round(victim: int, first_round: int, how: str):
    def hook(node, message, reply):
        if node != victim or message.metadata.message_type != TRAIN or int(message.metadata.group_id) < first_round:
            return reply
        if how == "unavailable":
            return Message(Error(code=ErrorCode.NODE_UNAVAILABLE, reason="node 1002 is gone"), reply_to=message)
        return None  # silence

    return hook


def train_phases(result):
    return [p for p in result["phases"] if p["phase"] == "train"]


def config_of(tmp_path, data, **keys):
    """A run over the folder ``data`` (k = 3), with ``keys`` given by run-config name
    (``stop_when_fixed`` for ``stop-when-fixed``)."""
    base = {"k": 3, "dataset": "npy-dir", "data-dir": str(data), "output-dir": str(tmp_path / "o")}
    return {**base, **{name.replace("_", "-"): value for name, value in keys.items()}}


def test_node_unavailable_leaves_at_once_and_its_cluster_is_reseeded_now(tmp_path, caplog):
    data, _ = three_blobs_one_per_node(tmp_path, extra_blob_on_node0=True)
    # stop_when_fixed off: the node goes in round 3, the run must still be there
    config = config_of(tmp_path, data, k=4, num_rounds=8, tol=0.0, stop_when_fixed=False)
    result = run(config, num_nodes=3, reply_hook=gone_from_round(1002, 3, "unavailable"))
    assert result["nodes"]["excluded"].keys() == {"1002"}
    (exclusion,) = result["nodes"]["exclusions"]
    assert exclusion["node"] == 1002 and exclusion["round"] == 3 and exclusion["phase"] == "train"
    assert "NODE_UNAVAILABLE" in exclusion["reason"]
    sent = [p["sent"] for p in train_phases(result)]
    assert sent[:3] == [3, 3, 3] and all(s == 2 for s in sent[3:])  # never sent to again
    # the cluster only node 1002 fed is re-seeded in round 3, not after reassign-patience=20
    round3 = result["rounds"][2]
    assert len(round3["orphaned"]) == 1 and round3["reassigned"] == round3["orphaned"]
    counts_after = np.array([r["empty_clusters"] for r in result["rounds"][3:]])
    assert np.all(counts_after == 0)  # the re-seeded center took half of node 0's two blobs
    assert result["nodes"]["active"] == 2 and result["final"]["num_points"] == 180
    assert "result covers 2 of 3 devices' data (1 left the run: 1002: " in caplog.text


def test_a_silent_node_leaves_after_max_missed_phases(tmp_path):
    data, _ = three_blobs_one_per_node(tmp_path)
    config = config_of(tmp_path, data, num_rounds=6, tol=0.0, round_timeout=0.3, max_missed_phases=2)
    result = run(config, num_nodes=3, reply_hook=gone_from_round(1002, 2, "silent"))
    (exclusion,) = result["nodes"]["exclusions"]
    assert exclusion["node"] == 1002 and exclusion["round"] == 3
    assert "no reply in 2 consecutive phases" in exclusion["reason"]
    assert [p["sent"] for p in train_phases(result)] == [3, 3, 3, 2, 2, 2]
    kinds = [f["kind"] for p in train_phases(result) for f in p["failures"]]
    assert kinds == ["timeout", "timeout"]


def test_an_invalid_reply_is_not_a_missed_phase(tmp_path):
    """A node that answers, even wrongly, is there: its replies are dropped, it stays."""
    data, _ = three_blobs_one_per_node(tmp_path)

    def hook(node, message, reply):
        if node == 1001 and message.metadata.message_type == TRAIN:
            return Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason="bad luck"), reply_to=message)
        return reply

    config = config_of(tmp_path, data, num_rounds=5, tol=0.0, max_missed_phases=1)
    result = run(config, num_nodes=3, reply_hook=hook)
    assert result["nodes"]["excluded"] == {}
    assert all(p["sent"] == 3 and p["replies"] == 2 for p in train_phases(result))


def lost_once(victim: int, message_type: str, code: int = ErrorCode.MESSAGE_UNAVAILABLE):
    """The victim's first reply to ``message_type`` lost in transit (Flower's error reply
    when a dropped link cut the upload of its objects); every later one arrives."""
    lost = []

    def hook(node, message, reply):
        if node == victim and message.metadata.message_type == message_type and not lost:
            lost.append(message.metadata.group_id)
            return Message(Error(code=code, reason="Reply message objects are unavailable."), reply_to=message)
        return reply

    return hook


@pytest.mark.parametrize("code", [ErrorCode.MESSAGE_UNAVAILABLE, ErrorCode.REPLY_MESSAGE_UNAVAILABLE])
def test_a_data_summary_lost_in_transit_leaves_the_node_a_newcomer_that_joins(tmp_path, code, caplog):
    """Before: a device whose first reply was lost on a dropped link was excluded from the
    run for good (docs/devices.md). Nothing about its data arrived: it is asked again as a
    newcomer, joins, and the result covers it."""
    data, _ = three_blobs_one_per_node(tmp_path)
    config = config_of(tmp_path, data, num_rounds=6, stop_when_fixed=False)
    result = run(config, num_nodes=3, reply_hook=lost_once(1002, "query.data_summary", code))
    assert result["nodes"]["excluded"] == {}
    assert [j["node"] for j in result["nodes"]["joined"]] == [1002]
    assert result["nodes"]["deferred"] == {}
    assert result["final"]["num_points"] == 180
    assert "result covers 3 of 3 devices' data" in caplog.text


def test_a_data_summary_lost_where_no_newcomer_joins_counts_as_uncovered(tmp_path, caplog):
    """A mixture's EM admits no newcomer: the node whose summary was lost never joins; the
    coverage line says the result lacks its data and why, instead of a normal-looking 2 of 2."""
    data, _ = three_blobs_one_per_node(tmp_path)
    config = config_of(tmp_path, data, algorithm="gmm")
    result = run(config, num_nodes=3, reply_hook=lost_once(1002, "query.data_summary"))
    assert result["nodes"]["excluded"] == {} and "1002" in result["nodes"]["deferred"]
    assert result["final"]["num_points"] == 120
    assert "result covers 2 of 3 devices' data" in caplog.text
    assert "its data summary never arrived" in caplog.text


def test_a_training_reply_lost_in_transit_is_a_missed_phase_not_a_reason_to_exclude(tmp_path):
    data, _ = three_blobs_one_per_node(tmp_path)
    config = config_of(tmp_path, data, num_rounds=4, tol=0.0, stop_when_fixed=False)
    result = run(config, num_nodes=3, reply_hook=lost_once(1001, TRAIN))
    assert result["nodes"]["excluded"] == {}
    kinds = [f["kind"] for p in train_phases(result) for f in p["failures"]]
    assert kinds == ["lost"]
    assert [p["replies"] for p in train_phases(result)][1:] == [3, 3, 3]
