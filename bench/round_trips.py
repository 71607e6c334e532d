"""Round trips: how many exchanges with the devices each algorithm spends, from real runs.

Every algorithm runs in-process with its run-config defaults on small generated data
(FedSpectral(+) on a generated two-community graph), and its ``result.json`` phases are
grouped by round trip (phases pushed together share one) and sorted into: before the first round, per round (mean over
the rounds), after
the last round, and in total. In a deployment every round trip costs about one
SuperLink/SuperNode exchange (~6 s measured on this machine), so this is the latency
budget of a run. Rows with a measurement option switched off (one by one, or all by
``preset = "deployment"``) show what it costs.

``--quick`` runs the same rows with 3 rounds instead of 10 where a row sets its rounds
(FedKMeans, FedSpectral+): the counts before, per and after the rounds stay the same,
the totals shrink with the rounds.

Usage::

    python bench/round_trips.py
    python bench/round_trips.py --quick --out DIR   # also writes DIR/round_trips.md
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

from _common import add_bench_flags, markdown_table, page_output, print_header, run_inprocess

ROWS = {
    "fedkmeans (fraction 1)": {"algorithm": "fedkmeans", "k": 4, "num-rounds": 10},
    "fedkmeans (fraction 0.3, eval-every 0: default)": {
        "algorithm": "fedkmeans",
        "k": 4,
        "num-rounds": 10,
        "fraction": 0.3,
    },
    "fedkmeans (fraction 0.3, eval-every 1)": {
        "algorithm": "fedkmeans",
        "k": 4,
        "num-rounds": 10,
        "fraction": 0.3,
        "eval-every": 1,
    },
    "fedkmeans (fraction 0.3, preset deployment)": {
        "algorithm": "fedkmeans",
        "k": 4,
        "num-rounds": 10,
        "fraction": 0.3,
        "preset": "deployment",
    },
    "fedkmeans k-range 2:8": {"algorithm": "fedkmeans", "k-range": "2:8"},
    "kfed (kfed-evaluate: default)": {"algorithm": "kfed", "k": 4},
    "kfed (kfed-evaluate = false)": {"algorithm": "kfed", "k": 4, "kfed-evaluate": False},
    "kfed (preset deployment)": {"algorithm": "kfed", "k": 4, "preset": "deployment"},
    "da-ufl (som)": {"algorithm": "da-ufl", "k": 4, "dataset": "da-ufl-paper"},
    "feddp-kmeans (2 Lloyd rounds, evaluate-cost: default)": {
        "algorithm": "feddp-kmeans",
        "k": 4,
        "dataset": "feddp-mixture",
        "lloyd-rounds": 2,
    },
    "feddp-kmeans (evaluate-cost = false)": {
        "algorithm": "feddp-kmeans",
        "k": 4,
        "dataset": "feddp-mixture",
        "lloyd-rounds": 2,
        "evaluate-cost": False,
    },
    "feddp-kmeans (preset deployment)": {
        "algorithm": "feddp-kmeans",
        "k": 4,
        "dataset": "feddp-mixture",
        "lloyd-rounds": 2,
        "preset": "deployment",
    },
    "fedspectral": {"algorithm": "fedspectral", "k": 2},
    "fedspectral-plus (10 rounds)": {"algorithm": "fedspectral-plus", "k": 2, "num-rounds": 10},
}


def graph_dir(folder: Path) -> Path:
    rng = np.random.default_rng(0)
    edges = np.array(
        [(a, b) for a in range(60) for b in range(a + 1, 60) if rng.random() < (0.3 if (a < 30) == (b < 30) else 0.01)]
    )
    folder.mkdir(parents=True, exist_ok=True)
    for i, part in enumerate(np.array_split(rng.permutation(len(edges)), 5)):
        np.savetxt(folder / f"client_{i:03d}.txt", edges[part], fmt="%d")
    return folder


def split(phases: list[dict]) -> tuple[int, float, int, int]:
    """Round trips (phases sent together count once) before, per and after the rounds."""
    trips: dict[int, object] = {}
    for p in phases:
        trips.setdefault(p["round_trip"], p.get("round"))
    marks = list(trips.values())
    numbered = [i for i, r in enumerate(marks) if r is not None]
    if not numbered:
        return len(marks), 0.0, 0, len(marks)
    first, last = numbered[0], numbered[-1]
    return first, (last - first + 1) / len({marks[i] for i in numbered}), len(marks) - last - 1, len(marks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_bench_flags(parser, quick="3 rounds instead of 10 for FedKMeans and FedSpectral+")
    args = parser.parse_args()
    with page_output(args.out, __file__):
        table(args.quick)


def table(quick: bool) -> None:
    print_header(
        "Round trips per run, by algorithm (in-process, run-config defaults"
        + (", --quick: 3 rounds" if quick else "")
        + ")",
        __doc__,
    )
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        edges = graph_dir(Path(tmp) / "graph")
        for name, config in ROWS.items():
            config = dict(config, reference=False)
            if quick and "num-rounds" in config:
                name = name.replace(f"{config['num-rounds']} rounds", "3 rounds")
                config["num-rounds"] = 3
            nodes = 20
            if config["algorithm"].startswith("fedspectral"):
                config.update({"dataset": "edge-dir", "data-dir": str(edges), "num-nodes": 60})
                nodes = 5
            if config.get("dataset") == "feddp-mixture":
                nodes = 100
            result = run_inprocess(config, num_nodes=nodes)
            before, per_round, after, total = split(result["phases"])
            names = " → ".join(dict.fromkeys(p["phase"] for p in result["phases"]))
            rows.append([name, before, f"{per_round:g}", after, total, names])
    print(markdown_table(["run", "before round 1", "per round", "after the last", "total", "phases"], rows))


if __name__ == "__main__":
    main()
