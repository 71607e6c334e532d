"""A reply is refused by its declared sizes before any of its data is decoded: a device that
adds an undeclared payload, or sends a declared array far larger than the protocol allows,
is named with the array, and the server never makes a NumPy array of it (whole runs through
the in-process runner, server memory traced)."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Error, Message, MetricRecord, RecordDict

from fedcluster.client.app import handle
from fedcluster import protocol
from fedcluster.wire import array_fields
from fedcluster.inprocess import run
from fedcluster.inprocess.grid import set_task_identity
from fedcluster.server.journal_file import message_bytes, message_from
from fedcluster.server.messages import bundle_message, incoming

PAYLOAD = 40 * 2**20  # bytes: small enough for a test, far above what the small run itself allocates


def traced_peak(config, tmp_path, hook):
    """The result of a run whose replies ``hook`` tampers with, and the most memory Python
    and NumPy held above the start meanwhile (after an honest run of the same config, so that
    modules imported on first use are not counted)."""
    run({**config, "output-dir": str(tmp_path / "honest")}, num_nodes=3)
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        start = tracemalloc.get_traced_memory()[0]
        result = run({**config, "output-dir": str(tmp_path / "hostile")}, num_nodes=3, reply_hook=hook)
        return result, tracemalloc.get_traced_memory()[1] - start
    finally:
        tracemalloc.stop()


def adding(victim: int, name: str, fields: dict, tasks: tuple[str, ...] = ()):
    """A reply hook: node ``victim`` puts the array ``fields`` under ``name`` in its replies
    (of ``tasks``, or all); the same bytes every time, made once before the run."""

    def hook(node, message, reply):
        if node == victim and not reply.has_error() and (not tasks or message.metadata.message_type in tasks):
            reply.content.array_records["arrays"][name] = Array(**fields)
        return reply

    return hook


def failures_of(result, node: int) -> list[str]:
    return [f["reason"] for phase in result["phases"] for f in phase["failures"] if str(f["node"]) == str(node)]


def test_an_undeclared_payload_in_every_reply_is_refused_unread_naming_the_array(tmp_path):
    junk = array_fields(np.zeros(PAYLOAD // 8))
    config = {"k": 3, "num-rounds": 2, "num-points": 600, "dim": 3, "reference": False}
    result, peak = traced_peak(config, tmp_path, adding(1001, "junk", junk))
    reasons = failures_of(result, 1001)
    assert reasons and all("undeclared array 'junk'" in reason for reason in reasons), reasons
    assert "1001" in result["nodes"]["excluded"]  # its start-up replies (a bundle's parts) were all refused
    assert np.isfinite(result["final"]["cost"]) and result["final"]["num_points"] < 600
    assert peak < PAYLOAD / 4, (
        f"the server held {peak / 2**20:.0f} MiB while refusing a {PAYLOAD / 2**20:.0f} MiB payload"
    )


def test_a_declared_array_beyond_its_bound_size_is_refused_before_it_is_decoded(tmp_path):
    rows = PAYLOAD // (8 * 3)  # 'sums' of the Lloyd statistics: (k, d) with k = 3 asked, d = 3
    huge = array_fields(np.zeros((rows, 3)))
    config = {"k": 3, "num-rounds": 2, "num-points": 600, "dim": 3, "reference": False}
    result, peak = traced_peak(config, tmp_path, adding(1002, "sums", huge, tasks=("query.lloyd_stats",)))
    reasons = failures_of(result, 1002)
    assert reasons and all("'sums'" in reason and f"({rows}, 3)" in reason for reason in reasons), reasons
    assert np.isfinite(result["final"]["cost"])
    assert peak < PAYLOAD / 4, (
        f"the server held {peak / 2**20:.0f} MiB while refusing a {PAYLOAD / 2**20:.0f} MiB array"
    )


def test_a_device_chosen_size_above_its_declared_limit_is_refused(tmp_path):
    """k-FED's devices choose their number of local centers c; the protocol bounds it."""
    c = 20_000
    config = {"algorithm": "kfed", "k": 3, "num-points": 600, "dim": 3, "output-dir": str(tmp_path), "reference": False}

    def hook(node, message, reply):
        if node == 1000 and message.metadata.message_type == "query.kfed_local" and not reply.has_error():
            record = reply.content.array_records["arrays"]
            record["centers"] = Array(**array_fields(np.zeros((c, 3))))
            record["counts"] = Array(**array_fields(np.zeros(c, dtype=np.int64)))  # as honest devices send them
        return reply

    result = run(config, num_nodes=3, reply_hook=hook)
    (reason,) = failures_of(result, 1000)
    assert "'centers'" in reason and f"c={c}" in reason and "k-prime" in reason, reason
    assert np.isfinite(result["final"]["cost"])


