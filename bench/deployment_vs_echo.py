"""Deployment against Flower's floor: fedcluster and Flower's echo app in ONE deployment.

One SuperLink with TLS and SuperNode authentication and 3 SuperNodes on loopback
(``LocalCluster``, what ``fedcluster-local-cluster`` starts), each reading its own ``.npy``
of 2 000 × 8 points (5 well-separated blobs). On that same federation, one after the
other:

- **echo, Flower's way**: ``bench/echo_app`` (a ServerApp that sends one small array to
  every node and waits for the replies with Flower's ``grid.send_and_receive``, whose pull
  loop sleeps 3 s), ``TRIPS`` round trips;
- **echo, pulled like ours**: the same app pulling every 0.1 s (``pull-pause``), as the
  fedcluster ServerApp does: the floor of a round trip in this deployment (run before and
  after ours); and once with its reply in 4 arrays (``up-arrays``), as a FedKMeans training
  reply (centers, counts, scatter, cost): Flower moves every array as an object of its own;
- **every algorithm with its run-config defaults** (FedDP-KMeans given the dimension, clipping
  norm and Lloyd rounds it has no default for; ``reference = false``: no central
  k-means in the ServerApp), as a user's ``flwr run`` would.

Per round trip: for the echo app the median of its timed broadcasts; for fedcluster the
median over the run's round trips of the seconds from the push to the last reply
(``result.json`` phases, grouped by ``round_trip``). "all in" is the ServerApp's wall time
(``wall_time_s``) over its round trips: the server's work between round trips and its
waiting for the nodes included. Time to result: ``flwr run`` returning to ``flwr ls``
reporting the run finished (polled every second), and the ServerApp's own ``wall_time_s``.

Where a round trip's seconds go (the table after): the fedcluster parts are measured here
on the same data (the device kernel of one training message in this process; the
server's work per round trip from the same FedKMeans run in-process, its round trips'
seconds less the devices' kernels; the import of our ClientApp in a fresh process beside
the import of Flower's alone). Flower's parts are its constants, named where they are in
Flower's source: a SuperNode with nothing to do sleeps 3 s before it asks again, the
SuperExec beside it looks for a new task every second and starts a fresh
``flwr-clientapp`` process for every message, the SuperNode waits for the ClientApp's reply
in steps of 0.5 s.

Then the same SuperLink set-up again with every SuperNode served by one long-lived
``fedcluster-device`` process (``--isolation process``, ``fedcluster-local-cluster
--device-worker``: no SuperExec, no ``flwr-clientapp`` process per message) and every
algorithm again: Flower's echo app cannot run there (the worker runs fedcluster's
ClientApp only), so its rows are set against the echo floor of the stock SuperNodes above,
Flower's own way of running a ClientApp.

Last, FedKMeans' default run then and now: on the stock SuperNodes with
``stop-when-fixed = false`` (every round after converging: the default run when issue 44
was filed) against the default run with device workers.

``--quick``: 4 echo round trips each, FedKMeans only, 5 rounds.

Usage::

    python bench/deployment_vs_echo.py
    python bench/deployment_vs_echo.py --quick --out DIR   # also writes DIR/deployment_vs_echo.md
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from _common import ROOT, add_bench_flags, markdown_table, page_output, print_header, run_inprocess
from deployment_seconds import kernel_seconds

NODES, POINTS, DIM, BLOBS = 3, 2_000, 8, 5
TRIPS, QUICK_TRIPS = 8, 4
ECHO_APP = ROOT / "bench" / "echo_app"
# Each algorithm's run with its defaults; only what a deployment needs is added.
RUNS = {
    "fedkmeans": "",
    "kfed": "algorithm='kfed'",
    # FedDP-KMeans has no default for what must be agreed in advance (the data's dimension, the
    # clipping norm) nor for its Lloyd rounds: the values for this data.
    "feddp-kmeans": "algorithm='feddp-kmeans' dimension=8 clip-norm=40.0 lloyd-rounds=2",
    "da-ufl": "algorithm='da-ufl'",
}
QUICK_RUNS = {"fedkmeans (5 rounds)": "num-rounds=5"}
# FedKMeans' default run as it was when issue 44 was filed: every one of its rounds after
# converging, on stock SuperNodes (the baseline of "the default run, then and now").
EVERY_ROUND = ("fedkmeans, every round (stop-when-fixed=false)", "stop-when-fixed=false")
FLOWER_WAITS = [
    ("SuperNode idle poll: sleeps 3 s when it pulled nothing", "flwr/supernode/start_client_internal.py", 3.0),
    ("SuperExec task poll: every 1 s (FLWR_SUPEREXEC_TASK_POLL_INTERVAL)", "flwr/supercore/superexec/", 1.0),
    ("SuperNode waits for the ClientApp's reply in steps of 0.5 s", "flwr/supernode/start_client_internal.py", 0.5),
]


def device_files(folder: Path) -> list[Path]:
    rng = np.random.default_rng(0)
    means = rng.normal(0, 8, size=(BLOBS, DIM))
    folder.mkdir(parents=True, exist_ok=True)
    files = []
    for i in range(NODES):
        files.append(folder / f"device_{i + 1}.npy")
        np.save(files[-1], means[rng.integers(BLOBS, size=POINTS)] + rng.normal(size=(POINTS, DIM)))
    return files


def trip_seconds(result: dict) -> list[float]:
    """Each round trip's seconds, push to last reply (its phases share one start)."""
    trips: dict[int, float] = {}
    for phase in result["phases"]:
        trips[phase["round_trip"]] = max(trips.get(phase["round_trip"], 0.0), phase["seconds"])
    return list(trips.values())


