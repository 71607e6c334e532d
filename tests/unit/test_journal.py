"""The journal on disk: records survive the process, a frame cut short by a crash (or
damaged) ends the journal there and is overwritten by the next record, a replay answers in
order and refuses a run that asks for something else, and node ids map both ways without
collisions."""

from __future__ import annotations

import pytest

from fedcluster.inprocess.grid import set_task_identity
from fedcluster.server.journal import NAME, Diverged, Journal


@pytest.fixture(autouse=True)
def _identity():
    set_task_identity(run_id=1, node_id=1)


def reply(node: int, value: float):
    import numpy as np
    from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict

    request = Message(RecordDict(), node, "query.x")
    return Message(
        RecordDict({"arrays": ArrayRecord({"v": Array(np.array([value]))}), "metrics": MetricRecord({"p": node})}),
        reply_to=request,
    )


def three_records(folder):
    journal = Journal(folder)
    journal.node_ids(lambda: [3, 1, 2])
    journal.record_round_trip([1, 2], ["query.x", "query.x"], ["a", "b"], [[reply(1, 1.5)], [reply(2, 2.5)]])
    journal.node_ids(lambda: [1, 2])
    journal.close()


def test_a_resumed_journal_replays_every_record_in_order(tmp_path):
    three_records(tmp_path)
    journal = Journal(tmp_path, resume=True)
    assert journal.replaying and journal.node_ids(lambda: pytest.fail("asked the grid")) == [1, 2, 3]
    ids, batches = journal.replayed_round_trip([1, 2], ["query.x", "query.x"])
    assert ids == ["a", "b"] and [len(b) for b in batches] == [1, 1]
    assert float(batches[1][0].content.array_records["arrays"]["v"].numpy()[0]) == 2.5
    assert journal.node_ids(lambda: pytest.fail("asked the grid")) == [1, 2]
    assert not journal.replaying and journal.live_since == 3
    assert journal.node_ids(lambda: [7]) == [7]  # live now: asked and recorded


def test_a_frame_cut_short_ends_the_journal_and_the_next_record_replaces_it(tmp_path):
    three_records(tmp_path)
    path = tmp_path / NAME
    data = path.read_bytes()
    path.write_bytes(data[:-3])  # the crash cut the last frame
    journal = Journal(tmp_path, resume=True)
    assert len(journal.records) == 2
    journal.node_ids(lambda: ())
    journal.replayed_round_trip([1, 2], ["query.x", "query.x"])
    journal.node_ids(lambda: [5, 6])  # live: written where the torn frame was
    journal.close()
    again = Journal(tmp_path, resume=True)  # (with the mark where the resumed attempt went live)
    assert [header["kind"] for header, _ in again.records] == ["nodes", "round-trip", "live", "nodes"]
    assert again.records[3][0]["ids"] == [5, 6]


def test_a_damaged_frame_is_not_trusted(tmp_path):
    three_records(tmp_path)
    path = tmp_path / NAME
    data = bytearray(path.read_bytes())
    data[40] ^= 0xFF  # inside the first frame's payload
    path.write_bytes(bytes(data))
    assert Journal(tmp_path, resume=True).records == []


def test_a_replay_that_asks_for_something_else_stops_by_name(tmp_path):
    three_records(tmp_path)
    journal = Journal(tmp_path, resume=True)
    with pytest.raises(Diverged, match="asked for 'round-trip' where the first attempt had 'nodes'"):
        journal.replayed_round_trip([1, 2], ["query.x", "query.x"])
    journal = Journal(tmp_path, resume=True)
    journal.node_ids(lambda: ())
    with pytest.raises(Diverged, match="other nodes or asks other tasks"):
        journal.replayed_round_trip([1, 3], ["query.x", "query.x"])


def test_node_ids_map_both_ways_and_a_newcomer_never_takes_a_runs_id(tmp_path):
    journal = Journal(None)
    journal.map_nodes({1: 10, 2: 1}, newcomers=[2, 30])  # the grid gave node 1's old id 1 to node 2
    assert journal.live(1) == 10 and journal.live(2) == 1 and journal.own(10) == 1 and journal.own(1) == 2
    assert journal.own(30) == 30  # a new id that nobody in the run had stays
    newcomer = journal.own(2)  # the grid's id 2 is the run's node 2: the newcomer gets a fresh one
    assert newcomer not in (1, 2, 10, 30) and journal.live(newcomer) == 2


# ---------------------------------------------------------------------- the privacy ledger
def test_a_ledger_record_cut_short_by_a_crash_is_skipped_and_every_later_release_stays_readable(tmp_path):
    import json

    import numpy as np

    from fedcluster.server.release_log import ReleaseLog

    path = tmp_path / "privacy-ledger.jsonl"
    first = ReleaseLog(path, chain=0, attempt=1)
    for step in ("a", "b"):
        first.release(step, {"mechanism": "gaussian"}, np.array([1.0]))
    with open(path, "a") as handle:
        handle.write('{"chain": 0, "attempt": 1, "index": 2, "st')  # the crash cut this write short
    resumed = ReleaseLog(path, chain=0, attempt=2)
    assert [e["step"] for e in resumed.lines] == ["a", "b"] and resumed.unreadable == [3]
    assert "line(s) 3" in resumed.damage()
    for step in ("c", "d"):
        resumed.release(step, {"mechanism": "gaussian"}, np.array([2.0]))
    later = ReleaseLog(path, chain=1, attempt=3)  # e.g. an overwrite: every earlier release counts
    assert [e["step"] for e in later.lines] == ["a", "b", "c", "d"] and later.unreadable == [3]
    assert len(later.extra()) == 4
    assert json.loads(path.read_text().splitlines()[-1])["step"] == "d"
