"""Opening a secure-aggregation session, the server's side: key advertisement (U1,
``secagg_setup``) and the encrypted shares routed through the server (U2,
``secagg_share_keys``), two round trips among the devices connected, set up again when devices
away leave fewer than its threshold or when a resumed run replayed its setup. A part the
secure sum (:class:`fedcluster.server.secure_sum.SecureSum`) holds; it counts the sessions."""

from __future__ import annotations

from logging import WARNING

import numpy as np
from flwr.common.logger import log

from fedcluster.secagg import device as secagg

from fedcluster.config import RunConfig
from fedcluster.server.base import SETUP_RETRIES
from fedcluster.server.membership import Membership
from fedcluster.server.messages import FederationError, Reply
from fedcluster.server.results import Results
from fedcluster.server.secure_session import Session, dealt, note_full_graph
from fedcluster.server.transport import Transport

FULL_GRAPH_NOTE = 200  # more devices than this on the full graph: a warning names secagg-neighbours


class SessionSetup:
    """Sessions opened for a run's secure sums (state: ``sessions``, how many were set up)."""

    def __init__(self, config: RunConfig, transport: Transport, members: Membership, results: Results) -> None:
        self.config, self.transport, self.members, self.results = config, transport, members, results
        self.sessions = 0

    def open(self, nodes: list[int], phase: str, floor: int, sums: int) -> Session:
        """A new session among ``nodes`` for the secure sums still planned: key advertisement
        (U1) and encrypted shares routed through the server (U2), two round trips. Replies
        whose keys do not parse, or repeat another device's, are left out of the session.
        ``floor``: a session set up again holds no sum over fewer devices than the first."""
        for _ in range(SETUP_RETRIES + 1):
            present = self.members.present(nodes)
            connected = [node for node in nodes if node in present]  # the participants: a device away holds no keys
            if len(connected) < max(2, floor) and len(nodes) >= max(2, floor):
                raise FederationError(
                    f"phase {phase!r}: secure aggregation: only {len(connected)} of its {len(nodes)} "
                    f"devices are connected, fewer than the {max(2, floor)} a secure sum needs "
                    "(at least 2, and a session set up again keeps the first one's threshold)"
                )
            session = self.attempt(connected, phase, floor, sums)
            if session is not None:
                return session
        raise FederationError(
            f"phase {phase!r}: secure aggregation: in {SETUP_RETRIES + 1} attempts fewer than the "
            "threshold of the devices asked stayed connected through a session's two round trips"
        )

    def attempt(self, nodes: list[int], phase: str, floor: int, sums: int) -> Session | None:
        """One attempt of :meth:`open` among ``nodes`` (connected when it starts); None when
        devices away at its second round trip leave fewer than its threshold."""
        if not 2 <= len(nodes) <= secagg.MAX_PARTICIPANTS:
            raise FederationError(
                f"phase {phase!r}: secure aggregation needs 2 to {secagg.MAX_PARTICIPANTS} "
                f"participants, got {len(nodes)}"
            )
        neighbours = self.config["secagg-neighbours"]
        degree = secagg.degree(len(nodes), neighbours)
        if len(nodes) > FULL_GRAPH_NOTE and degree == len(nodes) - 1:
            note_full_graph(phase, len(nodes))
        self.sessions += 1
        fraction = self.config["secagg-threshold"]
        t = max(secagg.threshold(len(nodes), fraction), floor)
        position = {node: index + 1 for index, node in enumerate(nodes)}
        share_t = secagg.threshold(degree + 1, fraction)  # t on the full graph
        common = {"session": self.sessions}
        replies = self.transport.broadcast(
            "secagg_setup",
            nodes,
            config={**common, "participants": len(nodes), "threshold": share_t, "sums": sums},
            per_node=lambda node: (None, {"position": position[node]}),
            phase=f"{phase}-setup",
            sizes={"h": sums},
            check=secagg.keys_problem,
            min_replies=t,
        )
        opened_at = self.results.journal.last  # the setup's round trip (a broadcast's last exchange)
        if self.results.journal.lost(opened_at):  # the keys came in the first attempt: gone from the devices now
            return self.reopen(nodes, phase, floor, sums)
        replies = secagg.unique_keys(
            replies, lambda r: (bytes(r.arrays["pk1"].tobytes()), bytes(r.arrays["pk2"].tobytes()))
        )
        keys = {position[r.node_id]: (r.arrays["pk1"], r.arrays["pk2"]) for r in replies}
        order = [position[r.node_id] for r in replies]
        graph, replies = self.share_keys(replies, keys, order, position, phase, sums)
        if self.results.journal.lost(
            opened_at
        ):  # the shares went round in the first attempt: gone from the devices now
            return self.reopen(nodes, phase, floor, sums)
        away_now = self.members.away_now
        if len(replies) < t and away_now:  # devices away since the keys came: set up again among those connected
            log(
                WARNING,
                "[fedcluster] %s: %d device(s) away at the key sharing leave %d of the threshold %d: the "
                "session is set up again",
                phase,
                len(away_now),
                len(replies),
                t,
            )
            return None
        self.transport.require(f"{phase}-share-keys", len(replies), len(order), t, self.results.phases[-1]["failures"])
        shared = {position[r.node_id] for r in replies}
        if len(shared) < len(nodes):
            log(
                WARNING,
                "[fedcluster] %s: %d of %d devices sit this secure-aggregation session out (no reply, keys that "
                "do not parse or repeat another device's, or shares not addressed to everyone once)",
                phase,
                len(nodes) - len(shared),
                len(nodes),
            )
        mail, hashes, commitments = dealt(replies, position, shared, self.sessions)
        session = Session(
            self.sessions,
            {n for n in nodes if position[n] in shared},
            position,
            t,
            sums,
            shared,
            {p: secagg.split_keys(bytes(keys[p][0].tobytes()), sums) for p in shared},
            {p: secagg.row_bytes(keys[p][1]) for p in shared},
            mail,
            hashes,
            commitments,
            graph,
            share_t,
            floor=floor,
            opened_at=opened_at,
        )
        return session

    def share_keys(
        self,
        replies: list[Reply],
        keys: dict[int, tuple[np.ndarray, np.ndarray]],
        order: list[int],
        position: dict[int, int],
        phase: str,
        sums: int,
    ) -> tuple[dict[int, set[int]], list[Reply]]:
        """The masking graph among the devices whose keys came (``order``: their positions) and
        the second round trip (U2): each gets its neighbours' keys, sends its encrypted shares."""
        neighbours = self.config["secagg-neighbours"]
        ring = secagg.neighbourhoods(
            len(order), neighbours, self.results.server_random("secagg-ring")
        )  # the run's secret: unknown outside, the same on resume
        graph = {
            order[i - 1]: {order[j - 1] for j in others} for i, others in ring.items()
        }  # among those whose keys came
        near = {
            p: [q for q in order if q == p or q in graph[p]] for p in order
        }  # each device's neighbourhood, itself in it

        def keys_of(mine: list[int]) -> dict[str, np.ndarray]:
            return {
                "positions": np.array(mine),
                "pk1": secagg.stack_bytes(bytes(keys[p][0].tobytes()) for p in mine),
                "pk2": secagg.stack_bytes(bytes(keys[p][1]) for p in mine),
            }

        full = secagg.degree(len(order), neighbours) == len(order) - 1  # the same request for everyone
        replies = self.transport.broadcast(
            "secagg_share_keys",
            [r.node_id for r in replies],
            config={"session": self.sessions},
            arrays=keys_of(order) if full else None,
            per_node=None if full else lambda node: (keys_of(near[position[node]]), None),
            phase=f"{phase}-share-keys",
            min_replies=0,
            sizes={"h": sums},
            check=lambda r: secagg.destinations_problem(
                r.arrays["destinations"], near[position[r.node_id]], position[r.node_id]
            ),
        )
        return graph, replies

    def reopen(self, nodes: list[int], phase: str, floor: int, sums: int) -> Session:
        """A session whose setup the journal replayed up to its end, set up again live among the
        same nodes (its keys and shares were the first attempt's devices': gone with their run)."""
        log(
            WARNING,
            "[fedcluster] %s: the secure-aggregation session set up before the resume is set up again "
            "(the devices no longer hold its keys)",
            phase,
        )
        return self.open(nodes, f"{phase}-again", floor, sums)
