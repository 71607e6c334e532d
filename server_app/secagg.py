"""Secure aggregation, the server's side: one secure sum is four round trips of declared
tasks (``secagg_setup``, ``secagg_share_keys``, ``secure_<task>``, ``secagg_unmask``) through
the transport, with the unmasking done by :mod:`fedcluster.secagg`. The server routes
public keys and encrypted shares, sums masked integer vectors, and learns only the sum of
the participants whose masked reply arrived (U3); a participant that drops after that is
still in the sum, recovered from the others' shares while at least t of them answer.

A mixin of :class:`server_app.base.FederatedStrategy` (state: ``config``)."""

from __future__ import annotations

from logging import WARNING
from typing import Any, Callable

import numpy as np
from flwr.common.logger import log

from fedcluster import protocol, secagg

from .messages import FederationError, Reply


class SecureAggregation:
    """``summed``: the sum of a summable task's replies, in the clear or securely."""

    secagg_sessions = 0
    secagg_rejected: list[str]  # phases whose secure sum lay outside every device's range

    @property
    def secure(self) -> bool:
        return bool(self.config["secure-aggregation"])

    def secagg_record(self) -> dict[str, Any]:
        """What result.json says about secure aggregation (threat model: docs/security.md)."""
        return {"sums": self.secagg_sessions, "threshold_fraction": self.config["secagg-threshold"],
                "out_of_range": list(getattr(self, "secagg_rejected", [])),
                "threat_model": "the server sees each secured step's sum over at least the threshold of devices, never one "
                                "device's; it adds the noise to that exact sum (central DP), and it is trusted to relay "
                                "the devices' public keys unchanged (honest-but-curious)"}

    def summed(self, task: str, nodes: list[int], arrays: dict[str, np.ndarray], config: dict[str, Any],
               sizes: dict[str, int], check: Callable[[Reply], str | None] | None, phase: str,
               ranges: dict[str, float]) -> tuple[dict[str, np.ndarray], int]:
        """The sum of the ``ranges``' arrays over the valid replies to ``task``, and how many
        devices are in it. Secure mode: no reply check beyond the masked shapes is possible
        (``check`` is not used), ``ranges`` (public, fixed before the round) clip every
        coordinate on the device, and a sum outside what that many devices' ranges allow
        (some device added something else) is None: the caller skips the update, and the
        phase is listed, as the culprit cannot be named."""
        if not self.secure:
            replies = self.broadcast(task, nodes, arrays=arrays, config=config, sizes=sizes, check=check, phase=phase)
            return {name: sum(r.arrays[name] for r in replies) for name in ranges}, len(replies)
        total, count = self.secure_sum(task, nodes, arrays, config, sizes, phase, ranges)
        if secagg.within_ranges(total, ranges, count):
            return total, count
        self.secagg_rejected = [*getattr(self, "secagg_rejected", []), phase]
        log(WARNING, "[fedcluster] %s: the secure sum of %d devices lies outside their public ranges (a device sent "
            "something else; secure aggregation hides which): this update is skipped", phase, count)
        return None, count

    def secure_sum(self, task: str, nodes: list[int], arrays: dict[str, np.ndarray], config: dict[str, Any],
                   sizes: dict[str, int], phase: str, ranges: dict[str, float]) -> tuple[dict[str, np.ndarray], int]:
        self.secagg_sessions += 1
        session, n = self.secagg_sessions, len(nodes)
        t = secagg.threshold(n, self.config["secagg-threshold"])
        if n < 2 or n > secagg.MAX_PARTICIPANTS:
            raise FederationError(f"phase {phase!r}: secure aggregation needs 2 to {secagg.MAX_PARTICIPANTS} participants, got {n}")
        position = {node: index + 1 for index, node in enumerate(nodes)}
        common = {"session": session}

        # RT1: key advertisement (U1)
        replies = self.broadcast("secagg_setup", nodes, config={**common, "participants": n, "threshold": t},
                                 per_node=lambda node: (None, {"position": position[node]}), phase=f"{phase}-setup", min_replies=t)
        keys = {position[r.node_id]: (r.arrays["pk1"], r.arrays["pk2"]) for r in replies}
        u1 = [r.node_id for r in replies]

        # RT2: encrypted shares, routed through the server (U2)
        order = [position[node] for node in u1]
        request = {"positions": np.array(order), "pk1": secagg.stack_bytes(bytes(keys[p][0]) for p in order),
                   "pk2": secagg.stack_bytes(bytes(keys[p][1]) for p in order)}
        replies = self.broadcast("secagg_share_keys", u1, arrays=request, config=common, phase=f"{phase}-share-keys",
                                 min_replies=t)
        inbox: dict[int, list[tuple[int, np.ndarray]]] = {position[r.node_id]: [] for r in replies}
        for r in replies:
            for destination, row in zip(r.arrays["destinations"], r.arrays["ciphertexts"]):
                inbox.setdefault(int(destination), []).append((position[r.node_id], row))
        u2 = [r.node_id for r in replies]
        shared = {position[node] for node in u2}

        def forwarded(node: int) -> tuple[dict[str, np.ndarray], None]:
            mail = [(source, row) for source, row in inbox[position[node]] if source in shared]
            return {"secagg-sources": np.array([source for source, _ in mail]),
                    "secagg-ciphertexts": np.stack([row for _, row in mail])}, None

        # RT3: masked replies (U3): the sum is over exactly these
        request = {**arrays, "secagg-ranges": np.array(list(ranges.values()))}
        replies = self.broadcast(protocol.secure_name(task), u2, arrays=request, config={**config, "secagg-session": session},
                                 per_node=forwarded, sizes=sizes, phase=phase, min_replies=t)
        total = secagg.masked_total((r.arrays for r in replies), ranges)
        alive = [position[r.node_id] for r in replies]
        dropped = sorted(shared - set(alive))
        pk1 = {p: bytes(keys[p][0]).rstrip(b"\0") for p in alive}

        # RT4: unmasking (U4 >= t)
        replies = self.broadcast("secagg_unmask", [r.node_id for r in replies], config=common, phase=f"{phase}-unmask",
                                 arrays={"alive": np.array(alive), "dropped": np.array(dropped, dtype=np.int64)}, min_replies=t)
        b_shares: dict[int, list[bytes]] = {p: [] for p in alive}
        sk_shares: dict[int, list[bytes]] = {p: [] for p in dropped}
        for r in replies:
            for key, into in (("b", b_shares), ("sk", sk_shares)):
                for p, row in zip(r.arrays[f"{key}-positions"], r.arrays[f"{key}-shares"]):
                    if int(p) in into:
                        into[int(p)].append(secagg.row_bytes(row, strip=False))
        try:
            return secagg.unmasked_sum(total, ranges, session, pk1, b_shares, sk_shares, t), len(alive)
        except ValueError as exc:
            raise FederationError(f"phase {phase!r}: {exc}") from None
