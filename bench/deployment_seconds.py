"""Deployment seconds per round: how much is Flower's transport and how much is our work.

A real deployment on loopback (``LocalCluster``, what ``fedcluster-local-cluster`` starts:
a SuperLink with TLS and SuperNode authentication and 3 SuperNodes, each reading its own
``.npy`` of 20 000 × 32 points), FedKMeans with ``k = 16``, every device every round,
``eval-every = 0``, 6 rounds. Seconds per round = the median of ``result.json``'s
``rounds[*].seconds`` over rounds 2..6. Split, each part measured here on the same data:

- **device kernel**: the ``fedkmeans_train`` task on one device's points (timed in this
  process, best of 3; the devices run in parallel, so the largest of the three counts);
- **ClientApp start**: a fresh Python process that imports the ClientApp and loads the
  device's file (Flower starts a new ``flwr-clientapp`` process for every message; this
  is a lower bound of that start, which also imports Flower's own runtime);
- **server work**: the ServerApp's computation per round, from the same run in-process
  (its round seconds minus the three device kernels it ran one after the other);
- **Flower transport and polling**: the rest (SuperLink ↔ SuperNode ↔ ClientApp process,
  the ServerApp's pull loop and the SuperNodes' polling intervals).

``--quick``: 5 000 points per SuperNode and 3 rounds (the median over rounds 2..3).

Usage::

    python bench/deployment_seconds.py
    python bench/deployment_seconds.py --quick --out DIR   # also writes DIR/deployment_seconds.md
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from _common import ROOT, add_bench_flags, markdown_table, page_output, print_header, run_inprocess

NODES, POINTS, DIM, K, ROUNDS = 3, 20_000, 32, 16, 6
QUICK_POINTS, QUICK_ROUNDS = 5_000, 3
CONFIG = {
    "k": K,
    "num-rounds": ROUNDS,
    "eval-every": 0,
    "reference": False,
    "tol": 0.0,
    "n-init": 1,
}  # one center set per round (the default trains up to 16 side by side in the first rounds)


def device_files(folder: Path, points: int = POINTS) -> list[Path]:
    rng = np.random.default_rng(0)
    means = rng.normal(0, 6, size=(K, DIM))
    folder.mkdir(parents=True, exist_ok=True)
    files = []
    for i in range(NODES):
        labels = rng.integers(K, size=points)
        files.append(folder / f"device_{i + 1}.npy")
        np.save(files[-1], means[labels] + rng.normal(size=(points, DIM)))
    return files


def kernel_seconds(path: Path, centers: np.ndarray) -> float:
    from fedcluster.node_data import device_data
    from fedcluster.device import run_task

    data = device_data({"dataset": "npy-dir"}, {"data-path": str(path)})
    config = {"local-epochs": 1, "batch-size": 0, "client-lr": 1.0, "seed": 1}
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        run_task("fedkmeans_train", data, {"centers": centers[None]}, config)  # the task takes (sets, k, d)
        best = min(best, time.perf_counter() - started)
    return best


def clientapp_start_seconds(path: Path) -> float:
    code = f"import numpy, fedcluster.client.app; numpy.load({str(path)!r})"
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)
        best = min(best, time.perf_counter() - started)
    return best


def median_round(result: dict) -> float:
    return statistics.median(r["seconds"] for r in result["rounds"][1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_bench_flags(parser, quick=f"{QUICK_POINTS} points per SuperNode, {QUICK_ROUNDS} rounds")
    args = parser.parse_args()
    with page_output(args.out, __file__):
        measure(*((QUICK_POINTS, QUICK_ROUNDS) if args.quick else (POINTS, ROUNDS)))


def measure(points: int, rounds: int) -> None:
    from fedcluster.tools.local_cluster import LocalCluster

    print_header(
        f"Deployment seconds per round: FedKMeans, {NODES} SuperNodes (TLS + auth, loopback), "
        f"{points} x {DIM} points each, k = {K}, {rounds} rounds",
        __doc__,
    )
    with tempfile.TemporaryDirectory(prefix="fedcluster-deploy-") as tmp:
        files = device_files(Path(tmp) / "data", points)
        inprocess = run_inprocess(
            {**CONFIG, "num-rounds": rounds, "dataset": "npy-dir", "data-dir": str(Path(tmp) / "data")}, NODES
        )
        centers = np.asarray(inprocess["centers"])
        kernels = [kernel_seconds(f, centers) for f in files]
        start = clientapp_start_seconds(files[0])
        server = max(median_round(inprocess) - sum(kernels), 0.0)
        out = Path(tmp) / "out"
        with LocalCluster(Path(tmp) / "cluster", files, echo=lambda *_: None) as cluster:
            cluster.start()
            run_id = cluster.submit(
                ROOT,
                f"k={K} num-rounds={rounds} eval-every=0 reference=false tol=0.0 min-nodes={NODES} output-dir='{out}'",
            )
            status = cluster.wait(run_id, 900)
            if status != "finished:completed":
                raise SystemExit(f"deployment run ended {status}:\n{cluster.run_log(run_id)[-3000:]}")
        deployed = json.loads((out / "result.json").read_text())
    per_round = median_round(deployed)
    device = max(kernels)
    rest = per_round - device - start - server
    rows = [
        [f"deployment, seconds per round (median, rounds 2..{rounds})", f"{per_round:.2f}", "100 %"],
        ["device kernel (fedkmeans_train, largest device)", f"{device:.3f}", f"{100 * device / per_round:.1f} %"],
        ["ClientApp start (fresh process: import + load data)", f"{start:.2f}", f"{100 * start / per_round:.1f} %"],
        ["server work (ServerApp, per round)", f"{server:.3f}", f"{100 * server / per_round:.1f} %"],
        ["Flower transport and polling (the rest)", f"{rest:.2f}", f"{100 * rest / per_round:.1f} %"],
    ]
    print(markdown_table(["part", "seconds", "share"], rows))
    print(f"\nin-process, the same run: {median_round(inprocess):.3f} s per round")


if __name__ == "__main__":
    main()
