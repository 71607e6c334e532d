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
While the run goes, the ServerApp's own lines (a line per round: its replies, seconds and
cost) are printed as they come (``flwr log RUN_ID --stream``). Each SuperNode is served by one
long-lived ``fedcluster-device`` process (docs/devices.md) when the installed flwr is one the
worker was verified with; ``--no-device-worker`` starts Flower's stock SuperNodes (a
SuperExec and a ``flwr-clientapp`` process per message).
The processes run with ``FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1`` (the project is
already installed here: no ``uv sync`` at run time). Nothing here imports flwr: it drives
Flower's commands, found beside this Python or on PATH.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
from datetime import datetime
from pathlib import Path

from fedcluster.data import DataError, refuse_run_folder

from .certs import MAX_SUPERNODES, make_certs
from .cli import ToolParser, UsageError, integer, number, output_folder, refuse
from .flower import FlowerError, FlowerProcesses

PROJECT = Path(__file__).resolve().parents[2]  # the Flower app (pyproject.toml): fedcluster/tools/ is two levels down
CONNECTION = "local"
TAG = "[fedcluster]"  # what the ServerApp's own log lines start with
FOLLOW_GRACE_S = 10.0  # after the run's end, how long its log stream may take to deliver the last lines
ClusterError = FlowerError  # the cluster could not be started or the run did not complete


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


class LocalCluster(FlowerProcesses):
    """A SuperLink + one SuperNode per data file, with TLS and SuperNode authentication, on
    loopback. Use as a context manager: every process started is stopped on exit."""

    def __init__(self, workdir: Path, data_files: list[Path], echo=print, device_worker: bool = False) -> None:
        super().__init__(workdir, CONNECTION, echo)
        self.data_files = [Path(p).resolve() for p in data_files]
        self.certs = None
        self.device_worker = device_worker  # each SuperNode served by one fedcluster-device process

    def start_superlink(self, extra_hosts: tuple[str, ...] = ()) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.certs = make_certs(
            self.workdir / "certs", ("127.0.0.1", "localhost", *extra_hosts), len(self.data_files), force=True
        )
        super().start_superlink(certs=self.certs, supernode_auth=True)
        self.echo(f"SuperLink on https://127.0.0.1:{self.port} (TLS, SuperNode authentication on); logs in {self.logs}")

    def restart_superlink(self, sig: int = signal.SIGKILL) -> None:
        """Stop the SuperLink (with its process group: the ServerApp of a run under way) and
        start it again on the same port, with the same certificates and database: the
        SuperNodes reconnect by themselves."""
        self.stop_process("superlink", sig)
        del self.processes["superlink"]
        super().start_superlink(certs=self.certs, supernode_auth=True, port=self.port)

    def register(self, index: int) -> None:
        """Register SuperNode ``index``'s public key (0-based) with the SuperLink."""
        public = f"{self.certs.supernode_keys[index]}.pub"
        done = self.flwr("supernode", "register", public, CONNECTION)
        if done.returncode != 0:
            raise ClusterError(
                f"flwr supernode register {public} failed (rc {done.returncode}): {(done.stdout + done.stderr)[-2000:]}"
            )

    def start_supernode(self, index: int, key: Path | None = None) -> subprocess.Popen:
        """Start SuperNode ``index`` (0-based) on its own data file; its ``partition-id`` is
        ``index``, so a run repeats with its seed (docs/DESIGN.md)."""
        return super().start_supernode(
            f"supernode-{index + 1}",
            f'data-path="{self.data_files[index]}" partition-id={index}',
            certs=self.certs,
            key=key or self.certs.supernode_keys[index],
            device_worker=self.device_worker,
        )

    def start(self) -> None:
        self.start_superlink()
        for index in range(len(self.data_files)):
            self.register(index)
            self.start_supernode(index)
        served = ", each served by one fedcluster-device process" if self.device_worker else ""
        self.echo(f"{len(self.data_files)} SuperNode(s) registered and started, one data file each{served}")


def print_progress(line: str) -> None:
    """A line of the run's log as it goes, when it is the ServerApp's own (its rounds, its
    phases, its warnings); Flower's lines stay in ``run.log``."""
    if TAG in line:
        print(line[line.index(TAG) :], flush=True)


def find_app(app: str | None) -> Path:
    path = Path(app).expanduser().resolve() if app is not None else PROJECT
    pyproject = path / "pyproject.toml"
    if not pyproject.is_file() or "[tool.flwr.app]" not in pyproject.read_text():
        raise ClusterError(
            f"no Flower app in {path} (pyproject.toml with [tool.flwr.app]): pass --app "
            "/path/to/the/fedcluster/checkout"
        )
    return path


