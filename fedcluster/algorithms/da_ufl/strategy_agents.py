"""DA-UFL's agents as they come and go: what the server holds of each (its data summary,
its bin counts, its latest step statistics), the weights it sends each, and the requests
that bring an agent in that was away or joined late. A mixin of :class:`fedcluster.algorithms.da_ufl.strategy.DAUFL`.

An agent is simply absent when it does not answer (away, late, or its reply dropped): its
contribution is missing, never wrong, and nothing is held against it. Its step statistics
stay in the server's objective as it last sent them (docs/ALGORITHMS.md §2, "Agents that
come and go"); only a reply that contradicts what the agent itself declared takes it out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

import fedcluster.protocol as protocol
from fedcluster.algorithms.da_ufl.model import bin_weights
from fedcluster.points import bounding_box

from fedcluster.server.base import SETUP_RETRIES
from fedcluster.server.messages import FederationError, Reply


@dataclass
class Statistics:
    """One agent's latest valid step reply: its gradient at the centers ``at`` and its
    weighted counts, under the labels of outer iteration ``outer`` (taken against
    ``anchor`` with the ξ of ``seed``)."""

    gradient: np.ndarray
    weight: np.ndarray
    at: np.ndarray
    outer: int
    anchor: np.ndarray
    seed: int
    points: float


class Agents:
    """State: ``bin_counts`` (node -> its points per bin), ``table`` (node -> the weights it
    is sent in this outer iteration), ``statistics`` (node -> :class:`Statistics`),
    ``point_weight`` (``weighting = uniform``), ``box`` (the federation's bounding box,
    widened by agents that join)."""

    def start_agents(self, box: tuple[np.ndarray, np.ndarray]) -> None:
        self.bin_counts: dict[int, np.ndarray] = {}
        self.table: dict[int, np.ndarray] = {}
        self.statistics: dict[int, Statistics] = {}
        self.point_weight = 1.0
        self.box = box

    def gather_summaries(
        self, summaries: list[Reply], soms: list[Reply] | None
    ) -> tuple[list[Reply], list[Reply] | None]:
        """The survey's data summaries (and SOM codebooks), with those of the agents away
        when it was taken and of newcomers, asked again in up to :data:`SETUP_RETRIES`
        round trips while any is missing."""
        summaries, soms = list(summaries), None if soms is None else list(soms)
        for _ in range(SETUP_RETRIES):
            members, joining = self.without_summary(), self.newcomers()
            if not members and not joining:
                break
            nodes = members + joining
            requests = [self.join_request(nodes)] + (
                [dict(self.som_request(), nodes=nodes, min_replies=0)] if soms is not None else []
            )
            got = self.broadcast_together(*requests)
            self.admit_newcomers([r for r in got[0] if r.node_id in joining])
            for reply in got[0]:
                if reply.node_id in members and not self.members.summary_fits(reply):
                    self.exclude(
                        reply.node_id,
                        f"its data summary has dimension {int(reply.metrics[protocol.DIM])}, "
                        f"the federation's is {self.members.dimension}",
                    )
            new = [r for r in got[0] if r.node_id not in self.members.excluded]
            summaries += new
            if soms is not None:
                soms += [r for r in got[1] if r.node_id in {s.node_id for s in new}]
        return summaries, soms

    def gather_counts(self, count_request: dict[str, Any], nodes: list[int]) -> None:
        """Bin counts of ``nodes``, those missing asked again in up to :data:`SETUP_RETRIES`
        round trips (an agent still missing then is asked with the steps)."""
        self.take_counts(self.broadcast(**count_request, nodes=nodes))
        for _ in range(SETUP_RETRIES):
            boxless = set(self.without_summary())
            missing = [node for node in self.active_nodes if node not in self.bin_counts and node not in boxless]
            if not missing:
                break
            self.take_counts(self.broadcast(**count_request, nodes=missing, min_replies=0))

    def take_counts(self, replies: list[Reply]) -> None:
        for reply in replies:
            self.bin_counts[reply.node_id] = reply.arrays["counts"]

    def counted(self) -> list[int]:
        """The active agents whose bin counts and data summary (the box its step replies are
        checked against) the server holds, in node order."""
        boxless = set(self.without_summary())
        return [node for node in self.active_nodes if node in self.bin_counts and node not in boxless]

    def renew_weights(self, uniform: bool) -> None:
        """The weights of this outer iteration (fixed during it: an agent's labels and
        weights define its statistics): w_jb = c_jb / Σ_j c_jb over every agent whose
        counts the server holds, or for ``uniform`` the one weight every point has (any
        constant gives the same step; kept from the first counts on)."""
        agents = self.counted()
        if uniform:
            self.table = {node: np.full(1, self.point_weight) for node in agents}
            return
        weights = bin_weights(np.stack([self.bin_counts[node] for node in agents])) if agents else []
        self.table = dict(zip(agents, weights))

    def without_summary(self) -> list[int]:
        """Active agents the server has no data summary (box) of: away when it was taken."""
        return [
            node
            for node in self.active_nodes
            if node not in self.members.declared or self.members.declared[node].low is None
        ]

    def catch_up_requests(self, count_request: dict[str, Any]) -> dict[str, dict[str, Any]]:
        """What this round trip also asks, beside the step: a data summary of newcomers and
        of agents without one, and the bin counts of agents with a summary but no counts.
        None of it is required (an agent away stays out until it answers)."""
        requests = {}
        present = self.present(self.active_nodes)  # an agent away now is asked when it is back
        joining = self.newcomers() + [node for node in self.without_summary() if node in present]
        if joining:
            requests["join"] = self.join_request(joining)
        missing = [
            node
            for node in self.active_nodes
            if node in present and node not in self.bin_counts and node not in joining
        ]
        if missing:
            requests["counts"] = dict(count_request, nodes=missing, min_replies=0)
        return requests

    def catch_up(self, got: dict[str, list[Reply]]) -> None:
        """Admit what :meth:`catch_up_requests` brought: newcomers join the run (another
        dimension excludes them), an agent's summary widens the federation's box, counts
        are kept (they weigh from the next outer iteration on)."""
        members = set(self.members.nodes)
        joined = got.get("join", [])
        self.admit_newcomers([r for r in joined if r.node_id not in members])
        for reply in joined:
            if reply.node_id in members and not self.members.summary_fits(reply):
                self.exclude(
                    reply.node_id,
                    f"its data summary has dimension {int(reply.metrics[protocol.DIM])}, "
                    f"the federation's is {self.members.dimension}",
                )
        for reply in joined:
            declared = self.members.declared.get(reply.node_id)
            if reply.node_id not in self.members.excluded and declared is not None and declared.low is not None:
                self.box = bounding_box([self.box[0], declared.low], [self.box[1], declared.high])
        self.take_counts(got.get("counts", []))

    def step_request(self, node: int, outer: int) -> tuple[dict[str, np.ndarray], dict[str, Any] | None]:
        """The per-agent part of a step request: its weights and, when the server holds its
        statistics under the labels of an earlier outer iteration, that iteration (the
        agent counts the labels it changed since)."""
        weights = {"weights": self.table[node]}
        held = self.statistics.get(node)
        if held is None or held.outer == outer:
            return weights, None
        return {**weights, "previous": held.anchor}, {"previous-outer": held.outer, "previous-seed": held.seed}

    def remember(
        self, replies: list[Reply], centers: np.ndarray, outer: int, anchor: np.ndarray, seed: int
    ) -> tuple[int, int]:
        """Keep every valid step reply as its agent's statistics. Returns the labels that
        changed in the server's objective (an agent's first reply in this outer iteration:
        the ones it changed since its held statistics, or all its points when none are
        held) and how many agents entered this outer iteration's labels."""
        changed = entered = 0
        for reply in replies:
            held = self.statistics.get(reply.node_id)
            if held is None or held.outer != outer:
                entered += 1
                changed += int(reply.arrays["changed"][0]) if held is not None else int(reply.num_examples)
            self.statistics[reply.node_id] = Statistics(
                reply.arrays["gradient"],
                reply.arrays["weight"],
                centers,
                outer,
                anchor,
                seed,
                float(reply.num_examples),
            )
        return changed, entered

    def forget(self, nodes: set[int]) -> int:
        """Drop the statistics of ``nodes`` (they left the run). Returns the points that
        left the server's objective."""
        gone = [node for node in nodes if node in self.statistics]
        return int(sum(self.statistics.pop(node).points for node in gone))

    def held(self) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """The statistics of every agent in the run, stacked (gradients, weights, the
        centers each was computed at), in node order; None when there are none."""
        nodes = [node for node in self.active_nodes if node in self.statistics]
        if not nodes:
            return None
        rows = [self.statistics[node] for node in nodes]
        return np.stack([r.gradient for r in rows]), np.stack([r.weight for r in rows]), np.stack([r.at for r in rows])

    def counts_array(self) -> np.ndarray:
        """Every counted agent's bin counts, (J, q) in node order (``bin_counts.npy``)."""
        agents = self.counted()
        if not agents:
            raise FederationError(
                "phase 'bin-counts': no agent sent its bin counts (every one away or its reply dropped)"
            )
        return np.stack([self.bin_counts[node] for node in agents])
