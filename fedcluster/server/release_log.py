"""The privacy ledger on disk (``privacy-ledger.jsonl`` in the run's folder): every private
release, written before it leaves the server, so that no crash can lose a release the
budget paid for."""

from __future__ import annotations

import hashlib
import json
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping

import numpy as np

LEDGER = "privacy-ledger.jsonl"


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class ReleaseLog:
    """The privacy ledger on disk: one line per private release, appended and synced before
    the release leaves the server. Lines carry the attempt that made them and the chain of
    attempts they belong to (a resumed attempt continues its chain; ``overwrite`` starts a
    new one): replaying a chain re-makes its releases with the same values, which are not
    spent again; a release made again with other values (the devices' own noise, drawn
    afresh) or in another chain is."""

    def __init__(self, path: Path, chain: int = 0, attempt: int = 0) -> None:
        self.path, self.chain, self.attempt = path, chain, attempt
        self.unreadable: list[int] = []  # line numbers of records that do not parse (cut short by a crash)
        self._torn_tail = False  # the file ends inside a record: the next one starts on a line of its own
        self.lines = self._read()
        self._index = 0  # releases made by this run so far (its chain's order)

    def _read(self) -> list[dict[str, Any]]:
        """The ledger's records. A record a crash cut short was being written before its
        release left (each is synced first), so that release never left: the record is
        skipped, its line number kept in ``unreadable``, and every record after it read."""
        try:
            data = self.path.read_bytes()
        except OSError:
            return []
        self._torn_tail = bool(data) and not data.endswith(b"\n")
        lines = []
        for number, line in enumerate(data.split(b"\n"), start=1):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
            except ValueError:
                entry = None
            if isinstance(entry, dict):
                lines.append(entry)
            else:
                self.unreadable.append(number)
        return lines

    def damage(self) -> str:
        """What the ledger could not read, in words ('' when nothing)."""
        if not self.unreadable:
            return ""
        return (
            f"{self.path} line(s) {', '.join(map(str, self.unreadable[:5]))} do not parse and are skipped (a record "
            f"cut short by a crash: its release never left the server, which writes each record first)"
        )

    def chain_entries(self) -> list[dict[str, Any]]:
        return [entry for entry in self.lines if entry.get("chain") == self.chain and not entry.get("superseded")]

    def release(self, step: str, what: Mapping[str, Any], value: np.ndarray | None) -> bool:
        """Record release number i of this run (``what``: the step's mechanism and its
        numbers; ``value``: the released value, None when the devices add the noise).
        Returns whether it was new (False: a replayed release of the same value)."""
        index, self._index = self._index, self._index + 1
        digest = None if value is None else hashlib.sha256(np.asarray(value, dtype=np.float64).tobytes()).hexdigest()
        earlier = [e for e in self.chain_entries() if e.get("index") == index]
        if earlier and earlier[-1].get("step") == step and digest is not None and earlier[-1].get("digest") == digest:
            return False
        entry = {
            "chain": self.chain,
            "attempt": self.attempt,
            "index": index,
            "step": step,
            **dict(what),
            "digest": digest,
            "time": now(),
            "again": bool(earlier),
        }
        with open(self.path, "a") as handle:
            # a record a crash cut short ends its line first: this one stays readable
            handle.write(("\n" if self._torn_tail else "") + json.dumps(entry, default=float) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        self._torn_tail = False
        self.lines.append(entry)
        return True

    def matches_replay(self, step: str) -> bool:
        """A release of the devices' noise whose sum the journal replays: the chain's entry
        at this index stands for it (the devices were not asked again)."""
        index = self._index
        earlier = [e for e in self.chain_entries() if e.get("index") == index]
        if earlier and earlier[-1].get("step") == step:
            self._index += 1
            return True
        return False

    def extra(self) -> list[dict[str, Any]]:
        """Releases from this folder that the run's own ledger does not count: those of
        other chains (discarded attempts, earlier finished runs) and those made again."""
        return [e for e in self.lines if e.get("chain") != self.chain or e.get("again")]

    def describe(self) -> str:
        return f", {len(self.lines)} private release(s) already made from it" if self.lines else ""
