"""Transport: a task of the protocol table to many nodes in one round trip (push, pull
with a deadline, bundles), every reply checked against the table, the device's own
declarations (:mod:`fedcluster.bounds`) and the caller's check, and each phase recorded
(sent, replies, failures, bytes, seconds). A part the base strategy
(:class:`fedcluster.server.base.FederatedStrategy`) holds: it asks the run's
:class:`~fedcluster.server.membership.Membership` whom to send to and records into its
:class:`~fedcluster.server.results.Results`."""

from __future__ import annotations

import math
import time
from logging import WARNING
from typing import Any, Callable, Iterable

import numpy as np
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid


import fedcluster.protocol as protocol
from fedcluster.config import RunConfig

from .messages import (
    BatchCheck,
    FederationError,
    Incoming,
    Reply,
    ReplySpec,
    bundle_message,
    incoming,
    kept_of,
    part_key,
    payload_bytes,
    to_array_record,
)
from .membership import Membership
from .results import Results
from .reply_check import check_together, read, refusal, validate
from .resume import match_nodes


class Transport:
    """Broadcasting and reply checks.

    Parameters
    ----------
    grid, config : the strategy's Flower grid and run config.
    members : the nodes of the run (whom to send to, what each declared, exclusions).
    results : the run's records (its journal; each phase is recorded there).
    exclude_invalid : a node one of whose replies was invalid leaves the run.
    public_reason : what result.json keeps of a reason (a private run strips numbers).
    """

    def __init__(
        self,
        grid: Grid,
        config: RunConfig,
        members: Membership,
        results: Results,
        exclude_invalid: bool = False,
        public_reason: Callable[[str], str] = str,
    ) -> None:
        self.grid, self.config, self.members, self.results = grid, config, members, results
        self.exclude_invalid, self.public_reason = exclude_invalid, public_reason
        self._unread: dict[str, str] = {}  # reply key -> why it was refused by its declared sizes, unread

    def broadcast(
        self,
        task: str,
        nodes: Iterable[int],
        *,
        arrays: dict[str, np.ndarray] | None = None,
        config: dict[str, Any] | None = None,
        seeded: bool | int = False,
        per_node: Callable[[int], tuple[dict | None, dict | None]] | None = None,
        sizes: dict[str, int | None] | None = None,
        check: Callable[[Reply], str | None] | None = None,
        phase: str | None = None,
        min_replies: int | None = None,
    ) -> list[Reply]:
        """Send task ``task`` of the protocol table to ``nodes``; return the valid replies
        in node order.

        ``arrays``/``config`` go to every node; ``seeded`` adds each node's own ``seed`` (an
        int: the random stream of :meth:`Membership.phase_seed` it comes from);
        ``per_node(node_id)`` may return extra ``(arrays, config)`` for one node. Replies
        are checked against the task's declared reply with its shape symbols bound to
        ``sizes`` (``d`` defaults to the federation's dimension) and then ``check``.
        Invalid replies are dropped with the reason recorded; fewer than the required
        number of valid replies raises :class:`FederationError` naming the failures. An
        empty ``nodes`` records a skipped phase and returns no reply.
        """
        request = dict(
            task=task,
            nodes=nodes,
            arrays=arrays,
            config=config,
            seeded=seeded,
            per_node=per_node,
            sizes=sizes,
            check=check,
            phase=phase,
            min_replies=min_replies,
        )
        return self.broadcast_together(request)[0]

    def broadcast_together(self, *requests: dict[str, Any]) -> list[list[Reply]]:
        """Several broadcasts (each a dict of :meth:`broadcast`'s arguments; a node may be
        in several) in ONE round trip: all messages are pushed, then pulled together. Each is
        checked and recorded as its own phase; returns each one's valid replies."""
        started = time.perf_counter()
        members, results = self.members, self.results
        requests, away = members.leave_out_away(requests)  # who is connected: asked once for sampling and sending
        results.round_trips += 1
        prepared = [self._prepare(**request) for request in requests]
        deadline = time.monotonic() + self.config.round_timeout  # from sending, not from the first pull
        sent, pushed = self._push_together(prepared)
        phase_of = {key: index for index, (node_of, _) in enumerate(sent) for key in node_of}
        checked: list[list[Reply]] = [[] for _ in prepared]
        answered: list[set[str]] = [set() for _ in prepared]
        up = [0] * len(prepared)

        def check(batch: list[Message]) -> None:
            """Check replies as they arrive, while the others are still on their way; a
            caller's :class:`BatchCheck` runs once on all of a pull's replies it checks."""
            together: dict[int, list[tuple[Reply, tuple]]] = {}  # phase -> its replies read, awaiting its check
            for message in batch:
                mid = message.metadata.reply_to_message_id
                node, parts = pushed.get(mid, (message.metadata.src_node_id, 1))
                verdicts = {}  # part -> (kind, reason, bytes) of the parts refused before their data was read
                for part, reply in enumerate(incoming(message, node, parts, replayed=results.journal.replaying_pull)):
                    index = phase_of.get(reply.key)
                    if index is None or reply.key in answered[index]:
                        continue  # not ours, or a second reply to the same message
                    p, (node_of, failures) = prepared[index], sent[index]
                    results.phase = p["phase"]
                    answered[index].add(reply.key)
                    valid, up_bytes, declarations = self._check_reply(reply, node_of, p["reply_spec"], failures)
                    up[index] += up_bytes
                    if declarations is not None:
                        together.setdefault(index, []).append((valid, declarations))
                    elif valid is not None:
                        checked[index].append(valid)
                    if reply.error is not None or reply.key in self._unread:
                        verdicts[part] = (
                            (reply.kind, reply.error, reply.up)
                            if reply.error is not None
                            else ("invalid", self._unread[reply.key], reply.up)
                        )
                if verdicts:
                    kept[mid] = kept_of(message, parts, verdicts)
            for index, read_replies in together.items():
                results.phase = prepared[index]["phase"]
                checked[index].extend(
                    check_together(self.members, read_replies, prepared[index]["reply_spec"], sent[index][1])
                )

        self._unread = {}
        kept: dict[str, Message] = {}  # message id -> what the journal keeps of a reply refused (in part) unread
        results.journal.pull(self.grid, set(pushed), deadline, check, kept)
        out = []
        for index, (p, (node_of, failures)) in enumerate(zip(prepared, sent)):
            results.phase = p["phase"]
            replies = self._finish_replies(checked[index], answered[index], node_of, failures)
            self._record_phase(
                p["phase"],
                p["spec"],
                p["nodes"],
                replies,
                failures,
                p["down"],
                up[index],
                time.perf_counter() - started,
            )
            results.record_away(away[index])
            out.append(replies)
        if prepared:  # presence once per round trip; who leaves, leaves in the trip's first phase
            last, results.phase = results.phase, prepared[0]["phase"]
            members.track_presence([(p["nodes"], failures) for p, (_, failures) in zip(prepared, sent)])
            results.phase = last
        for p, (_, failures), replies in zip(prepared, sent, out):
            required = self.required_replies(len(p["nodes"])) if p["min_replies"] is None else p["min_replies"]
            self.require(p["phase"], len(replies), len(p["nodes"]), required, failures)
        return out

    @staticmethod
    def require(phase: str, replies: int, sent: int, required: int, failures: list[dict[str, Any]]) -> None:
        """FederationError naming the failures when ``replies`` are fewer than ``required``."""
        if replies < required:
            reasons = "; ".join(f"node {f['node']}: {f['reason']}" for f in failures[:10])
            more = f" (and {len(failures) - 10} more)" if len(failures) > 10 else ""
            raise FederationError(
                f"phase {phase!r}: only {replies} valid replies of {sent} sent, {required} required. Failures: "
                f"{reasons}{more}"
            )

    def _prepare(
        self,
        task,
        nodes,
        arrays=None,
        config=None,
        seeded=False,
        per_node=None,
        sizes=None,
        check=None,
        phase=None,
        min_replies=None,
    ) -> dict[str, Any]:
        """The messages of one broadcast and how to check its replies."""
        spec = protocol.task(task)
        nodes = list(nodes)
        phase = phase or task
        self.results.phase = phase
        scaling = self.members.scaling
        if scaling is not None and task != "data_summary":
            arrays = {**(arrays or {}), **scaling.arrays()}  # the device standardizes its points (fedcluster.scaling)
        reply_spec = ReplySpec(
            spec, {"d": self.members.dimension, **(sizes or {})}, dict(config or {}), check, dict(arrays or {})
        )
        if seeded is not False:
            config = {**(config or {}), "seed": self.members.phase_seed(None if isinstance(seeded, bool) else seeded)}

        messages, down = self._messages(
            spec, nodes, arrays, config, per_node or (lambda node: (None, None)), phase, reply_spec.node_arrays
        )
        return {
            "spec": spec,
            "nodes": nodes,
            "phase": phase,
            "reply_spec": reply_spec,
            "messages": messages,
            "down": down,
            "min_replies": min_replies,
        }

    def _messages(
        self, spec, nodes, arrays, config, node_content, phase, node_requests=None
    ) -> tuple[list[Message], int]:
        """One message per node; the request is checked against the protocol table first
        (a malformed request is a bug of this server, not a device's problem). ``node_requests``
        gets each node's own arrays (they bind its reply's sizes)."""
        shared_record = to_array_record(arrays)
        shared_config: ConfigRecord | None = None  # the request of every node without content of its own, checked once
        messages, down = [], 0
        group = str(self.results.round_number) if self.results.current else phase
        for node in nodes:
            node_arrays, node_config = node_content(node)
            if node_arrays or node_config:
                full_arrays = {**(arrays or {}), **(node_arrays or {})}
                full_config = {**(config or {}), **(node_config or {})}
                spec.parse_request(full_arrays, full_config)
                config_record = ConfigRecord(full_config)
            else:
                if shared_config is None:
                    spec.parse_request(dict(arrays or {}), dict(config or {}))
                    shared_config = ConfigRecord(dict(config or {}))
                config_record = shared_config  # shared as the array record is: nothing writes to a request
            record = to_array_record(full_arrays) if node_arrays else shared_record
            if node_arrays and node_requests is not None:
                node_requests[int(node)] = node_arrays
            content = RecordDict({protocol.ARRAYS: record, protocol.CONFIG: config_record})
            down += payload_bytes(record)
            messages.append(Message(content, int(node), spec.message_type, group_id=group))
        return messages, down

    def _push_together(
        self, prepared: list[dict[str, Any]]
    ) -> tuple[list[tuple[dict[str, int], list]], dict[str, tuple[int, int]]]:
        """Push the messages of one round trip, ONE per node: a node asked for several
        tasks gets them as a bundle. Returns, per prepared broadcast, ``(reply key ->
        node, failures)``, and per pushed message id its ``(node, parts)``."""
        by_node: dict[int, list[tuple[int, Message]]] = {}
        for index, p in enumerate(prepared):
            for node, message in zip(p["nodes"], p["messages"]):
                by_node.setdefault(int(node), []).append((index, message))
        outgoing, routes = [], []
        for node, items in by_node.items():
            messages = [message for _, message in items]
            outgoing.append(
                messages[0] if len(messages) == 1 else bundle_message(messages, messages[0].metadata.group_id)
            )
            routes.append([index for index, _ in items])
        destinations = [int(message.metadata.dst_node_id) for message in outgoing]  # the strategy's own ids
        message_ids = self.results.journal.push(
            self.grid, outgoing, destinations, lambda: match_nodes(self.members, self.results)
        )
        sent: list[tuple[dict[str, int], list]] = [({}, []) for _ in prepared]
        pushed: dict[str, tuple[int, int]] = {}
        for mid, node, route in zip(message_ids, destinations, routes):
            if mid:
                pushed[mid] = (node, len(route))
            for part, index in enumerate(route):
                if mid:
                    sent[index][0][part_key(mid, part, len(route))] = node
                else:
                    sent[index][1].append(
                        {"node": node, "kind": "refused", "reason": "the SuperLink did not accept the message"}
                    )
        return sent, pushed

    def _check_reply(
        self, reply: Incoming, node_of: dict[str, int], spec: ReplySpec, failures: list[dict[str, Any]]
    ) -> tuple[Reply | None, int, tuple | None]:
        """One pulled reply of one broadcast (``node_of``: reply key -> node), checked: the
        valid :class:`Reply` or None with the reason appended to ``failures``; the bytes of
        array payload it carried; and, when the caller's check is a :class:`BatchCheck`, the
        reply read but not yet through it, with the declarations it keeps once it passes."""
        node = node_of.get(reply.key, reply.node)
        if reply.error is not None:
            failures.append({"node": node, "kind": reply.kind, "reason": reply.error})
            return None, reply.up, None
        later = isinstance(spec.check, BatchCheck)
        declarations = None
        try:
            if later:
                reason, valid, declarations = read(self.members, self._unread, node, reply, spec)
            else:
                reason, valid = validate(self.members, self._unread, node, reply, spec)
        except Exception as exc:  # a reply that cannot even be read is dropped, never fatal
            reason, valid = f"unreadable reply: {type(exc).__name__}: {exc}", None
        if reason:
            failures.append(refusal(node, reason))
            return None, reply.up, None
        return valid, reply.up, declarations

    def _finish_replies(
        self, replies: list[Reply], answered: set[str], node_of: dict[str, int], failures: list[dict[str, Any]]
    ) -> list[Reply]:
        """A message with no reply is a timeout. Replies arrive in whatever order the
        transport delivers them; they are returned in node order (``order_key``: by
        partition) so that the same seed gives the same result on every engine."""
        for key, node in node_of.items():
            if key not in answered:
                failures.append(
                    {
                        "node": node,
                        "kind": "timeout",
                        "reason": f"no reply within round-timeout={self.config['round-timeout']} s",
                    }
                )
        self.members.reorder_nodes()
        replies.sort(key=lambda reply: self.members.order_key(reply.node_id))
        failures.sort(key=lambda failure: str(failure["node"]))
        return replies

    def _record_phase(self, phase, spec, nodes, replies, failures, down, up, seconds) -> None:
        for failure in failures:
            log(WARNING, "[fedcluster] %s: dropped node %s: %s", phase, failure["node"], failure["reason"])
            failure["reason"] = self.public_reason(failure["reason"])
            if (self.exclude_invalid and failure["kind"] == "invalid") or failure["kind"] == "inconsistent":
                self.members.exclude(failure["node"], f"its {phase} reply was invalid: {failure['reason']}")
        if not nodes:
            log(WARNING, "[fedcluster] %s: no node to ask; phase skipped", phase)
        self.results.add_phase(
            {
                "phase": phase,
                "task": spec.message_type,
                "round": self.results.round_number,
                "sent": len(nodes),
                "round_trip": self.results.round_trips,  # phases sent together share one
                "replies": len(replies),
                "failures": failures,
                "bytes_down": down,
                "bytes_up": up,
                "seconds": seconds,
            }
        )

    def required_replies(self, sent: int) -> int:
        fraction = self.config.min_reply_fraction
        return min(sent, max(self.config.min_replies, int(math.ceil(fraction * sent))))
