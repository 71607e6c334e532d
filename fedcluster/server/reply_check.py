"""A reply, checked (:class:`fedcluster.server.transport.Transport`): its layout before
any of its data is decoded, the protocol table and the federation's dimension, the node's
own declarations (:mod:`fedcluster.bounds`), then the caller's check; a valid reply's
declaration is kept in the run's :class:`~fedcluster.server.membership.Membership`."""

from __future__ import annotations

from typing import Any

import numpy as np

import fedcluster.bounds as bounds
import fedcluster.protocol as protocol
from fedcluster.wire import array_numpy

from .membership import Membership
from .messages import Incoming, Reply, ReplySpec, dimension_hint, layout_problem


def validate(
    members: Membership, unread: dict[str, str], node: int, reply: Incoming, spec: ReplySpec
) -> tuple[str | None, Reply | None]:
    """Why ``reply`` of ``node`` is refused (None: valid) and the valid :class:`Reply`:
    its layout before any data is decoded, the protocol table, the node's own
    declarations, then the caller's check. A valid reply's declaration is kept."""
    if reply.arrays is None:
        return f"reply has no {protocol.ARRAYS!r} record", None
    sizes = spec.sizes_of(node)
    reason = layout_problem(reply, spec, sizes)  # before any of its data is decoded
    if reason:
        unread[reply.key] = reason  # refused by its declared sizes, unread
        return reason, None
    arrays = {key: array_numpy(value) for key, value in reply.arrays.items()}  # sizes checked: decoded
    metrics = reply.metrics or {}
    reason = table_problem(members, arrays, metrics, sizes, spec)
    if reason:
        return reason, None
    members.note_partition(node, metrics)  # a partition the checks refused is not the node's
    declared = members.declared.get(node)
    first = bounds.declaration(spec.task, arrays, metrics)
    binding = declared or first  # a first reply must at least agree with itself
    if binding is not None:
        reason = bounds.violation(spec.task, arrays, metrics, spec.request, binding, spec.config)
        if reason:
            return reason, None
    valid = Reply(node, arrays, metrics)
    reason = spec.check(valid) if spec.check is not None else None
    if reason:
        return reason, None
    keep_declaration(members, node, declared, first)
    return None, valid


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
