"""A reply, checked (:class:`fedcluster.server.transport.Transport`): its layout before
any of its data is decoded, the protocol table and the federation's dimension, the node's
own declarations (:mod:`fedcluster.bounds`), then the caller's check (a
:class:`~fedcluster.server.messages.BatchCheck` on many replies at once: :func:`read` each,
then the check); a valid reply's declaration is kept in the run's
:class:`~fedcluster.server.membership.Membership`."""

from __future__ import annotations

from typing import Any

import numpy as np

import fedcluster.bounds as bounds
import fedcluster.protocol as protocol
from fedcluster.wire import array_numpy

from .membership import Membership
from .messages import Incoming, Inconsistent, Reply, ReplySpec, dimension_hint, layout_problem


def validate(
    members: Membership, unread: dict[str, str], node: int, reply: Incoming, spec: ReplySpec
) -> tuple[str | None, Reply | None]:
    """Why ``reply`` of ``node`` is refused (None: valid) and the valid :class:`Reply`:
    its layout before any of its data is decoded, the protocol table, the node's own
    declarations, then the caller's check. A valid reply's declaration is kept."""
    reason, valid, declarations = read(members, unread, node, reply, spec)
    if reason is None and spec.check is not None:
        reason = spec.check(valid)
    if reason:
        return reason, None
    keep_declaration(members, node, *declarations)
    return None, valid


def read(
    members: Membership, unread: dict[str, str], node: int, reply: Incoming, spec: ReplySpec
) -> tuple[str | None, Reply | None, tuple]:
    """:func:`validate` up to the caller's check: the reason ``reply`` is refused or the
    :class:`Reply` with the declarations :func:`keep_declaration` keeps once the caller's
    check passes it too."""
    if reply.arrays is None:
        return f"reply has no {protocol.ARRAYS!r} record", None, ()
    sizes = spec.sizes_of(node)
    reason = layout_problem(reply, spec, sizes)  # before any of its data is decoded
    if reason:
        unread[reply.key] = reason  # refused by its declared sizes, unread
        return reason, None, ()
    arrays = {key: array_numpy(value) for key, value in reply.arrays.items()}  # sizes checked: decoded
    metrics = reply.metrics or {}
    reason = table_problem(members, arrays, metrics, sizes, spec)
    if reason:
        return reason, None, ()
    members.note_partition(node, metrics)  # a partition the checks refused is not the node's
    declared = members.declared.get(node)
    first = bounds.declaration(spec.task, arrays, metrics)
    binding = declared or first  # a first reply must at least agree with itself
    if binding is not None:
        reason = bounds.violation(spec.task, arrays, metrics, spec.request, binding, spec.config)
        if reason:
            return reason, None, ()
    return None, Reply(node, arrays, metrics), (declared, first)


def check_together(
    members: Membership, read_replies: list[tuple[Reply, tuple]], spec: ReplySpec, failures: list[dict[str, Any]]
) -> list[Reply]:
    """Replies :func:`read` (each with its declarations) through the caller's
    :class:`~fedcluster.server.messages.BatchCheck` at once: the valid ones, their
    declarations kept; each refused one appended to ``failures``. A check that raises on
    the batch takes each reply alone, so that only a reply it cannot take is dropped."""
    replies = [valid for valid, _ in read_replies]
    try:
        reasons = spec.check.many(replies)
    except Exception:
        reasons = []
        for valid in replies:
            try:
                reasons.append(spec.check(valid))
            except Exception as exc:
                reasons.append(f"unreadable reply: {type(exc).__name__}: {exc}")
    passed = []
    for (valid, declarations), reason in zip(read_replies, reasons):
        if reason:
            failures.append(refusal(valid.node_id, reason))
        else:
            keep_declaration(members, valid.node_id, *declarations)
            passed.append(valid)
    return passed


def refusal(node: int, reason: str) -> dict[str, Any]:
    """A reply refused by its checks, as a phase records it: ``inconsistent`` when its
    reason proves a lie (:class:`~fedcluster.server.messages.Inconsistent`)."""
    return {"node": node, "kind": "inconsistent" if isinstance(reason, Inconsistent) else "invalid", "reason": reason}


def table_problem(
    members: Membership, arrays: dict[str, np.ndarray], metrics: dict[str, Any], sizes: dict[str, int], spec: ReplySpec
) -> str | None:
    """Why the decoded reply breaks the protocol table or the federation's dimension."""
    dimension = members.dimension
    if protocol.DIM in metrics and dimension is not None and metrics[protocol.DIM] != dimension:
        return f"the node's data has dimension {metrics[protocol.DIM]}, the federation's is {dimension}"
    reason = spec.task.check_reply(arrays, metrics, sizes, spec.config) or bounds.box_violation(spec.task, arrays)
    return dimension_hint(reason, spec) if reason else None


def keep_declaration(
    members: Membership, node: int, declared: bounds.Declared | None, first: bounds.Declared | None
) -> None:
    """A valid reply's declaration: the node's first one fixes it; a later one with a box
    gives a node that declared none its box (in the run's units: ``standardize``)."""
    if declared is None and first is not None:
        if members.scaling is not None:  # a box declared in the data's own units (a newcomer's summary)
            members.scale_box(first)
        members.declared[node] = first
    elif declared is not None and declared.low is None and first is not None and first.low is not None:
        declared.low, declared.high = first.low, first.high
        if members.scaling is not None:
            members.scale_box(declared)
