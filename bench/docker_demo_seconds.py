"""Docker demo cluster: seconds from ``docker compose up`` to a finished job, plain and TLS.

Brings up the cluster of ``docker-compose.yml`` (and with ``docker-compose.tls.yml`` on top:
TLS + SuperNode authentication, certificates made here) on the demo data
(``docker/make_demo_data.py``: 3 SuperNodes, 1250 points, d = 2) with the compose file's own
job (FedKMeans, k = 4, 10 rounds), ``--repeats`` times each, and tears it down each time.
Columns: ``up`` = ``up -d`` returned (containers created and started); ``up → finished`` =
until the job container exited (``docker wait``), which is what a user waits for; ``run`` =
Flower's own pending → finished time of the run (``flwr-run.json``); seconds per round from
``result.json``. Baseline, same data and config in this process (``fedcluster.inprocess.run``): the
same job without any Flower transport.

Needs a Docker engine, Compose and the images (``bash docker/build.sh``).

Usage::

    python bench/docker_demo_seconds.py [--repeats 2]   # --quick: one run of each
    python bench/docker_demo_seconds.py --quick --out DIR   # also writes DIR/docker_demo_seconds.md
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np

from _common import ROOT, add_bench_flags, markdown_table, page_output, print_header, run_inprocess

JOB_CONFIG = {"k": 4, "num-rounds": 10, "tol": 1e-4, "reference": False}  # the compose file's job


def compose_command() -> list[str]:
    if subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    raise SystemExit("neither 'docker compose' nor 'docker-compose' is installed")


def make_demo_data(folder: Path) -> None:
    subprocess.run(
        [sys.executable, str(ROOT / "docker" / "make_demo_data.py"), "--out", str(folder)],
        check=True,
        capture_output=True,
    )


def timestamp(text: str) -> dt.datetime:
    return dt.datetime.strptime(text, "%Y-%m-%d %H:%M:%SZ")


def bring_up(compose: list[str], tmp: Path, tls: bool) -> dict:
    out = tmp / f"out-{uuid.uuid4().hex[:6]}"
    out.mkdir()
    env = {**os.environ, "FEDCLUSTER_DATA": str(tmp / "data"), "FEDCLUSTER_OUT": str(out)}
    files = ["-f", str(ROOT / "docker-compose.yml")]
    if tls:
        from fedcluster.tools.certs import make_certs

        env["FEDCLUSTER_CERTS"] = str(make_certs(tmp / "certs", hosts=("superlink",), supernodes=3, force=True).out)
        files += ["-f", str(ROOT / "docker-compose.tls.yml")]
    command = [*compose, *files, "-p", f"fedclusterbench{uuid.uuid4().hex[:8]}"]
    try:
        started = time.monotonic()
        subprocess.run([*command, "up", "-d"], check=True, capture_output=True, env=env, cwd=ROOT, timeout=600)
        up = time.monotonic() - started
        job = subprocess.run(
            [*command, "ps", "-a", "-q", "job"], capture_output=True, text=True, env=env, cwd=ROOT
        ).stdout.strip()
        code = subprocess.run(["docker", "wait", job], capture_output=True, text=True, timeout=900).stdout.strip()
        finished = time.monotonic() - started
    finally:
        subprocess.run(
            [*command, "down", "-v", "--remove-orphans"], capture_output=True, env=env, cwd=ROOT, timeout=300
        )
    status = json.loads((out / "flwr-run.json").read_text())
    if code != "0" or status.get("status") != "finished:completed":
        raise SystemExit(f"the job ended {code} / {status.get('status')}")
    result = json.loads((out / "result.json").read_text())
    run = (timestamp(status["finished-at"]) - timestamp(status["pending-at"])).total_seconds()
    return {
        "up": up,
        "finished": finished,
        "run": run,
        "rounds": len(result["rounds"]),
        "per_round": statistics.median(r["seconds"] for r in result["rounds"]),
        "cost": result["final"]["cost"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=2)
    add_bench_flags(parser, quick="one run of each variant (--repeats 1)")
    args = parser.parse_args()
    if args.quick:
        args.repeats = 1
    compose = compose_command()
    with page_output(args.out, __file__):
        print_header(
            "Docker demo cluster: docker compose up -> finished job (3 SuperNodes, 1250 points, FedKMeans k = 4)",
            __doc__,
        )
        with tempfile.TemporaryDirectory(prefix="fedcluster-docker-bench-") as directory:
            tmp = Path(directory)
            make_demo_data(tmp / "data")
            flat = tmp / "flat"
            flat.mkdir()
            for i in (1, 2, 3):
                np.save(flat / f"node-{i}.npy", np.load(tmp / "data" / f"node-{i}" / "client.npy"))
            started = time.perf_counter()
            inprocess = run_inprocess({**JOB_CONFIG, "dataset": "npy-dir", "data-dir": str(flat)}, 3)
            baseline = time.perf_counter() - started
            rows = []
            for variant in ("plain", "tls"):
                runs = [bring_up(compose, tmp, tls=variant == "tls") for _ in range(args.repeats)]
                median = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
                rows.append(
                    [
                        variant,
                        f"{median['up']:.1f}",
                        f"{median['finished']:.1f}",
                        f"{median['run']:.0f}",
                        f"{median['rounds']:.0f}",
                        f"{median['per_round']:.2f}",
                        f"{median['finished'] / baseline:.0f}×",
                        f"{median['cost']:.4f}",
                    ]
                )
        print(
            markdown_table(
                [
                    "cluster",
                    "up (s)",
                    "up → finished (s)",
                    "Flower run (s)",
                    "rounds",
                    "s / round",
                    "finished / in-process",
                    "cost / point",
                ],
                rows,
            )
        )
        print(
            f"\nbaseline, the same job in-process (fedcluster.inprocess.run): {baseline:.2f} s, "
            f"{len(inprocess['rounds'])} rounds, "
            f"cost {inprocess['final']['cost']:.4f}; medians of {args.repeats} runs per row"
        )


if __name__ == "__main__":
    main()
