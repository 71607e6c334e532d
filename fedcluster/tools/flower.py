"""Real Flower processes on this machine: the one launcher every caller uses.

:class:`FlowerProcesses` starts a SuperLink (simulation or deployment, optionally with TLS
and SuperNode authentication) and SuperNodes on free loopback ports, each with its log in
``workdir/logs``, in a private Flower home (``workdir/flwr-home``) whose ``config.toml``
names one SuperLink connection; it submits runs with ``flwr run``, follows them with
``flwr ls --format json`` (``flwr run --stream`` exits 0 even when a run failed) and stops
every process it started by process group (their ClientApps and SuperExecs too).
``fedcluster-local-cluster`` (:mod:`fedcluster.tools.local_cluster`), the engine tests and
the benchmarks that run ``flwr run`` all use it. Nothing here imports flwr: it drives
Flower's commands, found beside this Python or on PATH.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

FLOWER_ENV = {
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
}
COMMANDS = ("flwr", "flower-superlink", "flower-supernode")
_COLOR = re.compile(r"\x1b\[[0-9;]*m")


class FlowerError(RuntimeError):
    """A Flower process could not be started or a run did not complete (the message says why)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _find(name: str) -> str | None:
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.exists() else shutil.which(name)


def flower_installed() -> bool:
    """Whether Flower's commands are beside this Python or on PATH."""
    return all(_find(name) for name in COMMANDS)


def tool(name: str) -> str:
    found = _find(name)
    if not found:
        raise FlowerError(f"'{name}' not found beside {sys.executable} or on PATH: install flwr (pip install -e .)")
    return found


def run_config_text(config: dict[str, Any]) -> str:
    """A run config as ``flwr run --run-config`` takes it (TOML values: strings quoted)."""

    def value(v: Any) -> str:
        return json.dumps(v) if isinstance(v, str) else str(v).lower() if isinstance(v, bool) else str(v)

    return " ".join(f"{key}={value(v)}" for key, v in config.items())


def device_worker_args(port: int, certs: Any, secret: Path) -> tuple[list[str], list[str]]:
    """What a SuperNode whose Runtime API is on ``port`` and its ``fedcluster-device`` worker
    are given: ``--isolation process`` (the SuperNode starts no SuperExec), a SuperExec auth
    secret both share (no other process may claim its tasks) and, with ``certs``, TLS on the
    Runtime API (the SuperLink's certificate: it names 127.0.0.1; a device of its own makes
    one for its loopback)."""
    supernode = ["--isolation", "process", "--superexec-auth-secret-file", str(secret)]
    worker = ["--runtime-api-address", f"127.0.0.1:{port}", "--superexec-auth-secret-file", str(secret)]
    if certs:
        supernode += ["--ssl-ca-certfile", str(certs.ca_cert), "--ssl-certfile", str(certs.superlink_cert)]
        supernode += ["--ssl-keyfile", str(certs.superlink_key)]
        worker += ["--root-certificates", str(certs.ca_cert)]
    else:
        worker += ["--insecure"]
    return supernode, worker


