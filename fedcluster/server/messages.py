"""What a strategy sends and gets back: a checked :class:`Reply`, the spec a reply is
checked against, bundles (several tasks to one node in one Flower message) and their
parts, and the sums of replies every algorithm takes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common.constant import ErrorCode

import fedcluster.protocol as protocol
from fedcluster.wire import array_fields, array_layout, record_of


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


@dataclass(frozen=True)
class BatchCheck:
    """A caller's check that takes many valid replies at once (``many``: a reason or None
    per reply, in their order): the transport runs it on every reply a pull brought
    together (a round's replies, in process) instead of reply by reply. On one reply it is
    that reply's check."""

    many: Callable[[list[Reply]], list[str | None]]

    def __call__(self, reply: Reply) -> str | None:
        return self.many([reply])[0]


@dataclass
class ReplySpec:
    """What a valid reply to one broadcast holds: the task's declared reply
    (:meth:`fedcluster.protocol.Task.check_reply`) with its shape symbols bound to
    ``sizes`` (``"d"`` is bound to the federation's dimension once known) and to the
    request's arrays (:meth:`sizes_of`), then ``check``, which may return a reason to
    reject (bounds only the strategy knows)."""

    task: protocol.Task | None = None
    sizes: dict[str, int | None] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    check: Callable[[Reply], str | None] | BatchCheck | None = None
    request: dict[str, np.ndarray] = field(default_factory=dict)  # the arrays sent to every node
    node_arrays: dict[int, dict[str, np.ndarray]] = field(default_factory=dict)  # the arrays sent to one node only

    def sizes_of(self, node: int) -> dict[str, int | None]:
        """``sizes`` with the symbols bound by the request ``node`` got (the shared arrays and
        its own): what a reply from ``node`` is checked against."""
        return self.task.request_sizes({**self.request, **self.node_arrays.get(node, {})}, self.sizes)


def payload_bytes(record: ArrayRecord | None) -> int:
    """Bytes of array payload in a record (the protocol overhead is not counted)."""
    if record is None:
        return 0
    return int(sum(len(array.data) for array in record.values()))


def to_array_record(arrays: dict[str, np.ndarray] | None) -> ArrayRecord:
    """The arrays as a Flower record, filled item by item (``ArrayRecord(dict)`` copies
    every Array it is given once more)."""
    record = ArrayRecord()
    for key, value in (arrays or {}).items():
        record[key] = Array(**array_fields(value))
    return record


@dataclass
class Incoming:
    """One reply to one broadcast as pulled, before any check: from a plain message, or
    one part of a bundle's reply. ``key``: the message id, ``<id>/<part>`` for a part."""

    key: str
    node: int
    error: str | None = None  # why there is nothing to check: the device's or Flower's error, or unreadable
    # of the failure: "error" (the device's, or Flower's running its ClientApp), "unavailable" (Flower's
    # NODE_UNAVAILABLE: the node is gone), "lost" (the message or its reply lost in transit), "invalid"
    kind: str = "error"
    arrays: ArrayRecord | None = None
    metrics: dict[str, Any] | None = None
    up: int = 0  # bytes of array payload


def part_key(message_id: str, index: int, parts: int) -> str:
    return message_id if parts == 1 else f"{message_id}/{index}"


def bundle_message(messages: list[Message], group: str) -> Message:
    """The messages of one round trip to ONE node as a single ``query.bundle`` message
    (:mod:`fedcluster.protocol`), parts in the given order."""
    content = RecordDict(
        {protocol.BUNDLE: ConfigRecord({"tasks": [m.metadata.message_type.split(".", 1)[-1] for m in messages]})}
    )
    for index, message in enumerate(messages):
        content[protocol.part(protocol.ARRAYS, index)] = message.content.array_records[protocol.ARRAYS]
        content[protocol.part(protocol.CONFIG, index)] = message.content.config_records[protocol.CONFIG]
    return Message(content, messages[0].metadata.dst_node_id, f"query.{protocol.BUNDLE}", group_id=group)


REASON_MAX = 2000  # characters of a device's own error reason kept (logged, and in result.json)
METRICS_MAX = 64  # metrics one reply may hold (the protocol's replies have a handful, each a number)
NAME_MAX = 80  # characters of a metric's name (the protocol's are a few words)
# What the journal keeps of a reply part refused before any of its data was read (its verdict:
# kind, reason, bytes): record "refused" (a bundle's part i: "refused.i"). Read back only from the journal.
REFUSED = "refused"


def _reason(text: Any) -> str:
    """A device-chosen text, cut short: what is kept of it depends on its first
    :data:`REASON_MAX` characters alone (never its length), however long it is."""
    text = str(text[: REASON_MAX + 1] if isinstance(text, str) else text)
    return text if len(text) <= REASON_MAX else f"{text[:REASON_MAX]}... (cut at {REASON_MAX} characters)"


def _records_problem(content: RecordDict, parts: int) -> str | None:
    """A reply's records other than those its protocol declares (``arrays``/``metrics``, or
    per part ``arrays.i``/``metrics.i``/``error.i``): the first one named, or None."""
    if parts == 1:
        allowed = {protocol.ARRAYS, protocol.METRICS}
    else:
        allowed = {
            protocol.part(record, index)
            for index in range(parts)
            for record in (protocol.ARRAYS, protocol.METRICS, protocol.ERROR)
        }
    for name in content.keys():
        if name not in allowed:
            return f"the reply holds undeclared record {str(name)[:80]!r}"
    return None


def _metrics_problem(metrics: dict[str, Any]) -> str | None:
    if len(metrics) > METRICS_MAX:
        return f"the reply holds {len(metrics)} metrics, more than the {METRICS_MAX} a reply may"
    for key, value in metrics.items():
        if len(str(key)) > NAME_MAX:
            return f"the reply holds a metric named {str(key)[:NAME_MAX]!r}... longer than {NAME_MAX} characters"
        if isinstance(value, list):
            return f"metric {str(key)[:NAME_MAX]!r} is a list of {len(value)} values, not a number"
    return None


def _verdicts(message: Message, keys: list[str], node: int) -> list[Incoming] | None:
    """The replies of a message the journal kept as its verdicts (:func:`kept_of`), or None."""
    names = [REFUSED] if len(keys) == 1 else [protocol.part(REFUSED, index) for index in range(len(keys))]
    if not any(name in message.content.config_records for name in names):
        return None
    out = []
    for index, (key, name) in enumerate(zip(keys, names)):
        verdict = message.content.config_records.get(name)
        if verdict is None:
            out.extend(incoming(_part_message(message, index), node, 1, key=key))
        else:
            out.append(
                Incoming(key, node, error=str(verdict["reason"]), kind=str(verdict["kind"]), up=int(verdict["up"]))
            )
    return out


def _part_message(message: Message, index: int) -> Message:
    """Part ``index`` of a bundle's reply as a plain reply."""
    content = RecordDict()
    for plain, record in (
        (protocol.ARRAYS, protocol.part(protocol.ARRAYS, index)),
        (protocol.METRICS, protocol.part(protocol.METRICS, index)),
    ):
        if record in message.content:
            content[plain] = message.content[record]
    return Message(metadata=message.metadata, content=content)


def kept_of(message: Message, parts: int, verdicts: dict[int, tuple[str, str, int]]) -> Message:
    """What the journal keeps of a pulled reply whose parts ``verdicts`` (index -> kind,
    reason, bytes) were refused before any of their data was read: those verdicts instead of
    what the device sent (never its payload: an undeclared record, a huge error reason or
    metric), the other parts as they came (read, and bounded by their declared sizes).
    :func:`incoming` of it, replayed, gives the replies the original gave."""
    content = RecordDict()
    for index in range(parts):
        if index in verdicts:
            kind, reason, up = verdicts[index]
            content[REFUSED if parts == 1 else protocol.part(REFUSED, index)] = ConfigRecord(
                {"kind": kind, "reason": reason, "up": int(up)}
            )
        else:
            for record in (protocol.ARRAYS, protocol.METRICS):
                name = record if parts == 1 else protocol.part(record, index)
                if name in message.content:
                    content[name] = message.content[name]
    return Message(metadata=message.metadata, content=content)


# Flower's error replies that say nothing of the device's data: the node is gone, or a message
# (the request or the reply, e.g. its objects' upload cut by a dropped link) was lost in transit.
_ERROR_KINDS = {
    ErrorCode.NODE_UNAVAILABLE: "unavailable",
    ErrorCode.MESSAGE_UNAVAILABLE: "lost",
    ErrorCode.REPLY_MESSAGE_UNAVAILABLE: "lost",
}


def incoming(
    message: Message, node: int, parts: int, *, replayed: bool = False, key: str | None = None
) -> list[Incoming]:
    """A pulled message as the replies it holds (``parts`` > 1: a bundle's). Anything
    unreadable or undeclared (a record, a list-valued metric) becomes a reason, never an
    exception; a device's own error reason is cut to :data:`REASON_MAX` characters.
    ``replayed``: the message is what the journal kept (:func:`kept_of`), whose verdicts
    stand; a device's reply holding them is refused as any undeclared record."""
    mid = message.metadata.reply_to_message_id
    keys = [key] if key is not None else [part_key(mid, index, parts) for index in range(parts)]
    if replayed and not message.has_error():
        verdicts = _verdicts(message, keys, node)
        if verdicts is not None:
            return verdicts
    if message.has_error():
        kind = _ERROR_KINDS.get(message.error.code, "error")
        return [Incoming(key, node, error=f"error reply: {_reason(message.error.reason)}", kind=kind) for key in keys]
    try:
        problem = _records_problem(message.content, parts)
    except Exception as exc:  # a reply that cannot even be read is dropped, never fatal
        problem = f"unreadable reply: {type(exc).__name__}: {_reason(exc)}"
    if problem:
        return [Incoming(key, node, error=problem, kind="invalid") for key in keys]
    out = []
    for index, key in enumerate(keys):
        try:
            content = message.content
            if parts == 1:
                names = protocol.ARRAYS, protocol.METRICS
            else:
                names = protocol.part(protocol.ARRAYS, index), protocol.part(protocol.METRICS, index)
                error = record_of(content, protocol.part(protocol.ERROR, index), ConfigRecord)
                if error is not None:
                    out.append(
                        Incoming(key, node, error=f"error reply: {_reason(error.get('reason', '(no reason given)'))}")
                    )
                    continue
            arrays = record_of(content, names[0], ArrayRecord)
            metric = record_of(content, names[1], MetricRecord)
            metrics = dict(metric) if metric is not None else {}
            problem = _metrics_problem(metrics)
            if problem:
                out.append(Incoming(key, node, error=problem, kind="invalid", up=payload_bytes(arrays)))
                continue
            out.append(Incoming(key, node, arrays=arrays, metrics=metrics, up=payload_bytes(arrays)))
        except Exception as exc:  # a reply that cannot even be read is dropped, never fatal
            out.append(
                Incoming(key, node, error=f"unreadable reply: {type(exc).__name__}: {_reason(exc)}", kind="invalid")
            )
    return out


def layout_problem(reply: Incoming, spec: ReplySpec, sizes: dict[str, int | None]) -> str | None:
    """Why a reply is refused by its arrays' names, dtypes, shapes and byte counts as their
    metadata states them (the protocol table's declaration, ``sizes`` bound), or None. Nothing
    of the data is decoded: an undeclared or oversized array is refused unread."""
    names = list(reply.arrays or {})
    reason = protocol.undeclared_array(spec.task.reply, names, spec.config)
    if reason:
        return reason
    layouts = {}
    for key in names:
        try:
            layouts[key] = array_layout(reply.arrays[key])
        except ValueError as exc:
            return f"array {key!r} {exc}"
    reason = spec.task.check_layout(layouts, sizes, spec.config)
    return dimension_hint(reason, spec) if reason else None


def dimension_hint(reason: str, spec: ReplySpec) -> str:
    """A reply ``reason`` about a shape, with the likely cause when the dimension is bound."""
    if spec.sizes.get("d") is not None and "shape" in reason:
        reason += " (a different data dimension?)"
    return reason


def sum_arrays(replies: list[Reply], key: str) -> np.ndarray:
    """Element-wise sum of array ``key`` over ``replies`` (in node order)."""
    return np.sum([reply.arrays[key] for reply in replies], axis=0)


def sum_metric(replies: list[Reply], key: str = protocol.NUM_EXAMPLES) -> float:
    return float(sum(float(reply.metrics[key]) for reply in replies))


def one_set(reply: Reply, position: int) -> Reply:
    """One center set's part of a reply for several sets side by side (the arrays of set
    ``position``; a per-set ``cost`` as shape (1,))."""
    arrays = {
        name: (value[position : position + 1] if name == "cost" else value[position])
        for name, value in reply.arrays.items()
    }
    return Reply(reply.node_id, arrays, reply.metrics)
