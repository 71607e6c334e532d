"""The journal of a run: every exchange with the nodes, written to disk as it completes,
so that a run whose SuperLink or ServerApp died can continue (``resume = true``).

A strategy's computation is a function of its run config, its seeds and what the nodes
answered. The journal keeps what the nodes answered — each round trip's replies, in the
batches they were pulled in, and each answer of the grid to "which nodes are connected" —
in the order they came. A resumed run executes the same strategy from the start; while the
journal lasts, every exchange is answered from it instead of the grid (no device is asked
again for a round trip that completed), and the strategy arrives, bit for bit, at the state
it had when the first attempt stopped. Then it goes on live, and writes a mark there: what
the devices kept (a secure-aggregation session) before a mark is gone after it, and a later
resume, replaying the mark, decides as the attempt that wrote it did.

Flower's node ids are random per run: the journal keeps the ids the strategy knows (its
*own* ids, those of the first attempt), and a resumed run maps the nodes connected now onto
them by the partition each states (:mod:`fedcluster.server.resume`).

On disk: ``journal.bin`` in the run's folder, a sequence of frames, each
``length (8 bytes) | crc32 (4 bytes) | payload``; a frame cut short by a crash fails its
length or checksum and ends the journal there. A payload is a JSON header (its own length
first) followed by the replies as Flower's protobuf messages. Nothing in it is ever
unpickled.
"""

from __future__ import annotations

import os
import time
import zlib
from pathlib import Path
from typing import Any, Callable, Iterable

from flwr.app import Message

from .journal_file import FRAME, decode, encode, message_bytes, message_from, read_frames
from .messages import FederationError
from .pull import puller

NAME = "journal.bin"
LIVE = "live"  # the kind of the mark a resumed attempt writes where it goes live
# Pause between two pulls of a round trip's pending replies: Flower's own pause (the
# in-memory grid's `pull_interval`) when the last pull brought nothing; a shorter one while
# replies are arriving. A message and its reply leave the SuperLink's store only when the
# reply is pulled, and Flower's simulation engine rescans that whole store for every node,
# so replies left waiting slow down the delivery of the others (bench/flwr_scale.py).
PULL_PAUSE_S = 0.1
PULL_AGAIN_S = 0.05


class Diverged(FederationError):
    """A resumed run asked for something else than the first attempt did at the same point:
    the journal cannot answer it (the code, the config or the data changed)."""


