"""Secure aggregation, the server's side: a session (two round trips of declared tasks,
``secagg_setup`` and ``secagg_share_keys``) serves the run's planned secure sums, each two
more round trips (``secure_<task>``, ``secagg_unmask``), with the unmasking done by
:mod:`fedcluster.secagg`. The server routes public keys and encrypted shares (keeping what
each device committed to), sums masked integer vectors, and learns only the sum of the
participants whose masked reply arrived (U3); a participant that drops after that is
still in the sum, recovered from the others' shares while at least t of them answer. What
devices reveal is checked, and refusals settled, in ``fedcluster/server/secure_sum_checks.py``.

An object a strategy holds and calls (as Flower's server holds its SecAgg+ workflow),
given the strategy's parts; a private strategy's plan gives it its hooks."""

from __future__ import annotations

from logging import WARNING
from typing import Any, Callable

import numpy as np
from flwr.common.logger import log

import fedcluster.protocol as protocol
from fedcluster.secagg import device as secagg

from fedcluster.config import RunConfig
from fedcluster.server.base import SETUP_RETRIES
from fedcluster.server.membership import Membership
from fedcluster.server.messages import FederationError, Reply
from fedcluster.server.results import Results
from fedcluster.server.secure_session import Session, dealt, note_full_graph
from fedcluster.server.secure_sum_checks import SecaggChecks
from fedcluster.server.transport import Transport


FULL_GRAPH_NOTE = 200  # more devices than this on the full graph: a warning names secagg-neighbours
NO_NOISE = "no noise is added: the sum is exact (no differential privacy)"  # the threat model's words on noise


