"""The base strategy every algorithm shares: a Flower strategy in the sense of
``flwr.serverapp.strategy.Strategy`` — it owns the protocol's shared phases, and an
algorithm subclasses it, implements :meth:`FederatedStrategy.run` and reads top to bottom
like its paper: phase after phase of :meth:`broadcast` and calls into ``fedcluster``.

The bookkeeping lives beside it, one job per module:

- :mod:`fedcluster.server.transport` — a task to many nodes in one round trip, every reply
  checked (the protocol table, the device's declarations, the caller's check);
- :mod:`fedcluster.server.membership` — the nodes of a run: waiting, newcomers, exclusions,
  sampling, per-node seeds;
- :mod:`fedcluster.server.results` — round records, the output folder and ``result.json``;
- :mod:`fedcluster.server.messages` — replies, bundles and the sums every algorithm takes.

Here: the phases several algorithms repeat (the data summary with the dimension vote and
``standardize``, scoring candidate center sets, federated evaluation, device labels).
"""

from __future__ import annotations

import time
from logging import INFO, WARNING
from typing import Any, Callable

import numpy as np
from flwr.common.logger import log
from flwr.serverapp import Grid

import fedcluster.bounds as bounds

import fedcluster.protocol as protocol
from fedcluster.config import RunConfig
from fedcluster.points import majority_value
from fedcluster.scaling import Scaling

from .journal import Journal
from .membership import Membership
from .messages import FederationError, Reply, sum_arrays, sum_metric  # noqa: F401 (the strategies' imports)
from .results import Results
from .run_folder import RunFolder
from .transport import Transport


# A one-time collection (k-FED's local centers, DA-UFL's setup) asks the nodes away when it
# was sent, late, or connected since, again in up to this many round trips: what it
# gathers is all the run will know of them (the default of max-missed-phases).
SETUP_RETRIES = 3


