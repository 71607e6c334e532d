"""A run's folder, owned by the run from its start to its end (docs/DESIGN.md, "What a run
leaves behind"). Everything in it is written by the run; nothing else is ever written into
or deleted from it:

- ``fedcluster-run.json``, the marker: config, job (a digest of the config without the keys
  that say where and how to write), ``status`` (``running``, then ``finished``), attempts;
- ``journal.bin``, the exchanges with the nodes (:mod:`fedcluster.server.journal`), and
  ``server-secret``, the seed of the server's randomness that is not the run seed (owner-only):
  both removed when the run finishes;
- ``privacy-ledger.jsonl``, every private release, written before it leaves the server
  (:class:`fedcluster.server.release_log.ReleaseLog`); it stays;
- ``result.json`` and the arrays, when the run finishes.

The folder is locked (``flock``) while a process runs the run: a second run on it is
refused, and an unfinished run whose lock nobody holds is one that stopped. A folder is
taken only when it is new or empty, or holds a run of fedcluster whose state says what to
do: an unfinished run is continued with ``resume = true`` or discarded with ``overwrite =
true`` (its privacy ledger kept and counted); a finished one is replaced only with
``overwrite = true``. Anything else refuses the run, naming the folder.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import secrets
import socket
from datetime import datetime, timezone
from logging import WARNING
from pathlib import Path
from typing import Any, Mapping

import numpy as np
from flwr.common.logger import log

from fedcluster.data import RUN_MARKER

from .messages import FederationError
from .job import OPERATIONAL, job_changes, job_digest
from .release_log import LEDGER, ReleaseLog, now

MARKER = RUN_MARKER
SECRET = "server-secret"
RESULT = "result.json"
JOURNAL = "journal.bin"
STATE_FILES = frozenset({MARKER, SECRET, LEDGER, JOURNAL, "flwr-run.json"})  # (the Docker job's record of the run)


def read_marker(folder: Path) -> dict[str, Any] | None:
    try:
        marker = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) else None


def _write_json(path: Path, value: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as handle:
        handle.write(json.dumps(value, indent=2, default=str))
        handle.flush()
        os.fsync(handle.fileno())
    tmp.replace(path)


def _held(folder: Path) -> bool:
    """Whether another process holds the folder's lock now."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)  # closing releases a lock this probe took
    return False


def _listing(names: list[str]) -> str:
    return ", ".join(sorted(names)[:5]) + (" …" if len(names) > 5 else "")


