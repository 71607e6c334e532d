"""One message per node per round trip: several tasks for one node travel as a bundle
(``query.bundle``, fedcluster.protocol), each part checked as its own reply; a failing or
malformed part costs only itself. Whole runs through the in-process runner, and the
ClientApp's bundle handler called directly."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict

from fedcluster.client.app import handle
from fedcluster import protocol
from fedcluster.inprocess import run
from fedcluster.inprocess.grid import InProcessGrid, set_task_identity
from fedcluster.server.messages import bundle_message, incoming

CONFIG = {"k": 4, "num-rounds": 3, "num-points": 600, "dim": 3, "seed": 2}


def recording_push(monkeypatch):
    """Record, per push (round trip), the message types sent to each node."""
    pushes: list[dict[int, list[str]]] = []
    original = InProcessGrid.push_messages

    def push(self, messages):
        messages = list(messages)
        per_node: dict[int, list[str]] = {}
        for message in messages:
            per_node.setdefault(message.metadata.dst_node_id, []).append(message.metadata.message_type)
        pushes.append(per_node)
        return original(self, messages)

    monkeypatch.setattr(InProcessGrid, "push_messages", push)
    return pushes


def test_one_message_per_node_per_round_trip_and_the_start_is_a_bundle(monkeypatch, tmp_path):
    pushes = recording_push(monkeypatch)
    result = run({**CONFIG, "output-dir": str(tmp_path)}, num_nodes=4)
    assert len(pushes) == result["communication"]["round_trips"]
    for per_node in pushes:
        assert all(len(types) == 1 for types in per_node.values())
    # the first round trip asks every node for its data summary and its local summaries
    assert set(pushes[0]) == {1000, 1001, 1002, 1003}
    assert all(types == ["query.bundle"] for types in pushes[0].values())
    first = [p for p in result["phases"] if p["round_trip"] == 1]
    assert [p["phase"] for p in first] == ["data-summary", "init-local-summaries", "init-coarse-summaries"]
    assert all(p["replies"] == 4 and not p["failures"] for p in first)


def test_bundle_through_the_client_app_equals_its_parts_one_by_one(tmp_path):
    """No hook: the ClientApp answers the bundle itself. An identity hook: the in-process
    grid delivers each part as its own plain message. Same run, bit for bit."""
    bundled = run({**CONFIG, "output-dir": str(tmp_path / "b")}, num_nodes=4)
    parted = run(
        {**CONFIG, "output-dir": str(tmp_path / "p")}, num_nodes=4, reply_hook=lambda node, message, reply: reply
    )
    assert np.array_equal(np.load(tmp_path / "b" / "centers.npy"), np.load(tmp_path / "p" / "centers.npy"))
    assert np.array_equal(np.load(tmp_path / "b" / "init_centers.npy"), np.load(tmp_path / "p" / "init_centers.npy"))
    assert bundled["final"]["cost"] == parted["final"]["cost"]
    assert [p["bytes_up"] for p in bundled["phases"]] == [p["bytes_up"] for p in parted["phases"]]
    assert [p["bytes_down"] for p in bundled["phases"]] == [p["bytes_down"] for p in parted["phases"]]


def test_a_bad_part_costs_only_its_own_phase(tmp_path):
    """A device whose local summary is unreadable still counts for its data summary."""

    def hook(node, message, reply):
        if node == 1001 and message.metadata.message_type == "query.local_summary":
            reply.content.array_records[protocol.ARRAYS]["centers"] = reply.content.array_records[protocol.ARRAYS][
                "counts"
            ]
        return reply

    result = run({**CONFIG, "output-dir": str(tmp_path)}, num_nodes=4, reply_hook=hook)
    phases = {p["phase"]: p for p in result["phases"] if p["round_trip"] == 1}
    assert phases["data-summary"]["replies"] == 4
    for name in ("init-local-summaries", "init-coarse-summaries"):
        assert phases[name]["replies"] == 3
        (failure,) = phases[name]["failures"]
        assert failure["node"] == 1001 and failure["kind"] == "invalid" and "centers" in failure["reason"]


# ------------------------------------------------------------------ the envelope itself
def _context():
    return Context(
        run_id=5,
        node_id=1000,
        node_config={"partition-id": 0, "num-partitions": 2},
        state=RecordDict(),
        run_config={"num-points": 200, "dim": 3, "k": 3},
    )


def _bundle(configs: list[tuple[str, dict]]) -> Message:
    set_task_identity(run_id=5, node_id=1)
    plain = [
        Message(
            RecordDict({protocol.ARRAYS: ArrayRecord(), protocol.CONFIG: ConfigRecord(config)}),
            1000,
            protocol.task(task).message_type,
            group_id="g",
        )
        for task, config in configs
    ]
    message = bundle_message(plain, "g")
    message.metadata.__dict__["_message_id"] = "m1"
    return message


def test_client_answers_each_part_and_reports_a_failing_one_alone():
    message = _bundle(
        [("data_summary", {}), ("local_summary", {"k": 0, "seed": 1}), ("local_summary", {"k": 2, "seed": 1})]
    )
    assert message.metadata.message_type == "query.bundle"
    reply = handle(message, _context())
    assert not reply.has_error()
    parts = incoming(reply, 1000, 3)
    assert [p.key for p in parts] == ["m1/0", "m1/1", "m1/2"]
    assert parts[0].error is None and parts[0].metrics[protocol.NUM_EXAMPLES] > 0
    assert parts[1].error is not None and "local_summary" in parts[1].error and "'k'" in parts[1].error
    assert parts[2].error is None and parts[2].arrays["centers"].shape[0] <= 2


def test_a_bundle_reply_missing_a_part_or_with_junk_is_read_without_raising():
    message = _bundle([("data_summary", {}), ("data_summary", {})])
    reply = handle(message, _context())
    del reply.content.array_records[protocol.part(protocol.ARRAYS, 1)]
    reply.content[protocol.part(protocol.ERROR, 0)] = ConfigRecord({"nonsense": 1})
    first, second = incoming(reply, 1000, 2)
    assert first.error == "error reply: (no reason given)"
    assert second.error is None and second.arrays is None  # the server then says: no 'arrays' record


def test_a_record_of_the_wrong_kind_under_a_declared_name_is_read_as_missing():
    """``arrays`` that is not an ArrayRecord, ``metrics`` that is not a MetricRecord, an
    ``error.i`` that is not a ConfigRecord: each is read as absent, as Flower's filtered
    records read it, in a plain reply and in a bundle's; never an exception."""
    from flwr.app import MetricRecord

    message = _bundle([("data_summary", {}), ("data_summary", {})])
    reply = handle(message, _context())
    reply.content[protocol.part(protocol.ARRAYS, 0)] = ConfigRecord({"centers": 1})
    reply.content[protocol.part(protocol.METRICS, 1)] = ArrayRecord({"x": Array(np.zeros(2))})
    reply.content[protocol.part(protocol.ERROR, 1)] = MetricRecord({"reason": 1})
    first, second = incoming(reply, 1000, 2)
    assert first.error is None and first.arrays is None and first.metrics[protocol.NUM_EXAMPLES] > 0
    assert second.error is None and second.arrays is not None and second.metrics == {}
    plain = Message(
        RecordDict({protocol.ARRAYS: MetricRecord({"a": 1}), protocol.METRICS: ConfigRecord({"b": "c"})}),
        reply_to=message,
    )
    (only,) = incoming(plain, 1000, 1)
    assert only.error is None and only.arrays is None and only.metrics == {}