class FederatedStrategy(Membership, Transport, Results):
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

    def __init__(self, grid: Grid, config: RunConfig) -> None:
        self.grid = grid
        self.config = config
        self.rng = np.random.default_rng(config.seed)
        self.excluded: dict[int, str] = {}
        self.nodes: list[int] = []
        self.exclusions: list[dict[str, Any]] = []  # who left, why, in which phase and round
        self.joined: list[dict[str, Any]] = []  # nodes admitted after the start (admit_newcomers)
        self.away_now: list[int] = []  # nodes of the run not connected in the latest round trip
        self._connected_at: tuple[int, set[int]] | None = None  # (round trips so far, nodes connected then)
        self._missed: dict[int, int] = {}  # consecutive phases without any reply, per node
        self._order_stale = False  # a partition noted since nodes were last put in order
        self.declared: dict[int, bounds.Declared] = {}  # what each node's first reply fixed
        self.partitions: dict[int, int | None] = {}  # what each node's first reply stated (membership.order_key)
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
        self.folder: RunFolder | None = None  # the run's folder (prepare_output)
        self.journal = Journal(None)  # its exchanges with the nodes (none until prepare_output)
        self.resumes: list[dict[str, Any]] = []  # where a resumed run went live again (fedcluster.server.resume)
        self._started = time.perf_counter()

    def server_random(self, purpose: str) -> np.random.Generator:
        """The server's own randomness for ``purpose`` that must not follow from the run
        seed (a public number), one stream per purpose for the whole run: from the run
        folder's secret, so a resumed run draws the same (:class:`RunFolder.generator`)."""
        streams = self.__dict__.setdefault("_server_random", {})
        if purpose not in streams:
            streams[purpose] = self.folder.generator(purpose) if self.folder is not None else np.random.default_rng()
        return streams[purpose]

    def warn(self, text: str) -> None:
        """Say it in the log and keep it in result.json (``warnings``)."""
        log(WARNING, "[fedcluster] %s", text)
        self.warnings.append(text)

    # ------------------------------------------------------------------ shared phases
    def score_candidates(self, candidates: np.ndarray, phase: str, check: Callable | None = None) -> tuple[np.ndarray, int]:
        """The total k-means cost of every candidate center set (m, k, d) over the active
        nodes' points, in one round trip (``score_candidates``), and the points that scored
        them; ``check`` (optional): a reply it finds a reason against is dropped."""
        candidates = np.asarray(candidates)
        replies = self.broadcast("score_candidates", self.active_nodes, arrays={"candidates": candidates},
                                 sizes={"m": candidates.shape[0], "k": candidates.shape[1]}, phase=phase, check=check)
        return sum_arrays(replies, "costs"), int(sum_metric(replies))

    def ask_again(self, request: dict[str, Any], replies: list[Reply], admit: bool = True) -> list[Reply]:
        """``replies`` to a one-time query (``request``: :meth:`broadcast` arguments without
        ``nodes``) with those of the nodes of the run that were away or did not answer in
        time, and (``admit``) of newcomers (admitted with their data summary,
        :meth:`join_request`), asked again in up to :data:`SETUP_RETRIES` round trips while
        any is missing. A node whose reply was dropped is not asked again."""
        replies, first = list(replies), len(self.phases) - 1
        for _ in range(SETUP_RETRIES):
            answered = {r.node_id for r in replies}
            dropped = {f["node"] for p in self.phases[first:] if p["phase"] == request.get("phase")
                       for f in p["failures"] if f["kind"] in ("invalid", "inconsistent")}
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
            refused = {f["node"] for p in self.phases[first:] if p["phase"] == phase for f in p["failures"]
                       if f["kind"] in ("invalid", "inconsistent")}
            gone = [node for node in asked if node in self.excluded or node in refused]
            wanted = len(gone) - (len(asked) - len(sampled))  # not yet stood in for
            pool = [node for node in self.active_nodes if node not in set(asked)] if wanted > 0 else []
            present = self.present(pool)
            pool = [node for node in pool if node in present]
            if len(replies) >= required or not pool:
                break
            picked = self.rng.choice(len(pool), size=min(wanted, len(pool)), replace=False)
            stand_in = [pool[i] for i in sorted(picked)]
            log(INFO, "[fedcluster] %s: %d node(s) asked were refused or taken out of the run; %d not sampled asked "
                "in their place", phase, wanted, len(stand_in))
            asked += stand_in
            replies = sorted(replies + self.broadcast(**dict(request, nodes=stand_in, min_replies=0)),
                             key=lambda reply: self.order_key(reply.node_id))
        failures = [f for p in self.phases[first:] if p["phase"] == phase for f in p["failures"]]
        self.require(phase, len(replies), len(sampled), required, failures)
        return replies

    def vote_dimension(self, replies: list[Reply], dimension_of: Callable[[Reply], int]) -> list[Reply]:
        """Set the federation's dimension to the one most replies report (ties: the
        smaller); exclude the nodes with another. Returns the replies that agree."""
        if not replies:
            raise FederationError(f"phase {self._phase!r}: no node answered (every one away, late or its reply dropped): "
                                  "the federation's dimension is unknown")
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
        standardize = self.config.standardize
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
        summaries' sums and scatters (pooled about the federation's mean); from now on every
        request carries the scaling, and the summaries' boxes (and what each node declared)
        are in standardized units."""
        self.scaling = Scaling.from_summaries(np.array([r.num_examples for r in summaries], dtype=np.float64),
                                              np.stack([r.arrays["sum"] for r in summaries]),
                                              np.stack([r.arrays["scatter"] for r in summaries]))
        for reply in summaries:
            reply.arrays["min"], reply.arrays["max"] = self.scaling.apply(reply.arrays["min"]), self.scaling.apply(reply.arrays["max"])
        for declared in self.declared.values():
            self._scale_box(declared)
        log(INFO, "[fedcluster] standardize: %d features scaled (feature scales %.3g .. %.3g)", self.scaling.mean.size,
            float(self.scaling.scale.min()), float(self.scaling.scale.max()))

    def _scale_box(self, declared: bounds.Declared) -> None:
        """A node's declared box, moments and rounding in standardized units."""
        if declared.low is not None and not declared.scaled:
            self.scaling.scale_declared(declared)

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
        if not replies:
            raise FederationError(f"phase {phase!r}: no node answered (every one away): the cost of the centers is unknown")
        return float(sum_arrays(replies, "cost")[0]), int(sum_arrays(replies, "counts").sum())

    def run(self) -> dict[str, Any]:
        """Run the algorithm; return ``{"centers": ..., "final": {...}, ...}``."""
        raise NotImplementedError
