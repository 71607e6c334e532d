"""``InProcessGrid``: Flower's ``Grid`` for a federation living in one Python process."""

from __future__ import annotations

import time
import uuid
from typing import Any, Callable, Iterable, Sequence

from flwr.app import ConfigRecord, Context, Error, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid

import fedcluster.protocol as protocol

from .availability import Availability

# Flower's error codes (flwr.common.constant.ErrorCode).
CLIENT_APP_RAISED_EXCEPTION = 2
MESSAGE_UNAVAILABLE, REPLY_MESSAGE_UNAVAILABLE, NODE_UNAVAILABLE = 3, 4, 5
# What befalls a whole message, never one task of a bundle: the node gone, a message lost in transit.
TRANSPORT_ERRORS = (MESSAGE_UNAVAILABLE, REPLY_MESSAGE_UNAVAILABLE, NODE_UNAVAILABLE)

ReplyHook = Callable[[int, Message, Message], "Message | None"]


def set_task_identity(run_id: int, node_id: int) -> None:
    """Flower's ``Message`` constructor reads the sender's identity from the task runtime.

    Outside Flower's runtime nobody sets it, so the in-process runner does, here and only
    here. (flwr 1.41/1.42 keep it in ``flwr.supercore.task_identity``.)
    """
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.run_id = run_id
    TaskIdentity.node_id = node_id
    TaskIdentity.task_id = 1