class FlowerProcesses:
    """Flower processes started from ``workdir``; a context manager that stops them all."""

    def __init__(self, workdir: Path, connection: str = "local", echo=None) -> None:
        self.workdir = Path(workdir).resolve()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.connection = connection
        self.echo = echo or (lambda text: None)
        self.logs = self.workdir / "logs"
        self.home = self.workdir / "flwr-home"
        self.port = 0
        self.processes: dict[str, subprocess.Popen] = {}
        self.workers: dict[str, subprocess.Popen] = {}  # SuperNode name -> its fedcluster-device
        self._log_files: list[Any] = []
        self.env = {**os.environ, **FLOWER_ENV, "FLWR_HOME": str(self.home)}
        self.env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{self.env.get('PATH', '')}"

    # ---------------------------------------------------------------- processes
    def _start(self, name: str, args: list[str], cwd: Path | None = None) -> subprocess.Popen:
        """Start a process under ``name`` (``name-2``, ``name-3``, … when taken: a second
        process must never hide the first from :meth:`stop`)."""
        base, number = name, 2
        while name in self.processes:
            name, number = f"{base}-{number}", number + 1
        self.logs.mkdir(parents=True, exist_ok=True)
        log = open(self.logs / f"{name}.log", "w")
        self._log_files.append(log)
        process = subprocess.Popen(
            args,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=self.env,
            cwd=cwd or self.workdir,
            start_new_session=True,
        )
        self.processes[name] = process
        return process

    def stop_process(self, name: str, sig: int = signal.SIGTERM) -> None:
        """Stop one process started here, with its process group (its ClientApps), and a
        SuperNode's ``fedcluster-device`` worker with it."""
        worker = self.workers.pop(name, None)
        if worker is not None:
            self.stop_process(next(n for n, p in self.processes.items() if p is worker), sig)
        process = self.processes[name]
        if process.poll() is None:
            try:
                os.killpg(process.pid, sig)
            except ProcessLookupError:
                pass
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)

    def stop(self) -> None:
        """Stop every process started here, the last started first. A Ctrl-C while this
        runs (a second one: the first is what ends the run) does not leave the rest
        running: they are stopped, then the interrupt goes on."""
        interrupted: KeyboardInterrupt | None = None
        for name in reversed(list(self.processes)):
            try:
                self.stop_process(name)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
            except KeyboardInterrupt as exc:
                interrupted = exc
        for log in self._log_files:
            log.close()
        self._log_files.clear()
        if interrupted is not None:
            raise interrupted

    def __enter__(self) -> "FlowerProcesses":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def tail(self, name: str, chars: int = 3000) -> str:
        path = self.logs / f"{name}.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    def all_logs(self, chars: int = 3000) -> str:
        return "\n".join(f"--- {path.name}\n{self.tail(path.stem, chars)}" for path in sorted(self.logs.glob("*.log")))

    # ---------------------------------------------------------------- SuperLink, SuperNodes
    def start_superlink(
        self, simulation: bool = False, certs: Any = None, supernode_auth: bool = False, port: int | None = None
    ) -> None:
        """A SuperLink on a free loopback port (or ``port``: the one it had before a
        restart; ``certs``: TLS with a :func:`fedcluster.tools.certs.make_certs` bundle),
        and the connection to it. Its state (registered SuperNodes, runs) is in the work
        folder's database, so a restarted SuperLink knows its SuperNodes."""
        self.home.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        security = (
            [
                "--ssl-ca-certfile",
                str(certs.ca_cert),
                "--ssl-certfile",
                str(certs.superlink_cert),
                "--ssl-keyfile",
                str(certs.superlink_key),
            ]
            if certs
            else ["--insecure"]
        )
        superlink_dir = self.workdir / "superlink"
        superlink_dir.mkdir(parents=True, exist_ok=True)
        self._start(
            "superlink",
            [
                tool("flower-superlink"),
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                *security,
                *(["--enable-supernode-auth"] if supernode_auth else []),
                *(["--simulation"] if simulation else []),
                "--disable-runtime-dependency-installation",
                "--database",
                str(self.workdir / "state.db"),
            ],
            cwd=superlink_dir,
        )
        self._wait_for_port(self.port, "superlink")
        trust = f'root-certificates = "{certs.ca_cert}"' if certs else "insecure = true"
        (self.home / "config.toml").write_text(
            f'[superlink]\ndefault = "{self.connection}"\n\n[superlink.{self.connection}]\n'
            f'address = "127.0.0.1:{self.port}"\n{trust}\n'
        )

    def start_supernode(
        self,
        name: str,
        node_config: str,
        certs: Any = None,
        key: Path | None = None,
        superlink: str | None = None,
        prefix: tuple[str, ...] = (),
        device_worker: bool = False,
    ) -> subprocess.Popen:
        """A SuperNode on its own free ``--port`` (two on one host must not share one).
        ``superlink``: the Fleet API address (default this SuperLink on loopback); ``prefix``:
        a command the SuperNode runs under (a network namespace, a cgroup: tools/constrained.py).
        ``device_worker``: the SuperNode runs ``--isolation process`` and one
        ``fedcluster-device`` process (under the same prefix, in ``self.workers[name]``) serves
        all its messages (:func:`device_worker_args`)."""
        security = ["--root-certificates", str(certs.ca_cert)] if certs else ["--insecure"]
        if key is not None:
            security += ["--auth-supernode-private-key", str(key)]
        port = free_port()
        supernode_args, worker_args = device_worker_args(port, certs, self._secret(name)) if device_worker else ([], [])
        process = self._start(
            name,
            [
                *prefix,
                tool("flower-supernode"),
                "--superlink",
                superlink or f"127.0.0.1:{self.port}",
                *security,
                "--port",
                str(port),
                "--node-config",
                node_config,
                *supernode_args,
            ],
        )
        if device_worker:
            self.workers[name] = self._start(f"{name}-device", [*prefix, tool("fedcluster-device"), *worker_args])
        return process

    def _secret(self, name: str) -> Path:
        """A fresh SuperExec auth secret for SuperNode ``name`` (only its worker may claim its tasks)."""
        path = self.workdir / "secrets" / f"{name}.secret"
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        path.unlink(missing_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(secrets.token_hex(32).encode())
        return path

    def _wait_for_port(self, port: int, name: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.processes[name].poll() is not None:
                raise FlowerError(f"{name} exited at start (rc {self.processes[name].returncode}):\n{self.tail(name)}")
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    return
            time.sleep(0.2)
        raise FlowerError(f"{name}: nothing listens on 127.0.0.1:{port} after {timeout} s:\n{self.tail(name)}")

    # ---------------------------------------------------------------- runs
    def flwr(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(
            [tool("flwr"), *args],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=timeout,
            cwd=self.workdir,
            stdin=subprocess.DEVNULL,
        )

    def submit(self, app: Path, run_config: str, federation_config: str | None = None) -> str:
        """``flwr run`` (detached); the run id."""
        args = ["run", str(app), self.connection, "--run-config", run_config, "--format", "json"]
        done = self.flwr(*args, *(["--federation-config", federation_config] if federation_config else []), timeout=300)
        text = done.stdout
        try:
            payload = json.loads(text[text.index("{") :])
        except ValueError:
            payload = {}
        if done.returncode != 0 or not payload.get("success"):
            raise FlowerError(f"flwr run failed (rc {done.returncode}): {(done.stdout + done.stderr)[-3000:]}")
        return str(payload["run-id"])

    def status(self, run_id: str) -> str:
        done = self.flwr("ls", self.connection, "--format", "json", timeout=60)
        if done.returncode != 0 or "{" not in done.stdout:
            return ""
        runs = json.loads(done.stdout[done.stdout.index("{") :]).get("runs", [])
        entry = next((r for r in runs if str(r.get("run-id")) == run_id), {})
        return str(entry.get("status", ""))

    def wait(self, run_id: str, timeout: float, poll: float = 2.0) -> str:
        """Poll ``flwr ls`` until the run finishes; its final status (``finished:...``)."""
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            status = self.status(run_id)
            if status and status != last:
                self.echo(f"run {run_id}: {status}")
                last = status
            if status.startswith("finished"):
                return status
            if self.processes["superlink"].poll() is not None:
                raise FlowerError(
                    f"the SuperLink exited (rc {self.processes['superlink'].returncode}):\n{self.tail('superlink')}"
                )
            time.sleep(poll)
        raise FlowerError(
            f"run {run_id} did not finish within {timeout:.0f} s (last status {last or 'unknown'}); "
            f"see {self.logs}\n{self.all_logs()}"
        )

    def run_log(self, run_id: str) -> str:
        """The run's own log (ServerApp output), as ``flwr log RUN_ID --show`` prints it."""
        done = self.flwr("log", run_id, self.connection, "--show", timeout=60)
        return done.stdout + done.stderr

    def follow(self, run_id: str, on_line: Callable[[str], None]) -> threading.Thread:
        """Follow the run's log as it is written (``flwr log RUN_ID --stream``: the SuperLink
        pushes it, nothing here polls): ``on_line`` gets each line, colors removed. The
        stream ends by itself when the run does; :meth:`stop` ends it otherwise. Returns the
        thread reading it (join it to have every line)."""
        process = subprocess.Popen(
            self.log_command(run_id),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            errors="replace",
            env=self.env,
            cwd=self.workdir,
            start_new_session=True,
        )
        name, number = f"log-{run_id}", 2
        while name in self.processes:  # a second follower must not hide the first from stop()
            name, number = f"log-{run_id}-{number}", number + 1
        self.processes[name] = process

        def read() -> None:
            for line in process.stdout:
                on_line(_COLOR.sub("", line.rstrip("\n")))
            process.stdout.close()

        thread = threading.Thread(target=read, name=f"flwr-log-{run_id}", daemon=True)
        thread.start()
        return thread

    def log_command(self, run_id: str) -> list[str]:
        return [tool("flwr"), "log", run_id, self.connection, "--stream"]

    def run_streamed(
        self, app: Path, run_config: str, federation_config: str | None = None, timeout: float = 3600
    ) -> tuple[subprocess.CompletedProcess, float]:
        """``flwr run --stream`` to the end; (the completed command, its wall seconds). The
        caller checks the run's own output: ``--stream`` exits 0 even when the run failed."""
        args = ["run", str(app), self.connection, "--stream", "--run-config", run_config]
        started = time.perf_counter()
        done = self.flwr(
            *args, *(["--federation-config", federation_config] if federation_config else []), timeout=timeout
        )
        return done, time.perf_counter() - started
