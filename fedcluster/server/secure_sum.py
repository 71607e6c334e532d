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
from fedcluster.server.secure_session import Session
from fedcluster.server.secure_setup import SessionSetup
from fedcluster.server.secure_sum_checks import SecaggChecks
from fedcluster.server.transport import Transport


NO_NOISE = "no noise is added: the sum is exact (no differential privacy)"  # the threat model's words on noise


class SecureSum:
    """``summed``: the sum of a summable task's replies, in the clear or securely. Parameters:

    config : the run config (``secure-aggregation``, ``secagg-*``).
    transport, members, results : the strategy's parts (sending, who is connected, records).
    noise_model : the threat model's words on noise (a strategy with DP says who adds it).
    unmasking : called when the server is about to ask for the shares that unmask the
        current sum (a strategy whose devices add noise enters the release in its ledger).
    """

    def __init__(
        self,
        config: RunConfig,
        transport: Transport,
        members: Membership,
        results: Results,
        noise_model: Callable[[], str] = lambda: NO_NOISE,
        unmasking: Callable[[], None] = lambda: None,
    ) -> None:
        self.config, self.transport, self.members, self.results = config, transport, members, results
        self.noise_model, self.unmasking = noise_model, unmasking
        self.checks = SecaggChecks(transport, members)
        self.setup = SessionSetup(config, transport, members, results)
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
        return {
            "sessions": self.setup.sessions,
            "sums": sum(s.used for s in self.history),
            "threshold_fraction": self.config["secagg-threshold"],
            "neighbours": self.config["secagg-neighbours"] or "all",
            "out_of_range": list(self.rejected),
            **self.checks.record(),
            "threat_model": "the server sees each secured step's sum over at least the threshold of devices, never one "
            "device's; "
            + self.noise_model()
            + "; honest-but-curious server: it follows the protocol (its random masking graph "
            "included), relays the devices' public keys unchanged and names the noise the devices add"
            + (
                "; fewer than the Shamir threshold of any device's neighbours collude with the server"
                if self.config["secagg-neighbours"]
                else ""
            ),
        }

    def summed(
        self,
        task: str,
        nodes: list[int],
        arrays: dict[str, np.ndarray],
        config: dict[str, Any],
        sizes: dict[str, int],
        check: Callable[[Reply], str | None] | None,
        phase: str,
        ranges: dict[str, float],
        noise: dict[str, tuple[float, float]] | None = None,
    ) -> tuple[dict[str, np.ndarray] | None, list[int]]:
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
            replies = self.transport.broadcast(
                task, nodes, arrays=arrays, config=config, sizes=sizes, check=check, phase=phase
            )
            return {name: sum(r.arrays[name] for r in replies) for name in ranges}, [r.node_id for r in replies]
        noise = noise or {}
        total, summed = self.secure_sum(task, nodes, arrays, config, sizes, phase, ranges, noise)
        if total is None or secagg.within_ranges(total, ranges, len(summed), noise, self.session.threshold):
            return total, summed
        self.rejected = (*self.rejected, phase)
        self.failure = (
            f"the secure sum of {len(summed)} devices lies outside their public ranges (a device masked "
            "something else; secure aggregation hides which)"
        )
        log(WARNING, "[fedcluster] %s: %s: this update is skipped", phase, self.failure)
        return None, summed

    def secure_sum(
        self,
        task: str,
        nodes: list[int],
        arrays: dict[str, np.ndarray],
        config: dict[str, Any],
        sizes: dict[str, int],
        phase: str,
        ranges: dict[str, float],
        noise: dict[str, tuple[float, float]],
    ) -> tuple[dict[str, np.ndarray] | None, list[int]]:
        """The sum and the devices in it, set up again in a new session as long as an attempt
        abandons it before its unmasking (refused shares: without the accusers that lied
        or the senders whose shares did not open, :meth:`SecaggChecks.disputes`; a graph too
        thin or split to unmask). None for a sum a liar's shares keep masked."""
        while True:
            outcome = self.attempt(task, nodes, arrays, config, sizes, phase, ranges, noise)
            if not isinstance(outcome, set):
                return outcome
            nodes = [node for node in nodes if node not in outcome]

    def attempt(
        self,
        task: str,
        nodes: list[int],
        arrays: dict[str, np.ndarray],
        config: dict[str, Any],
        sizes: dict[str, int],
        phase: str,
        ranges: dict[str, float],
        noise: dict[str, tuple[float, float]],
    ) -> tuple[dict[str, np.ndarray] | None, list[int]] | set[int]:
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
        refusals = {
            position[r.node_id]: refused
            for r in replies
            if (refused := secagg.refused_positions(r.arrays["secagg-refused"]))
        }
        if refusals:  # masks that do not cancel: this sum is never unmasked, the session starts again without the liars
            out = self.checks.disputes(session, refusals, phase)
            session.members -= out
            self.again(session, [node for node in nodes if node not in out], phase, "after refused shares")
            return out
        alive, in_sum = [position[r.node_id] for r in replies], [r.node_id for r in replies]
        if self.results.journal.lost(
            session.opened_at
        ):  # a resumed run: the devices no longer hold this session's seeds
            log(
                WARNING,
                "[fedcluster] %s: the run was resumed between masking and unmasking; the sum is set up "
                "again in a new session (the masked one was never unmasked)",
                phase,
            )
            self.again(session, in_sum, phase, "after the resume")
            return set()
        dropped = sorted(asked - set(alive))
        if session.short(alive, dropped) or not secagg.connected(alive, session.graph):
            # some masks could not come off, or each part of the graph would come out on its own: never unmasked
            log(
                WARNING,
                "[fedcluster] %s: the %d devices in the sum leave a masking neighbourhood too thin to unmask, "
                "or the graph split: a new session sets it up again among them",
                phase,
                len(in_sum),
            )
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
            if not (
                session is None
                or session.used == session.sums
                or self.results.journal.lost(session.opened_at)
                or session.short({session.position[n] for n in nodes if n in session.members and n in present})
            ):
                return session, present
            session = self.open(nodes, phase, session.floor if session else 0)
        raise FederationError(
            f"phase {phase!r}: secure aggregation: in {SETUP_RETRIES + 1} sessions fewer than the "
            f"threshold {session.threshold} of their devices were connected when the sum was asked"
        )

    def masked(
        self,
        session: Session,
        task: str,
        nodes: list[int],
        arrays: dict[str, np.ndarray],
        config: dict[str, Any],
        sizes: dict[str, int],
        phase: str,
        ranges: dict[str, float],
        levels: dict[str, float],
        noise: dict[str, tuple[float, float]],
    ) -> list[Reply]:
        """The masked replies (U3) of ``nodes`` to the secure variant of ``task``: the sum is
        over exactly these; each device masks with the others asked."""
        position, t = session.position, session.threshold
        asked = {position[node] for node in nodes}

        def forwarded(node: int) -> tuple[dict[str, np.ndarray], None]:  # the shares, until its first masked reply came
            return secagg.forwarded(
                session.inbox(position[node]) if position[node] not in session.delivered else []
            ), None

        request = {
            **arrays,
            "secagg-ranges": np.array(list(ranges.values())),
            "secagg-levels": np.array(list(levels.values())),  # and each device's share of the noise
            "secagg-noise": np.array([noise.get(name, (0.0, 0.0))[0] / t for name in ranges]),
            "secagg-absent": np.array(sorted(session.shared - asked), dtype=np.int64),
        }
        return self.transport.broadcast(
            protocol.secure_name(task),
            nodes,
            per_node=forwarded,
            sizes={**sizes, "i": len(position)},
            phase=phase,
            arrays=request,
            config={**config, "secagg-session": session.number, "secagg-sum": session.used},
            min_replies=max(t, self.transport.required_replies(len(nodes))),
            check=lambda r: secagg.refusals_problem(  # only shares forwarded to it
                r.arrays["secagg-refused"], session.sources(position[r.node_id]), position[r.node_id]
            ),
        )

    def again(self, session: Session, rest: list[int], phase: str, why: str) -> None:
        """The current sum, abandoned (never unmasked; the session's earlier sums stand), set
        up again among ``rest`` in a new session: never over fewer devices than the first
        session's threshold."""
        floor = session.floor or session.threshold
        session.used -= 1
        if len(rest) < floor:
            raise FederationError(
                f"phase {phase!r}: {why} {len(rest)} devices are left for secure aggregation, fewer "
                f"than the threshold {floor}"
            )
        self.session = self.open(rest, f"{phase}-again", floor)

    def open(self, nodes: list[int], phase: str, floor: int = 0) -> Session:
        """A new session among ``nodes`` for the secure sums still planned (:class:`SessionSetup`)."""
        sums = max(1, int(self.planned) - sum(s.used for s in self.history))
        session = self.setup.open(nodes, phase, floor, sums)
        self.history = (*self.history, session)
        self.session = session
        return session
