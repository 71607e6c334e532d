"""FedKMeans on Triebe & Rajagopal's (2019) toy setup, against central k-means.

Setup (docs/ALGORITHMS.md §1): 50 non-IID clients, 10 points each, every client's points drawn
from ONE of 5 Gaussians (means 1..5, scale 0.2), 1-D; k = 5; T = 200 rounds. Metrics of
the paper: mean Euclidean intra-cluster distance and Davies–Bouldin index (both lower is
better), mean ± std over 10 seeds. Seed s generates the data (``dataset="triebe"``,
``seed=s``) and drives the server (sampling, initialization) and the central reference.

Federated labels: the pooled points (``fedcluster.node_data.pooled_points``, used here for
EVALUATION only) assigned to the final federated centers (the run's ``centers.npy``). Central:
scikit-learn ``KMeans`` on the pooled points (``fedcluster.metrics.central_kmeans``).

Rows (hyperparameters of the federated runs; everything else is the run-config default):

* ``default``: C = 1, E = 1, B = full, β = 1, α = 1, μ = 0, init ``auto``.
* ``B=5 E=2 β=0.5``: mini-batch local training.
* ``α=1 μ=0.5``: the paper's figure captions read "α = (1, 0.5)"; following
  docs/ALGORITHMS.md we read that as server learning rate 1 and server momentum 0.5.
* ``paper-like``: the paper's Figure 1 setting as we read it -- random initialization
  (``init=random-box``, the paper: "initialize cluster centroids randomly"), C = 0.1
  (5 of 50 clients per round), E = 1, B = full, β = 1, α = 1, μ = 0.5.
* ``random-box C=1``: random initialization with otherwise default settings.

Usage::

    python bench/fedkmeans_triebe.py            # 10 seeds, T = 200
    python bench/fedkmeans_triebe.py --quick    # 3 seeds, T = 50
    python bench/fedkmeans_triebe.py --quick --out DIR   # also writes DIR/fedkmeans_triebe.md
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import (
    add_bench_flags,
    default_jobs,
    markdown_table,
    mean_std,
    page_output,
    parallel_map,  # noqa: E402
    print_header,
    run_inprocess,
)

NUM_CLIENTS = 50
K = 5

# row name -> run-config overrides
SETTINGS: dict[str, dict] = {
    "default": {},
    "B=5 E=2 β=0.5": {"batch-size": 5, "local-epochs": 2, "client-lr": 0.5},
    "α=1 μ=0.5": {"server-lr": 1.0, "momentum": 0.5},
    "paper-like (random init, C=0.1, μ=0.5)": {
        "init": "random-box",
        "fraction": 0.1,
        "momentum": 0.5,
        "eval-every": 0,
    },
    "random-box init, C=1": {"init": "random-box"},
}


def evaluate_labels(X, labels) -> dict:
    from fedcluster.metrics import davies_bouldin, intra_cluster_distance

    used = len(set(labels.tolist()))
    return {
        "intra": intra_cluster_distance(X, labels),
        "db": davies_bouldin(X, labels) if 2 <= used <= X.shape[0] - 1 else float("nan"),
        "used": used,
    }


def central_job(args: tuple) -> dict:
    seed, n_init = args
    from fedcluster.config import with_defaults
    from fedcluster.node_data import pooled_points
    from fedcluster.lloyd import assign
    from fedcluster.metrics import central_kmeans

    X, _ = pooled_points(with_defaults({"dataset": "triebe", "k": K, "seed": seed}), NUM_CLIENTS)
    centers, total = central_kmeans(X, K, seed, n_init=n_init)
    out = evaluate_labels(X, assign(X, centers)[0])
    out["cost"] = total / X.shape[0]
    return out


def federated_job(args: tuple) -> dict:
    name, seed, rounds = args
    from fedcluster.config import with_defaults
    from fedcluster.node_data import pooled_points
    from fedcluster.lloyd import assign

    config = {"dataset": "triebe", "k": K, "seed": seed, "num-rounds": rounds, "reference": False}
    config.update(SETTINGS[name])
    started = time.perf_counter()
    result = run_inprocess(config, NUM_CLIENTS)
    seconds = time.perf_counter() - started
    X, _ = pooled_points(with_defaults(config), NUM_CLIENTS)
    centers = result["centers"]  # centers.npy of the run (its temporary folder is gone)
    out = evaluate_labels(X, assign(X, centers)[0])
    out["cost"] = result["final"]["cost"]
    out["seconds"] = seconds
    out["reassigned"] = sum(len(r.get("reassigned") or []) for r in result["rounds"])
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_bench_flags(parser, quick="3 seeds, 50 rounds")
    parser.add_argument("--seeds", type=int, default=None, help="number of seeds (default 10, quick 3)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds T (default 200, quick 50)")
    parser.add_argument("--jobs", type=int, default=default_jobs(), help="worker processes (default: usable CPUs)")
    args = parser.parse_args(argv)
    seeds = list(range(args.seeds or (3 if args.quick else 10)))
    rounds = args.rounds or (50 if args.quick else 200)

    with page_output(args.out, __file__):
        print_header("FedKMeans on Triebe's 1-D toy setup vs central k-means", __doc__)
        print(
            f"{NUM_CLIENTS} clients x 10 points, 1-D, means 1..5, scale 0.2, k={K}, T={rounds}, "
            f"seeds {seeds[0]}..{seeds[-1]}, {args.jobs} worker process(es)\n",
            flush=True,
        )

        started = time.perf_counter()
        rows = []
        jobs = [(seed, n_init) for n_init in (10, 1) for seed in seeds]
        central = parallel_map(central_job, jobs, args.jobs)
        for index, n_init in enumerate((10, 1)):
            runs = central[index * len(seeds) : (index + 1) * len(seeds)]
            rows.append(summarize(f"central k-means (scikit-learn, n_init={n_init})", runs))
        fed_jobs = [(name, seed, rounds) for name in SETTINGS for seed in seeds]
        federated = parallel_map(federated_job, fed_jobs, args.jobs)
        for index, name in enumerate(SETTINGS):
            runs = federated[index * len(seeds) : (index + 1) * len(seeds)]
            rows.append(summarize(f"FedKMeans {name}", runs))

        print(
            markdown_table(
                [
                    "method",
                    "intra-cluster distance",
                    "Davies–Bouldin",
                    "cost / point",
                    "clusters used (min)",
                    "reassigned / run",
                    "s / run",
                ],
                rows,
            )
        )
        print(
            f"\nintra-cluster distance and Davies–Bouldin: mean ± std over {len(seeds)} seeds, lower is better. "
            "Paper's claim: FedKMeans matches or beats central k-means with suitable hyperparameters."
        )
        print(f"total wall time {time.perf_counter() - started:.0f} s")
        return 0


def summarize(name: str, runs: list[dict]) -> list:
    import math

    dbs = [r["db"] for r in runs if not math.isnan(r["db"])]
    return [
        name,
        mean_std([r["intra"] for r in runs]),
        mean_std(dbs) + ("" if len(dbs) == len(runs) else f" ({len(runs) - len(dbs)} undefined)"),
        mean_std([r["cost"] for r in runs], 5),
        min(r["used"] for r in runs),
        f"{sum(r.get('reassigned', 0) for r in runs) / len(runs):.1f}" if "reassigned" in runs[0] else "–",
        f"{sum(r['seconds'] for r in runs) / len(runs):.1f}" if "seconds" in runs[0] else "–",
    ]


if __name__ == "__main__":
    sys.exit(main())