class InProcessGrid(Grid):
    """A ``Grid`` whose nodes are ClientApp calls in this process.

    Parameters
    ----------
    client_app : the ClientApp every node runs.
    run_config : the run config every node sees (``context.run_config``).
    node_configs : one node config per node (e.g. ``partition-id``/``num-partitions`` or
        ``data-path``).
    run_id : the run id.
    reply_hook : optional ``hook(node_id, message, reply) -> reply | None`` to tamper
        with replies in tests (return None: the node never answers).
    node_ids : the nodes' ids, in ``node_configs`` order (default 1000, 1001, ...); Flower's
        are random per run, and a run's result must not depend on them.
    availability : optional :class:`fedcluster.inprocess.availability.Availability`: which nodes are
        connected in each round trip (``push_messages`` call). A node that is not is left
        out of ``get_node_ids()`` and a message to it comes back NODE_UNAVAILABLE.
    """

    SERVER_NODE_ID = 1

    def __init__(
        self,
        client_app: ClientApp,
        run_config: dict[str, Any],
        node_configs: list[dict[str, Any]],
        *,
        run_id: int = 1,
        reply_hook: ReplyHook | None = None,
        node_ids: Sequence[int] | None = None,
        availability: Availability | None = None,
    ) -> None:
        from flwr.supercore.run import Run

        if node_ids is not None and (len(node_ids) != len(node_configs) or len(set(node_ids)) != len(node_ids)):
            raise ValueError(f"node_ids must be {len(node_configs)} distinct ids, one per node config")
        self._given_ids = list(node_ids or [])
        self._client_app = client_app
        self._run = Run.create_empty(run_id)
        self._reply_hook = reply_hook
        self._availability = availability
        self.round_trips = 0  # push_messages calls so far: the round trip the next push is
        self._replies: dict[str, Message] = {}
        self._contexts: dict[int, Context] = {}
        self._run_id, self._run_config = run_id, dict(run_config)
        for node_config in node_configs:
            self.add_node(node_config)
        self.client_seconds = 0.0
        # A node whose ClientApp takes longer than round-timeout never answers, as in a
        # real federation (the server then records "no reply within round-timeout").
        self._timeout = float(run_config.get("round-timeout", float("inf")))

    def add_node(self, node_config: dict[str, Any]) -> int:
        """Connect one more node (ids 1000, 1001, ... in order, or the next of ``node_ids``),
        as a SuperNode that joins the federation, possibly while a run is under way.
        Returns its id."""
        count = len(self._contexts)
        node_id = int(self._given_ids[count]) if count < len(self._given_ids) else 1000 + count
        self._contexts[node_id] = Context(
            run_id=self._run_id,
            node_id=node_id,
            node_config=dict(node_config),
            state=RecordDict(),
            run_config=dict(self._run_config),
        )
        return node_id

    # ---------------------------------------------------------------- Grid API
    def set_run(self, run: Any) -> None:
        self._run = run

    @property
    def run(self) -> Any:
        return self._run

    def create_message(
        self,
        content: RecordDict,
        message_type: str,
        dst_node_id: int,
        group_id: str,
        ttl: float | None = None,
    ) -> Message:
        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> Iterable[int]:
        return [node for node in self._contexts if self._online(node, self.round_trips)]

    def _online(self, node: int, trip: int) -> bool:
        return self._availability is None or self._availability.online(node, trip)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids = []
        trip, self.round_trips = self.round_trips, self.round_trips + 1
        for message in messages:
            message_id = uuid.uuid4().hex
            message.metadata.__dict__["_message_id"] = message_id
            ids.append(message_id)
            reply = self._deliver(message, trip)
            if reply is not None:
                reply.metadata.__dict__["_message_id"] = uuid.uuid4().hex
                self._replies[message_id] = reply
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return [self._replies.pop(mid) for mid in list(message_ids) if mid in self._replies]

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        return list(self.pull_messages(self.push_messages(messages)))

    # ---------------------------------------------------------------- delivery
    def _deliver(self, message: Message, trip: int) -> Message | None:
        node = message.metadata.dst_node_id
        context = self._contexts.get(node)
        if context is None or not self._online(node, trip):
            return Message(Error(code=NODE_UNAVAILABLE, reason=f"node {node} is not connected"), reply_to=message)
        started = time.perf_counter()
        bundle = self._reply_hook is not None and message.metadata.message_type == f"query.{protocol.BUNDLE}"
        reply = self._call_parts(node, message, context) if bundle else self._call(message, context)
        elapsed = time.perf_counter() - started
        self.client_seconds += elapsed
        if elapsed > self._timeout:
            return None
        if self._reply_hook is not None and not bundle:
            reply = self._reply_hook(node, message, reply)
        return reply

    def _call(self, message: Message, context: Context) -> Message:
        try:
            return self._client_app(message, context)
        except Exception as exc:  # as Flower's runtime does: an exception becomes an error reply
            return Message(
                Error(code=CLIENT_APP_RAISED_EXCEPTION, reason=f"{type(exc).__name__}: {exc}"),
                reply_to=message,
            )

    def _call_parts(self, node: int, message: Message, context: Context) -> Message | None:
        """A bundle, for a ``reply_hook``: each part delivered as the plain message it
        stands for (so the hook sees ``query.<task>`` messages and replies, as without
        bundles), the replies put back together as the bundle's reply. A part the hook
        silences or reports a transport error for (NODE_UNAVAILABLE, a message lost) does so
        for the whole bundle."""
        content = message.content
        tasks = content.config_records[protocol.BUNDLE]["tasks"]
        joined = RecordDict()
        for index, task in enumerate(tasks):
            part = Message(
                RecordDict(
                    {
                        protocol.ARRAYS: content.array_records[protocol.part(protocol.ARRAYS, index)],
                        protocol.CONFIG: content.config_records[protocol.part(protocol.CONFIG, index)],
                    }
                ),
                node,
                protocol.task(task).message_type,
                group_id=message.metadata.group_id,
            )
            part.metadata.__dict__["_message_id"] = uuid.uuid4().hex
            reply = self._reply_hook(node, part, self._call(part, context))
            if reply is None:
                return None
            if reply.has_error() and reply.error.code in TRANSPORT_ERRORS:  # the node or the message, not one task
                return Message(Error(code=reply.error.code, reason=reply.error.reason), reply_to=message)
            if reply.has_error():
                joined[protocol.part(protocol.ERROR, index)] = ConfigRecord({"reason": reply.error.reason})
                continue
            if protocol.ARRAYS in reply.content.array_records:
                joined[protocol.part(protocol.ARRAYS, index)] = reply.content.array_records[protocol.ARRAYS]
            if protocol.METRICS in reply.content.metric_records:
                joined[protocol.part(protocol.METRICS, index)] = reply.content.metric_records[protocol.METRICS]
        return Message(joined, reply_to=message)