# ------------------------------------------------------------------ what the journal keeps of a refused reply
BIG = 4 * 2**20  # bytes a hostile device adds: far above any verdict


def _reply(parts: list[tuple[str, dict]]) -> Message:
    """An honest device's reply to a request of ``parts`` (a bundle when there are several)."""
    set_task_identity(run_id=5, node_id=1)
    plain = [
        Message(
            RecordDict({protocol.ARRAYS: ArrayRecord(), protocol.CONFIG: ConfigRecord(config)}),
            1000,
            protocol.task(task).message_type,
            group_id="g",
        )
        for task, config in parts
    ]
    request = plain[0] if len(plain) == 1 else bundle_message(plain, "g")
    request.metadata.__dict__["_message_id"] = "m1"
    context = Context(
        run_id=5,
        node_id=1000,
        node_config={"partition-id": 0, "num-partitions": 2},
        state=RecordDict(),
        run_config={"num-points": 200, "dim": 3, "k": 3},
    )
    return handle(request, context)


def _with_error(reply: Message, reason: str) -> Message:
    return Message(metadata=reply.metadata, error=Error(code=2, reason=reason))


def _hostile(case: str) -> tuple[Message, int]:
    one, two = [("data_summary", {})], [("data_summary", {}), ("data_summary", {})]
    if case == "huge error reason":
        return _with_error(_reply(one), "z" * BIG), 1
    reply = _reply(two if case.startswith("bundle") else one)
    content = reply.content
    if case == "undeclared array record":
        content["evil"] = ArrayRecord({"x": Array(**array_fields(np.zeros(BIG // 8)))})
    elif case == "undeclared config record":
        content["evil"] = ConfigRecord({"x": "y" * BIG})
    elif case == "many metrics":
        content[protocol.METRICS] = MetricRecord(
            {**dict(content[protocol.METRICS]), **{f"m{i}": float(i) for i in range(BIG // 64)}}
        )
    elif case == "list metric":
        content[protocol.METRICS] = MetricRecord(
            {**dict(content[protocol.METRICS]), protocol.NUM_EXAMPLES: [1.0] * (BIG // 8)}
        )
    elif case == "long metric name":
        content[protocol.METRICS] = MetricRecord({**dict(content[protocol.METRICS]), "n" * BIG: 1.0})
    elif case == "bundle: extra part":
        content[protocol.part(protocol.ARRAYS, 7)] = ArrayRecord({"x": Array(**array_fields(np.zeros(BIG // 8)))})
    elif case == "bundle: huge error part":
        content[protocol.part(protocol.ERROR, 1)] = ConfigRecord({"reason": "q" * BIG})
    elif case == "bundle: error part with a payload":
        content[protocol.part(protocol.ERROR, 0)] = ConfigRecord({"reason": "x", "payload": "w" * BIG})
    elif case == "bundle: error reason not a string":
        content[protocol.part(protocol.ERROR, 0)] = ConfigRecord({"reason": [1] * (BIG // 8)})
    elif case == "bundle: undeclared array in one part":
        content[protocol.part(protocol.ARRAYS, 0)]["extra"] = Array(**array_fields(np.zeros(BIG // 8)))
    return reply, (2 if case.startswith("bundle") else 1)


HOSTILE_CASES = [
    "huge error reason",
    "undeclared array record",
    "undeclared config record",
    "many metrics",
    "list metric",
    "long metric name",
    "bundle: extra part",
    "bundle: huge error part",
    "bundle: error part with a payload",
    "bundle: error reason not a string",
    "bundle: undeclared array in one part",
]


@pytest.mark.parametrize("case", HOSTILE_CASES)
def test_the_journal_keeps_a_refused_reply_as_its_verdict_and_replays_the_same(case):
    """What the journal keeps of a reply refused before its data is read is bounded (the
    refusal: kind, reason, bytes) and, read back from disk, refuses it the same way; a
    bundle's other parts are kept whole (a valid part stays valid on resume)."""
    from fedcluster.server.messages import REASON_MAX, kept_of, layout_problem, ReplySpec

    message, parts = _hostile(case)
    live = incoming(message, 1000, parts)
    spec = ReplySpec(protocol.task("data_summary"), {"d": None})
    verdicts = {}
    for index, reply in enumerate(live):
        reason = None if reply.error is not None or reply.arrays is None else layout_problem(reply, spec, {"d": None})
        if reply.error is not None or reason:
            verdicts[index] = (
                (reply.kind, reply.error, reply.up) if reply.error is not None else ("invalid", reason, reply.up)
            )
    assert verdicts, case
    assert all(len(reason) < REASON_MAX + 200 for _, reason, _ in verdicts.values())
    kept = message_bytes(kept_of(message, parts, verdicts))
    assert len(kept) < 20_000, f"{case}: the journal would keep {len(kept)} bytes"
    replayed = incoming(message_from(kept), 1000, parts, replayed=True)
    for index, (before, after) in enumerate(zip(live, replayed)):
        if index in verdicts:
            kind, reason, up = verdicts[index]
            assert (after.kind, after.error, after.up) == (kind, reason, up)
        else:
            assert (after.error, after.metrics, sorted(after.arrays or {})) == (
                before.error,
                before.metrics,
                sorted(before.arrays or {}),
            )
    live_again = incoming(message_from(kept), 1000, parts)  # a device sending what the journal keeps: undeclared
    assert all(reply.kind == "invalid" and "undeclared record" in reply.error for reply in live_again)


def test_a_run_with_a_device_sending_huge_refused_replies_journals_no_payload(tmp_path, monkeypatch):
    """Whole run: one device answers every message with a 20 MB error reason, the next with an
    undeclared 20 MB record; no journal record holds either, and result.json keeps a bounded
    reason."""
    from fedcluster.server import journal

    largest = [0]
    append = journal.Journal.append

    def measured(self, header, blobs=()):
        blobs = list(blobs)
        largest[0] = max(largest[0], sum(len(blob) for blob in blobs))
        return append(self, header, blobs)

    monkeypatch.setattr(journal.Journal, "append", measured)
    huge = "z" * (20 * 2**20)
    junk = array_fields(np.zeros(2**20))

    def hook(node, message, reply):
        if node == 1001:
            return Message(metadata=reply.metadata, error=Error(code=2, reason=huge))
        if node == 1002 and not reply.has_error():
            reply.content["evil"] = ConfigRecord({"x": huge})
            reply.content["evil2"] = ArrayRecord({"x": Array(**junk)})
        return reply

    config = {"k": 3, "num-rounds": 2, "num-points": 800, "dim": 3, "reference": False, "output-dir": str(tmp_path)}
    result = run(config, num_nodes=4, reply_hook=hook)
    assert largest[0] < 2**20, f"a journal record of {largest[0]} bytes"
    reasons = failures_of(result, 1001) + failures_of(result, 1002)
    assert reasons and all(len(reason) < 3000 for reason in reasons)
    assert any("undeclared record 'evil'" in reason for reason in failures_of(result, 1002))
