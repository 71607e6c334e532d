"""The base strategy every algorithm shares: a Flower strategy in the sense of
``flwr.serverapp.strategy.Strategy`` — it owns the protocol's shared phases, and an
algorithm subclasses it, implements :meth:`FederatedStrategy.run` and reads top to bottom
like its paper: phase after phase of :meth:`broadcast` and calls into ``fedcluster``.

The bookkeeping is three parts the strategy holds, each with its own state, each given
the parts it needs when it is built:

- ``results`` (:mod:`fedcluster.server.results`) — round and phase records, warnings, the
  output folder and its journal, ``result.json``;
- ``members`` (:mod:`fedcluster.server.membership`, given ``results``) — the nodes of a run:
  waiting, newcomers, exclusions, what each declared, sampling, per-node seeds;
- ``transport`` (:mod:`fedcluster.server.transport`, given ``members`` and ``results``) — a
  task to many nodes in one round trip, every reply checked (the protocol table, the
  device's declarations, the caller's check).

The strategy keeps thin methods that hand on to them (:meth:`broadcast`,
:meth:`begin_round`, :meth:`exclude`, ...), so that an algorithm reads as its phases.
Replies, bundles and the sums every algorithm takes: :mod:`fedcluster.server.messages`.

Here: the phases several algorithms repeat (the data summary with the dimension vote and
``standardize``, scoring candidate center sets, federated evaluation, device labels).
"""

from __future__ import annotations

from logging import INFO
from typing import Any, Callable

import numpy as np
from flwr.common.logger import log
from flwr.serverapp import Grid

import fedcluster.protocol as protocol
from fedcluster.config import RunConfig
from fedcluster.points import majority_value

from .membership import Membership
from .messages import FederationError, Reply, sum_arrays, sum_metric  # noqa: F401 (the strategies' imports)
from .results import Results
from .startup import wait_for_nodes
from .transport import Transport


# A one-time collection (k-FED's local centers, DA-UFL's setup) asks the nodes away when it
# was sent, late, or connected since, again in up to this many round trips: what it
# gathers is all the run will know of them (the default of max-missed-phases).
SETUP_RETRIES = 3


