"""`flwr run` simulation at scale: seconds per broadcast, fedcluster against a minimal echo app.

For each number of SuperNodes (default 1000; ``--supernodes 1000 5000``) the script starts
a fresh ``flower-superlink --insecure --simulation`` for each run (private FLWR_HOME, free
loopback ports, stopped by PID afterwards; see ``_common.SimulationSuperLink``; the next run
starts once the previous run's Ray processes are gone) and runs, one after the other:

1. fedcluster's FedKMeans (IID Gaussian mixture, ``--points-per-client`` 100, d = 8,
   k = 8, ``--rounds`` 5, no central reference): seconds per training round from the
   run's result.json (``rounds[i].seconds``: messages built and pushed, replies pulled,
   validated and aggregated), the start-up round trips (``phases[].round_trip``) and the
   bytes per device per round;
2. the echo app of ``bench/echo_app`` (a ServerApp that broadcasts one float64 array
   with Flower's own ``grid.send_and_receive`` and ClientApps that reply with another),
   with the SAME payload per device down and up as one FedKMeans round and as many
   broadcasts as FedKMeans has rounds (plus a first one, left out: it starts the Ray
   actors, which fedcluster's start-up round trips do before its rounds), once BEFORE and
   once AFTER fedcluster's run.

It prints the median seconds per broadcast of each and the ratio of ours to the mean of
the two echo medians (target ≤ 1.15); two echo runs that disagree show how much the
machine's noise is. Both apps wait until all N nodes registered before their first broadcast, so
node start-up is not counted in either.

Usage::

    python bench/flwr_scale.py                       # 1000 SuperNodes (~5 min)
    python bench/flwr_scale.py --supernodes 1000 5000
    python bench/flwr_scale.py --quick               # 100 SuperNodes, 3 rounds
    python bench/flwr_scale.py --quick --out DIR     # also writes DIR/flwr_scale.md
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import ROOT, SimulationSuperLink, add_bench_flags, markdown_table, page_output, print_header  # noqa: E402

TARGET = 1.15
NPY_HEADER = 128  # bytes of an .npy header (format 1.0, padded to 64; small shapes)
ECHO_APP = Path(__file__).resolve().parent / "echo_app"


def fedkmeans_config(supernodes: int, points_per_client: int, rounds: int, output_dir: str) -> dict:
    return {
        "algorithm": "fedkmeans",
        "dataset": "gaussian-mixture",
        "partition": "iid",
        "num-points": supernodes * points_per_client,
        "dim": 8,
        "k": 8,
        "num-rounds": rounds,
        "n-init": 1,  # one center set per round: the echo's payload (the default trains up to 16 side by side)
        "reference": False,
        "min-nodes": supernodes,
        "output-dir": output_dir,
    }


def failure(completed, what: str) -> str:
    tail = (completed.stdout + completed.stderr)[-3000:]
    return f"\n{what} failed (exit {completed.returncode}):\n```\n{tail}\n```\n"


def quiesce(timeout: float = 60.0) -> None:
    """Wait until the previous run's Ray processes are gone (they shut down after the run
    ends and would otherwise load the next measurement)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if subprocess.run(["pgrep", "-f", "raylet|ray::"], capture_output=True).returncode != 0:
            return
        time.sleep(1)
    print(f"note: Ray processes still running after {timeout:.0f} s")


def run_echo(
    keep: bool, supernodes: int, broadcasts: int, down: int, up: int, output_dir: str, tag: str
) -> dict | None:
    out = Path(output_dir) / f"echo-{tag}.json"
    # One broadcast more than asked: the first one starts the Ray actors (fedcluster's runs do
    # that in their start-up round trips, before the rounds measured) and is left out.
    config = {
        "broadcasts": broadcasts + 1,
        "down-floats": down,
        "up-floats": up,
        "min-nodes": supernodes,
        "output": str(out),
    }
    quiesce()
    with SimulationSuperLink(keep=keep) as link:
        completed, wall = link.run(ECHO_APP, config, supernodes)
        link.failed = not out.exists()
    if not out.exists():
        print(failure(completed, f"echo app at {supernodes} SuperNodes (no output)"))
        return None
    echo = json.loads(out.read_text())
    if any(count != supernodes for count in echo["replies"]):
        print(f"note: echo replies per broadcast {echo['replies']} (of {supernodes})")
    echo["warm-up"], echo["seconds"] = echo["seconds"][0], echo["seconds"][1:]
    echo["wall"] = wall
    return echo