class RunFolder:
    """The folder of one run (see the module docstring). :meth:`open` takes it or refuses."""

    def __init__(self, path: Path, marker: dict[str, Any], lock_fd: int, resumed: bool) -> None:
        self.path = path
        self.marker = marker
        self._lock_fd = lock_fd
        self.resumed = resumed
        self.releases = ReleaseLog(path / LEDGER, chain=marker["chain"], attempt=len(marker["attempts"]))

    # ------------------------------------------------------------------ taking a folder
    @classmethod
    def open(cls, config: Mapping[str, Any], private: bool = False) -> "RunFolder":
        """Take the run's folder (``output-dir``, else a new ``outputs/<time>-<algorithm>``)
        or refuse with a :class:`FederationError` naming it and the choices."""
        configured = config["output-dir"]
        resume, overwrite = bool(config.get("resume", False)), bool(config["overwrite"])
        if resume and not configured:
            raise FederationError("resume=true needs output-dir: the folder of the unfinished run to continue")
        if configured:
            path = Path(configured).expanduser().resolve()
        else:
            path = _fresh_default(config)
        _check_place(path, config)
        created = not path.exists()
        try:
            path.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
            if not os.access(path, os.W_OK):
                os.close(fd)
                raise PermissionError("no write permission")
        except OSError as exc:
            raise FederationError(f"output-dir {path} cannot be written: {exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            other = read_marker(path) or {}
            who = (other.get("attempts") or [{}])[-1]
            raise FederationError(
                f"output-dir {path} is in use by another run right now (pid {who.get('pid', '?')} on "
                f"{who.get('host', '?')}, started {who.get('started', '?')}): choose another output-dir"
            ) from None
        try:
            marker, resumed = _decide(path, config, resume, overwrite)
            if not resumed:
                _sweep_siblings(path, config, private)
            marker["attempts"].append(
                {"started": now(), "pid": os.getpid(), "host": socket.gethostname(), "resumed": resumed}
            )
            marker["status"] = "running"
            _write_json(path / MARKER, marker)
        except BaseException:
            os.close(fd)
            if created and not any(path.iterdir()):
                path.rmdir()  # refused: the folder it made goes with it
            raise
        folder = cls(path, marker, fd, resumed)
        folder.created = created
        return folder

    # ------------------------------------------------------------------ during the run
    def secret(self) -> bytes:
        """The run's server secret (created on first use, owner-only, kept across a resume)."""
        path = self.path / SECRET
        if not path.exists():
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as handle:
                handle.write(secrets.token_hex(32))
                handle.flush()
                os.fsync(handle.fileno())
        return bytes.fromhex(path.read_text().strip())

    def generator(self, purpose: str) -> np.random.Generator:
        """A generator of the server's own randomness for ``purpose``, from the secret: the
        same in a resumed run, unknown to anyone who has not read the folder."""
        digest = hashlib.sha256(self.secret() + purpose.encode()).digest()
        return np.random.default_rng(int.from_bytes(digest, "big"))

    def finish(self) -> None:
        """The result is written: the journal and the secret go, the marker says finished."""
        for name in (JOURNAL, SECRET):
            (self.path / name).unlink(missing_ok=True)
        self.marker.update(status="finished", finished=now())
        _write_json(self.path / MARKER, self.marker)
        self.close()

    def forget(self) -> None:
        """A run that stopped before any node answered: its state goes, and the folder too
        when this run made it and nothing else is in it."""
        for name in (JOURNAL, SECRET, MARKER) if len(self.marker["attempts"]) == 1 else (JOURNAL, SECRET):
            (self.path / name).unlink(missing_ok=True)
        if self.created and not any(self.path.iterdir()):
            self.path.rmdir()

    def close(self) -> None:  # (the lock goes with the descriptor)
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None


def _fresh_default(config: Mapping[str, Any]) -> Path:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S-%f")
    root = Path(os.environ.get("FEDCLUSTER_OUTPUT_ROOT", "outputs"))
    path = (root / f"{stamp}-{config['algorithm']}").resolve()
    number = 1
    while path.exists():
        number += 1
        path = (root / f"{stamp}-{config['algorithm']}-{number}").resolve()
    return path


def _check_place(path: Path, config: Mapping[str, Any]) -> None:
    if path.exists() and not path.is_dir():
        raise FederationError(f"output-dir {path} is a file, not a folder: choose another output-dir")
    data_dir = config["data-dir"]
    if data_dir:
        data = Path(data_dir).expanduser().resolve()
        if path == data or data in path.parents:
            raise FederationError(
                f"output-dir {path} lies inside the data folder {data}: results there could be "
                f"read as client data next time; choose another output-dir"
            )


def _decide(path: Path, config: Mapping[str, Any], resume: bool, overwrite: bool) -> tuple[dict[str, Any], bool]:
    """The marker the run starts from, and whether it resumes; or a refusal."""
    marker = read_marker(path)
    fresh = {
        "fedcluster": "run folder",
        "algorithm": config["algorithm"],
        "job": job_digest(config),
        "config": dict(config),
        "attempts": [],
        "chain": 0,
    }
    if marker is None:
        _refuse_unmarked(path, resume, overwrite)
        return fresh, False
    _refuse_foreign(path)
    after = {**fresh, "attempts": marker.get("attempts", []), "chain": len(marker.get("attempts", []))}
    if marker.get("status") == "finished":
        _refuse_finished(path, marker, resume, overwrite)
        _remove_result(path)
        return after, False
    if resume:
        changed = job_changes(marker, config)
        if changed != []:
            raise FederationError(
                f"resume=true, but the unfinished run in output-dir {path} was started with another "
                f"config (differs in: {', '.join((changed or [])[:8]) or 'its digest'}): resume it with "
                f"the same run config ({', '.join(OPERATIONAL)} may differ), or overwrite=true to "
                f"discard it"
            )
        return {**marker, "config": dict(config), "job": job_digest(config)}, True  # (this attempt's operational keys)
    if not overwrite:
        spent = ReleaseLog(path / LEDGER).describe()
        raise FederationError(
            f"output-dir {path} holds an unfinished run ({marker.get('algorithm')}, started "
            f"{(marker.get('attempts') or [{}])[0].get('started', '?')}{spent}): continue it with "
            f"resume=true, or discard it with overwrite=true"
        )
    for name in (JOURNAL, SECRET):
        (path / name).unlink(missing_ok=True)
    return after, False


def _refuse_unmarked(path: Path, resume: bool, overwrite: bool) -> None:
    """A folder without a run's marker: empty (or only a result written before markers,
    with ``overwrite``) is taken; anything else refused."""
    if (path / RESULT).is_file() and overwrite:  # a result written before run folders had a marker
        _remove_result(path)
    names = [p.name for p in path.iterdir()]
    if names:
        if resume:
            raise FederationError(f"resume=true, but output-dir {path} holds no run of fedcluster to continue")
        raise FederationError(
            f"output-dir {path} already holds files this run did not write ({_listing(names)}): "
            f"choose an empty or new output-dir"
        )
    if resume:
        raise FederationError(f"resume=true, but output-dir {path} holds no unfinished run to continue")


def _refuse_foreign(path: Path) -> None:
    """A run's folder holding files its run did not write, or links: never written into."""
    names = [p.name for p in path.iterdir()]
    own = STATE_FILES | {RESULT} | set(_result_files(path))
    own |= {f"{name}.tmp" for name in own}  # (a write cut short)
    foreign = [name for name in names if name not in own]
    if foreign:
        raise FederationError(
            f"output-dir {path} holds files its run did not write ({_listing(foreign)}): "
            f"choose an empty or new output-dir"
        )
    linked = [name for name in names if (path / name).is_symlink()]
    if linked:  # never written or removed through: the run wrote files, not links
        raise FederationError(
            f"output-dir {path} holds symbolic links its run did not write ({_listing(linked)}): "
            f"remove them, or choose another output-dir"
        )


def _refuse_finished(path: Path, marker: Mapping[str, Any], resume: bool, overwrite: bool) -> None:
    """A finished run is replaced only with ``overwrite`` and never resumed."""
    if resume:
        raise FederationError(
            f"resume=true, but the run in output-dir {path} finished: its result is "
            f"{path / RESULT}; choose another output-dir for a new run"
        )
    if not overwrite:
        raise FederationError(
            f"output-dir {path} holds a finished run ({marker.get('algorithm')}, "
            f"{RESULT}): choose another output-dir, or overwrite=true to replace it"
        )


def _result_files(path: Path) -> list[str]:
    try:
        files = json.loads((path / RESULT).read_text()).get("files", [])
    except (OSError, ValueError, AttributeError):
        return []
    return (
        [name for name in files if isinstance(name, str) and Path(name).name == name and name.endswith(".npy")]
        if isinstance(files, list)
        else []
    )


def _remove_result(path: Path) -> None:
    """``overwrite``: the earlier result goes (its ``result.json`` and the arrays it lists)."""
    for target in (path / name for name in _result_files(path)):
        target.unlink() if target.is_file() and not target.is_symlink() else None
    (path / RESULT).unlink(missing_ok=True)


def _sweep_siblings(path: Path, config: Mapping[str, Any], private: bool) -> None:
    """An unfinished run of the same job beside this one (the job started again after a
    crash, into a new folder): a private run refuses (its releases would be spent again
    without a word), any other is told where it is."""
    try:
        siblings = [p for p in path.parent.iterdir() if p != path and p.is_dir()]
    except OSError:
        return
    for sibling in sorted(siblings):
        marker = read_marker(sibling)
        if not marker or marker.get("status") != "running" or job_changes(marker, config) != [] or _held(sibling):
            continue
        spent = ReleaseLog(sibling / LEDGER).describe()
        if private:
            raise FederationError(
                f"an unfinished run of this same job is in {sibling}{spent}: continue it with resume=true "
                f"output-dir='{sibling}', or start it afresh there with overwrite=true (its releases stay counted)"
            )
        log(
            WARNING,
            "[fedcluster] an unfinished run of this same job is in %s: resume=true output-dir='%s' continues it",
            sibling,
            sibling,
        )