class FederatedStrategy:
    """Base of every fedcluster strategy. Subclasses implement :meth:`run`.

    Parameters
    ----------
    grid : the Flower ``Grid`` (deployment, simulation or the in-process runner).
    config : the full, validated run config (``fedcluster.config.with_defaults``), frozen,
        its keys read typed as attributes (``config.num_rounds``).
    """

    name = "base"
    # A node one of whose replies was invalid is taken out of the rest of the run (FedDP:
    # a device that broke its clipping or its cap is not asked for anything else, its
    # evaluation included). Off elsewhere: an invalid reply costs only its phase.
    exclude_invalid = False
    # A node that is not connected now (missing from the grid's get_node_ids(): a phone
    # asleep) is not sent to and not held against: it may come back. Off for graphs, whose
    # every client's edges are needed: there a missing client fails the phase, as before.
    skips_away = True
    private = False  # a private run refuses to start while the same job stands unfinished beside it

    def __init__(self, grid: Grid, config: RunConfig) -> None:
        self.grid = grid
        self.config = config
        self.rng = np.random.default_rng(config.seed)
        self.results = Results(config, private=self.private)
        self.members = Membership(grid, config, self.rng, self.results, self.skips_away, self.public_reason)
        self.transport = Transport(grid, config, self.members, self.results, self.exclude_invalid, self.public_reason)

    def public_reason(self, reason: str) -> str:
        """What ``result.json`` keeps of a reason a node's reply failed or it was excluded
        (a private run overrides this: the numbers in a reason describe a device's data)."""
        return reason

    # ------------------------------------------------------------------ the parts, handed on
    def broadcast(self, task: str, nodes, **request: Any) -> list[Reply]:
        """:meth:`Transport.broadcast`: ``task`` to ``nodes``, the valid replies in node order."""
        return self.transport.broadcast(task, nodes, **request)

    def broadcast_together(self, *requests: dict[str, Any]) -> list[list[Reply]]:
        return self.transport.broadcast_together(*requests)

    def required_replies(self, sent: int) -> int:
        return self.transport.required_replies(sent)

    def require(self, phase: str, replies: int, sent: int, required: int, failures: list[dict[str, Any]]) -> None:
        self.transport.require(phase, replies, sent, required, failures)

    @property
    def active_nodes(self) -> list[int]:
        return self.members.active_nodes

    def exclude(self, node_id: int, reason: str) -> None:
        self.members.exclude(node_id, reason)

    def sample(self, fraction: float) -> list[int]:
        return self.members.sample(fraction)

    def phase_seed(self, stream: int | None = None) -> int:
        return self.members.phase_seed(stream)

    def present(self, nodes: list[int]) -> set[int]:
        return self.members.present(nodes)

    def newcomers(self) -> list[int]:
        return self.members.newcomers()

    def join_request(self, nodes: list[int]) -> dict[str, Any]:
        return self.members.join_request(nodes)

    def admit_newcomers(self, replies: list[Reply]) -> list[int]:
        return self.members.admit_newcomers(replies)

    def begin_round(self, number: int) -> None:
        self.results.begin_round(number)

    def end_round(self, **metrics: Any) -> dict[str, Any]:
        return self.results.end_round(**metrics)

    def warn(self, text: str) -> None:
        self.results.warn(text)

    def server_random(self, purpose: str) -> np.random.Generator:
        return self.results.server_random(purpose)

    def wait_for_nodes(self) -> list[int]:
        return wait_for_nodes(self.members, self.name)

    # ------------------------------------------------------------------ shared phases
    def score_candidates(
        self, candidates: np.ndarray, phase: str, check: Callable | None = None
    ) -> tuple[np.ndarray, int]:
        """The total k-means cost of every candidate center set (m, k, d) over the active
        nodes' points, in one round trip (``score_candidates``), and the points that scored
        them; ``check`` (optional): a reply it finds a reason against is dropped."""
        candidates = np.asarray(candidates)
        replies = self.broadcast(
            "score_candidates",
            self.active_nodes,
            arrays={"candidates": candidates},
            sizes={"m": candidates.shape[0], "k": candidates.shape[1]},
            phase=phase,
            check=check,
        )
        return sum_arrays(replies, "costs"), int(sum_metric(replies))

    def ask_again(self, request: dict[str, Any], replies: list[Reply], admit: bool = True) -> list[Reply]:
        """``replies`` to a one-time query (``request``: :meth:`broadcast` arguments without
        ``nodes``) with those of the nodes of the run that were away or did not answer in
        time, and (``admit``) of newcomers (admitted with their data summary,
        :meth:`join_request`), asked again in up to :data:`SETUP_RETRIES` round trips while
        any is missing. A node whose reply was dropped is not asked again."""
        replies, first = list(replies), len(self.results.phases) - 1
        for _ in range(SETUP_RETRIES):
            answered = {r.node_id for r in replies}
            dropped = self.refused_since(first, request.get("phase"))
            missing = [node for node in self.active_nodes if node not in answered and node not in dropped]
            joining = self.newcomers() if admit else []
            if not missing and not joining:
                break
            requests = [dict(request, nodes=missing + joining, min_replies=0)]
            if joining:
                requests.append(self.join_request(joining))
            got = self.broadcast_together(*requests)
            admitted = set(self.admit_newcomers(got[1])) if joining else set()
            replies += [r for r in got[0] if r.node_id in admitted or r.node_id in missing]
        return replies

    def refill(self, request: dict[str, Any], replies: list[Reply], first: int) -> list[Reply]:
        """The replies to a sampled phase (``request``: :meth:`broadcast` arguments, its
        ``nodes`` the sample, sent with ``min_replies=0`` as the phases from ``first`` on
        record) held to the quorum of the sample. When sampled nodes' replies were refused
        (a lie, a malformed reply) or they were taken out of the run (the SuperLink reports
        them gone) and the valid replies fall short, as many active nodes connected and not
        sampled are drawn in their place and asked in one more round trip, as
        :meth:`ask_again` asks the nodes away: a few liars in a sample stop no round the
        honest nodes can carry. Below the quorum then, the phase fails naming its failures
        (nodes that are late are waited for, not replaced)."""
        sampled, phase = list(request["nodes"]), request.get("phase") or request["task"]
        required = self.required_replies(len(sampled)) if request.get("min_replies") is None else request["min_replies"]
        asked = list(sampled)
        for _ in range(SETUP_RETRIES):  # a stand-in may lie too
            wanted, pool = self.stand_in_pool(asked, len(sampled), self.refused_since(first, phase))
            if len(replies) >= required or not pool:
                break
            picked = self.rng.choice(len(pool), size=min(wanted, len(pool)), replace=False)
            stand_in = [pool[i] for i in sorted(picked)]
            log(
                INFO,
                "[fedcluster] %s: %d node(s) asked were refused or taken out of the run; %d not sampled asked "
                "in their place",
                phase,
                wanted,
                len(stand_in),
            )
            asked += stand_in
            replies = sorted(
                replies + self.broadcast(**dict(request, nodes=stand_in, min_replies=0)),
                key=lambda reply: self.members.order_key(reply.node_id),
            )
        failures = [f for p in self.results.phases[first:] if p["phase"] == phase for f in p["failures"]]
        self.require(phase, len(replies), len(sampled), required, failures)
        return replies

    def refused_since(self, first: int, phase: str | None) -> set[int]:
        """The nodes whose replies to ``phase`` were refused (a lie, a malformed reply) in
        the phases recorded from ``first`` on."""
        return {
            f["node"]
            for p in self.results.phases[first:]
            if p["phase"] == phase
            for f in p["failures"]
            if f["kind"] in ("invalid", "inconsistent")
        }

    def stand_in_pool(self, asked: list[int], sampled: int, refused: set[int]) -> tuple[int, list[int]]:
        """How many of the ``asked`` nodes (the first ``sampled`` of them the sample) still
        want a stand-in, refused or out of the run, and the active nodes connected and not
        asked that may stand in."""
        gone = [node for node in asked if node in self.members.excluded or node in refused]
        wanted = len(gone) - (len(asked) - sampled)  # not yet stood in for
        pool = [node for node in self.active_nodes if node not in set(asked)] if wanted > 0 else []
        present = self.present(pool)
        return wanted, [node for node in pool if node in present]

    def vote_dimension(self, replies: list[Reply], dimension_of: Callable[[Reply], int]) -> list[Reply]:
        """Set the federation's dimension to the one most replies report (ties: the
        smaller); exclude the nodes with another. Returns the replies that agree."""
        if not replies:
            raise FederationError(
                f"phase {self.results.phase!r}: no node answered (every one away, late or its reply dropped): "
                "the federation's dimension is unknown"
            )
        dims = [int(dimension_of(reply)) for reply in replies]
        dimension = self.members.dimension = majority_value(dims)
        kept = []
        for reply, dim in zip(replies, dims):
            if dim != dimension:
                self.exclude(reply.node_id, f"its data has dimension {dim}, the federation's is {dimension}")
            else:
                kept.append(reply)
        return kept

    def discover_dimension(self) -> list[Reply]:
        """Phase 0 for point data: every node reports size, dimension and bounding box.

        The federation's dimension is the one most nodes report; nodes with another
        dimension, or whose summary failed, are excluded from the run; one whose summary never
        arrived (no reply in time, lost in transit) is not in it yet (``Membership.defer``)."""
        return self.survey()[0]

    def survey(self, *together: dict[str, Any]) -> tuple[list[Reply], list[list[Reply]]]:
        """:meth:`discover_dimension`, with other queries to every active node (dicts of
        :meth:`broadcast` arguments without ``nodes``) in the same round trip. Their
        replies are kept only from nodes that stay in the run and, where the protocol table
        gives a reply array the dimension ``d``, only when it is the federation's."""
        standardize = self.config.standardize
        requests = [dict(task="data_summary", nodes=self.active_nodes, phase="data-summary", config={"moments": True})]
        if not standardize:  # the other queries travel with the data summary (with standardize they need its scaling)
            requests += [{"nodes": self.active_nodes, **request} for request in together]
        first = len(self.results.phases)
        replies, *others = self.broadcast_together(*requests)
        self.results.phase = "data-summary"  # exclusions below belong to the data summary
        kept = self.vote_dimension(replies, lambda reply: reply.metrics[protocol.DIM])
        kept = [r for r in kept if self.members.summary_fits(r)]
        answered = {r.node_id for r in replies}
        for failure in self.results.phases[first]["failures"]:
            if failure["node"] in answered:
                continue
            if failure["kind"] in ("timeout", "lost"):  # nothing arrived: nothing is known of its data
                self.members.defer(failure["node"], failure["reason"])
            else:
                self.exclude(failure["node"], f"data summary failed: {failure['reason']}")
        if standardize:
            self.members.standardize(kept)
            if together:
                others = self.broadcast_together(
                    *[{"nodes": [r.node_id for r in kept], **request} for request in together]
                )
        staying = {r.node_id for r in kept}

        def fits(reply: Reply, task: protocol.Task) -> bool:
            return reply.node_id in staying and all(
                reply.arrays[f.name].shape[f.shape.index("d")] == self.members.dimension
                for f in task.reply
                if "d" in f.shape and f.name in reply.arrays
            )

        tasks = [protocol.task(request["task"]) for request in together]
        return kept, [[r for r in group if fits(r, task)] for group, task in zip(others, tasks)]

    def write_device_labels(self, centers: np.ndarray) -> dict[str, Any]:
        """``write-labels``: every active device saves its points' nearest-center labels
        beside its data file; only whether it did comes back."""
        replies = self.broadcast(
            "write_labels",
            self.active_nodes,
            arrays={"centers": centers},
            sizes={"k": centers.shape[0]},
            phase="write-labels",
            min_replies=0,
        )
        written = sum(1 for r in replies if r.arrays["written"][0] > 0)
        log(
            INFO,
            "[fedcluster] labels saved on %d of %d devices (fedcluster-labels/ beside each data file)",
            written,
            len(self.active_nodes),
        )
        if written < len(replies):
            self.warn(f"{len(replies) - written} devices hold generated data (no data file): they saved no labels")
        return {
            "devices": written,
            "asked": len(self.active_nodes),
            "where": "fedcluster-labels/<data file stem>.npy beside each device's data file",
        }

    def evaluate(self, centers: np.ndarray, phase: str = "evaluation") -> tuple[float, int]:
        """Federated k-means cost of ``centers`` on every active node: ``(total cost, points)``."""
        replies = self.broadcast(
            "lloyd_stats", self.active_nodes, arrays={"centers": centers}, sizes={"k": centers.shape[0]}, phase=phase
        )
        if not replies:
            raise FederationError(
                f"phase {phase!r}: no node answered (every one away): the cost of the centers is unknown"
            )
        return float(sum_arrays(replies, "cost")[0]), int(sum_arrays(replies, "counts").sum())

    def run(self) -> dict[str, Any]:
        """Run the algorithm; return ``{"centers": ..., "final": {...}, ...}``."""
        raise NotImplementedError
