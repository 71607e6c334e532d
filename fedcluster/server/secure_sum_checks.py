"""Secure aggregation, the server's checks of what devices reveal (the pure checks are
:mod:`fedcluster.secagg.checks`; the reasoning in docs/security.md): a refusal of another
device's shares is settled by that device's proof, and the unmasking checks every revealed
seed and every returned share against the commitments made with the shares. A device
caught lying is named and excluded from the run; the sum is completed without it where the
others' shares allow.

A mixin of :class:`fedcluster.server.secure_sum.SecureAggregation` (state: ``config``, a strategy's
``broadcast`` and ``exclude``)."""

from __future__ import annotations

from logging import WARNING
from typing import TYPE_CHECKING, Any

import numpy as np
from flwr.common.logger import log

from fedcluster.secagg import device as secagg
from fedcluster.secagg import checks as checks

from fedcluster.server.base import SETUP_RETRIES
from fedcluster.server.messages import FederationError, Reply

if TYPE_CHECKING:
    from fedcluster.server.secure_session import Session


class SecaggChecks:
    """Disputes over refused shares, and the checked unmasking of a sum."""

    secagg_liars: tuple[int, ...] = ()  # nodes a check named (excluded from the run)
    secagg_refused: tuple[int, ...] = ()  # nodes left out of a session: shares that did not open, as their holder said
    secagg_incomplete: tuple[str, ...] = ()  # phases whose sum a liar's shares kept masked
    secagg_failure: str = ""  # why the last secure sum came back as None

    def secagg_liar(self, session: "Session", node: int, reason: str) -> None:
        self.secagg_liars = (*self.secagg_liars, node)
        session.members.discard(node)
        self.exclude(node, f"secure aggregation: {reason}")

    def secagg_disputes(self, session: "Session", refusals: dict[int, list[int]], phase: str) -> set[int]:
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

        replies = self.broadcast("secagg_prove", [node_of[p] for p in accused], config={"session": session.number},
                                 per_node=asked, phase=f"{phase}-prove", min_replies=0, check=one_key_each)
        proofs = {(position[r.node_id], holder): secagg.row_bytes(row, strip=False)
                  for r in replies for holder, row in zip(accused[position[r.node_id]], r.arrays["scalars"])}
        false, failed = {}, set()
        for sender, accusers in accused.items():
            for holder in accusers:
                row, point, digest = session.mail[(sender, holder)]
                fault = checks.share_fault(secagg.row_bytes(row), secagg.row_bytes(point, strip=False),
                                           proofs.get((sender, holder)), session.pk2[holder], session.number, sender,
                                           holder, digest, session.sums)
                if fault is None:
                    false.setdefault(holder, []).append(node_of[sender])
                else:
                    failed.add(sender)
        for holder, senders in sorted(false.items()):
            self.secagg_liar(session, node_of[holder], f"refused the shares of node(s) {senders}, which the server opened "
                                                      "with their sender's proven key (a false accusation)")
        failed -= set(false)
        self.secagg_refused = (*self.secagg_refused, *sorted(node_of[p] for p in failed))
        log(WARNING, "[fedcluster] %s: shares refused; %d accuser(s) lied and are excluded, %d device(s) whose shares did "
            "not open sit this session out, and a new session starts", phase, len(false), len(failed))
        return {node_of[p] for p in set(false) | failed}

    def secagg_unmasked(self, session: "Session", index: int, masked: list[Reply], dropped: list[int],
                        ranges: dict[str, float], levels: dict[str, float],
                        phase: str) -> tuple[dict[str, np.ndarray] | None, list[int]]:
        """The float sum of sum ``index`` over the devices whose ``masked`` reply came
        (``dropped``: the positions asked that sent none), unmasked with every revealed
        seed and every returned share checked (:mod:`fedcluster.secagg.checks`). A device
        whose own seed fails its commitment is taken out of the sum as if it had dropped
        before masking, where the rest can be unmasked without it (else its seed is rebuilt
        from its shares); a share that fails names its holder; shares that match their
        commitments but rebuild another secret name their dealer. Every liar is excluded
        from the run. When the liars' lies leave a secret that cannot be rebuilt, the sum
        stays masked (None, the phase listed); when honest devices are too few, the run stops."""
        position, node_of, t, number = session.position, session.node_of, session.share_threshold, session.number
        vectors = {position[r.node_id]: r.arrays for r in masked}
        alive, total = sorted(vectors), secagg.masked_total(vectors.values(), ranges)
        shares: dict[tuple[str, int], dict[int, bytes]] = {}  # (kind, dealer) -> holder -> the share it returned
        liars: dict[int, str] = {}

        def unmask(targets: list[int], gone: list[int], recover: list[int], suffix: str) -> dict[int, Reply]:
            def among_neighbours(node: int) -> tuple[dict[str, np.ndarray], None]:
                near = session.graph[position[node]]
                return {"dropped": np.array([p for p in gone if p in near], dtype=np.int64),
                        "recover": np.array([p for p in recover if p in near], dtype=np.int64)}, None

            request = dict(task="secagg_unmask", phase=f"{phase}-{suffix}", min_replies=0,
                           config={"session": number, "sum": index}, per_node=among_neighbours)
            replies = self.broadcast(**request, nodes=[node_of[p] for p in targets])
            for _ in range(SETUP_RETRIES):  # the same request to those away or late: they hold the shares
                failed = {f["node"] for f in self.results.phases[-1]["failures"] if f["kind"] != "timeout"}
                answered = {r.node_id for r in replies}
                again = [node_of[p] for p in targets if node_of[p] not in answered | failed and node_of[p] in self.active_nodes]
                if not again:
                    break
                replies += self.broadcast(**request, nodes=again)
            for r in replies:
                for kind in ("b", "sk"):
                    for dealer, row in zip(r.arrays[f"{kind}-positions"], r.arrays[f"{kind}-shares"]):
                        shares.setdefault((kind, int(dealer)), {})[position[r.node_id]] = secagg.row_bytes(row, strip=False)
            return {position[r.node_id]: r for r in replies}

        # each survivor's own seed, checked, and its dropped neighbours' mask-key shares
        answered, seeds = unmask(alive, dropped, [], "unmask"), {}
        for p, r in answered.items():
            seed = secagg.row_bytes(r.arrays["seed"], strip=False)
            if checks.seed_commitment(seed, number, p, index) == session.seed_commitments[p][index - 1]:
                seeds[p] = seed
            else:
                liars[p] = "sent a wrong value of its own mask seed at the unmasking (not the one it committed to)"
        rest, grown = [p for p in alive if p not in liars], False
        if liars and not session.short(rest, dropped + list(liars)) and secagg.connected(rest, session.graph):
            total = secagg.without(total, [vectors[p] for p in liars])  # their vectors out: as if dropped before masking
            alive, dropped, grown = rest, sorted(dropped + list(liars)), True
        missing = [p for p in alive if p not in seeds]  # no answer, or a liar that cannot be taken out: rebuild its seed
        if missing or grown:
            unmask([p for p in answered if p not in liars], dropped, missing, "recover")

        seed_liars = set(liars)
        secrets, short, spoilt = {}, [], set()  # spoilt: the liars whose lies keep the sum masked
        for kind, dealers in (("b", missing), ("sk", dropped)):
            for p in dealers:
                commitment = session.seed_commitments[p][index - 1] if kind == "b" else session.pk1[p][index - 1]
                given = {h: s for h, s in shares.get((kind, p), {}).items() if h in session.graph[p]}
                got = checks.rebuilt(
                    given, lambda h: checks.hash_of(session.share_hashes.get((p, h), b""), index, kind),
                    lambda h, s: checks.share_hash(s, number, p, h, index, kind), t,
                    (lambda s: checks.seed_commitment(s, number, p, index) == commitment) if kind == "b"
                    else (lambda s: checks.scalar_matches(s, commitment)))
                what = "seed" if kind == "b" else "mask key"
                for h in got.bad_holders:
                    liars.setdefault(h, f"returned a share of another device's {what} that is not the one its dealer "
                                        "committed to")
                if got.secret is not None:
                    secrets[(kind, p)] = got.secret
                elif got.dealer_lied:
                    liars[p] = f"dealt shares of its {what} that match its commitments but do not rebuild it"
                    spoilt.add(p)
                elif p in seed_liars or len(given) >= t:  # its own lie, or shares enough but for the false ones
                    spoilt |= ({p} & seed_liars) | set(got.bad_holders)
                else:
                    short.append(p)
        for p, reason in sorted(liars.items()):
            self.secagg_liar(session, node_of[p], reason)
        if short:  # the sum stays masked and the run stops; never set up again (docs/security.md)
            raise FederationError(f"phase {phase!r}: secure aggregation: fewer than {t} shares to unmask positions {short} "
                                  "(too few of their neighbours answered the unmasking)")
        in_sum = [node_of[p] for p in alive]
        if spoilt:  # never set up again either: the liars could unmask this sum later and subtract
            self.secagg_incomplete = (*self.secagg_incomplete, phase)
            self.secagg_failure = (f"the secure sum stays masked: node(s) {sorted(node_of[p] for p in spoilt)} lied at its "
                                   "unmasking and the other devices' shares cannot make up for it (named and excluded)")
            log(WARNING, "[fedcluster] %s: %s; this update is skipped", phase, self.secagg_failure)
            return None, in_sum
        seeds.update({p: s for (kind, p), s in secrets.items() if kind == "b"})
        sk1 = {p: s for (kind, p), s in secrets.items() if kind == "sk"}
        total = secagg.unmasked_sum(total, ranges, secagg.stream_name(number, index),
                                    {p: session.pk1[p][index - 1] for p in alive}, {p: seeds[p] for p in alive}, sk1,
                                    levels, session.graph)
        return total, in_sum

    def secagg_check_record(self) -> dict[str, Any]:
        """What result.json says of the devices the checks caught."""
        return {"left_out_over_refused_shares": list(self.secagg_refused), "excluded_liars": sorted(set(self.secagg_liars)),
                "incomplete": list(self.secagg_incomplete)}
