"""Peak memory of a device: each algorithm's device kernels on 100 000 points x 32 dimensions.

Every measurement is a fresh Python process that imports the ClientApp (``fedcluster.client.app``,
hence flwr), loads the device's ``.npy`` through the same path a SuperNode uses
(``data-path``), runs ONE task through ``fedcluster.device.run_task`` (the protocol
parse and reply check included) and reports its peak resident set size (``VmHWM`` of
``/proc/self/status``: Linux starts a child's ``ru_maxrss`` at its parent's peak, kept
across fork and exec; ``ru_maxrss`` only where there is no ``/proc``).
The baseline row does everything but the task: the rest is what the kernel adds. Target
(issue "deployment"): <= 200 MB for the ClientApp process, a phone-class budget.

Usage::

    python bench/device_memory.py            # n = 100 000, d = 32
    python bench/device_memory.py --n 20000  # quicker
    python bench/device_memory.py --quick    # n = 5 000, every task (--out DIR: also DIR/device_memory.md)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from _common import add_bench_flags, markdown_table, page_output, print_header

ROOT = Path(__file__).resolve().parents[1]
K = 16


def requests(d: int, rng: np.random.Generator) -> dict[str, tuple[dict, dict]]:
    """task -> (arrays, config) of a representative request (k = 16)."""
    centers = rng.normal(size=(K, d))
    codebook = rng.normal(size=(16 * 10, d))
    weights = np.full(codebook.shape[0], 1.0 / codebook.shape[0])
    return {
        "(baseline: import + load, no task)": ({}, {}),
        "data_summary": ({}, {}),
        "lloyd_stats": ({"centers": centers}, {}),
        "score_candidates": ({"candidates": rng.normal(size=(10, K, d))}, {}),
        "local_summary": ({}, {"k": K, "seed": 1}),
        "fedkmeans_train": ({"centers": centers[None]}, {"seed": 1}),  # one set of centers (m = 1)
        "fedkmeans_train (B = 32, E = 2)": (
            {"centers": centers[None]},
            {"seed": 1, "batch-size": 32, "local-epochs": 2},
        ),
        "kfed_local": ({}, {"k-prime": 4, "seed": 1}),
        "feddp_outer": ({}, {"clip-norm": 10.0, "clip": 1.0}),
        "feddp_lloyd": ({"centers": centers}, {"clip-norm": 10.0, "clip": 1.0, "clip-l1": 1.0}),
        "som_codebook": ({}, {"grid": 4, "seed": 1}),  # the default epochs
        "bin_counts": ({"codebook": codebook}, {"binning": "codebook"}),
        "daufl_step": (
            {"centers": centers, "anchor": centers, "weights": weights, "codebook": codebook},
            {"binning": "codebook", "outer": 1, "seed": 1},
        ),
    }


CHILD = r"""
import json, resource, sys, time
import numpy as np
sys.path.insert(0, {root!r})
import fedcluster.client.app  # the ClientApp module, as flwr-clientapp loads it (imports flwr)
from fedcluster.config import with_defaults
from fedcluster.node_data import device_data
from fedcluster.device import run_task
request = json.loads(sys.argv[1])
data = device_data(with_defaults({{}}), {{"data-path": sys.argv[2]}})
started = time.perf_counter()
if request["task"]:
    arrays = {{k: np.asarray(v) for k, v in request["arrays"].items()}}
    run_task(request["task"], data, arrays, request["config"])
seconds = time.perf_counter() - started
try:  # this process's own peak (ru_maxrss starts at the parent's peak: Linux keeps it across fork and exec)
    peak_kb = next(float(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
except (OSError, StopIteration):
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({{"rss_mb": peak_kb / 1024, "seconds": seconds}}))
"""


def measure(task: str, arrays: dict, config: dict, data_path: Path) -> dict:
    name = task.split(" ")[0] if not task.startswith("(") else ""
    payload = json.dumps({"task": name, "arrays": {k: v.tolist() for k, v in arrays.items()}, "config": config})
    done = subprocess.run(
        [sys.executable, "-c", CHILD.format(root=str(ROOT)), payload, str(data_path)],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{task}: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=None, help="points on the device (default 100 000, quick 5 000)")
    parser.add_argument("--d", type=int, default=32)
    add_bench_flags(parser, quick="n = 5 000 points, every task")
    args = parser.parse_args()
    args.n = args.n or (5_000 if args.quick else 100_000)
    with page_output(args.out, __file__):
        print_header(f"Device peak memory: one task on {args.n} x {args.d} points (fresh process each)", __doc__)
        rng = np.random.default_rng(0)
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "device.npy"
            np.save(path, rng.normal(size=(args.n, args.d)))
            rows, baseline = [], None
            for task, (arrays, config) in requests(args.d, rng).items():
                got = measure(task, arrays, config, path)
                baseline = baseline if baseline is not None else got["rss_mb"]
                rows.append(
                    [
                        task,
                        f"{got['rss_mb']:.0f}",
                        f"{got['rss_mb'] - baseline:+.0f}",
                        f"{got['seconds']:.2f}",
                        "met" if got["rss_mb"] <= 200 else "**missed**",
                    ]
                )
        print(markdown_table(["task", "peak RSS (MB)", "over the baseline (MB)", "task seconds", "<= 200 MB"], rows))
        print(f"\ndata: {args.n * args.d * 8 / 1e6:.1f} MB of float64 points; k = {K}.")


if __name__ == "__main__":
    main()