def run_app(cluster, app: Path, run_config: str) -> tuple[str, float, str]:
    """Submit, wait; (final status, seconds from ``flwr run`` returning to finished, the
    tail of the run's log when it did not complete)."""
    run_id = cluster.submit(app, run_config)
    started = time.perf_counter()
    status = cluster.wait(run_id, 1800, poll=1.0)
    seconds = time.perf_counter() - started
    return status, seconds, "" if status == "finished:completed" else cluster.run_log(run_id)[-1500:]


def echo(cluster, out: Path, trips: int, pull_pause: float, arrays: int = 1) -> list[float]:
    path = out / f"echo-{pull_pause}-{arrays}-{time.monotonic_ns()}.json"
    status, _, log = run_app(
        cluster,
        ECHO_APP,
        f"broadcasts={trips} down-floats=80 up-floats=200 up-arrays={arrays} min-nodes={NODES} output='{path}' "
        f"pull-pause={pull_pause}",
    )
    if status != "finished:completed":
        raise SystemExit(f"the echo app ended {status}:\n{log}")
    return json.loads(path.read_text())["seconds"]


# A fresh process that does what a flwr-clientapp process does with one message, past
# Flower's own start: import the ClientApp and answer the message (echo's, or a FedKMeans
# training message on a device file: our data load, protocol checks and kernel).
ONE_MESSAGE = """
import sys, time
started = time.perf_counter()
import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.supercore.task_identity import TaskIdentity
TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
if sys.argv[1] == "echo":
    sys.path.insert(0, sys.argv[3])
    from echo_app.client import echo as handle
    arrays, config, kind = {"x": np.zeros(80)}, {"up-floats": 201}, "query"
else:
    from fedcluster.client.app import handle
    arrays, config = {"centers": np.zeros((1, 5, 8))}, {"local-epochs": 1, "batch-size": 0, "client-lr": 1.0, "seed": 1}
    kind = "train.fedkmeans_train"
content = RecordDict({"arrays": ArrayRecord({k: Array(v) for k, v in arrays.items()}), "config": ConfigRecord(config)})
context = Context(1, 1, {"data-path": sys.argv[2], "partition-id": 0}, RecordDict(), {})
reply = handle(Message(content, dst_node_id=1, message_type=kind), context)
assert not reply.has_error(), reply.error
print(time.perf_counter() - started)
"""


