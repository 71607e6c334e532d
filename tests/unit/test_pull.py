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


# ---------------------------------------------------------------- one incomplete reply


class _SuperLink:
    """The Runtime API's pull side of a SuperLink (PullMessages, PullObject,
    ConfirmMessageReceived) over real Flower messages: ``replies`` maps a request's id to
    its reply; the objects in ``missing`` are registered but not uploaded (a cut upload),
    those in ``gone`` unknown to the store."""

    def __init__(self, replies, missing=(), gone=()):
        from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects

        self.replies, self.missing, self.gone = dict(replies), set(missing), set(gone)
        self.objects = {}
        for reply in self.replies.values():
            self.objects.update({i: o.deflate() for i, o in get_all_nested_objects(reply).items()})
        self.confirmed, self.object_pulls = [], 0

    def PullMessages(self, request):
        from flwr.common.serde import message_to_proto
        from flwr.proto.runtime_pb2 import PullAppMessagesResponse
        from flwr.supercore.inflatable.inflatable_object import get_object_tree

        found = [self.replies.pop(i) for i in request.message_ids if i in self.replies]  # a pulled reply leaves
        return PullAppMessagesResponse(
            messages_list=[message_to_proto(m) for m in found], message_object_trees=[get_object_tree(m) for m in found]
        )

    def PullObject(self, request):
        from flwr.proto.message_pb2 import PullObjectResponse

        self.object_pulls += 1
        oid = request.object_id
        if oid in self.gone:
            return PullObjectResponse(object_found=False, object_available=False)
        if oid in self.missing:
            return PullObjectResponse(object_found=True, object_available=False)
        return PullObjectResponse(object_found=True, object_available=True, object_content=self.objects[oid])

    def ConfirmMessageReceived(self, request):
        self.confirmed.append(request.message_object_id)


def _deployment_grid(link):
    from flwr.superlink.grid.http_grid import HttpGrid
    from flwr.supercore.run import Run

    grid = HttpGrid(token="test")
    grid._client = link  # the Runtime API client it would connect
    grid.set_run(Run.create_empty(7))
    return grid


def _replies(n):
    """n requests with their replies (an array each, so each has objects of its own)."""
    import numpy as np
    from flwr.app import Array, ArrayRecord, Message, RecordDict

    from fedcluster.inprocess.grid import set_task_identity

    set_task_identity(7, 1)
    out = {}
    for i in range(n):
        request = Message(RecordDict(), dst_node_id=100 + i, message_type="train")
        request.metadata.__dict__["_message_id"] = f"req{i}"
        reply = Message(RecordDict({"arrays": ArrayRecord({"x": Array(np.full(3, float(i)))})}), reply_to=request)
        reply.metadata.__dict__["_message_id"] = reply.object_id
        out[f"req{i}"] = reply
    return out


def _one_object_of(reply):
    from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects

    return next(i for i in get_all_nested_objects(reply) if i != reply.object_id)


def test_flowers_deployment_grid_is_pulled_without_waiting_on_one_reply(monkeypatch):
    from fedcluster.server import pull as module
    from fedcluster.server.pull import RETRY_CAP_S, Replies, puller

    clock = _Clock()
    monkeypatch.setattr(module, "time", clock)

    replies = _replies(4)
    stuck = _one_object_of(replies["req0"])
    link = _SuperLink(replies, missing={stuck})
    pull = puller(_deployment_grid(link))
    assert isinstance(pull, Replies)
    got = pull(["req0", "req1", "req2", "req3"])
    assert sorted(m.metadata.reply_to_message_id for m in got) == ["req1", "req2", "req3"]
    assert [float(m.content["arrays"]["x"].numpy()[0]) for m in got] == [1.0, 2.0, 3.0]
    assert not any(m.has_error() for m in got)
    tries = link.object_pulls
    assert pull(["req0"]) == []  # tried again only after a wait
    assert link.object_pulls == tries
    for _ in range(12):  # still incomplete: held, asked of the SuperLink ever less often
        clock.sleep(0.05)
        assert pull(["req0"]) == []
    assert link.object_pulls - tries <= 3
    link.missing.clear()  # its upload completes
    clock.sleep(RETRY_CAP_S)
    late = pull(["req0"])
    assert [m.metadata.reply_to_message_id for m in late] == ["req0"]
    assert float(late[0].content["arrays"]["x"].numpy()[0]) == 0.0
    assert len(link.confirmed) == 4


def test_a_reply_incomplete_at_the_deadline_is_lost_and_one_whose_data_is_gone_at_once():
    from flwr.common.constant import ErrorCode

    from fedcluster.server.messages import incoming
    from fedcluster.server.pull import puller

    replies = _replies(3)
    link = _SuperLink(replies, missing={_one_object_of(replies["req0"])}, gone={_one_object_of(replies["req1"])})
    pull = puller(_deployment_grid(link))
    got = pull(["req0", "req1", "req2"])
    by = {m.metadata.reply_to_message_id: m for m in got}
    assert sorted(by) == ["req1", "req2"]
    assert by["req1"].has_error() and by["req1"].error.code == ErrorCode.MESSAGE_UNAVAILABLE
    assert not by["req2"].has_error()
    given_up = pull.give_up()
    assert [m.metadata.reply_to_message_id for m in given_up] == ["req0"]
    (lost,) = incoming(given_up[0], node=100, parts=1)
    assert lost.kind == "lost" and "upload was cut" in lost.error
    assert pull.held == {} and link.confirmed == [replies["req2"].object_id]


def test_the_pull_loop_gives_up_incomplete_replies_at_the_deadline(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(journal, "time", clock)
    replies = _replies(2)
    link = _SuperLink(replies, missing={_one_object_of(replies["req0"])})
    batches = []
    got = Journal(None).pull(_deployment_grid(link), {"req0", "req1"}, deadline=1.0, on_batch=batches.append)
    assert [[m.metadata.reply_to_message_id for m in b] for b in batches] == [["req1"], ["req0"]]
    assert not batches[0][0].has_error() and batches[1][0].has_error()
    assert len(got) == 2
