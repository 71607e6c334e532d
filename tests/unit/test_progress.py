"""A line per round a person can follow: the ServerApp says each round's replies, seconds
and cost when the round ends, whatever the runner (fedcluster.server.progress)."""

from __future__ import annotations

from fedcluster.config import with_defaults
from fedcluster.server import results as results_module
from fedcluster.server.progress import PREFIX, round_line
from fedcluster.server.results import Results


def phase(replies: int, sent: int, failures: int = 0) -> dict:
    return {
        "phase": "train",
        "sent": sent,
        "replies": replies,
        "failures": [{"node": i, "kind": "timeout", "reason": "late"} for i in range(failures)],
        "bytes_down": 10,
        "bytes_up": 20,
    }


def test_every_round_end_says_its_replies_seconds_and_cost(monkeypatch):
    said = []
    monkeypatch.setattr(results_module, "log", lambda level, text, *args: said.append(text % args))
    results = Results(with_defaults({}))
    results.begin_round(3)
    results.add_phase(phase(2, 3, failures=1))
    results.end_round(cost=1.25, center_shift=0.5, sets=[{"cost": 9.0}])
    lines = [line for line in said if line.startswith(PREFIX)]
    assert len(lines) == 1
    assert lines[0].startswith(f"{PREFIX} 3: 2/3 replies (1 failed), ")
    assert lines[0].endswith(" s, cost 1.25")  # the cost, not every metric, not a list's


def test_a_round_without_a_cost_says_its_replies_and_seconds():
    record = {"round": 1, "sent": 3, "replies": 3, "away": 1, "failures": [], "seconds": 7.214, "cost": None}
    assert round_line(record) == f"{PREFIX} 1: 3/3 replies, 1 away, 7.21 s"
