"""Phone-class devices: every algorithm through a secure deployment of capped SuperNodes.

A :class:`fedcluster.tools.constrained.ConstrainedCluster`: a SuperLink with TLS and SuperNode
authentication on loopback and ``--supernodes`` SuperNodes, each (with the ClientApp
processes it starts for every message) in cgroups of its own, a memory cap and a
quarter of a core (``cpu.cfs_quota_us`` 25 000 of 100 000), in a network namespace of its
own whose veth uplink sends 1 Mbit/s (``tc tbf``), reaching the Fleet API only through
``fedcluster.tools.link_proxy``: every chunk each way held 100 ms +- 20 ms, every
connection cut after an exponential life of mean 60 s (none in its first 10 s: a cut first
TLS handshake makes a SuperNode exit, code 305). Each device holds 2 000 points of
two of four 4-D blobs (non-IID); FedSpectral and FedSpectral+ run on a cluster of their own over a planted
three-community graph (90 nodes) split over the same number of devices.

Per algorithm (run config in the table): time to result (``flwr run`` to finished),
bytes per device (``result.json`` communication, both ways, over the devices), peak device
memory (resident: ``total_rss`` of the device's memory cgroup sampled every 0.25 s, the
SuperNode and its ClientApp together; the cgroup's ``max_usage_in_bytes``, which also
counts page cache, beside it), CPU seconds per device (``cpuacct.usage``), OOM kills, and
connections the link dropped. First k-FED with every device capped at ``--cap-mb``
(256 MB: does a device fit?), then every algorithm at ``--memory-mb``. Then a device
sleeps: k-FED runs, and once it is under way one SuperNode's process group is stopped
(SIGSTOP) for ``--sleep-s`` seconds and continued (SIGCONT); the page says how the run
ended and what it says of that device.

The 2 cores of this machine are shared by every device: 20 quarter-cores ask for 5. Times
are those of this machine under that contention, not of 20 phones.

``--quick``: 3 SuperNodes, FedKMeans and k-FED only, a 20 s sleep. Another ``--supernodes``
than 20 writes ``constrained_devices-<N>.md``. ``--device-worker``: every SuperNode runs
``--isolation process`` with one long-lived ``fedcluster-device`` process serving all its
messages (in the device's cgroups and namespace) instead of a SuperExec and a ClientApp
process per message; the page is ``constrained_devices[-<N>]-worker.md``. A run after which every SuperNode is dead
ends there.

Usage (root; cgroup v1 memory, cpu, cpuacct; ip, tc)::

    python bench/constrained_devices.py --out docs/results
    python bench/constrained_devices.py --quick
    python bench/constrained_devices.py --supernodes 5 --device-worker --memory-mb 256 --out docs/results
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from _common import ROOT, add_bench_flags, markdown_table, page_output, print_header

from fedcluster.tools.constrained import ConstrainedCluster, Limits, Sampler, unavailable
from fedcluster.tools.flower import FlowerError

MEANS = np.array([[0, 0, 0, 0], [12, 0, 0, 0], [0, 12, 0, 0], [0, 0, 12, 0]], dtype=float)
POINTS = 2000
RUNS = {
    "fedkmeans": "k=4 num-rounds=2 eval-every=0",
    "kfed": "algorithm='kfed' k=4 k-prime=2",
    "da-ufl": "algorithm='da-ufl' k=4 outer-iterations=1",
    "feddp-kmeans": "algorithm='feddp-kmeans' k=4 init='histogram' dimension=4 clip-norm=30.0 lloyd-rounds=1 "
    "epsilon=4.0 noise-seed=3",
    "gmm": "algorithm='gmm' k=4 em-rounds=5",
    "fedspectral": "algorithm='fedspectral' k=3 num-nodes=90",
    "fedspectral-plus": "algorithm='fedspectral-plus' k=3 num-rounds=2 num-nodes=90 edge-copies=2",
}
GRAPHS = ("fedspectral", "fedspectral-plus")
SLEEP_RUN = ("kfed", "algorithm='kfed' k=4 k-prime=2")
SLEEP_AFTER_S = 5.0
NODE_KEYS = ("connected", "exclusions", "away_at_end", "joined")
MB = 2**20
DEVICES = 20  # the page docs/results/constrained_devices.md; another count writes constrained_devices-<N>.md


def point_files(folder: Path, devices: int, points: int = POINTS) -> list[Path]:
    rng = np.random.default_rng(11)
    folder.mkdir(parents=True, exist_ok=True)
    files = []
    for i in range(devices):
        half = points // 2
        X = np.concatenate([MEANS[(i + j) % 4] + rng.normal(size=(half, 4)) for j in range(2)])
        files.append(folder / f"device_{i + 1:03d}.npy")
        np.save(files[-1], X)
    return files


def edge_files(folder: Path, devices: int) -> list[Path]:
    from fedcluster.graph import canonical_edges, split_edges, write_client_edge_files

    rng = np.random.default_rng(2)
    edges = []
    for start in (0, 30, 60):
        iu = np.triu_indices(30, 1)
        keep = rng.random(iu[0].size) < 0.3
        edges.append(np.stack([iu[0][keep] + start, iu[1][keep] + start], axis=1))
    edges.append(np.array([[0, 30], [30, 60], [60, 0]]))
    return write_client_edge_files(split_edges(canonical_edges(np.concatenate(edges)), devices, 2, 0), folder)


FIRST_LIFE_S = 10.0  # no connection of the link dropped sooner (a SuperNode's first handshake)
ROUND_TIMEOUT_S = 120.0  # a phase's wait for a device whose message the link lost (the project's default: 600 s)


def measured_run(cluster: ConstrainedCluster, name: str, config: str, timeout: float, sleep=None) -> dict:
    """One run to its end with every device's memory and CPU measured; ``sleep``: (seconds
    after the run is under way, seconds asleep) for device 1. Every run waits at most
    ``ROUND_TIMEOUT_S`` for a phase's replies: a message a dropped link lost (Flower does
    not send it again) would otherwise hold the phase for the default 600 s."""
    devices = len(cluster.data_files)
    if "round-timeout=" not in config:
        config = f"{config} round-timeout={ROUND_TIMEOUT_S:g}"
    out = cluster.workdir / f"out-{name}"
    for group in cluster.cgroups:
        group.reset_peak()
    before = [group.snapshot() for group in cluster.cgroups]
    link_before = cluster.link_stats()
    sampler = Sampler(cluster.cgroups)
    sampler.start()
    started = time.monotonic()
    run_id = cluster.submit(ROOT, f"{config} min-nodes={devices} node-settle-s=1.0 reference=false output-dir='{out}'")
    slept = None
    try:
        if sleep:
            slept = put_to_sleep(cluster, run_id, *sleep)
        status = cluster.wait(run_id, timeout)
    except FlowerError:
        status = f"not finished after {timeout:.0f} s"
    finally:
        sampler.halt.set()
        sampler.join()
    seconds = time.monotonic() - started
    after = [group.snapshot() for group in cluster.cgroups]
    result = json.loads((out / "result.json").read_text()) if (out / "result.json").is_file() else {}
    if not status.startswith("finished:completed"):
        (cluster.workdir / f"run-{name}.log").write_text(cluster.run_log(run_id))
    comm = result.get("communication", {})
    return {
        "status": status,
        "seconds": seconds,
        "result": result,
        "bytes_per_device": (comm.get("bytes_up", 0) + comm.get("bytes_down", 0)) / devices if comm else None,
        "round_trips": comm.get("round_trips"),
        "peak_rss": sampler.peak_rss,
        "peak_usage": [a["peak_usage"] for a in after],
        "oom_kills": sum(a["oom_kills"] - b["oom_kills"] for a, b in zip(after, before)),
        "cpu_s": [a["cpu_s"] - b["cpu_s"] for a, b in zip(after, before)],
        "dropped": cluster.link_stats().get("dropped", 0) - link_before.get("dropped", 0),
        "link_kb": [
            (cluster.link_stats().get(key, 0) - link_before.get(key, 0)) / devices / 1e3
            for key in ("bytes_down", "bytes_up")
        ],
        "slept": slept,
        "by_process": sampler.peak_by_process,
        "at_once": sampler.most_at_once,
        "dead": sum(
            1 for name, p in cluster.processes.items() if name.startswith("supernode") and p.poll() is not None
        ),
    }


def put_to_sleep(cluster: ConstrainedCluster, run_id: str, after_s: float, asleep_s: float) -> dict:
    """SIGSTOP device 1's SuperNode (its process group: its ClientApp too) once the run has
    been under way ``after_s`` seconds; SIGCONT ``asleep_s`` seconds later."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and cluster.status(run_id) != "running":
        time.sleep(1)
    time.sleep(after_s)
    process = cluster.processes["supernode-1"]
    worker = cluster.workers.get("supernode-1")  # --device-worker: it sleeps with its SuperNode
    groups = [p.pid for p in (process, worker) if p is not None]
    for group in groups:
        os.killpg(group, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        time.sleep(asleep_s)
    finally:
        for group in groups:
            os.killpg(group, signal.SIGCONT)
    return {"asleep_s": time.monotonic() - stopped, "alive_after": process.poll() is None}


def row(name: str, config: str, got: dict) -> list:
    rss, usage, cpu = got["peak_rss"], got["peak_usage"], got["cpu_s"]
    final = got["result"].get("final", {})
    if "cost" in final:
        quality = f"{final['cost']:.3g}"
    elif "log_likelihood" in final:
        quality = f"log-likelihood {final['log_likelihood']:.3g} per point"
    elif "cluster_sizes" in final:
        quality = "cluster sizes " + "/".join(str(n) for n in final["cluster_sizes"]) + " (planted: 30/30/30)"
    else:
        quality = ""
    return [
        name,
        f"`{config}`",
        got["status"].replace("finished:", ""),
        f"{got['seconds']:.0f}",
        got["round_trips"] if got["round_trips"] is not None else "",
        f"{got['bytes_per_device'] / 1e3:.1f}" if got["bytes_per_device"] is not None else "",
        f"{got['link_kb'][0]:.0f} / {got['link_kb'][1]:.0f}",
        f"{statistics.median(rss) / MB:.0f} / {max(rss) / MB:.0f}",
        f"{max(usage) / MB:.0f}",
        f"{statistics.median(cpu):.1f} / {max(cpu):.1f}",
        got["oom_kills"],
        got["dropped"],
        quality,
    ]


HEADERS = [
    "algorithm",
    f"run config (besides min-nodes, reference=false, round-timeout={ROUND_TIMEOUT_S:g})",
    "status",
    "time to result (s)",
    "round trips",
    "kB per device (result.json: arrays up + down)",
    "kB per device on the link (down / up)",
    "peak resident MB per device (median / max)",
    "cgroup peak incl. page cache, max (MB)",
    "CPU s per device (median / max)",
    "OOM kills",
    "connections dropped",
    "final cost / quality",
]


def line(cells: list) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def run_cluster(
    workdir: Path, files: list[Path], names: list[str], limits: Limits, timeout: float, sleep, worker: bool = False
) -> list:
    """Each run's row is printed as soon as it is measured (a long run leaves the rows before it)."""
    rows = []
    echo = lambda text: print(f"  [{text}]", file=sys.stderr)  # noqa: E731
    with ConstrainedCluster(workdir, files, limits, echo=echo, device_worker=worker) as cl:
        cl.start()
        time.sleep(5)  # the SuperNodes connect through the link
        for name in names:
            print(f"  running {name} ...", file=sys.stderr, flush=True)
            got = measured_run(cl, name, RUNS[name], timeout)
            print(line(row(name, RUNS[name], got)), flush=True)
            rows.append((name, got))
            if got["dead"] == len(files):
                print(
                    f"\nEvery SuperNode is dead after {name} (see the OOM kills): the remaining runs are not started.\n"
                )
                return rows
        if sleep:
            name = f"{SLEEP_RUN[0]} (device 1 asleep {sleep[1]:.0f} s)"
            print(f"  running {name} ...", file=sys.stderr, flush=True)
            got = measured_run(cl, "sleep", SLEEP_RUN[1], timeout, sleep=sleep)
            print(line(row(name, SLEEP_RUN[1], got)), flush=True)
            rows.append((name, got))
    return rows


def probe_cap(tmp: Path, devices: int, limits: Limits, timeout: float, worker: bool = False) -> dict:
    """k-FED (one round trip) with every device capped at ``limits.memory``: does it fit?"""
    files = point_files(tmp / "probe-data", devices)
    with ConstrainedCluster(tmp / "probe", files, limits, echo=lambda t: None, device_worker=worker) as cl:
        cl.start()
        time.sleep(5)
        got = measured_run(cl, "probe", RUNS["kfed"], timeout)
        got["oom_log"] = oom_lines()
    return got


def oom_lines() -> list[str]:
    """The kernel's last memory-cgroup OOM kills (dmesg), naming the process killed."""
    import subprocess

    done = subprocess.run(["dmesg"], capture_output=True, text=True)
    return [line.split("] ", 1)[-1] for line in done.stdout.splitlines() if "Memory cgroup out of memory" in line][-1:]


def process_table(runs: list[tuple[str, dict]]) -> str:
    """The largest resident set of each of a device's processes (by command), over the devices."""
    names = sorted(
        {name for _, m in runs for name in m["by_process"] if name.startswith(("flower", "flwr", "fedcluster-device"))}
    )
    rows = [
        [run, *(f"{m['by_process'].get(p, 0) / MB:.0f} ({m['at_once'].get(p, 0)})" for p in names)] for run, m in runs
    ]
    return "\nA device's processes: the largest resident set (MB) each reached over the devices, and in brackets " + (
        "the most running at once in one device (sampled every 0.25 s; shared library pages count in each):\n\n"
        + markdown_table(["run", *names], rows)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--supernodes", type=int, default=None, help="devices (default 20; quick 3)")
    parser.add_argument("--algorithms", default=",".join(RUNS), help="comma-separated, of: " + ", ".join(RUNS))
    parser.add_argument("--sleep-s", type=float, default=None, help="seconds device 1 sleeps (default 45; quick 20)")
    parser.add_argument("--cap-mb", type=int, default=256, help="the phone-class memory cap tried first (MB; 0: skip)")
    parser.add_argument("--memory-mb", type=int, default=512, help="the memory cap of the measured runs (MB)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds one run may take")
    parser.add_argument(
        "--device-worker", action="store_true", help="one fedcluster-device process per SuperNode (--isolation process)"
    )
    parser.add_argument(
        "--workdir", type=Path, default=None, help="keep every log, certificate and output here (default: temporary)"
    )
    add_bench_flags(parser, quick="3 SuperNodes, fedkmeans and kfed, a 20 s sleep")
    args = parser.parse_args()
    why = unavailable()
    if why:
        sys.exit(f"constrained_devices: {why}")
    devices = args.supernodes or (3 if args.quick else DEVICES)
    names = ["fedkmeans", "kfed"] if args.quick else [n for n in args.algorithms.split(",") if n]
    unknown = [n for n in names if n not in RUNS]
    if unknown:
        sys.exit(f"constrained_devices: unknown algorithm(s) {', '.join(unknown)}; known: {', '.join(RUNS)}")
    sleep_s = args.sleep_s if args.sleep_s is not None else (20.0 if args.quick else 45.0)
    # The link drops no connection in a SuperNode's first FIRST_LIFE_S: Flower's SuperNode exits
    # (code 305) when its first TLS handshake is cut and does not retry (docs/devices.md)
    capped = Limits(memory=args.cap_mb * MB, min_life_s=FIRST_LIFE_S)
    limits = Limits(memory=args.memory_mb * MB, min_life_s=FIRST_LIFE_S)
    stem = (
        "constrained_devices"
        + ("" if devices == DEVICES else f"-{devices}")
        + ("-worker" if args.device_worker else "")
    )
    page = Path(__file__).with_name(f"{stem}.py")
    with page_output(args.out, page):
        served = ", each served by one fedcluster-device process" if args.device_worker else ""
        print_header(f"Phone-class devices: {devices} capped SuperNodes behind an emulated link{served}", __doc__)
        print(
            f"\nper device: {limits.cpu} core, uplink {limits.uplink}, {limits.delay_ms:.0f} +- "
            f"{limits.jitter_ms:.0f} ms each way, a connection dropped every {limits.drop_mean_s:.0f} s on average; "
            f"{POINTS} points x 4.\n"
        )
        with contextlib.nullcontext(str(args.workdir)) if args.workdir else tempfile.TemporaryDirectory() as tmp:
            tmp = Path(tmp)
            tmp.mkdir(parents=True, exist_ok=True)
            probes = []
            if args.cap_mb:
                print(f"  k-FED at {args.cap_mb} MB ...", file=sys.stderr, flush=True)
                probe = probe_cap(
                    tmp, devices, capped, min(args.timeout, 150.0 if args.quick else 240.0), args.device_worker
                )
                print(
                    f"**At {args.cap_mb} MB per device**: k-FED ended `{probe['status']}`; {probe['oom_kills']} OOM "
                    f"kill(s), {probe['dead']} of {devices} SuperNodes dead. Kernel: "
                    + "; ".join(f"`{x}`" for x in probe["oom_log"])
                )
                print(markdown_table(HEADERS, [row("kfed", RUNS["kfed"], probe)]))
                probes = [(f"kfed ({args.cap_mb} MB)", probe)]
            print(f"\n**At {args.memory_mb} MB per device**, every algorithm (rows as they finished):\n")
            print(markdown_table(HEADERS, []), flush=True)
            points = [n for n in names if n not in GRAPHS]
            files = point_files(tmp / "data", devices)
            sleep = (SLEEP_AFTER_S, sleep_s)
            got = run_cluster(tmp / "points", files, points, limits, args.timeout, sleep, args.device_worker)
            graphs = [n for n in names if n in GRAPHS]
            if graphs:
                got += run_cluster(
                    tmp / "graph",
                    edge_files(tmp / "edges", devices),
                    graphs,
                    limits,
                    args.timeout,
                    None,
                    args.device_worker,
                )
        print(process_table(probes + got))
        for name, m in got:
            if m["slept"]:
                nodes = m["result"].get("nodes", {})
                print(
                    f"\n**A device sleeps.** {name}: device 1's SuperNode and ClientApp stopped "
                    f"{m['slept']['asleep_s']:.0f} s (SIGSTOP) once the run was {SLEEP_AFTER_S:.0f} s under way, then "
                    f"continued (SIGCONT); the run ended `{m['status']}` after {m['seconds']:.0f} s."
                )
                print("nodes (result.json): " + json.dumps({k: nodes.get(k) for k in NODE_KEYS}))
                print(
                    "phases (replies): "
                    + ", ".join(f"{p['phase']} {p.get('replies', '?')}" for p in m["result"].get("phases", []))
                )


if __name__ == "__main__":
    main()