class Journal:
    """A run's exchanges with its nodes: recorded as they complete, replayed on resume.

    Parameters
    ----------
    folder : the run's folder, or None for a run that keeps no journal (an estimator's
        temporary run: nothing to resume).
    resume : read the journal already there and replay it.
    """

    def __init__(self, folder: Path | None, resume: bool = False) -> None:
        self.path = folder / NAME if folder is not None else None
        self.records: list[tuple[dict[str, Any], list[bytes]]] = []
        end = 0
        if resume and self.path is not None:
            frames, end = read_frames(self.path)
            self.records = [decode(frame) for frame in frames]
            if not any(blobs for _, blobs in self.records):  # no node ever answered: nothing to replay
                self.records, end = [], 0
        self.position = 0
        self.last = -1  # the record replayed or written last
        self.answers = sum(len(blobs) for _, blobs in self.records)  # replies recorded, replayed or new
        self.resumed = bool(self.records)
        self.live_since: int | None = None if self.records else 0  # the record where the run went live
        # where an attempt went live: earlier ones' marks in the journal, and this one's
        self.marks = [index for index, (header, _) in enumerate(self.records) if header["kind"] == LIVE]
        self._file = None
        if self.path is not None:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)  # the devices' replies: the owner's only
            self._file = os.fdopen(fd, "r+b")
            self._file.truncate(end)  # a frame cut short by the crash goes (and a fresh run's journal starts empty)
            self._file.seek(end)
        # Node ids: the strategy's own (the first attempt's) against the grid's now.
        self._live_of: dict[int, int] = {}
        self._own_of: dict[int, int] = {}
        self._replayed: list[list[Message]] | None = None  # a replayed round trip's reply batches, for its pull
        self._live: tuple | None = None  # a live round trip's (destinations, types, ids, batches), for the journal

    # ------------------------------------------------------------------ replay
    @property
    def replaying(self) -> bool:
        return self.position < len(self.records)

    @property
    def recorded(self) -> int:
        """Records in the journal (replayed and new)."""
        return len(self.records) if self.replaying else self.position

    def next(self, kind: str) -> tuple[dict[str, Any], list[bytes]]:
        """The next record of the journal, which must be of ``kind``."""
        self._pass_marks()
        header, blobs = self.records[self.position]
        if header["kind"] != kind:
            raise Diverged(
                f"resume: at exchange {self.position + 1} the run asked for {kind!r} where the first attempt "
                f"had {header['kind']!r}: the code, the config or the data changed since; start afresh "
                f"(overwrite=true or another output-dir)"
            )
        self.last = self.position
        self.position += 1
        self._pass_marks()
        if not self.replaying:
            self.live_since = self.position
            self.records = []  # replayed: not needed any more
            self._mark()
        return header, blobs

    def _pass_marks(self) -> None:
        """Replay the marks where an earlier attempt went live (what the devices held from
        before one is gone: a later attempt must decide as that one did)."""
        while self.replaying and self.records[self.position][0]["kind"] == LIVE:
            self.position += 1

    def _mark(self) -> None:
        """This attempt goes live here: the mark goes into the journal."""
        self.marks.append(self.position)
        last = self.last
        self.append({"kind": LIVE})
        self.last = last  # (a mark is no exchange)

    def lost(self, position: int) -> bool:
        """Whether what the devices kept from exchange ``position`` on (a secure-aggregation
        session's keys) is gone by the next round trip: an attempt went live after it and
        before that round trip — in another run than the one the devices kept it in. While
        replaying, an attempt's decision is the one it took when it ran: its journal has the
        mark where it went live (and one that ends here goes live at the next round trip)."""
        if self.live_since is not None:
            return any(position < mark for mark in self.marks)
        ahead = [at for at in range(self.position, len(self.records)) if self.records[at][0]["kind"] == "round-trip"]
        if not ahead:
            return True
        return any(position < mark < ahead[0] for mark in self.marks)

    def ahead(self, message_type: str) -> bool:
        """Whether a round trip still to be replayed sends ``message_type`` (the devices are
        then not asked for it again)."""
        return any(
            header["kind"] == "round-trip" and message_type in header["types"]
            for header, _ in self.records[self.position :]
        )

    # ------------------------------------------------------------------ record
    def append(self, header: dict[str, Any], blobs: Iterable[bytes] = ()) -> None:
        """Write one record (durably: flushed and synced) after it completed."""
        self.last = self.position
        self.position += 1
        if self._file is None:
            return
        payload = encode(header, blobs)
        self._file.write(FRAME.pack(len(payload), zlib.crc32(payload)) + payload)
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def discard(self) -> None:
        """A finished run's journal goes: the result holds what matters, and the replies
        it kept are the devices' statistics."""
        self.close()
        if self.path is not None and self.path.exists():
            self.path.unlink()

    # ------------------------------------------------------------------ node ids
    @property
    def needs_mapping(self) -> bool:
        """A resumed run that went live and has not yet matched the grid's nodes to its own."""
        return self.resumed and not self.replaying and not self._mapped

    _mapped = False

    def map_nodes(self, live_of: dict[int, int], newcomers: Iterable[int]) -> None:
        """``live_of``: own id -> the grid's id now, for every node recognised; the grid's
        other nodes (``newcomers``) keep their id unless it is one of the run's own."""
        self._live_of = dict(live_of)
        self._own_of = {live: own for own, live in live_of.items()}
        taken = set(self._live_of) | set(self._own_of)
        for live in newcomers:
            own = live
            while own in taken and own not in self._own_of:  # a fresh id never collides with the run's own
                own = (own * 6364136223846793005 + 1442695040888963407) % (2**63)
            self._own_of[live], self._live_of[own] = own, live
            taken.add(own)
        self._mapped = True

    def own(self, live: int) -> int:
        return self._own_of.get(int(live), int(live))

    def live(self, own: int) -> int:
        return self._live_of.get(int(own), int(own))

    # ------------------------------------------------------------------ the two exchanges
    def node_ids(self, ask: Callable[[], Iterable[int]]) -> list[int]:
        """The grid's connected nodes (own ids): from the journal, or asked and recorded."""
        if self.replaying:
            return list(self.next("nodes")[0]["ids"])
        ids = sorted(self.own(node) for node in ask())
        self.append({"kind": "nodes", "ids": ids})
        return ids

    def push(self, grid: Any, outgoing: list[Message], destinations: list[int], match: Callable[[], None]) -> list[str]:
        """Push one round trip's messages (``destinations``: the strategy's own ids) and
        return their ids; when the journal replays this round trip nothing is sent and the
        ids are the first attempt's. ``match`` maps the grid's nodes first, if a resumed
        run goes live here."""
        types = [message.metadata.message_type for message in outgoing]
        if self.replaying:
            ids, self._replayed = self.replayed_round_trip(destinations, types)
            return ids
        if self.needs_mapping:
            match()
        for message, node in zip(outgoing, destinations):  # the grid's ids (another run's after a resume)
            message.metadata.dst_node_id = self.live(node)
        ids = list(grid.push_messages(outgoing)) if outgoing else []
        self._live = (destinations, types, ids, [])
        return ids

    replaying_pull = False  # True while a replayed round trip's batches go to ``on_batch`` (what ``kept`` holds)

    def pull(
        self,
        grid: Any,
        pending: set[str],
        deadline: float,
        on_batch: Callable[[list[Message]], None] | None = None,
        kept: dict[str, Message] | None = None,
    ) -> list[Message]:
        """The replies to ``pending`` message ids until all came or ``deadline`` (the
        journal's batches, for a replayed round trip); ``on_batch`` gets each pull's
        replies as they come. A live round trip is written to the journal once its pull
        ends; a reply whose message id is in ``kept`` (refused unread, at least in part) as
        what ``kept`` holds for it (:func:`fedcluster.server.messages.kept_of`: the refusal, not the payload)."""
        out: list[Message] = []
        if self._replayed is not None:
            batches, self._replayed = self._replayed, None
            self.replaying_pull = True
            try:
                for batch in batches:
                    out.extend(batch)
                    if on_batch is not None:
                        on_batch(batch)
            finally:
                self.replaying_pull = False
            return out
        pull = puller(grid)
        while pending:
            got = pull(list(pending))
            late = time.monotonic() > deadline
            if late:
                got += pull.give_up()  # replies still incomplete at the deadline: lost, and said so
            out.extend(got)
            pending.difference_update(m.metadata.reply_to_message_id for m in got)
            if got:
                if self._live is not None:
                    self._live[3].append(got)
                if on_batch is not None:
                    on_batch(got)
            if not pending or late:
                break
            time.sleep(PULL_AGAIN_S if got else PULL_PAUSE_S)
        if self._live is not None:
            (destinations, types, ids, batches), self._live = self._live, None
            kept = kept or {}
            batches = [[kept.get(m.metadata.reply_to_message_id, m) for m in batch] for batch in batches]
            self.record_round_trip(destinations, types, ids, batches)
        return out

    def replayed_round_trip(self, destinations: list[int], types: list[str]) -> tuple[list[str], list[list[Message]]]:
        """A round trip from the journal: the message ids it had and the reply batches as
        pulled. The messages must go where the first attempt's went."""
        header, blobs = self.next("round-trip")
        if header["to"] != destinations or header["types"] != types:
            raise Diverged(
                f"resume: round trip at exchange {self.position} goes to other nodes or asks other tasks "
                f"than the first attempt's: the code, the config or the data changed since; start afresh "
                f"(overwrite=true or another output-dir)"
            )
        batches, at = [], 0
        for size in header["batches"]:
            batches.append([message_from(blob) for blob in blobs[at : at + size]])
            at += size
        return list(header["ids"]), batches

    def record_round_trip(
        self, destinations: list[int], types: list[str], ids: list[str], batches: list[list[Message]]
    ) -> None:
        self.answers += sum(len(batch) for batch in batches)
        self.append(
            {
                "kind": "round-trip",
                "to": destinations,
                "types": types,
                "ids": ids,
                "batches": [len(batch) for batch in batches],
            },
            (message_bytes(message) for batch in batches for message in batch),
        )
