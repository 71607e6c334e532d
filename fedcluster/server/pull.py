"""Pulling a round trip's replies so that one incomplete reply never holds up the others.

A device's reply reaches Flower's SuperLink in two steps: the message, then its objects
(the arrays). When the device's connection is cut between the two, Flower 1.42's SuperNode
gives the reply up ("Failed to send message … Failed to push object"), and the SuperLink
holds a message whose objects never come. Flower's own ``HttpGrid.pull_messages`` pulls
the replies one after another and waits for each one's objects with a growing backoff
and hundreds of tries: one such reply blocks every reply after it, far beyond any
round-timeout (docs/devices.md tells the run where it was seen).

:class:`Replies` pulls from the deployment grid (``HttpGrid``) as a strategy needs: every
pull asks the SuperLink for the new replies and tries each missing object of every reply
still incomplete once (then again after a wait that doubles up to :data:`RETRY_CAP_S`); a
reply is delivered as soon as all its objects are there, the others wait. At the round
trip's deadline, :meth:`Replies.give_up` turns what is still incomplete into the error
reply Flower gives a reply whose objects are gone (``MESSAGE_UNAVAILABLE``: kind ``lost``,
a missed phase, never an exclusion). Any other grid (simulation,
:class:`fedcluster.inprocess.grid.InProcessGrid`) is pulled with its own ``pull_messages``.
"""

from __future__ import annotations

import time
from typing import Any

from flwr.app import Message, Metadata
from flwr.app.error import Error
from flwr.app.message import make_message
from flwr.common.constant import ErrorCode

try:  # Flower's internals, as its HttpGrid uses them (verified with 1.42)
    from flwr.proto.message_pb2 import ConfirmMessageReceivedRequest
    from flwr.proto.runtime_pb2 import PullAppMessagesRequest
    from flwr.supercore.constant import SYSTEM_MESSAGE_TYPE
    from flwr.supercore.date import now
    from flwr.supercore.inflatable.inflatable_object import iterate_object_tree
    from flwr.supercore.inflatable.inflatable_protobuf_utils import make_pull_object_fn_protobuf
    from flwr.supercore.inflatable.inflatable_utils import (
        ObjectPullError,
        ObjectUnavailableError,
        inflate_object_from_contents,
    )
    from flwr.superlink.grid.http_grid import HttpGrid
except ImportError:  # another Flower: every grid is pulled with its own pull_messages
    HttpGrid = None

REASON = "its reply reached the SuperLink without all of its data (the upload was cut) by the round-timeout"
# An incomplete reply's objects are tried again after FIRST_RETRY_S, the wait doubling up
# to RETRY_CAP_S: a reply still uploading is read within a second of its last object, and
# many incomplete replies do not make the server ask the SuperLink ten times a second each.
FIRST_RETRY_S, RETRY_CAP_S = 0.1, 1.0


def puller(grid: Any) -> "Replies | GridPull":
    """What to pull ``grid``'s replies with: a :class:`Replies` for Flower's deployment
    grid, the grid's own ``pull_messages`` otherwise (or where Flower's internals differ)."""
    if (
        HttpGrid is not None
        and isinstance(grid, HttpGrid)
        and isinstance(getattr(HttpGrid, "_runtime_client", None), property)  # not read: it would connect
        and all(hasattr(grid, a) for a in ("_run", "node"))
    ):
        return Replies(grid)
    return GridPull(grid)


class GridPull:
    """A grid pulled with its own ``pull_messages``: a reply comes whole or not at all."""

    def __init__(self, grid: Any) -> None:
        self.grid = grid

    def __call__(self, ids: list[str]) -> list[Message]:
        return list(self.grid.pull_messages(ids))

    def give_up(self) -> list[Message]:
        return []  # nothing is held


class Replies:
    """The replies of one round trip from an ``HttpGrid``, never waiting on one of them
    (module docstring). Call it with the message ids still pending."""

    def __init__(self, grid: Any) -> None:
        self.grid, self.run_id = grid, grid._run.run_id
        self.pull_object = make_pull_object_fn_protobuf(
            pull_object_protobuf=grid._runtime_client.PullObject, node=grid.node, run_id=self.run_id
        )
        # reply_to id -> (the reply's protobuf, its object ids in inflation order, the objects got)
        self.held: dict[str, tuple[Any, list[str], dict[str, bytes]]] = {}
        self.retry: dict[str, tuple[float, float]] = {}  # reply_to id -> (next try, wait after it)

    def __call__(self, ids: list[str]) -> list[Message]:
        asked = [i for i in ids if i not in self.held]
        if asked:
            client = self.grid._runtime_client
            res = client.PullMessages(PullAppMessagesRequest(message_ids=asked))
            for proto, tree in zip(res.messages_list, res.message_object_trees, strict=True):
                objects = [t.object_id for t in iterate_object_tree(tree)]
                self.held[proto.metadata.reply_to_message_id] = (proto, objects, {})
        out, now = [], time.monotonic()
        for reply_to in list(self.held):
            due, wait = self.retry.get(reply_to, (now, FIRST_RETRY_S))
            if due > now:
                continue
            message = self._complete(reply_to)
            if message is None:
                self.retry[reply_to] = (now + wait, min(2 * wait, RETRY_CAP_S))
            else:
                del self.held[reply_to]
                self.retry.pop(reply_to, None)
                out.append(message)
        return out

    def _complete(self, reply_to: str) -> Message | None:
        """The reply to ``reply_to`` once every object of it is here (each missing one tried
        once), its error reply when the SuperLink no longer has one, else None."""
        proto, objects, got = self.held[reply_to]
        for object_id in objects:
            if object_id in got:
                continue
            try:
                got[object_id] = self.pull_object(object_id)
            except ObjectUnavailableError:
                return None  # still on its way: the next pull tries again
            except ObjectPullError as exc:
                return self._lost(proto, f"its reply's data is gone from the SuperLink ({exc})")
        msg_id = proto.metadata.message_id
        self.grid._runtime_client.ConfirmMessageReceived(
            ConfirmMessageReceivedRequest(node=self.grid.node, run_id=self.run_id, message_object_id=msg_id)
        )
        message = inflate_object_from_contents(msg_id, got)
        message.metadata.__dict__["_message_id"] = msg_id
        return message

    def give_up(self) -> list[Message]:
        """Every reply still incomplete, as a lost reply (the round trip's deadline passed)."""
        out = [self._lost(proto, REASON) for proto, _, _ in self.held.values()]
        self.held.clear()
        self.retry.clear()
        return out

    def _lost(self, proto: Any, reason: str) -> Message:
        """The error reply Flower's grid makes of a reply whose objects are unavailable."""
        node = self.grid.node.node_id
        return make_message(
            metadata=Metadata(
                run_id=self.run_id,
                message_id="",
                src_node_id=node,
                dst_node_id=node,
                message_type=SYSTEM_MESSAGE_TYPE,
                group_id="",
                ttl=0,
                reply_to_message_id=proto.metadata.reply_to_message_id,
                created_at=now().timestamp(),
            ),
            error=Error(code=ErrorCode.MESSAGE_UNAVAILABLE, reason=reason),
        )