def measure(keep: bool, supernodes: int, points_per_client: int, rounds: int) -> dict | None:
    """Echo, fedcluster, echo again (machine noise shows as the two echo runs disagreeing;
    the baseline is their mean)."""
    output_dir = tempfile.mkdtemp(prefix=f"fedcluster-bench-scale-{supernodes}-")
    # FedKMeans' round payload, from its protocol: centers (k, d) down; centers, scatter (k, d),
    # counts (k,), cost (1,) up, each .npy with a 128-byte header; the echo sends one array
    # each way, of the same bytes. Checked against the run's own count below.
    k, d = 8, 8
    down, up = k * d, 2 * k * d + k + 1 + 3 * NPY_HEADER // 8
    before = run_echo(keep, supernodes, rounds, down, up, output_dir, "before")
    quiesce()
    with SimulationSuperLink(keep=keep) as link:
        print(f"{supernodes} SuperNodes: SuperLink `{' '.join(link.command)}`", flush=True)
        completed, ours_wall = link.run(
            ROOT, fedkmeans_config(supernodes, points_per_client, rounds, output_dir), supernodes
        )
        result_file = Path(output_dir) / "result.json"
        link.failed = not result_file.exists()
    if not result_file.exists():
        print(failure(completed, f"fedcluster at {supernodes} SuperNodes (no result.json)"))
        return None
    result = json.loads(result_file.read_text())
    train = [r for r in result["rounds"] if r["replies"] == supernodes]
    if len(train) != len(result["rounds"]):
        print(f"note: {len(result['rounds']) - len(train)} round(s) without every reply left out")
    per_round = [r["seconds"] for r in train]
    measured_down = statistics.median(r["bytes_down"] for r in train) / supernodes
    measured_up = statistics.median(r["bytes_up"] for r in train) / supernodes
    echo_bytes = (8 * down + NPY_HEADER, 8 * up + NPY_HEADER)
    if (measured_down, measured_up) != echo_bytes:
        print(f"note: FedKMeans sent {measured_down:g} / {measured_up:g} bytes per device, the echo {echo_bytes}")
    startup: dict[int, float] = {}
    for phase in result["phases"]:
        if phase["round"] is None and phase.get("round_trip") is not None:
            startup[phase["round_trip"]] = max(startup.get(phase["round_trip"], 0.0), phase["seconds"])
    after = run_echo(keep, supernodes, rounds, down, up, output_dir, "after")
    if before is None or after is None:
        return None
    return {
        "supernodes": supernodes,
        "ours": per_round,
        "echo": [before["seconds"], after["seconds"]],
        "warm-up": [before["warm-up"], after["warm-up"]],
        "startup": [startup[key] for key in sorted(startup)],
        "down": echo_bytes[0],
        "up": echo_bytes[1],
        "ours_wall": ours_wall,
        "echo_wall": [before["wall"], after["wall"]],
        "ours_server_wall": result["wall_time_s"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--supernodes", type=int, nargs="+", default=[1000])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--points-per-client", type=int, default=100)
    add_bench_flags(parser, quick="100 SuperNodes, 3 rounds")
    parser.add_argument("--keep-flwr-home", action="store_true", help="keep the SuperLink's FLWR_HOME (its log)")
    args = parser.parse_args(argv)
    if args.quick:
        args.supernodes, args.rounds = [100], 3
    with page_output(args.out, __file__):
        print_header(
            "`flwr run` simulation: seconds per broadcast, fedcluster FedKMeans vs a minimal echo app", __doc__
        )
        rows, ok = [], True
        for supernodes in args.supernodes:
            measured = measure(args.keep_flwr_home, supernodes, args.points_per_client, args.rounds)
            if measured is None:
                ok = False
                rows.append([supernodes, "failed", "–", "–", "–", "–", "–"])
                continue
            ours = statistics.median(measured["ours"])
            echoes = [statistics.median(seconds) for seconds in measured["echo"]]
            echo = statistics.mean(echoes)
            ratio = ours / echo
            ok = ok and ratio <= TARGET
            print(
                f"  ours s/round {', '.join(f'{s:.2f}' for s in measured['ours'])}; "
                f"echo s/broadcast before {', '.join(f'{s:.2f}' for s in measured['echo'][0])} "
                f"(warm-up {measured['warm-up'][0]:.2f} left out), "
                f"after {', '.join(f'{s:.2f}' for s in measured['echo'][1])} (warm-up {measured['warm-up'][1]:.2f}); "
                f"start-up round trips {', '.join(f'{s:.2f}' for s in measured['startup'])} s; "
                f"flwr run wall {measured['ours_wall']:.0f} s (ServerApp {measured['ours_server_wall']:.0f} s), "
                f"echo {' / '.join(f'{w:.0f}' for w in measured['echo_wall'])} s",
                flush=True,
            )
            rows.append(
                [
                    supernodes,
                    f"{measured['down']} / {measured['up']}",
                    f"{ours:.2f}",
                    f"{echoes[0]:.2f} / {echoes[1]:.2f}",
                    f"{ratio:.2f}" + ("" if ratio <= TARGET else " (above 1.15)"),
                    " + ".join(f"{s:.1f}" for s in measured["startup"]),
                    f"{measured['ours_wall']:.0f} / {' / '.join(f'{w:.0f}' for w in measured['echo_wall'])}",
                ]
            )
        print()
        print(
            markdown_table(
                [
                    "SuperNodes",
                    "bytes per device down / up",
                    "ours s / round (median)",
                    "echo s / broadcast (median), before / after ours",
                    "ours / mean echo",
                    "ours start-up round trips s",
                    "`flwr run` wall s: ours / echo before / after",
                ],
                rows,
            )
        )
        print(f"\ntarget: ours / echo <= {TARGET}")
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