def one_message_seconds(kind: str, path: Path) -> float:
    """Best of 3 fresh processes: import the ClientApp and answer one message."""
    args = [sys.executable, "-c", ONE_MESSAGE, kind, str(path), str(ECHO_APP)]
    return min(
        float(subprocess.run(args, cwd=ROOT, check=True, capture_output=True, text=True).stdout) for _ in range(3)
    )


def fab_install_seconds(folder: Path) -> tuple[int, float]:
    """Our FAB (``flwr build``): its bytes and the best of 3 unpack-and-verify, what every
    flwr-clientapp process does before it loads the ClientApp (an install already there is
    kept, after the check)."""
    from fedcluster.tools.flower import FlowerProcesses

    flower = FlowerProcesses(folder)
    done = flower.flwr("build", "--app", str(ROOT), timeout=300)
    fabs = sorted(folder.glob("*.fab"))
    if done.returncode != 0 or not fabs:
        raise SystemExit(f"flwr build failed: {(done.stdout + done.stderr)[-2000:]}")
    code = (
        "import sys, time; from flwr.cli.install import install_from_fab; data = open(sys.argv[1], 'rb').read(); "
        "install_from_fab(data, skip_prompt=True); t = time.perf_counter(); "
        "install_from_fab(data, skip_prompt=True); print(time.perf_counter() - t)"
    )
    runs = [subprocess.run([sys.executable, "-c", code, str(fabs[0])], env=flower.env, capture_output=True, text=True)]
    runs += [subprocess.run([sys.executable, "-c", code, str(fabs[0])], env=flower.env, capture_output=True, text=True)]
    return fabs[0].stat().st_size, min(float(r.stdout.strip().splitlines()[-1]) for r in runs)


def server_seconds(folder: Path, files: list[Path]) -> tuple[float, float]:
    """FedKMeans in-process on the same files: (the server's seconds per round trip, the
    largest device kernel)."""
    result = run_inprocess({"dataset": "npy-dir", "data-dir": str(folder), "reference": False}, NODES)
    kernels = [kernel_seconds(f, np.asarray(result["centers"])) for f in files]
    per_trip = statistics.median(trip_seconds(result))
    return max(per_trip - sum(kernels), 0.0), max(kernels)


