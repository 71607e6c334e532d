"""``fedcluster-local-cluster``: a real, secure Flower deployment on this machine, for a try.

Starts a SuperLink and one SuperNode per data file, all on free loopback ports, with TLS
(a fresh CA and certificate from ``fedcluster-make-certs``) and SuperNode authentication
(every SuperNode's key registered with ``flwr supernode register``), submits one run of any
algorithm with ``flwr run`` (``--run-config`` is passed through), follows it with
``flwr ls --format json`` until it finishes, prints where the results are, and stops every
process it started (by PID, the whole process group) on exit, Ctrl-C or failure.

Examples::

    fedcluster-local-cluster --demo-nodes 3 --run-config "k=4 num-rounds=5"
    fedcluster-local-cluster --data a.npy --data b.npy --run-config "algorithm='kfed' k=6"
    fedcluster-local-cluster --data-dir /tmp/email5 \\
        --run-config "algorithm='fedspectral-plus' k=10 num-nodes=1005 edge-copies=2"

Everything goes into ``--workdir`` (default ``./local-cluster/<time>``): ``certs/``, the
Flower home (``flwr-home/``), ``logs/`` of every process, ``run.log`` (the ServerApp's log)
and ``out/`` (result.json, centers.npy, ...) unless the run config names an ``output-dir``.
The processes run with ``FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1`` (the project is
already installed here: no ``uv sync`` at run time). Nothing here imports flwr: it drives
Flower's commands, found beside this Python or on PATH.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

from .certs import make_certs

PROJECT = Path(__file__).resolve().parents[2]  # the Flower app (pyproject.toml): fedcluster/tools/ is two levels down
CONNECTION = "local"
FLOWER_ENV = {
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
}


class ClusterError(RuntimeError):
    """The cluster could not be started or the run did not complete (the message says why)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tool(name: str) -> str:
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return str(beside)
    found = shutil.which(name)
    if not found:
        raise ClusterError(f"'{name}' not found beside {sys.executable} or on PATH: install flwr (pip install -e .)")
    return found


def demo_data(directory: Path, nodes: int, seed: int = 0) -> list[Path]:
    """``nodes`` non-IID files: node i holds points of 2 of 4 well-separated 2-D blobs."""
    import numpy as np

    rng = np.random.default_rng(seed)
    means = np.array([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0], [10.0, 10.0]])
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(nodes):
        parts = [means[(i + j) % 4] + rng.normal(size=(60 - 20 * j, 2)) for j in range(2)]
        path = directory / f"node_{i + 1}.npy"
        np.save(path, np.concatenate(parts))
        paths.append(path)
    return paths


