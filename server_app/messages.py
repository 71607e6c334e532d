"""What a strategy sends and gets back: a checked :class:`Reply`, the spec a reply is
checked against, bundles (several tasks to one node in one Flower message) and their
parts, and the sums of replies every algorithm takes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.common.constant import ErrorCode

from fedcluster import protocol
from fedcluster.wire import array_fields


class FederationError(RuntimeError):
    """The federation cannot go on: too few nodes or too few valid replies."""


class Inconsistent(str):
    """A reply check's reason that proves the device lied (its replies contradict each
    other: no honest device can send them). The reply is dropped with kind
    ``inconsistent`` and the device leaves the run."""


@dataclass
class Reply:
    """A validated reply of one node."""

    node_id: int
    arrays: dict[str, np.ndarray]
    metrics: dict[str, Any]

    @property
    def num_examples(self) -> int:
        return int(self.metrics.get(protocol.NUM_EXAMPLES, 0))


@dataclass
class ReplySpec:
    """What a valid reply to one broadcast holds: the task's declared reply
    (:meth:`fedcluster.protocol.Task.check_reply`) with its shape symbols bound to
    ``sizes`` (``"d"`` is bound to the federation's dimension once known), then ``check``,
    which may return a reason to reject (bounds only the strategy knows)."""

    task: protocol.Task | None = None
    sizes: dict[str, int | None] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    check: Callable[[Reply], str | None] | None = None
    request: dict[str, np.ndarray] = field(default_factory=dict)  # the arrays sent to every node


def payload_bytes(record: ArrayRecord | None) -> int:
    """Bytes of array payload in a record (the protocol overhead is not counted)."""
    if record is None:
        return 0
    return int(sum(len(array.data) for array in record.values()))


def to_array_record(arrays: dict[str, np.ndarray] | None) -> ArrayRecord:
    return ArrayRecord({key: Array(**array_fields(value)) for key, value in (arrays or {}).items()})


@dataclass
class Incoming:
    """One reply to one broadcast as pulled, before any check: from a plain message, or
    one part of a bundle's reply. ``key``: the message id, ``<id>/<part>`` for a part."""

    key: str
    node: int
    error: str | None = None  # why there is nothing to check: the device's or Flower's error, or unreadable
    kind: str = "error"  # of the failure: "error", "unavailable" (Flower's NODE_UNAVAILABLE), "invalid"
    arrays: ArrayRecord | None = None
    metrics: dict[str, Any] | None = None
    up: int = 0  # bytes of array payload


def part_key(message_id: str, index: int, parts: int) -> str:
    return message_id if parts == 1 else f"{message_id}/{index}"


def bundle_message(messages: list[Message], group: str) -> Message:
    """The messages of one round trip to ONE node as a single ``query.bundle`` message
    (:mod:`fedcluster.protocol`), parts in the given order."""
    content = RecordDict({protocol.BUNDLE: ConfigRecord({
        "tasks": [m.metadata.message_type.split(".", 1)[-1] for m in messages]
    })})
    for index, message in enumerate(messages):
        content[protocol.part(protocol.ARRAYS, index)] = message.content.array_records[protocol.ARRAYS]
        content[protocol.part(protocol.CONFIG, index)] = message.content.config_records[protocol.CONFIG]
    return Message(content, messages[0].metadata.dst_node_id, f"query.{protocol.BUNDLE}", group_id=group)


def incoming(message: Message, node: int, parts: int) -> list[Incoming]:
    """A pulled message as the replies it holds (``parts`` > 1: a bundle's). Anything
    unreadable becomes a reason, never an exception."""
    mid = message.metadata.reply_to_message_id
    keys = [part_key(mid, index, parts) for index in range(parts)]
    if message.has_error():
        kind = "unavailable" if message.error.code == ErrorCode.NODE_UNAVAILABLE else "error"
        return [Incoming(key, node, error=f"error reply: {message.error.reason}", kind=kind) for key in keys]
    out = []
    for index, key in enumerate(keys):
        try:
            content = message.content
            records, metric_records = content.array_records, content.metric_records
            if parts == 1:
                names = protocol.ARRAYS, protocol.METRICS
            else:
                names = protocol.part(protocol.ARRAYS, index), protocol.part(protocol.METRICS, index)
                error = content.config_records.get(protocol.part(protocol.ERROR, index))
                if error is not None:
                    out.append(Incoming(key, node, error=f"error reply: {error.get('reason', '(no reason given)')}"))
                    continue
            arrays = records.get(names[0])
            metrics = dict(metric_records[names[1]]) if names[1] in metric_records else {}
            out.append(Incoming(key, node, arrays=arrays, metrics=metrics, up=payload_bytes(arrays)))
        except Exception as exc:  # a reply that cannot even be read is dropped, never fatal
            out.append(Incoming(key, node, error=f"unreadable reply: {type(exc).__name__}: {exc}", kind="invalid"))
    return out


def sum_arrays(replies: list[Reply], key: str) -> np.ndarray:
    """Element-wise sum of array ``key`` over ``replies`` (in node order)."""
    return np.sum([reply.arrays[key] for reply in replies], axis=0)


def sum_metric(replies: list[Reply], key: str = protocol.NUM_EXAMPLES) -> float:
    return float(sum(float(reply.metrics[key]) for reply in replies))


def one_set(reply: Reply, position: int) -> Reply:
    """One center set's part of a reply for several sets side by side (the arrays of set
    ``position``; a per-set ``cost`` as shape (1,))."""
    arrays = {name: (value[position:position + 1] if name == "cost" else value[position]) for name, value in reply.arrays.items()}
    return Reply(reply.node_id, arrays, reply.metrics)
