"""Records and results: per-round records, the output folder, ``result.json`` and the
arrays beside it. A mixin of :class:`fedcluster.server.base.FederatedStrategy`."""

from __future__ import annotations

import json
import math
import time
from logging import INFO
from pathlib import Path
from typing import Any

import numpy as np
from flwr.common.logger import log

from .journal import Journal
from .run_folder import RunFolder


# Result arrays that are points of the data space (written back in the original units by a
# standardized run).
IN_DATA_SPACE = frozenset({"centers", "init_centers", "last_centers", "device_centers", "bin_representatives"})


class Results:
    """Round records and the run's output (state: ``rounds``, ``phases``, ``warnings``, bytes,
    ``folder``, ``journal``)."""

    private = False  # a private run refuses to start while the same job stands unfinished beside it

    def begin_round(self, number: int) -> None:
        self._current_round = {
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
        record = self._current_round
        assert record is not None, "end_round without begin_round"
        record["seconds"] = time.perf_counter() - self._round_start
        record.update({key: _jsonable(value) for key, value in metrics.items()})
        self.rounds.append(record)
        self._current_round = None
        return record

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

    def write_result(self, outcome: dict[str, Any]) -> dict[str, Any]:
        out = self.output_dir()
        arrays = outcome.pop("arrays", {})
        centers = outcome.pop("centers", None)
        if centers is not None:
            arrays = {"centers": centers, **arrays}
        if self.scaling is not None:  # centers and other points are written in the data's own units
            arrays = {name: self.scaling.undo(value) if name in IN_DATA_SPACE else value for name, value in arrays.items()}
            outcome["standardize"] = {**self.scaling.record(), "how": "x -> (x - mean) / scale per feature; centers "
                                      "written in the original units, costs and nearest centers in the standardized ones"}
        for name, value in arrays.items():
            np.save(out / f"{name}.npy", np.asarray(value))
        result = {
            "algorithm": self.config.algorithm,
            "config": dict(self.config),
            "nodes": {
                "connected": len(self.nodes),
                "active": len(self.active_nodes),
                "excluded": {str(k): v for k, v in self.excluded.items()},
                "exclusions": self.exclusions,
                "joined": self.joined,
                "away_at_end": self.away_now,
            },
            "rounds": self.rounds,
            "phases": self.phases,
            "warnings": self.warnings,
            **{key: _jsonable(value) for key, value in outcome.items()},
            "communication": {"bytes_up": self.bytes_up, "bytes_down": self.bytes_down, "round_trips": self.round_trips},
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