class LocalCluster:
    """A SuperLink + SuperNodes with TLS and SuperNode authentication on loopback.

    Use as a context manager: every process started is stopped on exit."""

    def __init__(self, workdir: Path, data_files: list[Path], echo=print) -> None:
        self.workdir = Path(workdir).resolve()
        self.data_files = [Path(p).resolve() for p in data_files]
        self.echo = echo
        self.logs = self.workdir / "logs"
        self.home = self.workdir / "flwr-home"
        self.certs = None
        self.port = 0
        self.processes: dict[str, subprocess.Popen] = {}
        self._log_files = []
        self.env = {**os.environ, **FLOWER_ENV, "FLWR_HOME": str(self.home)}
        self.env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{self.env.get('PATH', '')}"

    # ---------------------------------------------------------------- processes
    def _start(self, name: str, args: list[str], cwd: Path) -> subprocess.Popen:
        """Start a process under ``name`` (``name-2``, ``name-3``, … when taken: a second
        process must never hide the first from :meth:`stop`)."""
        base, number = name, 2
        while name in self.processes:
            name, number = f"{base}-{number}", number + 1
        log = open(self.logs / f"{name}.log", "w")
        self._log_files.append(log)
        process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   env=self.env, cwd=cwd, start_new_session=True)
        self.processes[name] = process
        return process

    def stop_process(self, name: str, sig: int = signal.SIGTERM) -> None:
        """Stop one process this cluster started, with its process group (its ClientApps)."""
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
        for name in reversed(list(self.processes)):
            try:
                self.stop_process(name)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        for log in self._log_files:
            log.close()
        self._log_files.clear()

    def __enter__(self) -> "LocalCluster":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def tail(self, name: str, chars: int = 3000) -> str:
        path = self.logs / f"{name}.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    # ---------------------------------------------------------------- steps
    def flwr(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([tool("flwr"), *args], capture_output=True, text=True, env=self.env,
                              timeout=timeout, cwd=self.workdir, stdin=subprocess.DEVNULL)

    def start_superlink(self, extra_hosts: tuple[str, ...] = ()) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(exist_ok=True)
        self.home.mkdir(exist_ok=True)
        self.certs = make_certs(self.workdir / "certs", ("127.0.0.1", "localhost", *extra_hosts), len(self.data_files), force=True)
        self.port = free_port()
        superlink_dir = self.workdir / "superlink"
        superlink_dir.mkdir(exist_ok=True)
        self._start("superlink", [
            tool("flower-superlink"), "--host", "127.0.0.1", "--port", str(self.port),
            "--ssl-ca-certfile", str(self.certs.ca_cert), "--ssl-certfile", str(self.certs.superlink_cert),
            "--ssl-keyfile", str(self.certs.superlink_key), "--enable-supernode-auth",
            "--disable-runtime-dependency-installation", "--database", str(self.workdir / "state.db"),
        ], cwd=superlink_dir)
        self._wait_for_port(self.port, "superlink")
        (self.home / "config.toml").write_text(
            f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\n'
            f'address = "127.0.0.1:{self.port}"\nroot-certificates = "{self.certs.ca_cert}"\n'
        )
        self.echo(f"SuperLink on https://127.0.0.1:{self.port} (TLS, SuperNode authentication on); logs in {self.logs}")

    def register(self, index: int) -> None:
        """Register SuperNode ``index``'s public key (0-based) with the SuperLink."""
        public = f"{self.certs.supernode_keys[index]}.pub"
        done = self.flwr("supernode", "register", public, CONNECTION)
        if done.returncode != 0:
            raise ClusterError(f"flwr supernode register {public} failed (rc {done.returncode}): {(done.stdout + done.stderr)[-2000:]}")

    def start_supernode(self, index: int, key: Path | None = None) -> subprocess.Popen:
        """Start SuperNode ``index`` (0-based) on its own data file and its own --port; its
        ``partition-id`` is ``index``, so a run repeats with its seed (docs/DESIGN.md)."""
        key = key or self.certs.supernode_keys[index]
        data = self.data_files[index]
        return self._start(f"supernode-{index + 1}", [
            tool("flower-supernode"), "--superlink", f"127.0.0.1:{self.port}",
            "--root-certificates", str(self.certs.ca_cert), "--auth-supernode-private-key", str(key),
            "--port", str(free_port()), "--node-config", f'data-path="{data}" partition-id={index}',
        ], cwd=self.workdir)

    def start(self) -> None:
        self.start_superlink()
        for index in range(len(self.data_files)):
            self.register(index)
            self.start_supernode(index)
        self.echo(f"{len(self.data_files)} SuperNode(s) registered and started, one data file each")

    def submit(self, app: Path, run_config: str) -> str:
        done = self.flwr("run", str(app), CONNECTION, "--run-config", run_config, "--format", "json", timeout=300)
        text = done.stdout
        try:
            payload = json.loads(text[text.index("{"):])
        except ValueError:
            payload = {}
        if done.returncode != 0 or not payload.get("success"):
            raise ClusterError(f"flwr run failed (rc {done.returncode}): {(done.stdout + done.stderr)[-3000:]}")
        return str(payload["run-id"])

    def status(self, run_id: str) -> str:
        done = self.flwr("ls", CONNECTION, "--format", "json", timeout=60)
        if done.returncode != 0 or "{" not in done.stdout:
            return ""
        runs = json.loads(done.stdout[done.stdout.index("{"):]).get("runs", [])
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
                raise ClusterError(f"the SuperLink exited (rc {self.processes['superlink'].returncode}):\n{self.tail('superlink')}")
            time.sleep(poll)
        raise ClusterError(f"run {run_id} did not finish within {timeout:.0f} s (last status {last or 'unknown'}); see {self.logs}")

    def run_log(self, run_id: str) -> str:
        done = self.flwr("log", run_id, CONNECTION, "--show", timeout=60)
        return done.stdout + done.stderr

    def _wait_for_port(self, port: int, name: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.processes[name].poll() is not None:
                raise ClusterError(f"{name} exited at start (rc {self.processes[name].returncode}):\n{self.tail(name)}")
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    return
            time.sleep(0.2)
        raise ClusterError(f"{name}: nothing listens on 127.0.0.1:{port} after {timeout} s:\n{self.tail(name)}")


def find_app(app: str | None) -> Path:
    path = Path(app).expanduser().resolve() if app else PROJECT
    pyproject = path / "pyproject.toml"
    if not pyproject.is_file() or "[tool.flwr.app]" not in pyproject.read_text():
        raise ClusterError(
            f"no Flower app in {path} (pyproject.toml with [tool.flwr.app]): pass --app /path/to/the/fedcluster/checkout"
        )
    return path


def data_files_from(args) -> list[Path]:
    files = [Path(p).expanduser() for p in args.data or []]
    if args.data_dir:
        directory = Path(args.data_dir).expanduser()
        if not directory.is_dir():
            raise ClusterError(f"--data-dir {directory} is not a folder")
        files += sorted(p for p in directory.iterdir() if p.suffix in (".npy", ".txt", ".csv") and p.is_file())
    missing = [str(p) for p in files if not p.is_file()]
    if missing:
        raise ClusterError(f"data file(s) not found: {', '.join(missing)}")
    return files


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fedcluster-local-cluster",
        description="Start a SuperLink and one SuperNode per data file on this machine (TLS + SuperNode "
        "authentication, free loopback ports), run one job, print where the results are, stop everything.",
    )
    data = parser.add_argument_group("data (one SuperNode per file)")
    data.add_argument("--data", action="append", metavar="FILE", help="a SuperNode's data file (.npy points or an edge list); repeatable")
    data.add_argument("--data-dir", metavar="DIR", help="every .npy/.txt/.csv file in DIR is one SuperNode's data")
    data.add_argument("--demo-nodes", type=int, default=0, metavar="N", help="make N small non-IID 2-D demo files instead")
    parser.add_argument("--run-config", default="", help="passed to flwr run (TOML key=value pairs); min-nodes and output-dir are added unless given")
    parser.add_argument("--workdir", default=None, help="folder for certificates, logs and results (default ./local-cluster/<time>)")
    parser.add_argument("--app", default=None, help="the Flower app to submit (default: this checkout)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds to wait for the run to finish (default 900)")
    return parser


def _terminate(signum, frame):  # SIGTERM behaves like Ctrl-C: clean up, then exit
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    workdir = Path(args.workdir or Path("local-cluster") / datetime.now().strftime("%Y%m%d-%H%M%S")).resolve()
    previous = signal.signal(signal.SIGTERM, _terminate)
    cluster = None
    try:
        app = find_app(args.app)
        files = data_files_from(args)
        if args.demo_nodes:
            files += demo_data(workdir / "data", args.demo_nodes)
        if not files:
            raise ClusterError("no data: give --data FILE (repeatable), --data-dir DIR or --demo-nodes N")
        run_config = args.run_config.strip()
        if "min-nodes" not in run_config:
            run_config += f" min-nodes={len(files)}"
        out = workdir / "out"
        if "output-dir" not in run_config:
            run_config += f" output-dir='{out}'"
        else:
            out = None
        print(f"work folder: {workdir}")
        with LocalCluster(workdir, files) as cluster:
            cluster.start()
            run_id = cluster.submit(app, run_config.strip())
            print(f"run {run_id} submitted: {run_config.strip()}")
            status = cluster.wait(run_id, args.timeout)
            (workdir / "run.log").write_text(cluster.run_log(run_id))
            print(f"run log (flwr log {run_id} --show): {workdir / 'run.log'}")
            if status != "finished:completed":
                raise ClusterError(f"run {run_id} ended {status}; see {workdir / 'run.log'} and {cluster.logs}")
        where = out if out is not None else "the run config's output-dir"
        print(f"results: {where} (result.json, centers.npy, ...)")
        if out is not None and (out / "result.json").is_file():
            final = json.loads((out / "result.json").read_text()).get("final", {})
            if "cost" in final:
                print(f"final cost per point: {final['cost']:.6g} on {final.get('num_points', '?')} points")
        print("every process started here is stopped")
        return 0
    except ClusterError as exc:
        print(f"fedcluster-local-cluster: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("fedcluster-local-cluster: interrupted; every process started here is stopped", file=sys.stderr)
        return 130
    finally:
        if cluster is not None:
            cluster.stop()
        signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
