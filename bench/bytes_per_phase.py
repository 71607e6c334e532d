"""Bytes per device per phase: what each algorithm sends to and receives from one device.

Every algorithm runs in-process (the same ClientApp and Flower messages as a deployment)
with its run-config defaults: point data of d = 32 on 10 devices of 1000 points with
k = 16 (DA-UFL on its paper's d = 2 data, FedDP-KMeans on its App. G.1 mixture with 100
devices, FedSpectral(+) on a 60-node two-community graph split over 5 devices, k = 2).
For every phase of ``result.json`` the bytes the server pushed (``bytes_down``) and pulled
(``bytes_up``) are divided by the devices asked and the replies received, and averaged
over the phase's occurrences. Sizes are the serialized arrays of each message (``.npy``
bytes, ``fedcluster.server.messages.payload_bytes``); config values, Flower's message metadata and
gRPC/TLS framing come on top (not counted here).

``--quick`` runs the same rows with 3 rounds where a row sets its rounds (FedKMeans,
FedSpectral+) and 1 Lloyd round for FedDP-KMeans: the bytes per phase occurrence stay the
same, the ``times`` column and the whole-run totals shrink with the rounds.

Usage::

    python bench/bytes_per_phase.py
    python bench/bytes_per_phase.py --quick --out DIR   # also writes DIR/bytes_per_phase.md
"""

from __future__ import annotations

import argparse
import tempfile
from collections import defaultdict
from pathlib import Path

from _common import add_bench_flags, markdown_table, page_output, print_header, run_inprocess
from round_trips import graph_dir

POINTS = {"num-points": 10_000, "dim": 32, "k": 16}
ROWS = {
    "fedkmeans (fraction 0.3)": ({"algorithm": "fedkmeans", "num-rounds": 10, "fraction": 0.3, **POINTS}, 10),
    "kfed": ({"algorithm": "kfed", **POINTS}, 10),
    "da-ufl (som)": ({"algorithm": "da-ufl", "k": 16, "dataset": "da-ufl-paper", "num-points": 800}, 10),
    "feddp-kmeans (data-point)": (
        {"algorithm": "feddp-kmeans", "k": 10, "dataset": "feddp-mixture", "lloyd-rounds": 2},
        100,
    ),
    "fedspectral-plus (10 rounds)": ({"algorithm": "fedspectral-plus", "k": 2, "num-rounds": 10}, 5),
}


def kib(value: float) -> str:
    return f"{value / 1024:.1f}"


def quick_config(name: str, config: dict) -> tuple[str, dict]:
    """--quick: 3 rounds where the row sets its rounds, 1 Lloyd round for FedDP-KMeans."""
    config = dict(config)
    if "num-rounds" in config:
        name = name.replace(f"{config['num-rounds']} rounds", "3 rounds")
        config["num-rounds"] = 3
    if "lloyd-rounds" in config:
        config["lloyd-rounds"] = 1
    return name, config


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_bench_flags(parser, quick="3 rounds for FedKMeans and FedSpectral+, 1 Lloyd round for FedDP-KMeans")
    args = parser.parse_args()
    with page_output(args.out, __file__):
        table(args.quick)


def table(quick: bool) -> None:
    print_header(
        "Bytes per device per phase (in-process, run-config defaults"
        + (", --quick: fewer rounds" if quick else "")
        + ")",
        __doc__,
    )
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        edges = graph_dir(Path(tmp) / "graph")
        for name, (config, nodes) in ROWS.items():
            if quick:
                name, config = quick_config(name, config)
            config = dict(config, reference=False)
            if config["algorithm"].startswith("fedspectral"):
                config.update({"dataset": "edge-dir", "data-dir": str(edges), "num-nodes": 60})
            result = run_inprocess(config, num_nodes=nodes)
            down, up, times = defaultdict(float), defaultdict(float), defaultdict(int)
            for phase in result["phases"]:
                if phase["sent"]:
                    down[phase["phase"]] += phase["bytes_down"] / phase["sent"]
                    up[phase["phase"]] += phase["bytes_up"] / max(phase["replies"], 1)
                    times[phase["phase"]] += 1
            for phase, count in times.items():
                rows.append([name, phase, count, kib(down[phase] / count), kib(up[phase] / count)])
            total = result["communication"]
            rows.append(
                [
                    name,
                    "**whole run, per device**",
                    "",
                    kib(total["bytes_down"] / nodes),
                    kib(total["bytes_up"] / nodes),
                ]
            )
    print(markdown_table(["run", "phase", "times", "KiB down / device", "KiB up / device"], rows))


if __name__ == "__main__":
    main()
