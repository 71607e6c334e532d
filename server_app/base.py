"""The base strategy every algorithm shares.

It owns what every federated clustering algorithm needs once: waiting for the nodes,
sampling, broadcasting a task with a timeout, validating replies (error replies, missing
keys, wrong shapes, NaN/inf, negative counts, a node whose data dimension differs — all
dropped with a logged reason, never aggregated), the minimum-replies check, per-round
history, bytes sent and received, timing, and writing ``result.json``.

An algorithm subclasses :class:`FederatedStrategy`, implements :meth:`run`, and reads top
to bottom like its paper: phase after phase of :meth:`broadcast` and NumPy aggregation.
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
from flwr.common.logger import log
from flwr.serverapp import Grid

from fedcluster.wire import array_fields, array_numpy


class FederationError(RuntimeError):
    """The federation cannot go on: too few nodes or too few valid replies."""


@dataclass
class Reply:
    """A validated reply of one node."""

    node_id: int
    arrays: dict[str, np.ndarray]
    metrics: dict[str, Any]

    @property
    def num_examples(self) -> int:
        return int(self.metrics.get("num-examples", 0))


@dataclass
class ReplySpec:
    """What a valid reply holds.

    ``shapes`` maps every required array to its expected shape; an entry may be an int,
    None (any size) or the string ``"d"`` (the federation's data dimension). Arrays in
    ``nonnegative`` must have no negative entry. ``check`` may return a reason to reject.
    Every array must be finite.
    """

    shapes: dict[str, tuple] = field(default_factory=dict)
    nonnegative: tuple[str, ...] = ()
    metrics: tuple[str, ...] = ("num-examples",)
    check: Callable[[Reply], str | None] | None = None


def payload_bytes(record: ArrayRecord | None) -> int:
    """Bytes of array payload in a record (the protocol overhead is not counted)."""
    if record is None:
        return 0
    return int(sum(len(array.data) for array in record.values()))


def to_array_record(arrays: dict[str, np.ndarray] | None) -> ArrayRecord:
    return ArrayRecord({key: Array(**array_fields(value)) for key, value in (arrays or {}).items()})


class FederatedStrategy:
    """Base of every fedcluster strategy. Subclasses implement :meth:`run`.

    Parameters
    ----------
    grid : the Flower ``Grid`` (deployment, simulation or the in-process runner).
    config : the full run config (``fedcluster.config.with_defaults``).
    """

    name = "base"

    def __init__(self, grid: Grid, config: dict[str, Any]) -> None:
        self.grid = grid
        self.config = config
        self.rng = np.random.default_rng(config["seed"])
        self.nodes: list[int] = []
        self.excluded: dict[int, str] = {}
        self.dimension: int | None = None
        self.rounds: list[dict[str, Any]] = []
        self.phases: list[dict[str, Any]] = []
        self.bytes_up = 0
        self.bytes_down = 0
        self._current_round: dict[str, Any] | None = None
        self._started = time.perf_counter()

    # ------------------------------------------------------------------ nodes
    def wait_for_nodes(self) -> list[int]:
        """Wait until ``min-nodes`` nodes are connected (or, when 0, until the count has
        been stable for ``node-settle-s`` seconds), at most ``node-wait-s`` seconds."""
        expected = int(self.config["min-nodes"])
        deadline = time.monotonic() + float(self.config["node-wait-s"])
        settle = float(self.config["node-settle-s"])
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

    @property
    def active_nodes(self) -> list[int]:
        return [node for node in self.nodes if node not in self.excluded]

    def exclude(self, node_id: int, reason: str) -> None:
        if node_id not in self.excluded:
            self.excluded[node_id] = reason
            log(WARNING, "[fedcluster] node %s excluded from the run: %s", node_id, reason)

    def sample(self, fraction: float) -> list[int]:
        """``max(floor(fraction * M), 1)`` active nodes, uniformly without replacement."""
        active = self.active_nodes
        m = max(int(math.floor(fraction * len(active))), 1)
        if m >= len(active):
            return list(active)
        picked = self.rng.choice(len(active), size=m, replace=False)
        return [active[i] for i in sorted(picked)]

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
        per_node: Callable[[int], tuple[dict | None, dict | None]] | None = None,
        kind: str = "query",
        spec: ReplySpec | None = None,
        phase: str | None = None,
        min_replies: int | None = None,
    ) -> list[Reply]:
        """Send ``<kind>.<task>`` to ``nodes`` and return the valid replies.

        ``arrays``/``config`` go to every node; ``per_node(node_id)`` may return extra
        ``(arrays, config)`` for one node (e.g. its own seed). Invalid replies are dropped
        with a logged reason; fewer than the required number of valid replies raises
        :class:`FederationError` naming every failure.
        """
        nodes = list(nodes)
        spec = spec or ReplySpec()
        phase = phase or task
        started = time.perf_counter()
        shared_arrays = to_array_record(arrays)
        messages = []
        down = 0
        for node in nodes:
            node_arrays, node_config = (None, None) if per_node is None else per_node(node)
            record = shared_arrays
            if node_arrays:
                record = to_array_record({**(arrays or {}), **node_arrays})
            content = RecordDict(
                {"arrays": record, "config": ConfigRecord({**(config or {}), **(node_config or {})})}
            )
            down += payload_bytes(record)
            group = str(self._current_round["round"]) if self._current_round else phase
            messages.append(Message(content, int(node), f"{kind}.{task}", group_id=group))
        message_ids = list(self.grid.push_messages(messages))
        node_of = {mid: node for mid, node in zip(message_ids, nodes) if mid}
        failures: list[dict[str, Any]] = [
            {"node": node, "reason": "the SuperLink did not accept the message"}
            for mid, node in zip(message_ids, nodes)
            if not mid
        ]
        raw = self._pull(set(node_of), float(self.config["round-timeout"]))
        replies: list[Reply] = []
        up = 0
        answered = set()
        for message in raw:
            mid = message.metadata.reply_to_message_id
            node = node_of.get(mid, message.metadata.src_node_id)
            answered.add(mid)
            if message.has_error():
                failures.append({"node": node, "reason": f"error reply: {message.error.reason}"})
                continue
            records = message.content.array_records
            record = records["arrays"] if "arrays" in records else None
            up += payload_bytes(record)
            reason, reply = self._validate(node, message, spec)
            if reason:
                failures.append({"node": node, "reason": reason})
                continue
            replies.append(reply)
        for mid, node in node_of.items():
            if mid not in answered:
                failures.append(
                    {"node": node, "reason": f"no reply within round-timeout={self.config['round-timeout']} s"}
                )
        # Replies arrive in whatever order the transport delivers them; aggregate them in
        # node order so that the same seed gives the same result.
        replies.sort(key=lambda reply: reply.node_id)
        failures.sort(key=lambda failure: str(failure["node"]))
        for failure in failures:
            log(WARNING, "[fedcluster] %s: dropped node %s: %s", phase, failure["node"], failure["reason"])
        seconds = time.perf_counter() - started
        self.bytes_down += down
        self.bytes_up += up
        self.phases.append(
            {
                "phase": phase,
                "task": f"{kind}.{task}",
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
        required = self.required_replies(len(nodes)) if min_replies is None else min_replies
        if len(replies) < required:
            reasons = "; ".join(f"node {f['node']}: {f['reason']}" for f in failures[:10])
            more = f" (and {len(failures) - 10} more)" if len(failures) > 10 else ""
            raise FederationError(
                f"phase {phase!r}: only {len(replies)} valid replies of {len(nodes)} sent, "
                f"{required} required. Failures: {reasons}{more}"
            )
        return replies

    def required_replies(self, sent: int) -> int:
        fraction = float(self.config["min-reply-fraction"])
        return min(sent, max(int(self.config["min-replies"]), int(math.ceil(fraction * sent))))

    def _pull(self, pending: set[str], timeout: float) -> list[Message]:
        deadline = time.monotonic() + timeout
        out: list[Message] = []
        while pending:
            got = list(self.grid.pull_messages(list(pending)))
            out.extend(got)
            pending.difference_update(m.metadata.reply_to_message_id for m in got)
            if not pending or time.monotonic() > deadline:
                break
            time.sleep(0.05 if got else 0.1)
        return out

    def _validate(self, node: int, message: Message, spec: ReplySpec) -> tuple[str | None, Reply | None]:
        content = message.content
        if "arrays" not in content.array_records:
            return "reply has no 'arrays' record", None
        arrays = {key: array_numpy(value) for key, value in content.array_records["arrays"].items()}
        metrics = dict(content.metric_records["metrics"]) if "metrics" in content.metric_records else {}
        for key in spec.metrics:
            if key not in metrics:
                return f"reply misses metric {key!r}", None
        if "dim" in metrics and self.dimension is not None and int(metrics["dim"]) != self.dimension:
            return (
                f"the node's data has dimension {int(metrics['dim'])}, the federation's is "
                f"{self.dimension}",
                None,
            )
        for key, shape in spec.shapes.items():
            if key not in arrays:
                return f"reply misses array {key!r}", None
            expected = tuple(self.dimension if s == "d" else s for s in shape)
            got = arrays[key].shape
            if len(got) != len(expected) or any(e is not None and e != g for e, g in zip(expected, got)):
                hint = ""
                if "d" in shape and len(got) == len(expected) and self.dimension is not None:
                    hint = " (a different data dimension?)"
                return f"array {key!r} has shape {got}, expected {expected}{hint}", None
        for key, value in arrays.items():
            if value.dtype.kind in "fc" and not np.all(np.isfinite(value)):
                return f"array {key!r} contains NaN or inf", None
        for key in spec.nonnegative:
            if np.any(arrays[key] < 0):
                return f"array {key!r} has negative entries", None
        reply = Reply(node, arrays, metrics)
        if spec.check is not None:
            reason = spec.check(reply)
            if reason:
                return reason, None
        return None, reply

    # ------------------------------------------------------------------ shared phases
    def discover_dimension(self) -> list[Reply]:
        """Phase 0 for point data: every node reports size, dimension and bounding box.

        The federation's dimension is the one most nodes report (ties: the smaller);
        nodes with another dimension are excluded from the run with a logged reason.
        """
        replies = self.broadcast(
            "data_summary",
            self.active_nodes,
            spec=ReplySpec(shapes={"min": (None,), "max": (None,)}, metrics=("num-examples", "dim")),
            phase="data-summary",
        )
        dims = np.array([int(r.metrics["dim"]) for r in replies])
        values, counts = np.unique(dims, return_counts=True)
        self.dimension = int(values[np.argmax(counts)])
        kept = []
        for reply in replies:
            if int(reply.metrics["dim"]) != self.dimension:
                self.exclude(
                    reply.node_id,
                    f"its data has dimension {int(reply.metrics['dim'])}, the federation's is {self.dimension}",
                )
            elif reply.arrays["min"].shape != (self.dimension,) or reply.arrays["max"].shape != (self.dimension,):
                self.exclude(
                    reply.node_id,
                    f"its data summary has shapes {reply.arrays['min'].shape}/{reply.arrays['max'].shape}, "
                    f"expected ({self.dimension},)",
                )
            else:
                kept.append(reply)
        answered = {r.node_id for r in replies}
        for failure in self.phases[-1]["failures"]:
            if failure["node"] not in answered:
                self.exclude(failure["node"], f"data summary failed: {failure['reason']}")
        return kept

    # ------------------------------------------------------------------ results
    def run(self) -> dict[str, Any]:
        """Run the algorithm; return ``{"centers": ..., "final": {...}, ...}``."""
        raise NotImplementedError

    def output_dir(self) -> Path:
        configured = self.config["output-dir"]
        if configured:
            path = Path(configured).expanduser()
        else:
            stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S-%f")
            root = Path(os.environ.get("FEDCLUSTER_OUTPUT_ROOT", "outputs"))
            path = (root / f"{stamp}-{self.config['algorithm']}").resolve()
        path.mkdir(parents=True, exist_ok=True)
        return path

    def write_result(self, outcome: dict[str, Any]) -> dict[str, Any]:
        out = self.output_dir()
        arrays = outcome.pop("arrays", {})
        centers = outcome.pop("centers", None)
        if centers is not None:
            arrays = {"centers": centers, **arrays}
        for name, value in arrays.items():
            np.save(out / f"{name}.npy", np.asarray(value))
        result = {
            "algorithm": self.config["algorithm"],
            "config": dict(self.config),
            "nodes": {"connected": len(self.nodes), "excluded": {str(k): v for k, v in self.excluded.items()}},
            "rounds": self.rounds,
            "phases": self.phases,
            **{key: _jsonable(value) for key, value in outcome.items()},
            "communication": {"bytes_up": self.bytes_up, "bytes_down": self.bytes_down},
            "wall_time_s": time.perf_counter() - self._started,
            "output_dir": str(out),
            "files": sorted(f"{name}.npy" for name in arrays),
        }
        tmp = out / "result.json.tmp"
        tmp.write_text(json.dumps(result, indent=2, default=_jsonable))
        tmp.replace(out / "result.json")
        log(INFO, "[fedcluster] result written to %s", out)
        return result


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
