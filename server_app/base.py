"""The base strategy every algorithm shares.

It owns what every federated clustering algorithm needs once: waiting for the nodes,
sampling, broadcasting a task of the protocol table (:mod:`fedcluster.protocol`) with a
timeout, checking every reply against that table (error replies, missing or non-numeric
arrays, wrong shapes, NaN/inf, negative counts, a node whose data dimension differs; a
reply that cannot even be read: all dropped with the reason recorded, never aggregated),
the minimum-replies check, the phases several algorithms repeat (the dimension vote,
federated evaluation of centers, per-node seeds, summing replies), per-round history,
bytes sent and received, timing, and writing ``result.json``.

An algorithm subclasses :class:`FederatedStrategy`, implements :meth:`run`, and reads top
to bottom like its paper: phase after phase of :meth:`broadcast` and calls into
``fedcluster``.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from logging import INFO, WARNING
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.common.constant import ErrorCode
from flwr.common.logger import log
from flwr.serverapp import Grid

from fedcluster import bounds, protocol
from fedcluster.common import majority_value
from fedcluster.data import list_client_files
from fedcluster.scaling import Scaling
from fedcluster.wire import array_fields, array_numpy

# Result arrays that are points of the data space (written back in the original units by a
# standardized run).
IN_DATA_SPACE = frozenset({"centers", "init_centers", "last_centers", "device_centers", "bin_representatives"})


class FederationError(RuntimeError):
    """The federation cannot go on: too few nodes or too few valid replies."""


# Pause between two pulls of a broadcast's pending replies. Flower's own pause (the
# in-memory grid's `pull_interval`) when the last pull brought nothing; a shorter one while
# replies are arriving: a message and its reply leave the SuperLink's store only when the
# reply is pulled, and Flower's simulation engine rescans that whole store for every node
# about every 0.1 s, so replies left waiting slow down the delivery of the others (one
# `bench/flwr_scale.py` run at 1000 nodes with pauses of up to 9x the pull's own time:
# rounds of 15-26 s instead of 9-11 s).
PULL_PAUSE_S = 0.1
PULL_AGAIN_S = 0.05


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


class FederatedStrategy:
    """Base of every fedcluster strategy. Subclasses implement :meth:`run`.

    Parameters
    ----------
    grid : the Flower ``Grid`` (deployment, simulation or the in-process runner).
    config : the full, validated, typed run config (``fedcluster.config.with_defaults``).
    """

    name = "base"
    # A node one of whose replies was invalid is taken out of the rest of the run (FedDP:
    # a device that broke its clipping or its cap is not asked for anything else, its
    # evaluation included). Off elsewhere: an invalid reply costs only its phase.
    exclude_invalid = False

    def __init__(self, grid: Grid, config: dict[str, Any]) -> None:
        self.grid = grid
        self.config = config
        self.rng = np.random.default_rng(config["seed"])
        self.nodes: list[int] = []
        self.excluded: dict[int, str] = {}
        self.exclusions: list[dict[str, Any]] = []  # who left, why, in which phase and round
        self.joined: list[dict[str, Any]] = []  # nodes admitted after the start (admit_newcomers)
        self._missed: dict[int, int] = {}  # consecutive phases without any reply, per node
        self.declared: dict[int, bounds.Declared] = {}  # what each node's first reply fixed
        self._phase: str | None = None
        self.round_trips = 0  # push-and-pull exchanges with the nodes (one per broadcast_together)
        self.dimension: int | None = None
        self.rounds: list[dict[str, Any]] = []
        self.phases: list[dict[str, Any]] = []
        self.warnings: list[str] = []  # said in the log and kept in result.json
        self.bytes_up = 0
        self.bytes_down = 0
        self._current_round: dict[str, Any] | None = None
        self.scaling: Scaling | None = None  # standardize: set by the data summary (survey)
        self._started = time.perf_counter()

    # ------------------------------------------------------------------ nodes
    def wait_for_nodes(self) -> list[int]:
        """Wait until ``min-nodes`` nodes are connected (or, when 0, until the count has
        been stable for ``node-settle-s`` seconds), at most ``node-wait-s`` seconds."""
        expected = self.config["min-nodes"]
        deadline = time.monotonic() + self.config["node-wait-s"]
        settle = self.config["node-settle-s"]
        last_count, stable_since = -1, time.monotonic()
        while True:
            ids = sorted(int(i) for i in self.grid.get_node_ids())
            now = time.monotonic()
            if len(ids) != last_count:
                last_count, stable_since = len(ids), now
                if ids:
                    log(INFO, "[fedcluster] %d node(s) connected", len(ids))
            if expected > 0 and len(ids) >= expected:
                break
            if expected <= 0 and ids and now - stable_since >= settle:
                break
            if now > deadline:
                if expected > 0:
                    raise FederationError(
                        f"only {len(ids)} of the {expected} expected nodes (run-config "
                        f"min-nodes) connected within node-wait-s={self.config['node-wait-s']} s"
                    )
                if not ids:
                    raise FederationError(
                        f"no node connected within node-wait-s={self.config['node-wait-s']} s"
                    )
                break
            time.sleep(0.2 if expected > 0 else min(0.2, settle / 4 + 1e-3))
        self.nodes = ids
        log(INFO, "[fedcluster] starting %s with %d node(s)", self.name, len(ids))
        return ids

    def check_data_coverage(self) -> None:
        """With one data file per client (``npy-dir``, ``edge-dir``) and fewer nodes than
        files, say which files are left out; for a graph, where every client's edges are
        needed, refuse. (Only when the server can see ``data-dir``: a simulation.)"""
        dataset, directory = self.config.get("dataset"), self.config.get("data-dir")
        if dataset not in ("npy-dir", "edge-dir") or not directory or not Path(directory).is_dir():
            return
        files = list_client_files(directory, "*.npy" if dataset == "npy-dir" else "*.txt")
        if len(self.nodes) >= len(files):
            return
        unused = [f.name for f in files[len(self.nodes):]]
        text = (
            f"{len(files)} data files in {directory} but only {len(self.nodes)} nodes: "
            f"{', '.join(unused[:5])}{' …' if len(unused) > 5 else ''} will not be used"
        )
        if dataset == "edge-dir":
            raise FederationError(f"{text}; a graph needs every client's edges: start one node per file")
        self.warn(text)

    def warn(self, text: str) -> None:
        """Say it in the log and keep it in result.json (``warnings``)."""
        log(WARNING, "[fedcluster] %s", text)
        self.warnings.append(text)

    @property
    def active_nodes(self) -> list[int]:
        return [node for node in self.nodes if node not in self.excluded]

    def exclude(self, node_id: int, reason: str) -> None:
        """Take a node out of the run for good: it is not sent to again, and the result
        records the reason, the phase and the round."""
        if node_id not in self.excluded:
            log(WARNING, "[fedcluster] node %s excluded from the run: %s", node_id, reason)
            reason = self.public_reason(reason)
            self.excluded[node_id] = reason
            round_number = self._current_round["round"] if self._current_round else None
            self.exclusions.append({"node": node_id, "reason": reason, "phase": self._phase, "round": round_number})

    def public_reason(self, reason: str) -> str:
        """What ``result.json`` keeps of a reason a node's reply failed or it was excluded
        (a private run overrides this: the numbers in a reason describe a device's data)."""
        return reason

    def summary_fits(self, reply: Reply) -> bool:
        """A data summary of the federation's dimension (the metric and the box agree)."""
        return int(reply.metrics[protocol.DIM]) == self.dimension and reply.arrays["min"].shape == (self.dimension,)

    def newcomers(self) -> list[int]:
        """Nodes connected now that are neither in the run nor excluded from it: SuperNodes
        that joined after the start."""
        known = set(self.nodes) | set(self.excluded)
        return sorted(int(i) for i in self.grid.get_node_ids() if int(i) not in known)

    @staticmethod
    def join_request(nodes: list[int]) -> dict[str, Any]:
        """The data-summary query a newcomer answers before it may join (a
        :meth:`broadcast_together` request; no reply is required)."""
        return dict(task="data_summary", nodes=nodes, phase="join", min_replies=0, config={"moments": True})

    def admit_newcomers(self, replies: list[Reply]) -> list[int]:
        """Newcomers whose data summary (:meth:`join_request`) is valid and of the
        federation's dimension join the run: their summary fixes their declared size and
        box as a first reply does, they are recorded in ``nodes.joined`` and may be sent
        to from then on. Another dimension excludes the node; no reply leaves it a
        newcomer, asked again next time (``max-missed-phases`` silent asks exclude it)."""
        admitted = []
        for reply in replies:
            if not self.summary_fits(reply):
                dim = int(reply.metrics[protocol.DIM])
                self.exclude(reply.node_id, f"it joined with data of dimension {dim}, the federation's is {self.dimension}")
                continue
            admitted.append(reply.node_id)
            round_number = self._current_round["round"] if self._current_round else None
            self.joined.append({"node": reply.node_id, "round": round_number, "points": int(reply.num_examples)})
            log(INFO, "[fedcluster] node %s joined the run (round %s, %d points)", reply.node_id, round_number,
                reply.num_examples)
        self.nodes = sorted(self.nodes + admitted)
        return admitted

    def _track_presence(self, nodes: list[int], failures: list[dict[str, Any]]) -> None:
        """A node the SuperLink reports unavailable leaves at once; one that sent nothing in
        ``max-missed-phases`` consecutive phases leaves then. Any reply (even an invalid
        one) shows the node is there."""
        kinds = {failure["node"]: failure.get("kind") for failure in failures}
        limit = self.config["max-missed-phases"]
        for node in nodes:
            kind = kinds.get(node)
            if kind == "unavailable":
                self.exclude(node, "the SuperLink reports the node unavailable (NODE_UNAVAILABLE)")
            elif kind == "timeout":
                self._missed[node] = self._missed.get(node, 0) + 1
                if self._missed[node] >= limit:
                    self.exclude(node, f"no reply in {limit} consecutive phases (max-missed-phases)")
            else:
                self._missed[node] = 0

    def sample(self, fraction: float) -> list[int]:
        """``max(floor(fraction * M), 1)`` active nodes, uniformly without replacement."""
        active = self.active_nodes
        m = max(int(math.floor(fraction * len(active))), 1)
        if m >= len(active):
            return list(active)
        picked = self.rng.choice(len(active), size=m, replace=False)
        return [active[i] for i in sorted(picked)]

    def node_seeds(self, nodes: Iterable[int], stream: int | None = None) -> dict[int, int]:
        """One seed per node from the server's generator (drawn in node order); with
        ``stream``, from (run seed, stream, node) instead, leaving the generator untouched."""
        if stream is not None:
            return {node: int(np.random.default_rng([self.config["seed"], stream, node]).integers(2**31)) for node in nodes}
        return {node: int(self.rng.integers(2**31)) for node in nodes}

    # ------------------------------------------------------------------ rounds
    def begin_round(self, number: int) -> None:
        self._current_round = {
            "round": number,
            "sent": 0,
            "replies": 0,
            "failures": [],
            "bytes_down": 0,
            "bytes_up": 0,
            "seconds": 0.0,
        }
        self._round_start = time.perf_counter()

    def end_round(self, **metrics: Any) -> dict[str, Any]:
        record = self._current_round
        assert record is not None, "end_round without begin_round"
        record["seconds"] = time.perf_counter() - self._round_start
        record.update({key: _jsonable(value) for key, value in metrics.items()})
        self.rounds.append(record)
        self._current_round = None
        return record

    # ------------------------------------------------------------------ messaging
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
        int: the random stream of :meth:`node_seeds` it comes from);
        ``per_node(node_id)`` may return extra ``(arrays, config)`` for one node. Replies
        are checked against the task's declared reply with its shape symbols bound to
        ``sizes`` (``d`` defaults to the federation's dimension) and then ``check``.
        Invalid replies are dropped with the reason recorded; fewer than the required
        number of valid replies raises :class:`FederationError` naming the failures. An
        empty ``nodes`` records a skipped phase and returns no reply.
        """
        request = dict(task=task, nodes=nodes, arrays=arrays, config=config, seeded=seeded, per_node=per_node,
                       sizes=sizes, check=check, phase=phase, min_replies=min_replies)
        return self.broadcast_together(request)[0]

    def broadcast_together(self, *requests: dict[str, Any]) -> list[list[Reply]]:
        """Several broadcasts (each a dict of :meth:`broadcast`'s arguments; a node may be
        in several) in ONE round trip: all messages are pushed, then pulled together. Each is
        checked and recorded as its own phase; returns each one's valid replies."""
        started = time.perf_counter()
        self.round_trips += 1
        prepared = [self._prepare(**request) for request in requests]
        deadline = time.monotonic() + self.config["round-timeout"]  # from sending, not from the first pull
        sent, pushed = self._push_together(prepared)
        phase_of = {key: index for index, (node_of, _) in enumerate(sent) for key in node_of}
        checked: list[list[Reply]] = [[] for _ in prepared]
        answered: list[set[str]] = [set() for _ in prepared]
        up = [0] * len(prepared)

        def check(batch: list[Message]) -> None:
            """Check replies as they arrive, while the others are still on their way."""
            for message in batch:
                mid = message.metadata.reply_to_message_id
                node, parts = pushed.get(mid, (message.metadata.src_node_id, 1))
                for reply in incoming(message, node, parts):
                    index = phase_of.get(reply.key)
                    if index is None or reply.key in answered[index]:
                        continue  # not ours, or a second reply to the same message
                    p, (node_of, failures) = prepared[index], sent[index]
                    self._phase = p["phase"]
                    answered[index].add(reply.key)
                    valid, up_bytes = self._check_reply(reply, node_of, p["reply_spec"], failures)
                    up[index] += up_bytes
                    if valid is not None:
                        checked[index].append(valid)

        self._pull(set(pushed), deadline, check)
        out = []
        for index, (p, (node_of, failures)) in enumerate(zip(prepared, sent)):
            self._phase = p["phase"]
            replies = self._finish_replies(checked[index], answered[index], node_of, failures)
            self._record_phase(p["phase"], p["spec"], p["nodes"], replies, failures, p["down"], up[index], time.perf_counter() - started)
            self.phases[-1]["round_trip"] = self.round_trips  # phases sent together share one
            self._track_presence(p["nodes"], failures)
            required = self.required_replies(len(p["nodes"])) if p["min_replies"] is None else p["min_replies"]
            if len(replies) < required:
                reasons = "; ".join(f"node {f['node']}: {f['reason']}" for f in failures[:10])
                more = f" (and {len(failures) - 10} more)" if len(failures) > 10 else ""
                raise FederationError(
                    f"phase {p['phase']!r}: only {len(replies)} valid replies of {len(p['nodes'])} sent, "
                    f"{required} required. Failures: {reasons}{more}"
                )
            out.append(replies)
        return out

    def _prepare(self, task, nodes, arrays=None, config=None, seeded=False, per_node=None, sizes=None, check=None,
                 phase=None, min_replies=None) -> dict[str, Any]:
        """The messages of one broadcast and how to check its replies."""
        spec = protocol.task(task)
        nodes = list(nodes)
        phase = phase or task
        self._phase = phase
        if self.scaling is not None and task != "data_summary":
            arrays = {**(arrays or {}), **self.scaling.arrays()}  # the device standardizes its points (fedcluster.scaling)
        reply_spec = ReplySpec(spec, {"d": self.dimension, **(sizes or {})}, dict(config or {}), check, dict(arrays or {}))
        seeded, stream = seeded is not False, (None if isinstance(seeded, bool) else seeded)
        seeds = self.node_seeds(nodes, stream) if seeded else {}

        def node_content(node: int) -> tuple[dict | None, dict | None]:
            extra_arrays, extra_config = (None, None) if per_node is None else per_node(node)
            if seeded:
                extra_config = {**(extra_config or {}), "seed": seeds[node]}
            return extra_arrays, extra_config

        messages, down = self._messages(spec, nodes, arrays, config, node_content, phase)
        return {"spec": spec, "nodes": nodes, "phase": phase, "reply_spec": reply_spec, "messages": messages,
                "down": down, "min_replies": min_replies}

    def _messages(self, spec, nodes, arrays, config, node_content, phase) -> tuple[list[Message], int]:
        """One message per node; the request is checked against the protocol table first
        (a malformed request is a bug of this server, not a device's problem)."""
        shared_record = to_array_record(arrays)
        messages, down = [], 0
        group = str(self._current_round["round"]) if self._current_round else phase
        for node in nodes:
            node_arrays, node_config = node_content(node)
            full_arrays = {**(arrays or {}), **(node_arrays or {})}
            full_config = {**(config or {}), **(node_config or {})}
            spec.parse_request(full_arrays, full_config)
            record = to_array_record(full_arrays) if node_arrays else shared_record
            content = RecordDict({protocol.ARRAYS: record, protocol.CONFIG: ConfigRecord(full_config)})
            down += payload_bytes(record)
            messages.append(Message(content, int(node), spec.message_type, group_id=group))
        return messages, down

    def _push_together(self, prepared: list[dict[str, Any]]) -> tuple[list[tuple[dict[str, int], list]], dict[str, tuple[int, int]]]:
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
            outgoing.append(messages[0] if len(messages) == 1 else bundle_message(messages, messages[0].metadata.group_id))
            routes.append([index for index, _ in items])
        message_ids = list(self.grid.push_messages(outgoing)) if outgoing else []
        sent: list[tuple[dict[str, int], list]] = [({}, []) for _ in prepared]
        pushed: dict[str, tuple[int, int]] = {}
        for mid, message, route in zip(message_ids, outgoing, routes):
            node = int(message.metadata.dst_node_id)
            if mid:
                pushed[mid] = (node, len(route))
            for part, index in enumerate(route):
                if mid:
                    sent[index][0][part_key(mid, part, len(route))] = node
                else:
                    sent[index][1].append({"node": node, "kind": "refused", "reason": "the SuperLink did not accept the message"})
        return sent, pushed

    def _check_reply(
        self, reply: Incoming, node_of: dict[str, int], spec: ReplySpec, failures: list[dict[str, Any]]
    ) -> tuple[Reply | None, int]:
        """One pulled reply of one broadcast (``node_of``: reply key -> node), checked: the
        valid :class:`Reply` or None with the reason appended to ``failures``; and the
        bytes of array payload it carried."""
        node = node_of.get(reply.key, reply.node)
        if reply.error is not None:
            failures.append({"node": node, "kind": reply.kind, "reason": reply.error})
            return None, 0
        try:
            reason, valid = self._validate(node, reply, spec)
        except Exception as exc:  # a reply that cannot even be read is dropped, never fatal
            reason, valid = f"unreadable reply: {type(exc).__name__}: {exc}", None
        if reason:
            failures.append({"node": node, "kind": "invalid", "reason": reason})
            return None, reply.up
        return valid, reply.up

    def _finish_replies(
        self, replies: list[Reply], answered: set[str], node_of: dict[str, int], failures: list[dict[str, Any]]
    ) -> list[Reply]:
        """A message with no reply is a timeout. Replies arrive in whatever order the
        transport delivers them; they are returned in node order so that the same seed
        gives the same result."""
        for key, node in node_of.items():
            if key not in answered:
                failures.append(
                    {"node": node, "kind": "timeout", "reason": f"no reply within round-timeout={self.config['round-timeout']} s"}
                )
        replies.sort(key=lambda reply: reply.node_id)
        failures.sort(key=lambda failure: str(failure["node"]))
        return replies

    def _record_phase(self, phase, spec, nodes, replies, failures, down, up, seconds) -> None:
        for failure in failures:
            log(WARNING, "[fedcluster] %s: dropped node %s: %s", phase, failure["node"], failure["reason"])
            failure["reason"] = self.public_reason(failure["reason"])
            if self.exclude_invalid and failure["kind"] == "invalid":
                self.exclude(failure["node"], f"its {phase} reply was invalid: {failure['reason']}")
        if not nodes:
            log(WARNING, "[fedcluster] %s: no node to ask; phase skipped", phase)
        self.bytes_down += down
        self.bytes_up += up
        self.phases.append(
            {
                "phase": phase,
                "task": spec.message_type,
                "round": self._current_round["round"] if self._current_round else None,
                "sent": len(nodes),
                "replies": len(replies),
                "failures": failures,
                "bytes_down": down,
                "bytes_up": up,
                "seconds": seconds,
            }
        )
        if self._current_round is not None:
            record = self._current_round
            record["sent"] += len(nodes)
            record["replies"] += len(replies)
            record["failures"].extend(failures)
            record["bytes_down"] += down
            record["bytes_up"] += up

    def required_replies(self, sent: int) -> int:
        fraction = self.config["min-reply-fraction"]
        return min(sent, max(self.config["min-replies"], int(math.ceil(fraction * sent))))

    def _pull(self, pending: set[str], deadline: float, on_batch: Callable[[list[Message]], None] | None = None) -> list[Message]:
        """Pull the replies to ``pending`` message ids until all came or ``deadline``;
        ``on_batch`` is called with each pull's replies as they come."""
        out: list[Message] = []
        while pending:
            got = list(self.grid.pull_messages(list(pending)))
            out.extend(got)
            pending.difference_update(m.metadata.reply_to_message_id for m in got)
            if got and on_batch is not None:
                on_batch(got)
            if not pending or time.monotonic() > deadline:
                break
            time.sleep(PULL_AGAIN_S if got else PULL_PAUSE_S)
        return out

    def _validate(self, node: int, reply: Incoming, spec: ReplySpec) -> tuple[str | None, Reply | None]:
        if reply.arrays is None:
            return f"reply has no {protocol.ARRAYS!r} record", None
        arrays = {key: array_numpy(value) for key, value in reply.arrays.items()}
        metrics = reply.metrics or {}
        if protocol.DIM in metrics and self.dimension is not None and metrics[protocol.DIM] != self.dimension:
            return f"the node's data has dimension {metrics[protocol.DIM]}, the federation's is {self.dimension}", None
        reason = spec.task.check_reply(arrays, metrics, spec.sizes, spec.config) or bounds.box_violation(spec.task, arrays)
        if reason:
            if "d" in spec.sizes and spec.sizes["d"] is not None and "shape" in reason:
                reason += " (a different data dimension?)"
            return reason, None
        declared = self.declared.get(node)
        first = bounds.declaration(spec.task, arrays, metrics)
        binding = declared or first  # a first reply must at least agree with itself
        if binding is not None:
            reason = bounds.violation(spec.task, arrays, metrics, spec.request, binding, spec.config)
            if reason:
                return reason, None
        reply = Reply(node, arrays, metrics)
        if spec.check is not None:
            reason = spec.check(reply)
            if reason:
                return reason, None
        if declared is None and first is not None:
            if self.scaling is not None:  # a box declared in the data's own units (a newcomer's summary)
                self._scale_box(first)
            self.declared[node] = first
        elif declared is not None and declared.low is None and first is not None and first.low is not None:
            declared.low, declared.high = first.low, first.high
            if self.scaling is not None:
                self._scale_box(declared)
        return None, reply

    # ------------------------------------------------------------------ shared phases
    def score_candidates(self, candidates: np.ndarray, phase: str) -> tuple[np.ndarray, int]:
        """The total k-means cost of every candidate center set (m, k, d) over the active
        nodes' points, in one round trip (``score_candidates``), and the points that scored them."""
        candidates = np.asarray(candidates)
        replies = self.broadcast("score_candidates", self.active_nodes, arrays={"candidates": candidates},
                                 sizes={"m": candidates.shape[0], "k": candidates.shape[1]}, phase=phase)
        return sum_arrays(replies, "costs"), int(sum_metric(replies))

    def vote_dimension(self, replies: list[Reply], dimension_of: Callable[[Reply], int]) -> list[Reply]:
        """Set the federation's dimension to the one most replies report (ties: the
        smaller); exclude the nodes with another. Returns the replies that agree."""
        dims = [int(dimension_of(reply)) for reply in replies]
        self.dimension = majority_value(dims)
        kept = []
        for reply, dim in zip(replies, dims):
            if dim != self.dimension:
                self.exclude(reply.node_id, f"its data has dimension {dim}, the federation's is {self.dimension}")
            else:
                kept.append(reply)
        return kept

    def discover_dimension(self) -> list[Reply]:
        """Phase 0 for point data: every node reports size, dimension and bounding box.

        The federation's dimension is the one most nodes report; nodes with another
        dimension, or whose summary failed, are excluded from the run."""
        return self.survey()[0]

    def survey(self, *together: dict[str, Any]) -> tuple[list[Reply], list[list[Reply]]]:
        """:meth:`discover_dimension`, with other queries to every active node (dicts of
        :meth:`broadcast` arguments without ``nodes``) in the same round trip. Their
        replies are kept only from nodes that stay in the run and, where the protocol table
        gives a reply array the dimension ``d``, only when it is the federation's."""
        standardize = self.config.get("standardize", False)
        requests = [dict(task="data_summary", nodes=self.active_nodes, phase="data-summary", config={"moments": True})]
        if not standardize:  # the other queries travel with the data summary (with standardize they need its scaling)
            requests += [{"nodes": self.active_nodes, **request} for request in together]
        first = len(self.phases)
        replies, *others = self.broadcast_together(*requests)
        self._phase = "data-summary"  # exclusions below belong to the data summary
        kept = self.vote_dimension(replies, lambda reply: reply.metrics[protocol.DIM])
        kept = [r for r in kept if self.summary_fits(r)]
        answered = {r.node_id for r in replies}
        for failure in self.phases[first]["failures"]:
            if failure["node"] not in answered:
                self.exclude(failure["node"], f"data summary failed: {failure['reason']}")
        if standardize:
            self.standardize(kept)
            if together:
                others = self.broadcast_together(*[{"nodes": [r.node_id for r in kept], **request} for request in together])
        staying = {r.node_id for r in kept}

        def fits(reply: Reply, task: protocol.Task) -> bool:
            return reply.node_id in staying and all(
                reply.arrays[f.name].shape[f.shape.index("d")] == self.dimension
                for f in task.reply if "d" in f.shape and f.name in reply.arrays
            )

        tasks = [protocol.task(request["task"]) for request in together]
        return kept, [[r for r in group if fits(r, task)] for group, task in zip(others, tasks)]

    def standardize(self, summaries: list[Reply]) -> None:
        """``standardize``: the federation's per-feature mean and variance from the data
        summaries' sums; from now on every request carries the scaling, and the summaries'
        boxes (and what each node declared) are in standardized units."""
        points = sum(r.num_examples for r in summaries)
        self.scaling = Scaling.from_moments(points, sum_arrays(summaries, "sum"), sum_arrays(summaries, "sumsq"))
        for reply in summaries:
            reply.arrays["min"], reply.arrays["max"] = self.scaling.apply(reply.arrays["min"]), self.scaling.apply(reply.arrays["max"])
        for declared in self.declared.values():
            self._scale_box(declared)
        log(INFO, "[fedcluster] standardize: %d features scaled (feature scales %.3g .. %.3g)", self.scaling.mean.size,
            float(self.scaling.scale.min()), float(self.scaling.scale.max()))

    def _scale_box(self, declared: bounds.Declared) -> None:
        """A node's declared box and moments in standardized units."""
        if declared.low is not None and not declared.scaled:
            declared.low, declared.high = self.scaling.apply(declared.low), self.scaling.apply(declared.high)
            if declared.moment_sum is not None:
                declared.moment_sum, declared.moment_sumsq, declared.moment_scale = self.scaling.apply_moments(
                    declared.points, declared.moment_sum, declared.moment_sumsq, declared.moment_scale)
            declared.scaled = True

    def write_device_labels(self, centers: np.ndarray) -> dict[str, Any]:
        """``write-labels``: every active device saves its points' nearest-center labels
        beside its data file; only whether it did comes back."""
        replies = self.broadcast("write_labels", self.active_nodes, arrays={"centers": centers},
                                 sizes={"k": centers.shape[0]}, phase="write-labels", min_replies=0)
        written = sum(1 for r in replies if r.arrays["written"][0] > 0)
        log(INFO, "[fedcluster] labels saved on %d of %d devices (fedcluster-labels/ beside each data file)",
            written, len(self.active_nodes))
        if written < len(replies):
            self.warn(f"{len(replies) - written} devices hold generated data (no data file): they saved no labels")
        return {"devices": written, "asked": len(self.active_nodes), "where": "fedcluster-labels/<data file stem>.npy beside each device's data file"}

    def evaluate(self, centers: np.ndarray, phase: str = "evaluation") -> tuple[float, int]:
        """Federated k-means cost of ``centers`` on every active node: ``(total cost, points)``."""
        replies = self.broadcast(
            "lloyd_stats", self.active_nodes, arrays={"centers": centers}, sizes={"k": centers.shape[0]}, phase=phase
        )
        return float(sum_arrays(replies, "cost")[0]), int(sum_arrays(replies, "counts").sum())

    # ------------------------------------------------------------------ results
    def run(self) -> dict[str, Any]:
        """Run the algorithm; return ``{"centers": ..., "final": {...}, ...}``."""
        raise NotImplementedError

    def prepare_output(self) -> Path:
        """Choose and check the results folder before any node is waited for: a file, a
        folder inside the data folder, or an unwritable one stops the run here; a folder
        that already holds a result gets a fresh ``run-N`` sub-folder unless ``overwrite``."""
        configured = self.config["output-dir"]
        if configured:
            path = Path(configured).expanduser().resolve()
        else:
            stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S-%f")
            root = Path(os.environ.get("FEDCLUSTER_OUTPUT_ROOT", "outputs"))
            path = (root / f"{stamp}-{self.config['algorithm']}").resolve()
        if path.exists() and not path.is_dir():
            raise FederationError(f"output-dir {path} is a file, not a folder: choose another output-dir")
        data_dir = self.config.get("data-dir")
        if data_dir:
            data = Path(data_dir).expanduser().resolve()
            if path == data or data in path.parents:
                raise FederationError(
                    f"output-dir {path} lies inside the data folder {data}: results there could be "
                    f"read as client data next time; choose another output-dir"
                )
        if (path / "result.json").exists() and not self.config["overwrite"]:
            number = 2
            while (path / f"run-{number}").exists():
                number += 1
            log(WARNING, "[fedcluster] %s already holds a result: writing to run-%d inside it (overwrite=true to replace)", path, number)
            path = path / f"run-{number}"
        try:
            path.mkdir(parents=True, exist_ok=True)
            probe = path / ".fedcluster-write-test"
            probe.write_text("")
            probe.unlink()
        except OSError as exc:
            raise FederationError(f"output-dir {path} cannot be written: {exc}") from None
        self._output = path
        return path

    def output_dir(self) -> Path:
        return getattr(self, "_output", None) or self.prepare_output()

    def write_result(self, outcome: dict[str, Any]) -> dict[str, Any]:
        out = self.output_dir()
        arrays = outcome.pop("arrays", {})
        centers = outcome.pop("centers", None)
        if centers is not None:
            arrays = {"centers": centers, **arrays}
        if self.scaling is not None:  # centers and other points are written in the data's own units
            arrays = {name: self.scaling.undo(value) if name in IN_DATA_SPACE else value for name, value in arrays.items()}
            outcome["standardize"] = {**self.scaling.record(), "how": "x -> (x - mean) / scale per feature; centers "
                                      "written in the original units, costs and nearest centers in the standardized ones"}
        self._remove_earlier_result(out)
        for name, value in arrays.items():
            np.save(out / f"{name}.npy", np.asarray(value))
        result = {
            "algorithm": self.config["algorithm"],
            "config": dict(self.config),
            "nodes": {
                "connected": len(self.nodes),
                "active": len(self.active_nodes),
                "excluded": {str(k): v for k, v in self.excluded.items()},
                "exclusions": self.exclusions,
                "joined": self.joined,
            },
            "rounds": self.rounds,
            "phases": self.phases,
            "warnings": self.warnings,
            **{key: _jsonable(value) for key, value in outcome.items()},
            "communication": {"bytes_up": self.bytes_up, "bytes_down": self.bytes_down, "round_trips": self.round_trips},
            "wall_time_s": time.perf_counter() - self._started,
            "output_dir": str(out),
            "files": sorted(f"{name}.npy" for name in arrays),
        }
        tmp = out / "result.json.tmp"
        tmp.write_text(json.dumps(result, indent=2, default=_jsonable))
        tmp.replace(out / "result.json")
        log(INFO, "[fedcluster] result written to %s", out)
        return result


    @staticmethod
    def _remove_earlier_result(out: Path) -> None:
        """``overwrite``: the arrays the earlier run in ``out`` wrote (its result.json
        ``files``) are removed, and only those: plain ``.npy`` files directly in ``out``, so
        no earlier result is left beside the new one and nothing else is touched."""
        earlier = out / "result.json"
        if not earlier.is_file():
            return
        try:
            files = json.loads(earlier.read_text()).get("files", [])
        except (OSError, ValueError, AttributeError):
            log(WARNING, "[fedcluster] %s is unreadable: none of its files removed before overwriting it", earlier)
            return
        removed = []
        for name in files if isinstance(files, list) else []:
            if isinstance(name, str) and name.endswith(".npy") and Path(name).name == name:
                target = out / name
                if target.is_file() and not target.is_symlink():
                    target.unlink()
                    removed.append(name)
        if removed:
            log(INFO, "[fedcluster] overwrite: removed the earlier run's %s", ", ".join(sorted(removed)))


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (np.floating,)):
        return float(value)
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
