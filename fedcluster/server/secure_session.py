"""The server's view of one secure-aggregation session (:class:`Session`): who shared
keys, the threshold, the commitments it keeps, who masks with whom. Held by the secure
sum (:mod:`fedcluster.server.secure_sum`) and read by its checks."""

from __future__ import annotations

from dataclasses import dataclass, field
from logging import WARNING

import numpy as np
from flwr.common.logger import log

from fedcluster.secagg import checks as checks
from fedcluster.secagg import device as secagg


@dataclass
class Session:
    """The server's view of one secure-aggregation session: who shared keys (positions
    1..n), the threshold (the fewest devices a sum may hold), how many sums it serves and
    has served, each device's public keys (a mask key per sum, an encryption key), the
    share tokens to forward with what their dealers committed to, and who masks with whom."""

    number: int
    members: set[int]  # node ids
    position: dict[int, int]
    threshold: int
    sums: int
    shared: set[int]
    pk1: dict[int, list[bytes]]
    pk2: dict[int, bytes]
    mail: dict[
        tuple[int, int], tuple[np.ndarray, np.ndarray, bytes]
    ]  # (dealer, holder) -> token row, ephemeral point, digest
    share_hashes: dict[tuple[int, int], bytes]  # (dealer, holder) -> per sum the hashes of its two shares
    seed_commitments: dict[int, list[bytes]]  # dealer -> per sum the hash of its mask seed
    graph: dict[int, set[int]]  # position -> the positions it masks with (secagg.neighbourhoods)
    share_threshold: int  # Shamir's, of each neighbourhood (t on the full graph)
    used: int = 0
    floor: int = 0  # a session set up again (refused shares, dropouts): the threshold of the first one
    delivered: set[int] = field(default_factory=set)  # positions whose masked reply came (the shares reached them)
    opened_at: int = (
        0  # the journal's exchange of its setup (fedcluster.server.journal: before a resume went live, gone)
    )
    node_of: dict[int, int] = field(init=False)  # position -> node id
    inboxes: dict[int, list[tuple[int, np.ndarray, np.ndarray, bytes]]] = field(init=False)

    def __post_init__(self) -> None:
        self.node_of = {p: node for node, p in self.position.items()}
        self.inboxes = {}
        for (dealer, holder), sent in sorted(self.mail.items()):
            self.inboxes.setdefault(holder, []).append((dealer, *sent))

    def inbox(self, holder: int) -> list[tuple[int, np.ndarray, np.ndarray, bytes]]:
        """The tokens forwarded to ``holder``: (dealer, token row, ephemeral point, digest)."""
        return self.inboxes.get(holder, [])

    def sources(self, holder: int) -> set[int]:
        """The dealers whose tokens were forwarded to ``holder`` (the only ones it may refuse)."""
        return {dealer for dealer, *_ in self.inbox(holder)}

    def short(self, alive, dropped=()) -> bool:
        """Whether a sum over ``alive`` (positions) cannot be unmasked: fewer than the
        threshold, or a neighbourhood too thin (:func:`fedcluster.secagg.short_neighbourhoods`)."""
        alive = set(alive)
        return len(alive) < self.threshold or bool(
            secagg.short_neighbourhoods(alive, dropped, self.graph, self.share_threshold)
        )


def dealt(replies: list, position: dict[int, int], shared: set[int], number: int) -> tuple[dict, dict, dict]:
    """What each dealer sent and committed to in session ``number``: the share tokens to
    forward among the devices that ``shared`` (with their digests), the hashes of every
    share, and the commitments to its mask seeds."""
    mail, hashes, commitments = {}, {}, {}
    for r in replies:
        dealer = position[r.node_id]
        commitments[dealer] = [secagg.row_bytes(row, strip=False) for row in r.arrays["seed-commitments"]]
        for to, row, point, rows in zip(
            r.arrays["destinations"], r.arrays["ciphertexts"], r.arrays["ephemeral"], r.arrays["commitments"]
        ):
            hashes[(dealer, int(to))] = secagg.row_bytes(rows, strip=False)
            if int(to) in shared:
                mail[(dealer, int(to))] = (
                    row,
                    point,
                    checks.share_digest(hashes[(dealer, int(to))], number, dealer, int(to)),
                )
    return mail, hashes, commitments


def note_full_graph(phase: str, devices: int) -> None:
    """Say that a session among many devices on the full graph costs O(n^2) shares."""
    log(
        WARNING,
        "[fedcluster] %s: secure aggregation among %d devices on the full graph: each device shares keys "
        "with and masks with every other (O(n) work each, O(n^2) shares through the server); secagg-neighbours "
        "= m cuts both to m (docs/security.md)",
        phase,
        devices,
    )
