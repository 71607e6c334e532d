"""Records and results: per-round and per-phase records, warnings, the output folder with
its journal, ``result.json`` and the arrays beside it. A part the base strategy
(:class:`fedcluster.server.base.FederatedStrategy`) holds; membership and transport write
their records here."""

from __future__ import annotations

import json
import math
import time
from logging import INFO, WARNING
from pathlib import Path
from typing import Any

import numpy as np
from flwr.common.logger import log

from fedcluster.config import RunConfig
from fedcluster.scaling import Scaling

from .journal import Journal
from .progress import round_line
from .run_folder import RunFolder


# Result arrays that are points of the data space (written back in the original units by a
# standardized run).
IN_DATA_SPACE = frozenset({"centers", "init_centers", "last_centers", "device_centers", "bin_representatives"})


class Results:
    """Round and phase records and the run's output. ``private``: a private run refuses to
    start while the same job stands unfinished beside it (:class:`RunFolder`)."""

    def __init__(self, config: RunConfig, private: bool = False) -> None:
        self.config = config
        self.private = private
        self.rounds: list[dict[str, Any]] = []
        self.phases: list[dict[str, Any]] = []
        self.warnings: list[str] = []  # said in the log and kept in result.json
        self.bytes_up = 0
        self.bytes_down = 0
        self.round_trips = 0  # push-and-pull exchanges with the nodes (one per broadcast_together)
        self.current: dict[str, Any] | None = None  # the round under way (begin_round .. end_round)
        self.phase: str | None = None  # the phase under way (exclusions are recorded in it)
        self.folder: RunFolder | None = None  # the run's folder (prepare_output)
        self.journal = Journal(None)  # its exchanges with the nodes (none until prepare_output)
        self.resumes: list[dict[str, Any]] = []  # where a resumed run went live again (fedcluster.server.resume)
        self._server_random: dict[str, np.random.Generator] = {}
        self._round_start = 0.0
        self._started = time.perf_counter()

    def warn(self, text: str) -> None:
        """Say it in the log and keep it in result.json (``warnings``)."""
        log(WARNING, "[fedcluster] %s", text)
        self.warnings.append(text)

    def server_random(self, purpose: str) -> np.random.Generator:
        """The server's own randomness for ``purpose`` that must not follow from the run
        seed (a public number), one stream per purpose for the whole run: from the run
        folder's secret, so a resumed run draws the same (:class:`RunFolder.generator`)."""
        streams = self._server_random
        if purpose not in streams:
            streams[purpose] = self.folder.generator(purpose) if self.folder is not None else np.random.default_rng()
        return streams[purpose]

    @property
    def round_number(self) -> int | None:
        """The round under way, None between rounds."""
        return self.current["round"] if self.current else None

    def begin_round(self, number: int) -> None:
        self.current = {
            "round": number,
            "sent": 0,
            "replies": 0,
            "away": 0,
            "failures": [],
            "bytes_down": 0,
            "bytes_up": 0,
            "seconds": 0.0,
        }
        self._round_start = time.perf_counter()

    def end_round(self, **metrics: Any) -> dict[str, Any]:
        record = self.current
        assert record is not None, "end_round without begin_round"
        record["seconds"] = time.perf_counter() - self._round_start
        record.update({key: _jsonable(value) for key, value in metrics.items()})
        self.rounds.append(record)
        self.current = None
        log(INFO, "%s", round_line(record))
        return record

    def add_phase(self, record: dict[str, Any]) -> None:
        """A phase's record (transport), counted in the round under way too."""
        self.bytes_down += record["bytes_down"]
        self.bytes_up += record["bytes_up"]
        self.phases.append(record)
        if self.current is not None:
            for key in ("sent", "replies", "bytes_down", "bytes_up"):
                self.current[key] += record[key]
            self.current["failures"].extend(record["failures"])

    def record_away(self, away: list[int]) -> None:
        """The nodes the latest phase left out because they were not connected: counted in
        the phase (``away``), never a failure."""
        self.phases[-1]["away"] = len(away)
        if away:
            log(
                INFO,
                "[fedcluster] %s: %d node(s) away (not connected) were not asked",
                self.phases[-1]["phase"],
                len(away),
            )
        self.note_round_away(len(away))

    def note_round_away(self, count: int) -> None:
        """A round's ``away``: the most nodes of the run missing from one of its phases or
        from its sampling."""
        if self.current is not None:
            self.current["away"] = max(self.current.get("away", 0), count)

    def prepare_output(self, journal: bool = True) -> Path:
        """Take the run's folder before any node is waited for (:class:`RunFolder`: a new
        or empty folder, or a run of fedcluster to resume or replace; anything else stops
        the run here) and open its journal (``journal=False``: none, for a run nobody can
        resume: an estimator's temporary one)."""
        self.folder = RunFolder.open(self.config, private=self.private)
        self.journal = Journal(self.folder.path if journal else None, resume=self.folder.resumed)
        if self.folder.resumed:
            log(INFO, "[fedcluster] resuming the run in %s", self.folder.path)
        if self.folder.releases.damage():
            self.warn(f"privacy ledger: {self.folder.releases.damage()}")
        log(INFO, "[fedcluster] results folder: %s", self.folder.path)
        return self.folder.path

    def output_dir(self) -> Path:
        return self.folder.path if self.folder is not None else self.prepare_output()

    def close_output(self, failed: bool = False) -> None:
        """Release the folder. A run that stopped before its result stays unfinished there
        (``resume = true`` continues it) — unless no node had answered and nothing private
        was released: then there is nothing to continue, and the folder is left as found."""
        self.journal.close()
        if self.folder is not None:
            if failed and not self.journal.answers and not self.folder.releases.lines:
                self.folder.forget()
            self.folder.close()

    def write_result(self, outcome: dict[str, Any], nodes: dict[str, Any], scaling: Scaling | None) -> dict[str, Any]:
        """``result.json`` and the arrays beside it (``nodes``: what it says of the nodes,
        :meth:`Membership.record`; ``scaling``: standardize's, the points written back)."""
        out = self.output_dir()
        arrays = outcome.pop("arrays", {})
        centers = outcome.pop("centers", None)
        if centers is not None:
            arrays = {"centers": centers, **arrays}
        if scaling is not None:  # centers and other points are written in the data's own units
            arrays = {name: scaling.undo(value) if name in IN_DATA_SPACE else value for name, value in arrays.items()}
            outcome["standardize"] = {
                **scaling.record(),
                "how": "x -> (x - mean) / scale per feature; centers "
                "written in the original units, costs and nearest centers in the standardized ones",
            }
        for name, value in arrays.items():
            np.save(out / f"{name}.npy", np.asarray(value))
        result = {
            "algorithm": self.config.algorithm,
            "config": dict(self.config),
            "nodes": nodes,
            "rounds": self.rounds,
            "phases": self.phases,
            "warnings": self.warnings,
            **{key: _jsonable(value) for key, value in outcome.items()},
            "communication": {
                "bytes_up": self.bytes_up,
                "bytes_down": self.bytes_down,
                "round_trips": self.round_trips,
            },
            "wall_time_s": time.perf_counter() - self._started,
            "output_dir": str(out),
            "files": sorted(f"{name}.npy" for name in arrays),
        }
        if self.resumes:
            result["resumed"] = self.resumes
        tmp = out / "result.json.tmp"
        tmp.write_text(json.dumps(result, indent=2, default=_jsonable))
        tmp.replace(out / "result.json")
        self.journal.discard()
        self.folder.finish()
        log(INFO, "[fedcluster] result written to %s", out)
        return result


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (np.floating,)):
        return float(value)
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
