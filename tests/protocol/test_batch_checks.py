"""A caller's check that takes a round's replies together (``BatchCheck``, FedKMeans'
training check): the transport runs it once on every reply a pull brings, with the same
verdicts as one reply at a time; a batch it cannot take is taken reply by reply. Whole
runs through the in-process runner."""

from __future__ import annotations

import numpy as np

from fedcluster.algorithms.fedkmeans.strategy_measure import FedKMeansMeasure
from fedcluster.inprocess import run
from fedcluster.server.messages import BatchCheck

CONFIG = {"k": 4, "num-rounds": 4, "num-points": 800, "dim": 3, "seed": 5}
NODES = 6


def _wrapped(monkeypatch, wrap):
    """FedKMeans' training check as ``wrap(batch_check)`` makes it; returns the batch sizes
    its ``many`` was called with (only for wrappers that keep a BatchCheck)."""
    original = FedKMeansMeasure.cost_check
    sizes: list[int] = []

    def cost_check(self, incoming, sent):
        check = original(self, incoming, sent)
        if check is None:
            return None

        def many(replies):
            sizes.append(len(replies))
            return check.many(replies)

        return wrap(BatchCheck(many))

    monkeypatch.setattr(FedKMeansMeasure, "cost_check", cost_check)
    return sizes


def _outcome(result, folder):
    return (
        np.load(folder / "centers.npy"),
        result["final"]["cost"],
        [(p["phase"], p["replies"], len(p["failures"])) for p in result["phases"]],
    )


def test_a_rounds_replies_are_checked_together_with_the_verdicts_of_one_at_a_time(monkeypatch, tmp_path):
    sizes = _wrapped(monkeypatch, lambda check: check)
    together = run({**CONFIG, "output-dir": str(tmp_path / "t")}, num_nodes=NODES)
    trains = [p for p in together["phases"] if p["phase"] == "train"]
    assert sizes == [NODES] * len(trains) and len(trains) >= 2  # once per round, every reply at once
    one_by_one = _wrapped(monkeypatch, lambda check: lambda reply: check.many([reply])[0])
    alone = run({**CONFIG, "output-dir": str(tmp_path / "a")}, num_nodes=NODES)
    assert set(one_by_one) == {1}
    got, expected = _outcome(together, tmp_path / "t"), _outcome(alone, tmp_path / "a")
    assert np.array_equal(got[0], expected[0]) and got[1:] == expected[1:]


def test_a_batch_the_check_cannot_take_is_taken_reply_by_reply(monkeypatch, tmp_path):
    """A check that raises on several replies at once (a server bug) costs no reply: the
    transport takes each on its own, and the run is the one it is without the fault."""

    tried: list[int] = []

    def fragile(check):
        def many(replies):
            tried.append(len(replies))
            if len(replies) > 1:
                raise RuntimeError("cannot take a batch")
            return check.many(replies)

        return BatchCheck(many)

    _wrapped(monkeypatch, fragile)
    faulty = run({**CONFIG, "output-dir": str(tmp_path / "f")}, num_nodes=NODES)
    assert tried[: 1 + NODES] == [NODES] + [1] * NODES  # tried at once, then one by one
    monkeypatch.undo()
    sound = run({**CONFIG, "output-dir": str(tmp_path / "s")}, num_nodes=NODES)
    got, expected = _outcome(faulty, tmp_path / "f"), _outcome(sound, tmp_path / "s")
    assert np.array_equal(got[0], expected[0]) and got[1:] == expected[1:]
    assert all(p["failures"] == [] for p in faulty["phases"] if p["phase"] == "train")
