"""What secure aggregation costs: FedDP-KMeans without server data, plain vs
``secure-aggregation = true``, in the same run.

Both runs are in-process (the same ClientApp and Flower messages as a deployment) on the
same data and seeds: a Gaussian mixture split over the devices (200 points each), the
default start without server data (the histogram) and 3 relative Lloyd rounds at ε = 1.
Reported per Lloyd round (the session of keys is set up once, in the first secured phase,
and reported on its own line): round trips, the bytes of every message (``.npy`` payloads,
``fedcluster.server.messages.payload_bytes``), and the round's seconds. In-process, the devices
run one after the other on this machine, so a round's seconds are the server's plus EVERY
device's compute; in a deployment the devices work in parallel and a round costs its round
trips (seconds each, docs/results/deployment_seconds.md) plus one device's compute, listed
as "device s / round". The secure run is the default: the devices add their shares of the
noise (``secagg-noise = devices``), so its centers are not the plain run's; that they are,
with the server's noise, is tested (tests/protocol/test_secagg.py). Where 16 neighbours are
fewer than every other device, the secure run is measured a second time on SecAgg+'s sparse
graph (``secagg-neighbours = 16``): the session's Shamir sharing and key agreement, and each
round's pairwise masks, then grow with 16, not with the number of devices.

Then the same pair in a real deployment on loopback (``LocalCluster``, what
``fedcluster-local-cluster`` starts: a SuperLink with TLS and SuperNode authentication, one
SuperNode per device, each a separate process with its own ``.npy`` of 200 points; Flower
starts a fresh ClientApp process for every message), d = 10, k = 5: the round trips and
seconds of a Lloyd round there, where the devices work in parallel.

Usage::

    python bench/secure_aggregation.py                 # 10 and 100 devices in-process, 4 SuperNodes
    python bench/secure_aggregation.py --quick --out DIR   # 10 and 30 devices, 3 SuperNodes
    python bench/secure_aggregation.py --deployment-nodes 0   # in-process only
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np

from _common import ROOT, add_bench_flags, markdown_table, page_output, print_header, run_inprocess
from speed import DeviceSeconds

PAYLOADS = {"d = 10, k = 5": (10, 5), "d = 100, k = 10": (100, 10)}
POINTS_PER_DEVICE = 200
ROUNDS = 3
NEIGHBOURS = 16  # SecAgg+'s sparse graph, measured where it is sparser than the full one


def config(devices: int, d: int, k: int, secure: bool, out: Path, neighbours: int = 0) -> dict:
    return {
        "algorithm": "feddp-kmeans",
        "dataset": "gaussian-mixture",
        "dim": d,
        "dimension": d,
        "k": k,
        "components": k,
        "num-points": POINTS_PER_DEVICE * devices,
        "seed": 1,
        "noise-seed": 2,
        "epsilon": 1.0,
        "lloyd-rounds": ROUNDS,
        "clip-norm": 4.0 * np.sqrt(d),
        "reference": False,
        "evaluate-cost": False,
        "secure-aggregation": secure,
        "output-dir": str(out),
        **({"secagg-neighbours": neighbours} if secure else {}),
    }


def lloyd_trips(result: dict) -> list[int]:
    """The round trips of the Lloyd rounds (the session's two, once per run, apart)."""
    phases = [
        p
        for p in result["phases"]
        if p["phase"].startswith("lloyd") and not p["phase"].endswith(("setup", "share-keys"))
    ]
    return sorted({p["round_trip"] for p in phases})


def measure(devices: int, d: int, k: int, secure: bool, tmp: Path, neighbours: int = 0) -> dict:
    out = tmp / f"{devices}-{d}-{secure}-{neighbours}"
    with DeviceSeconds() as clock:
        result = run_inprocess(config(devices, d, k, secure, out, neighbours), num_nodes=devices)
    rounds = result["rounds"]
    trips = lloyd_trips(result)
    session = [p for p in result["phases"] if p["phase"].endswith(("setup", "share-keys"))]
    return {
        "trips": len(trips) / len(rounds),
        "bytes": sum(r["bytes_up"] + r["bytes_down"] for r in rounds) / len(rounds),
        "seconds": sum(r["seconds"] for r in rounds) / len(rounds),
        "device": sum(clock.per_trip.get(t, 0.0) for t in trips) / len(rounds) / devices,
        "session_trips": len(session),
        "session_bytes": sum(p["bytes_up"] + p["bytes_down"] for p in session),
        "session_seconds": sum(p["seconds"] for p in session),
    }


def kib(value: float) -> str:
    return f"{value / 1024:.1f}"


def table(quick: bool) -> None:
    print_header(
        "Secure aggregation's cost: FedDP-KMeans without server data, plain vs secure (in-process"
        + (", --quick: 10 and 30 devices" if quick else "")
        + ")",
        __doc__,
    )
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for devices in (10, 30) if quick else (10, 100):
            for name, (d, k) in PAYLOADS.items():
                plain = measure(devices, d, k, False, Path(tmp))
                for graph in (0, NEIGHBOURS) if NEIGHBOURS < devices - 1 else (0,):
                    secure = measure(devices, d, k, True, Path(tmp), graph)
                    rows.append(row(devices, name, graph, plain, secure))
    print(
        markdown_table(
            [
                "devices",
                "payload",
                "masks with",
                "round trips / round",
                "KiB / round (plain / secure)",
                "s / round in-process",
                "device s / round (one device)",
                "session (once)",
            ],
            rows,
        )
    )
    print(
        f"\n{ROUNDS} Lloyd rounds per run, {POINTS_PER_DEVICE} points per device; the session is set up in the "
        'histogram phase, before the rounds. "masks with": every other device (SecAgg\'s full graph, the default) '
        f"or {NEIGHBOURS} neighbours (``secagg-neighbours = {NEIGHBOURS}``, SecAgg+'s sparse graph), measured where "
        "that "
        "is fewer than every other device."
    )


def row(devices: int, name: str, graph: int, plain: dict, secure: dict) -> list:
    return [
        devices,
        name,
        f"{graph} neighbours" if graph else "all others",
        f"{plain['trips']:.0f} / {secure['trips']:.0f}",
        f"{kib(plain['bytes'])} / {kib(secure['bytes'])} ({secure['bytes'] / plain['bytes']:.2f}×)",
        f"{plain['seconds']:.3f} / {secure['seconds']:.3f} ({secure['seconds'] / plain['seconds']:.1f}×)",
        f"{plain['device'] * 1e3:.2f} / {secure['device'] * 1e3:.2f} ms",
        f"{secure['session_trips']} trips, {kib(secure['session_bytes'])} KiB, {secure['session_seconds']:.1f} s",
    ]


def deployment(nodes: int) -> None:
    """Plain, then secure, on one LocalCluster of ``nodes`` SuperNodes: seconds per Lloyd round
    from each run's result.json (the devices work in parallel there)."""
    from fedcluster.tools.local_cluster import LocalCluster

    d, k = PAYLOADS["d = 10, k = 5"]
    rng = np.random.default_rng(1)
    means = rng.normal(scale=3.0, size=(k, d))
    measured = {}
    with tempfile.TemporaryDirectory(prefix="fedcluster-secagg-deploy-") as tmp:
        files = []
        for node in range(nodes):
            files.append(Path(tmp) / f"device_{node}.npy")
            np.save(files[-1], means[rng.integers(k, size=POINTS_PER_DEVICE)] + rng.normal(size=(POINTS_PER_DEVICE, d)))
        with LocalCluster(Path(tmp) / "cluster", files, echo=lambda *_: None) as cluster:
            cluster.start()
            for secure in (False, True):
                out = Path(tmp) / f"out-{secure}"
                run_id = cluster.submit(
                    ROOT,
                    f"algorithm='feddp-kmeans' k={k} dimension={d} clip-norm={4.0 * np.sqrt(d)} "
                    f"epsilon=1.0 noise-seed=2 lloyd-rounds={ROUNDS} evaluate-cost=false "
                    f"reference=false min-nodes={nodes} secure-aggregation={str(secure).lower()} "
                    f"output-dir='{out}'",
                )
                status = cluster.wait(run_id, 1800)
                if status != "finished:completed":
                    raise SystemExit(f"deployment run ended {status}:\n{cluster.run_log(run_id)[-3000:]}")
                result = json.loads((out / "result.json").read_text())
                rounds = result["rounds"]
                measured[secure] = (
                    len(lloyd_trips(result)) / len(rounds),
                    sum(r["seconds"] for r in rounds) / len(rounds),
                    result["wall_time_s"],
                )
    (plain_trips, plain_s, plain_wall), (secure_trips, secure_s, secure_wall) = measured[False], measured[True]
    print(f"\n## In a deployment: {nodes} SuperNodes on loopback (TLS + SuperNode authentication), d = {d}, k = {k}\n")
    print(
        markdown_table(
            ["devices", "round trips / round", "s / round (plain / secure)", "whole run s (plain / secure)"],
            [
                [
                    nodes,
                    f"{plain_trips:.0f} / {secure_trips:.0f}",
                    f"{plain_s:.2f} / {secure_s:.2f} ({secure_s / plain_s:.2f}×)",
                    f"{plain_wall:.1f} / {secure_wall:.1f}",
                ]
            ],
        )
    )
    print(
        f"\n{ROUNDS} Lloyd rounds per run; the secure run's whole time includes its session (two round trips) "
        "and the histogram's two."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_bench_flags(parser, quick="10 and 30 devices, 3 SuperNodes")
    parser.add_argument(
        "--deployment-nodes",
        type=int,
        default=None,
        help="SuperNodes of the deployment measurement (default 4, 3 with --quick; 0 = none)",
    )
    args = parser.parse_args()
    nodes = args.deployment_nodes if args.deployment_nodes is not None else (3 if args.quick else 4)
    with page_output(args.out, __file__):
        table(args.quick)
        if nodes:
            deployment(nodes)


if __name__ == "__main__":
    main()