class SecureSum:
    """``summed``: the sum of a summable task's replies, in the clear or securely. Parameters:

    config : the run config (``secure-aggregation``, ``secagg-*``).
    transport, members, results : the strategy's parts (sending, who is connected, records).
    noise_model : the threat model's words on noise (a strategy with DP says who adds it).
    unmasking : called when the server is about to ask for the shares that unmask the
        current sum (a strategy whose devices add noise enters the release in its ledger).
    """

    def __init__(self, config: RunConfig, transport: Transport, members: Membership, results: Results,
                 noise_model: Callable[[], str] = lambda: NO_NOISE, unmasking: Callable[[], None] = lambda: None) -> None:
        self.config, self.transport, self.members, self.results = config, transport, members, results
        self.noise_model, self.unmasking = noise_model, unmasking
        self.checks = SecaggChecks(transport, members)
        self.sessions = 0
        self.planned = 1  # the secure sums a run will ask (the strategy sets it)
        self.session: Session | None = None  # the current one
        self.history: tuple[Session, ...] = ()  # every session of the run
        self.rejected: tuple[str, ...] = ()  # phases whose secure sum lay outside every device's range
        self.failure = ""  # why the last secure sum came back as None

    @property
    def enabled(self) -> bool:
        return bool(self.config["secure-aggregation"])

    def record(self) -> dict[str, Any]:
        """What result.json says about secure aggregation (threat model: docs/security.md)."""
        return {"sessions": self.sessions, "sums": sum(s.used for s in self.history),
                "threshold_fraction": self.config["secagg-threshold"],
                "neighbours": self.config["secagg-neighbours"] or "all",
                "out_of_range": list(self.rejected), **self.checks.record(),
                "threat_model": "the server sees each secured step's sum over at least the threshold of devices, never one "
                                "device's; " + self.noise_model()
                                + "; honest-but-curious server: it follows the protocol (its random masking graph "
                                  "included), relays the devices' public keys unchanged and names the noise the devices add"
                                + ("; fewer than the Shamir threshold of any device's neighbours collude with the server"
                                   if self.config["secagg-neighbours"] else "")}

    def summed(self, task: str, nodes: list[int], arrays: dict[str, np.ndarray], config: dict[str, Any],
               sizes: dict[str, int], check: Callable[[Reply], str | None] | None, phase: str, ranges: dict[str, float],
               noise: dict[str, tuple[float, float]] | None = None) -> tuple[dict[str, np.ndarray] | None, list[int]]:
        """The sum of the ``ranges``' arrays over the valid replies to ``task``, and the
        devices in it (node ids). Secure mode: no reply check beyond the masked shapes is possible
        (``check`` is not used), ``ranges`` (public, fixed before the round) clip every
        coordinate on the device, ``noise`` gives each array's (variance in grid steps, grid
        levels) when the devices add the noise. The sum is None when it lies outside what
        that many devices' ranges allow (some device masked something else: secure
        aggregation hides which), or when a liar's shares keep it masked (the liar named):
        the phase is listed, :attr:`failure` says why, and the caller skips the update
        or stops."""
        if not self.enabled:
            replies = self.transport.broadcast(task, nodes, arrays=arrays, config=config, sizes=sizes, check=check, phase=phase)
            return {name: sum(r.arrays[name] for r in replies) for name in ranges}, [r.node_id for r in replies]
        noise = noise or {}
        total, summed = self.secure_sum(task, nodes, arrays, config, sizes, phase, ranges, noise)
        if total is None or secagg.within_ranges(total, ranges, len(summed), noise, self.session.threshold):
            return total, summed
        self.rejected = (*self.rejected, phase)
        self.failure = (f"the secure sum of {len(summed)} devices lies outside their public ranges (a device masked "
                        "something else; secure aggregation hides which)")
        log(WARNING, "[fedcluster] %s: %s: this update is skipped", phase, self.failure)
        return None, summed

    def secure_sum(self, task: str, nodes: list[int], arrays: dict[str, np.ndarray], config: dict[str, Any],
                   sizes: dict[str, int], phase: str, ranges: dict[str, float],
                   noise: dict[str, tuple[float, float]]) -> tuple[dict[str, np.ndarray] | None, list[int]]:
        """The sum and the devices in it, set up again in a new session as long as an attempt
        abandons it before its unmasking (refused shares: without the accusers that lied
        or the senders whose shares did not open, :meth:`SecaggChecks.disputes`; a graph too
        thin or split to unmask). None for a sum a liar's shares keep masked."""
        while True:
            outcome = self.attempt(task, nodes, arrays, config, sizes, phase, ranges, noise)
            if not isinstance(outcome, set):
                return outcome
            nodes = [node for node in nodes if node not in outcome]

    def attempt(self, task: str, nodes: list[int], arrays: dict[str, np.ndarray], config: dict[str, Any],
                sizes: dict[str, int], phase: str, ranges: dict[str, float],
                noise: dict[str, tuple[float, float]]) -> tuple[dict[str, np.ndarray] | None, list[int]] | set[int]:
        """One attempt at the sum: the masked replies (U3), then the unmasking; the nodes to
        leave out (a set) when it is abandoned before its unmasking and set up again."""
        session, present = self.session_for(nodes, phase)
        nodes = [node for node in nodes if node in session.members and node in present]  # keys failed: sits it out
        session.used += 1
        index, position = session.used, session.position
        asked = {position[node] for node in nodes}
        levels = {name: noise.get(name, (0.0, secagg.HALF_LEVELS))[1] for name in ranges}
        replies = self.masked(session, task, nodes, arrays, config, sizes, phase, ranges, levels, noise)
        session.delivered |= {position[r.node_id] for r in replies}
        refusals = {position[r.node_id]: refused for r in replies if (refused := secagg.refused_positions(r.arrays["secagg-refused"]))}
        if refusals:  # masks that do not cancel: this sum is never unmasked, the session starts again without the liars
            out = self.checks.disputes(session, refusals, phase)
            session.members -= out
            self.again(session, [node for node in nodes if node not in out], phase, "after refused shares")
            return out
        alive, in_sum = [position[r.node_id] for r in replies], [r.node_id for r in replies]
        if self.results.journal.lost(session.opened_at):  # a resumed run: the devices no longer hold this session's seeds
            log(WARNING, "[fedcluster] %s: the run was resumed between masking and unmasking; the sum is set up "
                "again in a new session (the masked one was never unmasked)", phase)
            self.again(session, in_sum, phase, "after the resume")
            return set()
        dropped = sorted(asked - set(alive))
        if session.short(alive, dropped) or not secagg.connected(alive, session.graph):
            # some masks could not come off, or each part of the graph would come out on its own: never unmasked
            log(WARNING, "[fedcluster] %s: the %d devices in the sum leave a masking neighbourhood too thin to unmask, "
                "or the graph split: a new session sets it up again among them", phase, len(in_sum))
            self.again(session, in_sum, phase, "after dropouts")
            return set()
        # the unmasking, every seed and share checked; never set up again once it began: with shares a device
        # withheld, the server could unmask this sum later and subtract the sum set up again among fewer devices
        self.unmasking()
        total, in_sum = self.checks.unmasked(session, index, replies, dropped, ranges, levels, phase)
        if total is None:
            self.failure = self.checks.failure
        return total, in_sum

    def session_for(self, nodes: list[int], phase: str) -> tuple[Session, set[int]]:
        """The session the next sum of ``nodes`` is masked in, and those of them connected
        now: the current one, or a new one when it is used up, was opened before a resumed
        run went live (gone from the devices), or those connected cannot unmask a sum."""
        session = self.session
        for _ in range(SETUP_RETRIES + 1):
            # a device away now is not asked (the others mask without it)
            present = self.members.present(nodes)
            if not (session is None or session.used == session.sums or self.results.journal.lost(session.opened_at)
                    or session.short({session.position[n] for n in nodes if n in session.members and n in present})):
                return session, present
            session = self.open(nodes, phase, session.floor if session else 0)
        raise FederationError(f"phase {phase!r}: secure aggregation: in {SETUP_RETRIES + 1} sessions fewer than the "
                              f"threshold {session.threshold} of their devices were connected when the sum was asked")

    def masked(self, session: Session, task: str, nodes: list[int], arrays: dict[str, np.ndarray],
               config: dict[str, Any], sizes: dict[str, int], phase: str, ranges: dict[str, float],
               levels: dict[str, float], noise: dict[str, tuple[float, float]]) -> list[Reply]:
        """The masked replies (U3) of ``nodes`` to the secure variant of ``task``: the sum is
        over exactly these; each device masks with the others asked."""
        position, t = session.position, session.threshold
        asked = {position[node] for node in nodes}

        def forwarded(node: int) -> tuple[dict[str, np.ndarray], None]:  # the shares, until its first masked reply came
            return secagg.forwarded(session.inbox(position[node]) if position[node] not in session.delivered else []), None

        request = {**arrays, "secagg-ranges": np.array(list(ranges.values())),
                   "secagg-levels": np.array(list(levels.values())),  # and each device's share of the noise
                   "secagg-noise": np.array([noise.get(name, (0.0, 0.0))[0] / t for name in ranges]),
                   "secagg-absent": np.array(sorted(session.shared - asked), dtype=np.int64)}
        return self.transport.broadcast(
            protocol.secure_name(task), nodes, per_node=forwarded, sizes={**sizes, "i": len(position)}, phase=phase,
            arrays=request, config={**config, "secagg-session": session.number, "secagg-sum": session.used},
            min_replies=max(t, self.transport.required_replies(len(nodes))), check=lambda r: secagg.refusals_problem(  # only shares forwarded to it
                r.arrays["secagg-refused"], session.sources(position[r.node_id]), position[r.node_id]))

    def again(self, session: Session, rest: list[int], phase: str, why: str) -> None:
        """The current sum, abandoned (never unmasked; the session's earlier sums stand), set
        up again among ``rest`` in a new session: never over fewer devices than the first
        session's threshold."""
        floor = session.floor or session.threshold
        session.used -= 1
        if len(rest) < floor:
            raise FederationError(f"phase {phase!r}: {why} {len(rest)} devices are left for secure aggregation, fewer "
                                  f"than the threshold {floor}")
        self.session = self.open(rest, f"{phase}-again", floor)

    def open(self, nodes: list[int], phase: str, floor: int = 0) -> Session:
        """A new session among ``nodes`` for the secure sums still planned: key advertisement
        (U1) and encrypted shares routed through the server (U2), two round trips. Replies
        whose keys do not parse, or repeat another device's, are left out of the session.
        ``floor``: a session set up again holds no sum over fewer devices than the first."""
        for _ in range(SETUP_RETRIES + 1):
            present = self.members.present(nodes)
            connected = [node for node in nodes if node in present]  # the participants: a device away holds no keys
            if len(connected) < max(2, floor) and len(nodes) >= max(2, floor):
                raise FederationError(f"phase {phase!r}: secure aggregation: only {len(connected)} of its {len(nodes)} "
                                      f"devices are connected, fewer than the {max(2, floor)} a secure sum needs "
                                      "(at least 2, and a session set up again keeps the first one's threshold)")
            session = self.setup(connected, phase, floor)
            if session is not None:
                return session
        raise FederationError(f"phase {phase!r}: secure aggregation: in {SETUP_RETRIES + 1} attempts fewer than the "
                              "threshold of the devices asked stayed connected through a session's two round trips")

    def setup(self, nodes: list[int], phase: str, floor: int) -> Session | None:
        """One attempt of :meth:`open` among ``nodes`` (connected when it starts); None when
        devices away at its second round trip leave fewer than its threshold."""
        if not 2 <= len(nodes) <= secagg.MAX_PARTICIPANTS:
            raise FederationError(f"phase {phase!r}: secure aggregation needs 2 to {secagg.MAX_PARTICIPANTS} "
                                  f"participants, got {len(nodes)}")
        neighbours = self.config["secagg-neighbours"]
        degree = secagg.degree(len(nodes), neighbours)
        if len(nodes) > FULL_GRAPH_NOTE and degree == len(nodes) - 1:
            note_full_graph(phase, len(nodes))
        self.sessions += 1
        sums = max(1, int(self.planned) - sum(s.used for s in self.history))
        fraction = self.config["secagg-threshold"]
        t = max(secagg.threshold(len(nodes), fraction), floor)
        position = {node: index + 1 for index, node in enumerate(nodes)}
        share_t = secagg.threshold(degree + 1, fraction)  # t on the full graph
        common = {"session": self.sessions}
        replies = self.transport.broadcast(
            "secagg_setup", nodes, config={**common, "participants": len(nodes), "threshold": share_t, "sums": sums},
            per_node=lambda node: (None, {"position": position[node]}), phase=f"{phase}-setup",
            sizes={"h": sums}, check=secagg.keys_problem, min_replies=t)
        opened_at = self.results.journal.last  # the setup's round trip (a broadcast's last exchange)
        if self.results.journal.lost(opened_at):  # the keys came in the first attempt: gone from the devices now
            return self.reopen(nodes, phase, floor)
        replies = secagg.unique_keys(replies, lambda r: (bytes(r.arrays["pk1"].tobytes()), bytes(r.arrays["pk2"].tobytes())))
        keys = {position[r.node_id]: (r.arrays["pk1"], r.arrays["pk2"]) for r in replies}
        order = [position[r.node_id] for r in replies]
        graph, replies = self.share_keys(replies, keys, order, position, phase, sums)
        if self.results.journal.lost(opened_at):  # the shares went round in the first attempt: gone from the devices now
            return self.reopen(nodes, phase, floor)
        away_now = self.members.away_now
        if len(replies) < t and away_now:  # devices away since the keys came: set up again among those connected
            log(WARNING, "[fedcluster] %s: %d device(s) away at the key sharing leave %d of the threshold %d: the "
                "session is set up again", phase, len(away_now), len(replies), t)
            return None
        self.transport.require(f"{phase}-share-keys", len(replies), len(order), t, self.results.phases[-1]["failures"])
        shared = {position[r.node_id] for r in replies}
        if len(shared) < len(nodes):
            log(WARNING, "[fedcluster] %s: %d of %d devices sit this secure-aggregation session out (no reply, keys that "
                "do not parse or repeat another device's, or shares not addressed to everyone once)", phase,
                len(nodes) - len(shared), len(nodes))
        mail, hashes, commitments = dealt(replies, position, shared, self.sessions)
        session = Session(self.sessions, {n for n in nodes if position[n] in shared}, position, t, sums, shared,
                          {p: secagg.split_keys(bytes(keys[p][0].tobytes()), sums) for p in shared},
                          {p: secagg.row_bytes(keys[p][1]) for p in shared}, mail, hashes, commitments, graph, share_t,
                          floor=floor, opened_at=opened_at)
        self.history = (*self.history, session)
        self.session = session
        return session

    def share_keys(self, replies: list[Reply], keys: dict[int, tuple[np.ndarray, np.ndarray]], order: list[int],
                   position: dict[int, int], phase: str, sums: int) -> tuple[dict[int, set[int]], list[Reply]]:
        """The masking graph among the devices whose keys came (``order``: their positions) and
        the second round trip (U2): each gets its neighbours' keys, sends its encrypted shares."""
        neighbours = self.config["secagg-neighbours"]
        ring = secagg.neighbourhoods(len(order), neighbours, self.results.server_random("secagg-ring"))  # the run's secret: unknown outside, the same on resume
        graph = {order[i - 1]: {order[j - 1] for j in others} for i, others in ring.items()}  # among those whose keys came
        near = {p: [q for q in order if q == p or q in graph[p]] for p in order}  # each device's neighbourhood, itself in it

        def keys_of(mine: list[int]) -> dict[str, np.ndarray]:
            return {"positions": np.array(mine), "pk1": secagg.stack_bytes(bytes(keys[p][0].tobytes()) for p in mine),
                    "pk2": secagg.stack_bytes(bytes(keys[p][1]) for p in mine)}

        full = secagg.degree(len(order), neighbours) == len(order) - 1  # the same request for everyone
        replies = self.transport.broadcast(
            "secagg_share_keys", [r.node_id for r in replies], config={"session": self.sessions},
            arrays=keys_of(order) if full else None,
            per_node=None if full else lambda node: (keys_of(near[position[node]]), None),
            phase=f"{phase}-share-keys", min_replies=0, sizes={"h": sums},
            check=lambda r: secagg.destinations_problem(r.arrays["destinations"], near[position[r.node_id]],
                                                        position[r.node_id]))
        return graph, replies

    def reopen(self, nodes: list[int], phase: str, floor: int) -> Session:
        """A session whose setup the journal replayed up to its end, set up again live among the
        same nodes (its keys and shares were the first attempt's devices': gone with their run)."""
        log(WARNING, "[fedcluster] %s: the secure-aggregation session set up before the resume is set up again "
            "(the devices no longer hold its keys)", phase)
        return self.open(nodes, f"{phase}-again", floor)

