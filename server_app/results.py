"""Records and results: per-round records, the output folder, ``result.json`` and the
arrays beside it. A mixin of :class:`server_app.base.FederatedStrategy`."""

from __future__ import annotations

import json
import math
import os
import time
from datetime import datetime, timezone
from logging import INFO, WARNING
from pathlib import Path
from typing import Any

import numpy as np
from flwr.common.logger import log


from .messages import FederationError


# Result arrays that are points of the data space (written back in the original units by a
# standardized run).
IN_DATA_SPACE = frozenset({"centers", "init_centers", "last_centers", "device_centers", "bin_representatives"})


class Results:
    """Round records and the run's output (state: ``rounds``, ``phases``, ``warnings``, bytes)."""

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

    def prepare_output(self) -> Path:
        """Choose and check the results folder before any node is waited for: a file, a
        folder inside the data folder, or an unwritable one stops the run here; a folder
        that already holds a result gets a fresh ``run-N`` sub-folder unless ``overwrite``."""
        configured = self.config.output_dir
        if configured:
            path = Path(configured).expanduser().resolve()
        else:
            stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S-%f")
            root = Path(os.environ.get("FEDCLUSTER_OUTPUT_ROOT", "outputs"))
            path = (root / f"{stamp}-{self.config['algorithm']}").resolve()
        if path.exists() and not path.is_dir():
            raise FederationError(f"output-dir {path} is a file, not a folder: choose another output-dir")
        data_dir = self.config.data_dir
        if data_dir:
            data = Path(data_dir).expanduser().resolve()
            if path == data or data in path.parents:
                raise FederationError(
                    f"output-dir {path} lies inside the data folder {data}: results there could be "
                    f"read as client data next time; choose another output-dir"
                )
        if (path / "result.json").exists() and not self.config.overwrite:
            number = 2
            while (path / f"run-{number}").exists():
                number += 1
            log(WARNING, "[fedcluster] %s already holds a result: writing to run-%d inside it (overwrite=true to replace)", path, number)
            path = path / f"run-{number}"
        try:
            path.mkdir(parents=True, exist_ok=True)
            probe = path / ".fedcluster-write-test"
            probe.write_text("")
            probe.unlink()
        except OSError as exc:
            raise FederationError(f"output-dir {path} cannot be written: {exc}") from None
        self._output = path
        return path

    def output_dir(self) -> Path:
        return getattr(self, "_output", None) or self.prepare_output()

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
        self._remove_earlier_result(out)
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
        tmp = out / "result.json.tmp"
        tmp.write_text(json.dumps(result, indent=2, default=_jsonable))
        tmp.replace(out / "result.json")
        log(INFO, "[fedcluster] result written to %s", out)
        return result


    @staticmethod
    def _remove_earlier_result(out: Path) -> None:
        """``overwrite``: the arrays the earlier run in ``out`` wrote (its result.json
        ``files``) are removed, and only those: plain ``.npy`` files directly in ``out``, so
        no earlier result is left beside the new one and nothing else is touched."""
        earlier = out / "result.json"
        if not earlier.is_file():
            return
        try:
            files = json.loads(earlier.read_text()).get("files", [])
        except (OSError, ValueError, AttributeError):
            log(WARNING, "[fedcluster] %s is unreadable: none of its files removed before overwriting it", earlier)
            return
        removed = []
        for name in files if isinstance(files, list) else []:
            if isinstance(name, str) and name.endswith(".npy") and Path(name).name == name:
                target = out / name
                if target.is_file() and not target.is_symlink():
                    target.unlink()
                    removed.append(name)
        if removed:
            log(INFO, "[fedcluster] overwrite: removed the earlier run's %s", ", ".join(sorted(removed)))


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
