"""A reply is refused by its declared sizes before any of its data is decoded: a device that
adds an undeclared payload, or sends a declared array far larger than the protocol allows,
is named with the array, and the server never makes a NumPy array of it (whole runs through
the in-process runner, server memory traced)."""

from __future__ import annotations

import tracemalloc

import numpy as np
from flwr.app import Array

from fedcluster.wire import array_fields
from fedcluster.inprocess import run

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
    assert peak < PAYLOAD / 4, f"the server held {peak / 2**20:.0f} MiB while refusing a {PAYLOAD / 2**20:.0f} MiB payload"


def test_a_declared_array_beyond_its_bound_size_is_refused_before_it_is_decoded(tmp_path):
    rows = PAYLOAD // (8 * 3)  # 'sums' of the Lloyd statistics: (k, d) with k = 3 asked, d = 3
    huge = array_fields(np.zeros((rows, 3)))
    config = {"k": 3, "num-rounds": 2, "num-points": 600, "dim": 3, "reference": False}
    result, peak = traced_peak(config, tmp_path, adding(1002, "sums", huge, tasks=("query.lloyd_stats",)))
    reasons = failures_of(result, 1002)
    assert reasons and all("'sums'" in reason and f"({rows}, 3)" in reason for reason in reasons), reasons
    assert np.isfinite(result["final"]["cost"])
    assert peak < PAYLOAD / 4, f"the server held {peak / 2**20:.0f} MiB while refusing a {PAYLOAD / 2**20:.0f} MiB array"


def test_a_device_chosen_size_above_its_declared_limit_is_refused(tmp_path):
    """k-FED's devices choose their number of local centers c; the protocol bounds it."""
    c = 20_000
    config = {"algorithm": "kfed", "k": 3, "num-points": 600, "dim": 3, "output-dir": str(tmp_path), "reference": False}

    def hook(node, message, reply):
        if node == 1000 and message.metadata.message_type == "query.kfed_local" and not reply.has_error():
            record = reply.content.array_records["arrays"]
            record["centers"] = Array(**array_fields(np.zeros((c, 3))))
            record["counts"] = Array(**array_fields(np.zeros(c)))
        return reply

    result = run(config, num_nodes=3, reply_hook=hook)
    (reason,) = failures_of(result, 1000)
    assert "'centers'" in reason and f"c={c}" in reason and "k-prime" in reason, reason
    assert np.isfinite(result["final"]["cost"])