def test_a_reply_with_an_undeclared_record_is_refused_for_every_part_naming_it():
    reply = handle(_bundle([("data_summary", {}), ("data_summary", {})]), _context())
    reply.content["junk"] = ArrayRecord({"x": Array(np.zeros(10))})
    parts = incoming(reply, 1000, 2)
    assert all(p.kind == "invalid" and p.arrays is None and "undeclared record 'junk'" in p.error for p in parts)


def test_a_list_valued_metric_or_a_huge_error_reason_is_cut_short():
    reply = handle(_bundle([("data_summary", {}), ("data_summary", {})]), _context())
    reply.content[protocol.part(protocol.METRICS, 0)]["padding"] = [0.0] * 100_000
    reply.content[protocol.part(protocol.ERROR, 1)] = ConfigRecord({"reason": "x" * 10**6})
    first, second = incoming(reply, 1000, 2)
    assert first.kind == "invalid" and "metric 'padding' is a list of 100000 values" in first.error
    assert len(second.error) < 3000 and second.error.endswith("(cut at 2000 characters)")


@pytest.mark.parametrize("tasks", [["no_such_task"], "not a list"])
def test_client_refuses_a_malformed_bundle_with_a_reason(tasks):
    message = _bundle([("data_summary", {})])
    message.content.config_records[protocol.BUNDLE]["tasks"] = tasks
    reply = handle(message, _context())
    if isinstance(tasks, list):
        (part,) = incoming(reply, 1000, 1 + 1)[:1]
        assert "no_such_task" in part.error
    else:
        assert reply.has_error() and "must list task names" in reply.error.reason


def test_a_node_gone_during_the_start_is_unavailable_for_every_part(tmp_path):
    from flwr.app import Error
    from flwr.common.constant import ErrorCode

    def hook(node, message, reply):
        if node == 1003 and message.metadata.message_type == "query.local_summary":
            return Message(Error(code=ErrorCode.NODE_UNAVAILABLE, reason="node 1003 is gone"), reply_to=message)
        return reply

    result = run({**CONFIG, "output-dir": str(tmp_path)}, num_nodes=4, reply_hook=hook)
    first = [p for p in result["phases"] if p["round_trip"] == 1]
    for phase in first:
        assert phase["replies"] == 3
        (failure,) = phase["failures"]
        assert failure["node"] == 1003 and failure["kind"] == "unavailable"
    assert set(result["nodes"]["excluded"]) == {"1003"}