def data_files_from(args) -> list[Path]:
    files = [Path(p).expanduser() for p in args.data or []]
    if args.data_dir:
        directory = Path(args.data_dir).expanduser()
        if not directory.is_dir():
            raise ClusterError(f"--data-dir {directory} is not a folder")
        try:
            refuse_run_folder(directory)
        except DataError as exc:
            raise ClusterError(f"--data-dir: {exc}") from None
        files += sorted(p for p in directory.iterdir() if p.suffix in (".npy", ".txt", ".csv") and p.is_file())
    missing = [str(p) for p in files if not p.is_file()]
    if missing:
        raise ClusterError(f"data file(s) not found: {', '.join(missing)}")
    return files


def build_parser() -> ToolParser:
    parser = ToolParser(
        prog="fedcluster-local-cluster",
        description="Start a SuperLink and one SuperNode per data file on this machine (TLS + SuperNode "
        "authentication, free loopback ports), run one job, print where the results are, stop everything.",
    )
    data = parser.add_argument_group("data (one SuperNode per file)")
    data.add_argument(
        "--data",
        action="append",
        metavar="FILE",
        help="a SuperNode's data file (.npy points or an edge list); repeatable",
    )
    data.add_argument("--data-dir", metavar="DIR", help="every .npy/.txt/.csv file in DIR is one SuperNode's data")
    data.add_argument(
        "--demo-nodes",
        type=integer(0, MAX_SUPERNODES),
        default=0,
        metavar="N",
        help=f"make N small non-IID 2-D demo files instead (at most {MAX_SUPERNODES})",
    )
    parser.add_argument(
        "--run-config",
        default="",
        help="passed to flwr run (TOML key=value pairs); min-nodes and output-dir are added unless given",
    )
    parser.add_argument(
        "--workdir",
        default=None,
        help="a new or empty folder for certificates, logs and results (default ./local-cluster/<time>)",
    )
    parser.add_argument("--app", default=None, help="the Flower app to submit (default: this checkout)")
    parser.add_argument(
        "--device-worker",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="run each SuperNode with --isolation process and one long-lived fedcluster-device process "
        "serving all its messages (no flower-superexec, no flwr-clientapp process per message; docs/devices.md). "
        "Default: on with a flwr release the worker was verified with, else off; --no-device-worker: Flower's "
        "stock SuperNodes",
    )
    parser.add_argument(
        "--timeout",
        type=number(0, 10**7, low_open=True),
        default=900.0,
        help="seconds to wait for the run to finish (default 900)",
    )
    return parser


def worker_by_default() -> bool:
    """Whether SuperNodes get a ``fedcluster-device`` worker when not told: with a flwr the
    worker was verified with (it uses Flower's internal Runtime API), stock ones otherwise,
    said on stdout."""
    from importlib.metadata import version

    from ..client.device_worker import VERIFIED_FLOWER, verified

    release = version("flwr")
    if verified(release):
        return True
    print(
        f"SuperNodes: Flower's stock ones (flwr {release}: fedcluster-device was verified with "
        f"{', '.join(VERIFIED_FLOWER)} only; --device-worker tries it anyway)"
    )
    return False


def _terminate(signum, frame):  # SIGTERM behaves like Ctrl-C: clean up, then exit
    raise KeyboardInterrupt


def checked_run_config(text: str) -> None:
    """The ``--run-config`` as the run will see it, checked here before any process starts."""
    from ..config import parse_run_config, with_defaults

    with_defaults(parse_run_config(text))


def main(argv: list[str] | None = None) -> int:
    from ..config import ConfigError

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        checked_run_config(args.run_config)
        default = Path("local-cluster") / datetime.now().strftime("%Y%m%d-%H%M%S")
        workdir = output_folder(default if args.workdir is None else args.workdir, "--workdir", empty=True).resolve()
    except ConfigError as exc:
        parser.error(f"argument --run-config: {' '.join(str(exc).split())}")
    except UsageError as exc:
        parser.error(str(exc))
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
        worker = args.device_worker if args.device_worker is not None else worker_by_default()
        with LocalCluster(workdir, files, device_worker=worker) as cluster:
            cluster.start()
            run_id = cluster.submit(app, run_config.strip())
            print(f"run {run_id} submitted: {run_config.strip()}", flush=True)
            follower = cluster.follow(run_id, print_progress)
            status = cluster.wait(run_id, args.timeout)
            follower.join(timeout=FOLLOW_GRACE_S)  # the stream ends by itself once the run is over
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
    except (ClusterError, OSError) as exc:
        return refuse("fedcluster-local-cluster", exc)
    except KeyboardInterrupt:
        print("fedcluster-local-cluster: interrupted; every process started here is stopped", file=sys.stderr)
        return 130
    finally:
        if cluster is not None:
            cluster.stop()
        signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
