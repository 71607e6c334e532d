"""The server's pull loop: it waits longer between pulls that cost more (pull_pause)."""

from types import SimpleNamespace

import pytest

from server_app import base
from server_app.base import PULL_PAUSE_FACTOR, PULL_PAUSE_S, pull_pause


def test_pause_has_a_floor_and_grows_with_the_pull():
    assert pull_pause(0.0) == PULL_PAUSE_S
    assert pull_pause(0.001) == PULL_PAUSE_S
    assert pull_pause(0.05) == pytest.approx(PULL_PAUSE_FACTOR * 0.05)
    # pulling takes at most 1 / (1 + factor) of the time once the pull dominates
    for seconds in (0.02, 0.1, 1.0):
        assert seconds / (seconds + pull_pause(seconds)) <= 1 / (1 + PULL_PAUSE_FACTOR) + 1e-12


class _Reply:
    def __init__(self, mid):
        self.metadata = SimpleNamespace(reply_to_message_id=mid)


class _SlowGrid:
    """Each pull costs `cost` seconds (on the fake clock) and returns one pending reply."""

    def __init__(self, clock, cost):
        self.clock, self.cost, self.calls = clock, cost, []

    def pull_messages(self, ids):
        ids = sorted(ids)
        self.calls.append(len(ids))
        self.clock.now += self.cost
        return [_Reply(ids[0])]


class _Clock:
    def __init__(self):
        self.now, self.sleeps = 0.0, []

    def monotonic(self):
        return self.now

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.now += seconds


@pytest.mark.parametrize("cost", [0.001, 0.05])
def test_pull_loop_pauses_by_the_cost_of_its_pulls(monkeypatch, cost):
    clock = _Clock()
    monkeypatch.setattr(base, "time", SimpleNamespace(monotonic=clock.monotonic, sleep=clock.sleep, perf_counter=clock.monotonic))
    grid = _SlowGrid(clock, cost)
    pending = {f"m{i}" for i in range(4)}
    out = base.FederatedStrategy._pull(SimpleNamespace(grid=grid), set(pending), deadline=1e9)
    assert {m.metadata.reply_to_message_id for m in out} == pending
    assert grid.calls == [4, 3, 2, 1]  # one reply per pull, the pending set shrinks
    assert clock.sleeps == pytest.approx([max(PULL_PAUSE_S, PULL_PAUSE_FACTOR * cost)] * 3)


def test_pull_loop_stops_at_the_deadline(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(base, "time", SimpleNamespace(monotonic=clock.monotonic, sleep=clock.sleep, perf_counter=clock.monotonic))
    grid = _SlowGrid(clock, 0.5)
    out = base.FederatedStrategy._pull(SimpleNamespace(grid=grid), {"a", "b", "c"}, deadline=0.4)
    assert len(out) == 1 and clock.sleeps == []
