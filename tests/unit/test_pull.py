"""The server's pull loop: Flower's own pause after a pull that brought nothing, a short
one while replies arrive (they leave the SuperLink's store only when pulled)."""

from types import SimpleNamespace

import pytest

from fedcluster.server import journal
from fedcluster.server.journal import PULL_AGAIN_S, PULL_PAUSE_S, Journal


class _Reply:
    def __init__(self, mid):
        self.metadata = SimpleNamespace(reply_to_message_id=mid)


class _Grid:
    """Each pull costs `cost` seconds (on the fake clock) and returns one pending reply,
    or none on the pulls numbered in `empty`."""

    def __init__(self, clock, cost, empty=()):
        self.clock, self.cost, self.calls, self.empty = clock, cost, [], set(empty)

    def pull_messages(self, ids):
        ids = sorted(ids)
        self.calls.append(len(ids))
        self.clock.now += self.cost
        return [] if len(self.calls) in self.empty else [_Reply(ids[0])]


class _Clock:
    def __init__(self):
        self.now, self.sleeps = 0.0, []

    def monotonic(self):
        return self.now

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.now += seconds


def test_pause_is_flowers_own_pull_interval():
    from flwr.simulation.run_simulation import InMemoryGrid

    assert PULL_PAUSE_S == InMemoryGrid.__init__.__defaults__[-1] == 0.1


def test_pull_loop_pulls_again_soon_while_replies_arrive(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(
        journal, "time", SimpleNamespace(monotonic=clock.monotonic, sleep=clock.sleep, perf_counter=clock.monotonic)
    )
    grid = _Grid(clock, 0.01, empty={2})
    pending = {f"m{i}" for i in range(4)}
    out = Journal(None).pull(grid, set(pending), deadline=1e9)
    assert {m.metadata.reply_to_message_id for m in out} == pending
    assert grid.calls == [4, 3, 3, 2, 1]  # one reply per pull but the second: the pending set shrinks
    assert clock.sleeps == pytest.approx([PULL_AGAIN_S, PULL_PAUSE_S, PULL_AGAIN_S, PULL_AGAIN_S])
    assert PULL_AGAIN_S < PULL_PAUSE_S


def test_pull_loop_stops_at_the_deadline(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(
        journal, "time", SimpleNamespace(monotonic=clock.monotonic, sleep=clock.sleep, perf_counter=clock.monotonic)
    )
    grid = _Grid(clock, 0.5)
    out = Journal(None).pull(grid, {"a", "b", "c"}, deadline=0.4)
    assert len(out) == 1 and clock.sleeps == []
