"""Secure aggregation, the server's checks of what devices reveal (the pure checks are
:mod:`fedcluster.secagg.checks`; the reasoning in docs/security.md): a refusal of another
device's shares is settled by that device's proof, and the unmasking checks every revealed
seed and every returned share against the commitments made with the shares. A device
caught lying is named and excluded from the run; the sum is completed without it where the
others' shares allow.

Held by the secure sum (:class:`fedcluster.server.secure_sum.SecureSum`), given the
strategy's transport and membership; its state is what it caught."""

from __future__ import annotations

from logging import WARNING
from typing import TYPE_CHECKING, Any

import numpy as np
from flwr.common.logger import log

from fedcluster.secagg import device as secagg
from fedcluster.secagg import checks as checks

from fedcluster.server.base import SETUP_RETRIES
from fedcluster.server.membership import Membership
from fedcluster.server.messages import FederationError, Reply
from fedcluster.server.transport import Transport

if TYPE_CHECKING:
    from fedcluster.server.secure_session import Session


class SecaggChecks:
    """Disputes over refused shares, and the checked unmasking of a sum."""

    def __init__(self, transport: Transport, members: Membership) -> None:
        self.transport, self.members = transport, members
        self.liars: tuple[int, ...] = ()  # nodes a check named (excluded from the run)
        self.refused: tuple[
            int, ...
        ] = ()  # nodes left out of a session: shares that did not open, as their holder said
        self.incomplete: tuple[str, ...] = ()  # phases whose sum a liar's shares kept masked
        self.failure = ""  # why the last unmasking left its sum masked

    def liar(self, session: "Session", node: int, reason: str) -> None:
        self.liars = (*self.liars, node)
        session.members.discard(node)
        self.members.exclude(node, f"secure aggregation: {reason}")

    def disputes(self, session: "Session", refusals: dict[int, list[int]], phase: str) -> set[int]:
        """Settle every refusal of a masked sum (``refusals``: position -> the positions
        whose share it refused): each refused device is asked for the ephemeral keys of its
        tokens to its accusers, and the server opens each token as its holder does. A token
        that opens makes its accuser a liar (excluded from the run); one that does not, or
        no proof, leaves its sender out of the session (its reply may have been damaged on
        the way: not a proven lie). Returns the nodes that leave the session."""
        position, node_of = session.position, session.node_of
        accused = checks.accused(refusals)

        def asked(node: int) -> tuple[dict[str, np.ndarray], None]:
            return {"positions": np.array(accused[position[node]], dtype=np.int64)}, None

        def one_key_each(reply: Reply) -> str | None:
            if len(reply.arrays["scalars"]) != len(accused[position[reply.node_id]]):
                return "not one key per refused share"
            return None

        replies = self.transport.broadcast(
            "secagg_prove",
            [node_of[p] for p in accused],
            config={"session": session.number},
            per_node=asked,
            phase=f"{phase}-prove",
            min_replies=0,
            check=one_key_each,
        )
        proofs = {
            (position[r.node_id], holder): secagg.row_bytes(row, strip=False)
            for r in replies
            for holder, row in zip(accused[position[r.node_id]], r.arrays["scalars"])
        }
        false, failed = {}, set()
        for sender, accusers in accused.items():
            for holder in accusers:
                row, point, digest = session.mail[(sender, holder)]
                fault = checks.share_fault(
                    secagg.row_bytes(row),
                    secagg.row_bytes(point, strip=False),
                    proofs.get((sender, holder)),
                    session.pk2[holder],
                    session.number,
                    sender,
                    holder,
                    digest,
                    session.sums,
                )
                if fault is None:
                    false.setdefault(holder, []).append(node_of[sender])
                else:
                    failed.add(sender)
        for holder, senders in sorted(false.items()):
            self.liar(
                session,
                node_of[holder],
                f"refused the shares of node(s) {senders}, which the server opened "
                "with their sender's proven key (a false accusation)",
            )
        failed -= set(false)
        self.refused = (*self.refused, *sorted(node_of[p] for p in failed))
        log(
            WARNING,
            "[fedcluster] %s: shares refused; %d accuser(s) lied and are excluded, %d device(s) whose shares did "
            "not open sit this session out, and a new session starts",
            phase,
            len(false),
            len(failed),
        )
        return {node_of[p] for p in set(false) | failed}

    def unmasked(
        self,
        session: "Session",
        index: int,
        masked: list[Reply],
        dropped: list[int],
        ranges: dict[str, float],
        levels: dict[str, float],
        phase: str,
    ) -> tuple[dict[str, np.ndarray] | None, list[int]]:
        """The float sum of sum ``index`` over the devices whose ``masked`` reply came
        (``dropped``: the positions asked that sent none), unmasked with every revealed
        seed and every returned share checked (:mod:`fedcluster.secagg.checks`). A device
        whose own seed fails its commitment is taken out of the sum as if it had dropped
        before masking, where the rest can be unmasked without it (else its seed is rebuilt
        from its shares); a share that fails names its holder; shares that match their
        commitments but rebuild another secret name their dealer. Every liar is excluded
        from the run. When the liars' lies leave a secret that cannot be rebuilt, the sum
        stays masked (None, the phase listed); when honest devices are too few, the run stops."""
        position, node_of, t = session.position, session.node_of, session.share_threshold
        vectors = {position[r.node_id]: r.arrays for r in masked}
        alive, total = sorted(vectors), secagg.masked_total(vectors.values(), ranges)
        shares: dict[tuple[str, int], dict[int, bytes]] = {}  # (kind, dealer) -> holder -> the share it returned

        # each survivor's own seed, checked, and its dropped neighbours' mask-key shares
        answered = self.unmask(session, index, alive, dropped, [], f"{phase}-unmask", shares)
        seeds, liars = self.own_seeds(session, index, answered)
        grown = self.can_leave_out(session, alive, dropped, liars)
        if grown:
            total = secagg.without(
                total, [vectors[p] for p in liars]
            )  # their vectors out: as if dropped before masking
            alive, dropped = [p for p in alive if p not in liars], sorted(dropped + list(liars))
        missing = [
            p for p in alive if p not in seeds
        ]  # no answer, or a liar that cannot be taken out: rebuild its seed
        if missing or grown:
            self.unmask(
                session, index, [p for p in answered if p not in liars], dropped, missing, f"{phase}-recover", shares
            )
        secrets, short, spoilt = self.rebuild(session, index, shares, missing, dropped, liars)
        self.name_liars(session, liars)
        if short:  # the sum stays masked and the run stops; never set up again (docs/security.md)
            raise FederationError(
                f"phase {phase!r}: secure aggregation: fewer than {t} shares to unmask positions {short} "
                "(too few of their neighbours answered the unmasking)"
            )
        in_sum = [node_of[p] for p in alive]
        if spoilt:  # never set up again either: the liars could unmask this sum later and subtract
            self.incomplete = (*self.incomplete, phase)
            self.failure = (
                f"the secure sum stays masked: node(s) {sorted(node_of[p] for p in spoilt)} lied at its "
                "unmasking and the other devices' shares cannot make up for it (named and excluded)"
            )
            log(WARNING, "[fedcluster] %s: %s; this update is skipped", phase, self.failure)
            return None, in_sum
        return opened(session, index, total, alive, seeds, secrets, ranges, levels), in_sum

    @staticmethod
    def can_leave_out(session: "Session", alive: list[int], dropped: list[int], liars: dict[int, str]) -> bool:
        """Whether the devices whose seed lied can be taken out of the sum as if dropped
        before masking: the rest still unmask, on a graph still connected."""
        rest = [p for p in alive if p not in liars]
        return bool(liars) and not session.short(rest, dropped + list(liars)) and secagg.connected(rest, session.graph)

    def name_liars(self, session: "Session", liars: dict[int, str]) -> None:
        for p, reason in sorted(liars.items()):
            self.liar(session, session.node_of[p], reason)

    def unmask(
        self,
        session: "Session",
        index: int,
        targets: list[int],
        gone: list[int],
        recover: list[int],
        phase: str,
        shares: dict[tuple[str, int], dict[int, bytes]],
    ) -> dict[int, Reply]:
        """Ask ``targets`` (positions) for their own seed of sum ``index`` and their shares of
        the neighbours ``gone`` (mask keys) and ``recover`` (seeds), those away or late again
        (they hold the shares); the shares returned are kept in ``shares``. Returns the
        replies by position."""
        position, node_of = session.position, session.node_of

        def among_neighbours(node: int) -> tuple[dict[str, np.ndarray], None]:
            near = session.graph[position[node]]
            return {
                "dropped": np.array([p for p in gone if p in near], dtype=np.int64),
                "recover": np.array([p for p in recover if p in near], dtype=np.int64),
            }, None

        request = dict(
            task="secagg_unmask",
            phase=phase,
            min_replies=0,
            config={"session": session.number, "sum": index},
            per_node=among_neighbours,
        )
        replies = self.transport.broadcast(**request, nodes=[node_of[p] for p in targets])
        for _ in range(SETUP_RETRIES):  # the same request to those away or late: they hold the shares
            failed = {
                f["node"] for f in self.transport.results.phases[-1]["failures"] if f["kind"] not in ("timeout", "lost")
            }
            answered = {r.node_id for r in replies}
            active = self.members.active_nodes
            again = [node_of[p] for p in targets if node_of[p] not in answered | failed and node_of[p] in active]
            if not again:
                break
            replies += self.transport.broadcast(**request, nodes=again)
        for r in replies:
            for kind in ("b", "sk"):
                for dealer, row in zip(r.arrays[f"{kind}-positions"], r.arrays[f"{kind}-shares"]):
                    shares.setdefault((kind, int(dealer)), {})[position[r.node_id]] = secagg.row_bytes(row, strip=False)
        return {position[r.node_id]: r for r in replies}

    @staticmethod
    def own_seeds(
        session: "Session", index: int, answered: dict[int, Reply]
    ) -> tuple[dict[int, bytes], dict[int, str]]:
        """Each answering survivor's own mask seed of sum ``index`` where it matches its
        commitment, and the liars whose seed does not."""
        seeds, liars = {}, {}
        for p, r in answered.items():
            seed = secagg.row_bytes(r.arrays["seed"], strip=False)
            if checks.seed_commitment(seed, session.number, p, index) == session.seed_commitments[p][index - 1]:
                seeds[p] = seed
            else:
                liars[p] = "sent a wrong value of its own mask seed at the unmasking (not the one it committed to)"
        return seeds, liars

    @staticmethod
    def rebuild(
        session: "Session",
        index: int,
        shares: dict[tuple[str, int], dict[int, bytes]],
        missing: list[int],
        dropped: list[int],
        liars: dict[int, str],
    ) -> tuple[dict[tuple[str, int], bytes], list[int], set[int]]:
        """The secrets rebuilt from the returned ``shares``: the seeds of ``missing`` and the
        mask keys of ``dropped``, each share checked. Adds to ``liars`` the holders whose
        shares fail and the dealers whose shares rebuild another secret. Returns the
        secrets by (kind, dealer), the dealers short of shares, and the liars whose lies
        keep the sum masked."""
        t, number = session.share_threshold, session.number
        seed_liars = set(liars)
        secrets, short, spoilt = {}, [], set()  # spoilt: the liars whose lies keep the sum masked
        for kind, dealers in (("b", missing), ("sk", dropped)):
            for p in dealers:
                commitment = session.seed_commitments[p][index - 1] if kind == "b" else session.pk1[p][index - 1]
                given = {h: s for h, s in shares.get((kind, p), {}).items() if h in session.graph[p]}
                got = checks.rebuilt(
                    given,
                    lambda h: checks.hash_of(session.share_hashes.get((p, h), b""), index, kind),
                    lambda h, s: checks.share_hash(s, number, p, h, index, kind),
                    t,
                    (lambda s: checks.seed_commitment(s, number, p, index) == commitment)
                    if kind == "b"
                    else (lambda s: checks.scalar_matches(s, commitment)),
                )
                what = "seed" if kind == "b" else "mask key"
                for h in got.bad_holders:
                    liars.setdefault(
                        h, f"returned a share of another device's {what} that is not the one its dealer committed to"
                    )
                if got.secret is not None:
                    secrets[(kind, p)] = got.secret
                elif got.dealer_lied:
                    liars[p] = f"dealt shares of its {what} that match its commitments but do not rebuild it"
                    spoilt.add(p)
                elif p in seed_liars or len(given) >= t:  # its own lie, or shares enough but for the false ones
                    spoilt |= ({p} & seed_liars) | set(got.bad_holders)
                else:
                    short.append(p)
        return secrets, short, spoilt

    def record(self) -> dict[str, Any]:
        """What result.json says of the devices the checks caught."""
        return {
            "left_out_over_refused_shares": list(self.refused),
            "excluded_liars": sorted(set(self.liars)),
            "incomplete": list(self.incomplete),
        }


def opened(
    session: "Session",
    index: int,
    total: Any,
    alive: list[int],
    seeds: dict[int, bytes],
    secrets: dict[tuple[str, int], bytes],
    ranges: dict[str, float],
    levels: dict[str, float],
) -> dict[str, np.ndarray]:
    """The float sum of sum ``index`` over ``alive``: the masked ``total`` with every mask
    taken off (the survivors' seeds, those rebuilt, and the dropped devices' mask keys)."""
    seeds = {**seeds, **{p: s for (kind, p), s in secrets.items() if kind == "b"}}
    sk1 = {p: s for (kind, p), s in secrets.items() if kind == "sk"}
    return secagg.unmasked_sum(
        total,
        ranges,
        secagg.stream_name(session.number, index),
        {p: session.pk1[p][index - 1] for p in alive},
        {p: seeds[p] for p in alive},
        sk1,
        levels,
        session.graph,
    )
