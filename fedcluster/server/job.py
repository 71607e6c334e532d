"""What a run computes — its job — as distinct from where and how it writes: two runs of
one job have the same config but for these keys. A run may be resumed only as the same
job, and an unfinished private run of the same job beside a new one stops the new one
(:mod:`fedcluster.server.run_folder`)."""

from __future__ import annotations

import hashlib
import json
from typing import Any, Mapping

# Keys that say where and how a run writes, not what it computes.
NOT_THE_JOB = ("output-dir", "resume", "overwrite")
# Keys that change neither what the devices are asked before the run's result, nor its
# centers, nor what it releases: a resumed run may set them otherwise (a longer wait for
# the nodes, the labels saved as well), and they do not make another job.
OPERATIONAL = ("round-timeout", "node-wait-s", "node-settle-s", "write-labels", "reference")


def _job(config: Mapping[str, Any]) -> dict[str, Any]:
    """What a run computes: its config without the keys above, as JSON would hold it."""
    job = {key: value for key, value in config.items() if key not in NOT_THE_JOB + OPERATIONAL}
    return json.loads(json.dumps(job, sort_keys=True, default=str))


def job_digest(config: Mapping[str, Any]) -> str:
    """What a run computes, as a digest (two runs of one job have the same)."""
    return hashlib.sha256(json.dumps(_job(config), sort_keys=True).encode()).hexdigest()[:16]


def job_changes(marker: Mapping[str, Any], config: Mapping[str, Any]) -> list[str] | None:
    """The keys of what a run computes that differ between a folder's run (its marker) and
    ``config``: [] for the same job; None when the marker holds no config to compare."""
    recorded = marker.get("config")
    if not isinstance(recorded, dict):
        return None if marker.get("job") != job_digest(config) else []
    mine, theirs = _job(config), _job(recorded)
    return sorted(key for key in set(mine) | set(theirs) if mine.get(key) != theirs.get(key))
