"""Choosing k without seeing the data: a federated ``k-range`` run against central k-means.

The federated side is ``k-range = "2:KMAX"`` (local summaries once, every k's candidates
built on the server, all scored in one federated round: 3 broadcasts in all). The central
side is scikit-learn on the pooled points: KMeans(n_init = 10) for every k, scikit-learn's
``calinski_harabasz_score`` and the same elbow rule (kneedle on log inertia) written out
here. Data: Gaussian mixtures the project generates (true k = 4, 8, 12; Dirichlet(0.3)
over 20 clients) and scikit-learn's digits (10 classes, 1797 points, 64 features; 2 classes
per client, 20 clients).

Usage::

    python bench/choose_k.py                 # 5 seeds
    python bench/choose_k.py --seeds 2 --figures docs/figures/choose-k
    python bench/choose_k.py --quick         # 1 seed; mixture k = 4 and digits (--out DIR: also DIR/choose_k.md)
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from _common import (
    add_bench_flags,
    default_jobs,
    figure_path,
    markdown_table,
    page_output,
    parallel_map,
    print_header,
    run_inprocess,
    svg_line_chart,
)

DATASETS = {
    "mixture, true k = 4 (d = 5)": ({"dataset": "gaussian-mixture", "components": 4, "dim": 5, "num-points": 3000}, 4),
    "mixture, true k = 8 (d = 10)": (
        {"dataset": "gaussian-mixture", "components": 8, "dim": 10, "num-points": 4000},
        8,
    ),
    "mixture, true k = 12 (d = 10)": (
        {"dataset": "gaussian-mixture", "components": 12, "dim": 10, "num-points": 6000},
        12,
    ),
    "digits (10 classes, d = 64)": ({"dataset": "digits", "partition": "components", "classes-per-client": 2}, 10),
}
QUICK = ("mixture, true k = 4 (d = 5)", "digits (10 classes, d = 64)")  # --quick: one generated, one real
K_MAX = 16


def kneedle_log(ks, inertia):
    """The k farthest below the chord of the normalised log-inertia curve."""
    logs = np.log(np.asarray(inertia))
    x = (np.asarray(ks) - ks[0]) / (ks[-1] - ks[0])
    y = (logs - logs[-1]) / (logs[0] - logs[-1])
    return int(ks[int(np.argmax(1 - x - y))])


def one(job):
    name, seed = job
    from sklearn.cluster import KMeans
    from sklearn.metrics import calinski_harabasz_score

    from fedcluster.config import with_defaults
    from fedcluster.node_data import pooled_points

    overrides, _ = DATASETS[name]
    config = {**overrides, "seed": seed, "k-range": f"2:{K_MAX}", "reference": False}
    result = run_inprocess(config, num_nodes=20)
    report = result["k_range"]
    X, _ = pooled_points(with_defaults(config), 20)
    ks = list(range(2, K_MAX + 1))
    fits = [KMeans(k, n_init=10, random_state=seed).fit(X) for k in ks]
    central_ch = [calinski_harabasz_score(X, f.labels_) for f in fits]
    central_cost = [f.inertia_ / len(X) for f in fits]
    return {
        "fed_ch": report["calinski_harabasz_k"],
        "fed_elbow": report["elbow_k"],
        "central_ch": ks[int(np.argmax(central_ch))],
        "central_elbow": kneedle_log(ks, central_cost),
        "ratio": [f / c for f, c in zip(report["cost"], central_cost)],
        "fed_cost": report["cost"],
        "central_cost": central_cost,
        "fed_ch_curve": report["calinski_harabasz"],
        "central_ch_curve": central_ch,
        "phases": len(result["phases"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=None, help="number of seeds (default 5, quick 1)")
    parser.add_argument("--jobs", type=int, default=default_jobs())
    parser.add_argument("--figures", type=Path, default=None, help="write cost and CH per k (SVG) into this folder")
    add_bench_flags(parser, quick="1 seed; the true-k-4 mixture and digits only")
    args = parser.parse_args()
    seeds = list(range(args.seeds or (1 if args.quick else 5)))
    datasets = {name: DATASETS[name] for name in (QUICK if args.quick else DATASETS)}
    with page_output(args.out, __file__):
        print_header(f"Choosing k: federated k-range 2:{K_MAX} vs central k-means (20 clients)", __doc__)
        jobs = [(name, seed) for name in datasets for seed in seeds]
        results = dict(zip(jobs, parallel_map(one, jobs, args.jobs)))
        rows = []
        for name, (_, truth) in datasets.items():
            runs = [results[(name, s)] for s in seeds]

            def picks(key):
                return ", ".join(str(r[key]) for r in runs)

            ratio_at_truth = [r["ratio"][truth - 2] for r in runs]
            rows.append(
                [
                    name,
                    truth,
                    picks("fed_ch"),
                    picks("central_ch"),
                    picks("fed_elbow"),
                    picks("central_elbow"),
                    f"{np.median(ratio_at_truth):.4f} (max {np.max(ratio_at_truth):.4f})",
                    runs[0]["phases"],
                ]
            )
        print(
            markdown_table(
                [
                    "data",
                    "true k",
                    "CH: federated",
                    "CH: central",
                    "elbow: federated",
                    "elbow: central",
                    "federated / central cost at true k",
                    "phases",
                ],
                rows,
            )
        )
        print(
            f"\nOne entry per seed ({len(seeds)} seeds). Federated cost = the best server-built candidate, "
            "scored in one round, no training rounds."
        )
        if args.figures or args.out:
            for name, (_, truth) in datasets.items():
                r = results[(name, seeds[0])]
                ks = list(range(2, K_MAX + 1))
                slug = name.split(" (")[0].replace(", ", "-").replace(" = ", "").replace(" ", "-")
                cost_path, cost_link = figure_path(args.out, args.figures, __file__, f"cost-{slug}.svg")
                ch_path, ch_link = figure_path(args.out, args.figures, __file__, f"ch-{slug}.svg")
                print(f"\n![{name}: cost per point by k]({cost_link}) ![{name}: Calinski-Harabasz by k]({ch_link})")
                svg_line_chart(
                    cost_path,
                    f"{name}: cost per point by k (seed 0)",
                    "k",
                    "cost per point",
                    {"federated": (ks, r["fed_cost"], None), "central": (ks, r["central_cost"], None)},
                )
                top = max(max(r["fed_ch_curve"]), max(r["central_ch_curve"]))
                svg_line_chart(
                    ch_path,
                    f"{name}: Calinski-Harabasz / its maximum (seed 0)",
                    "k",
                    "CH (scaled)",
                    {
                        "federated": (ks, [v / top for v in r["fed_ch_curve"]], None),
                        "central": (ks, [v / top for v in r["central_ch_curve"]], None),
                    },
                )


if __name__ == "__main__":
    main()
