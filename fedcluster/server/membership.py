"""Membership: which nodes take part, who joined late or left and why, what each declared
(the federation's dimension and scaling with it), sampling and per-node seeds. A part the
base strategy (:class:`fedcluster.server.base.FederatedStrategy`) holds; it records into
the run's :class:`fedcluster.server.results.Results`."""

from __future__ import annotations

import math
from logging import INFO, WARNING
from typing import Any, Callable

import numpy as np
from flwr.common.logger import log
from flwr.serverapp import Grid

import fedcluster.bounds as bounds
import fedcluster.protocol as protocol
from fedcluster.config import RunConfig
from fedcluster.scaling import Scaling

from .messages import Reply
from .results import Results
from .resume import match_nodes


class Membership:
    """The nodes of a run.

    Parameters
    ----------
    grid, config : the strategy's Flower grid and run config.
    rng : the server's generator (seeded by the run seed; the strategy draws from it too).
    results : the run's records (its journal, the phase and round under way, warnings).
    skips_away : a node not connected now is not sent to (off: every node is asked).
    public_reason : what result.json keeps of a reason (a private run strips numbers).
    """

    def __init__(
        self,
        grid: Grid,
        config: RunConfig,
        rng: np.random.Generator,
        results: Results,
        skips_away: bool = True,
        public_reason: Callable[[str], str] = str,
    ) -> None:
        self.grid, self.config, self.rng, self.results = grid, config, rng, results
        self.skips_away, self.public_reason = skips_away, public_reason
        self.nodes: list[int] = []
        self.excluded: dict[int, str] = {}
        self.exclusions: list[dict[str, Any]] = []  # who left, why, in which phase and round
        self.joined: list[dict[str, Any]] = []  # nodes admitted after the start (admit_newcomers)
        self.deferred: dict[int, str] = {}  # nodes whose first data summary never arrived (defer), not yet joined
        self.away_now: list[int] = []  # nodes of the run not connected in the latest round trip
        self.declared: dict[int, bounds.Declared] = {}  # what each node's first reply fixed
        self.partitions: dict[int, int | None] = {}  # what each node's first reply stated (order_key)
        self.dimension: int | None = None  # the federation's (voted, or public)
        self.scaling: Scaling | None = None  # standardize: set by the data summary (survey)
        self._connected_at: tuple[int, set[int]] | None = None  # (round trips so far, nodes connected then)
        self._missed: dict[int, int] = {}  # consecutive phases without any reply, per node
        self._order_stale = False  # a partition noted since nodes were last put in order

    def record(self) -> dict[str, Any]:
        """What result.json says of the nodes."""
        return {
            "connected": len(self.nodes),
            "active": len(self.active_nodes),
            "excluded": {str(k): v for k, v in self.excluded.items()},
            "exclusions": self.exclusions,
            "joined": self.joined,
            "deferred": {str(k): v for k, v in self.deferred.items()},
            "away_at_end": self.away_now,
        }

    @property
    def nodes(self) -> list[int]:
        """Every node that took part, excluded ones included, in :meth:`order_key` order."""
        return self._nodes

    @nodes.setter
    def nodes(self, nodes: list[int]) -> None:
        self._nodes, self._active = list(nodes), None

    def _active_state(self) -> dict[str, Any]:
        """What is derived from ``nodes`` and ``excluded``, kept until either changes (it
        is asked several times a round: a Python walk over 10⁵ nodes each time is what a
        round would otherwise pay for the population instead of the sample)."""
        if self._active is None or self._active["excluded"] != len(self.excluded):  # only exclude() adds
            self._active = {
                "excluded": len(self.excluded),
                "nodes": [node for node in self._nodes if node not in self.excluded],
            }
        return self._active

    @property
    def active_nodes(self) -> list[int]:
        """The nodes in the run, in :meth:`order_key` order."""
        return list(self._active_state()["nodes"])

    def active_points(self) -> int:
        """The points the active nodes declared (a node's declaration is fixed by its first
        reply and never changes)."""
        state = self._active_state()
        if state.get("declared") != len(self.declared):
            state["declared"] = len(self.declared)
            state["points"] = sum(self.declared[n].points for n in state["nodes"] if n in self.declared)
        return state["points"]

    def order_key(self, node: int) -> tuple[int, int, int]:
        """Nodes are ordered by the partition their first reply stated, then by node id
        (nodes that stated none come last): Flower's node ids are random per run, partitions
        are the same on every engine, so sampling and sums follow the run seed alone."""
        partition = self.partitions.get(node)
        return (0, partition, node) if partition is not None else (1, 0, node)

    def note_partition(self, node: int, metrics: Any) -> None:
        """Record the partition of a node's first reply (a later reply cannot change it);
        :meth:`reorder_nodes` puts ``nodes`` in order once a phase's replies are in."""
        if node not in self.partitions:
            self.partitions[node] = protocol.partition_of(metrics)
            self._order_stale = True

    def reorder_nodes(self) -> None:
        if self._order_stale:
            self.nodes = sorted(self.nodes, key=self.order_key)
            self._order_stale = False

    def exclude(self, node_id: int, reason: str) -> None:
        """Take a node out of the run for good: it is not sent to again, and the result
        records the reason, the phase and the round."""
        if node_id not in self.excluded:
            log(WARNING, "[fedcluster] node %s excluded from the run: %s", node_id, reason)
            reason = self.public_reason(reason)
            self.excluded[node_id] = reason
            self.exclusions.append(
                {"node": node_id, "reason": reason, "phase": self.results.phase, "round": self.results.round_number}
            )

    def defer(self, node_id: int, reason: str) -> None:
        """A node whose data summary never arrived (no reply in time, or lost in transit: a
        dropped link, nothing about its data) is not in the run yet rather than out of it: a
        newcomer again, asked to join where the strategy admits newcomers. Until it joins the
        result's coverage counts it as a device whose data the result lacks."""
        log(WARNING, "[fedcluster] node %s is not in the run yet: its data summary never arrived (%s)", node_id, reason)
        self.deferred[node_id] = self.public_reason(reason)
        self.nodes = [node for node in self._nodes if node != node_id]

    def summary_fits(self, reply: Reply) -> bool:
        """A data summary of the federation's dimension (the metric and the box agree)."""
        return int(reply.metrics[protocol.DIM]) == self.dimension and reply.arrays["min"].shape == (self.dimension,)

    def standardize(self, summaries: list[Reply]) -> None:
        """``standardize``: the federation's per-feature mean and variance from the data
        summaries' sums and scatters (pooled about the federation's mean); from now on every
        request carries the scaling, and the summaries' boxes (and what each node declared)
        are in standardized units."""
        self.scaling = Scaling.from_summaries(
            np.array([r.num_examples for r in summaries], dtype=np.float64),
            np.stack([r.arrays["sum"] for r in summaries]),
            np.stack([r.arrays["scatter"] for r in summaries]),
        )
        for reply in summaries:
            reply.arrays["min"], reply.arrays["max"] = (
                self.scaling.apply(reply.arrays["min"]),
                self.scaling.apply(reply.arrays["max"]),
            )
        for declared in self.declared.values():
            self.scale_box(declared)
        log(
            INFO,
            "[fedcluster] standardize: %d features scaled (feature scales %.3g .. %.3g)",
            self.scaling.mean.size,
            float(self.scaling.scale.min()),
            float(self.scaling.scale.max()),
        )

    def scale_box(self, declared: bounds.Declared) -> None:
        """A node's declared box, moments and rounding in standardized units."""
        if declared.low is not None and not declared.scaled:
            self.scaling.scale_declared(declared)

    def newcomers(self) -> list[int]:
        """Nodes connected now that are neither in the run nor excluded from it: SuperNodes
        that joined after the start."""
        state = self._active_state()
        if "known" not in state:
            state["known"] = set(self._nodes) | set(self.excluded)
        return sorted(self.connected() - state["known"])

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
                self.exclude(
                    reply.node_id, f"it joined with data of dimension {dim}, the federation's is {self.dimension}"
                )
                continue
            admitted.append(reply.node_id)
            self.deferred.pop(reply.node_id, None)
            round_number = self.results.round_number
            self.joined.append({"node": reply.node_id, "round": round_number, "points": int(reply.num_examples)})
            log(
                INFO,
                "[fedcluster] node %s joined the run (round %s, %d points)",
                reply.node_id,
                round_number,
                reply.num_examples,
            )
        self.nodes = sorted(self.nodes + admitted, key=self.order_key)
        return admitted

    def track_presence(self, sent: list[tuple[list[int], list[dict[str, Any]]]]) -> None:
        """After a round trip (its phases' nodes and failures, sent together): a node the
        SuperLink reports unavailable leaves at once; one from which nothing arrived in
        ``max-missed-phases`` consecutive round trips (silent, or its replies lost in transit)
        leaves then, one round trip counting once however many phases it carried. Any reply
        (even an invalid one) shows the node is there."""
        asked: dict[int, None] = {}
        arrived: set[int] = set()
        unavailable: set[int] = set()
        for nodes, failures in sent:
            kinds = {failure["node"]: failure.get("kind") for failure in failures}
            for node in nodes:
                asked[node] = None
                kind = kinds.get(node)
                if kind == "unavailable":
                    unavailable.add(node)
                elif kind not in ("timeout", "lost"):
                    arrived.add(node)
        limit = self.config.max_missed_phases
        for node in asked:
            if node in unavailable:
                self.exclude(node, "the SuperLink reports the node unavailable (NODE_UNAVAILABLE)")
            elif node in arrived:
                self._missed[node] = 0
            else:
                self._missed[node] = self._missed.get(node, 0) + 1
                if self._missed[node] >= limit:
                    self.exclude(node, f"no reply in {limit} consecutive phases (max-missed-phases)")

    def present(self, nodes: list[int]) -> set[int]:
        """Those of ``nodes`` connected now (all of them where the strategy does not skip
        nodes that are away: ``skips_away``)."""
        if not self.skips_away or not nodes:
            return set(nodes)
        connected = self.connected()
        return {node for node in nodes if node in connected}

    def connected(self) -> set[int]:
        """The nodes the grid lists as connected, asked once per round trip (in a deployment
        each question is a call to the SuperLink): newcomers, sampling and sending share it."""
        round_trips = self.results.round_trips
        if self._connected_at is None or self._connected_at[0] != round_trips:
            self._connected_at = (round_trips, set(self.results.journal.node_ids(self.live_node_ids)))
        return self._connected_at[1]

    def live_node_ids(self) -> list[int]:
        """The grid's connected nodes now (its ids; a resumed run first matches them to its
        own: :func:`fedcluster.server.resume.match_nodes`)."""
        if self.results.journal.needs_mapping:
            match_nodes(self, self.results)
        return [int(node) for node in self.grid.get_node_ids()]

    def leave_out_away(self, requests: tuple[dict[str, Any], ...]) -> tuple[list[dict[str, Any]], list[list[int]]]:
        """The broadcast requests with their nodes that are away left out, and those nodes."""
        requests = [{**request, "nodes": list(request["nodes"])} for request in requests]
        present = self.present(sorted({node for request in requests for node in request["nodes"]}))
        away = [[node for node in request["nodes"] if node not in present] for request in requests]
        self.away_now = sorted({node for nodes in away for node in nodes})
        return [{**r, "nodes": [n for n in r["nodes"] if n in present]} for r in requests], away

    def sample(self, fraction: float) -> list[int]:
        """``max(floor(fraction * M), 1)`` of the M active nodes connected now, uniformly
        without replacement (Flower's fraction of the available nodes)."""
        every = self._active_state()["nodes"]
        present = self.present(every)
        active = every if len(present) == len(every) else [node for node in every if node in present]
        self.results.note_round_away(len(every) - len(active))
        if not active:
            return []
        m = max(int(math.floor(fraction * len(active))), 1)
        if m >= len(active):
            return list(active)
        picked = self.rng.choice(len(active), size=m, replace=False)
        return [active[i] for i in sorted(picked)]

    def phase_seed(self, stream: int | None = None) -> int:
        """The seed of a phase, the same for every node (each device mixes it with its own
        partition: fedcluster.protocol.device_seed), from the server's generator; with
        ``stream``, from (run seed, stream) instead, leaving the generator untouched."""
        if stream is not None:
            return int(np.random.default_rng([self.config.seed, stream]).integers(2**31))
        return int(self.rng.integers(2**31))