def run_algorithms(cluster, runs: dict[str, str], out: Path, suffix: str, rows: list, times: list, failed: list):
    """Each run (name -> run config) on ``cluster``, one after the other, its outputs in
    ``out``-<i>: a row of seconds per round trip and one of time to result each (names
    ending in ``suffix``), or what failed."""
    for index, (name, extra) in enumerate(runs.items()):
        name, folder = f"{name}{suffix}", Path(f"{out}-{index}")
        config = f"{extra} reference=false min-nodes={NODES} output-dir='{folder}'".strip()
        status, seconds, log = run_app(cluster, ROOT, config)
        if status != "finished:completed":
            failed.append(f"{name} ({config}) ended {status}:\n{log}")
            continue
        result = json.loads((folder / "result.json").read_text())
        per_trip = trip_seconds(result)
        rows.append([name, len(per_trip), statistics.median(per_trip), result["wall_time_s"] / len(per_trip)])
        times.append([name, len(per_trip), len(result["rounds"]), f"{result['wall_time_s']:.1f}", f"{seconds:.1f}"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_bench_flags(parser, quick=f"{QUICK_TRIPS} echo round trips each, FedKMeans only with 5 rounds")
    args = parser.parse_args()
    with page_output(args.out, __file__):
        measure(QUICK_TRIPS if args.quick else TRIPS, QUICK_RUNS if args.quick else RUNS)


def measure(trips: int, runs: dict[str, str]) -> None:
    from fedcluster.tools.local_cluster import LocalCluster

    print_header(
        f"Deployment against Flower's echo app: {NODES} SuperNodes (TLS + auth, loopback), "
        f"{POINTS} x {DIM} points each",
        __doc__,
    )
    rows, times, failed = [], [], []
    with tempfile.TemporaryDirectory(prefix="fedcluster-vs-echo-") as tmp:
        tmp = Path(tmp)
        files = device_files(tmp / "data")
        server, kernel = server_seconds(tmp / "data", files)
        echo_message, our_message = one_message_seconds("echo", files[0]), one_message_seconds("ours", files[0])
        fab_bytes, fab_seconds = fab_install_seconds(tmp / "fab")
        with LocalCluster(tmp / "cluster", files, echo=lambda *_: None) as cluster:
            cluster.start()
            slow = echo(cluster, tmp, trips, 0.0)
            fast = echo(cluster, tmp, trips, 0.1)
            four = echo(cluster, tmp, trips, 0.1, arrays=4)
            stock_runs = {**runs, EVERY_ROUND[0]: EVERY_ROUND[1]} if "fedkmeans" in runs else runs
            run_algorithms(cluster, stock_runs, tmp / "stock", "", rows, times, failed)
            fast += echo(cluster, tmp, trips, 0.1)  # again after ours: a change of load hits both
        with LocalCluster(tmp / "worker-cluster", files, echo=lambda *_: None, device_worker=True) as cluster:
            cluster.start()
            run_algorithms(cluster, runs, tmp / "worker", ", fedcluster-device", rows, times, failed)
    floor = statistics.median(fast)
    rows = [
        ["echo, Flower's send_and_receive (3 s pulls)", trips, f"{statistics.median(slow):.2f}", "", ""],
        ["echo, pulled every 0.1 s (the floor; before and after ours)", 2 * trips, f"{floor:.2f}", "", "1.00"],
        ["echo, 4 arrays per reply, pulled every 0.1 s", trips, f"{statistics.median(four):.2f}", "", ""],
        *[[name, n, f"{median:.2f}", f"{all_in:.2f}", f"{median / floor:.2f}"] for name, n, median, all_in in rows],
    ]
    print("## Seconds per round trip, the same deployment\n")
    print(markdown_table(["run", "round trips", "s per round trip (median)", "all in", "/ echo floor"], rows))
    print("\n## Time to result per algorithm (run-config defaults, reference = false)\n")
    print(markdown_table(["algorithm", "round trips", "rounds", "ServerApp wall s", "flwr run → finished s"], times))
    took = {row[0]: float(row[4]) for row in times}
    then, now = took.get(EVERY_ROUND[0]), took.get("fedkmeans, fedcluster-device")
    if then and now:
        print(
            f"\nFedKMeans' default run, flwr run to finished: {now:.1f} s now (fedcluster-device, stops once "
            f"converged) against {then:.1f} s as when issue 44 was filed (stock SuperNodes, every round): "
            f"**{then / now:.1f}x shorter**."
        )
    split = [
        ["echo floor, per round trip (measured above)", f"{floor:.2f}"],
        *[[f"Flower: {what} ({where})", f"≤ {seconds:.1f}"] for what, where, seconds in FLOWER_WAITS],
        ["a fresh process: import echo's ClientApp, answer one message (numpy + Flower)", f"{echo_message:.2f}"],
        ["a fresh process: import ours, answer one FedKMeans training message", f"{our_message:.2f}"],
        [
            f"ours: unpack and verify our FAB ({fab_bytes / 1e6:.2f} MB), in every flwr-clientapp process",
            f"{fab_seconds:.3f}",
        ],
        ["ours: device kernel (fedkmeans_train, largest device)", f"{kernel:.4f}"],
        ["ours: the server's work per round trip (in-process, less the kernels)", f"{server:.4f}"],
    ]
    print("\n## Where a round trip's seconds go\n")
    print(markdown_table(["part", "seconds"], split))
    for text in failed:
        print(f"\nFAILED: {text}")
    if os.environ.get("PYTHONDONTWRITEBYTECODE"):
        print("\nPYTHONDONTWRITEBYTECODE is set here: every process compiles fedcluster's modules from source.")


if __name__ == "__main__":
    main()
