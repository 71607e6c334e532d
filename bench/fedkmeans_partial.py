"""FedKMeans under partial participation: does the run converge to the answer?

Data: a mixture of 20 Gaussian components in d = 30 (separation 8 σ, unequal sizes: the
component sizes are proportional to 1..20, 14 to 286 points), 3000 points over 50 clients, split:
pathological non-IID (each client 1, 2 or 3 components), Dirichlet(0.1), Dirichlet(0.5)
or IID. FedKMeans with only ``k = 20``, ``fraction`` and ``num-rounds = 60`` set (full
batch), and with mini-batch ``batch-size = 32, local-epochs = 2``. Rows:

- ``defaults``: today's run-config defaults (``server-memory = true``: every client's
  latest statistics enter the server step; unsampled clients as they last reported;
  ``init-coarse = true``: candidate starts from coarse device summaries as well;
  ``init-server-starts = 100``: the 10 candidates per summary are the best of 100 server
  starts by their cost on the summary);
- ``previous defaults``: ``server-memory = false`` (this round's replies only: the paper),
  ``init-coarse = false`` (candidates from the fine summaries only) and
  ``init-server-starts = 10`` (the 10 candidates are the first 10 starts);
- ``paper setting``: the previous defaults with ``server-lr = 0.5, momentum = 0.5``
  (Triebe et al.'s α and μ).

Reported: the final cost over the best of scikit-learn KMeans(n_init = 10) and KMeans
started from the true means, median and worst over the seeds; and how far the final cost
lies above the best cost seen in the run: every run here sets ``eval-every = 1`` (each round
also scores the centers on every client; the run-config default, 0, contacts only the
sampled ones and records no cost per round). ``--figures DIR`` (or ``--out``, beside the
page) draws the cost per round (median over the seeds, over the best central cost) of the three settings
at ``fraction = 0.3``, full batch, for the 2-component and the Dirichlet(0.1) splits.

Usage::

    python bench/fedkmeans_partial.py            # 10 seeds, the whole grid
    python bench/fedkmeans_partial.py --quick    # 3 seeds, the pathological 2-component rows
    python bench/fedkmeans_partial.py --quick --out DIR   # also writes DIR/fedkmeans_partial.md
    python bench/fedkmeans_partial.py --out docs/results
    python bench/fedkmeans_partial.py --diagnose # other starts / no reassignment, 1-2 components
"""

from __future__ import annotations

import argparse
import tempfile
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
    quiet_flower,
    svg_line_chart,
)

from fedcluster.data import partition_components, partition_dirichlet, partition_iid
from fedcluster.lloyd import kmeans_cost

K, D, N, CLIENTS = 20, 30, 3000, 50
PARTITIONS = ("1 component", "2 components", "3 components", "Dirichlet(0.1)", "Dirichlet(0.5)", "IID")
SETTINGS = {
    "defaults": {},
    "previous defaults": {"server-memory": False, "init-coarse": False, "init-server-starts": 10},
    "paper setting": {
        "server-memory": False,
        "init-coarse": False,
        "init-server-starts": 10,
        "server-lr": 0.5,
        "momentum": 0.5,
    },
}

# --diagnose: where the remaining gap on the 1- and 2-component rows comes from
DIAGNOSTIC = {
    "init = kfed": {"init": "kfed"},
    "50 candidate starts": {"init-candidates": 50},
    "no reassignment": {"reassign-threshold": 0.0},
}


def data(seed: int, partition: str):
    rng = np.random.default_rng(seed)
    means = rng.normal(0.0, 8.0 / np.sqrt(2 * D), size=(K, D))
    weights = np.arange(1, K + 1) / np.arange(1, K + 1).sum()
    sizes = np.floor(weights * N).astype(int)
    sizes[-1] += N - sizes.sum()  # component j holds ~ (j + 1) / 210 of the points: 14 .. 286
    labels = rng.permutation(np.repeat(np.arange(K), sizes))
    X = means[labels] + rng.normal(size=(N, D))
    if partition.endswith("component") or partition.endswith("components"):
        parts = partition_components(labels, CLIENTS, int(partition[0]), seed)
    elif partition.startswith("Dirichlet"):
        parts = partition_dirichlet(labels, CLIENTS, float(partition[10:-1]), seed)
    else:
        parts = partition_iid(N, CLIENTS, seed)
    return X, labels, means, parts


def central(X, labels, means, seed):
    from sklearn.cluster import KMeans

    true_start = np.stack([X[labels == j].mean(0) for j in range(K)])
    best = min(
        KMeans(K, n_init=10, random_state=seed).fit(X).inertia_, KMeans(K, init=true_start, n_init=1).fit(X).inertia_
    )
    return best / len(X)


def reference_of(job):
    partition, seed = job
    X, labels, means, _ = data(seed, partition)
    return central(X, labels, means, seed)


def one(job):
    partition, fraction, batch, setting, seed, reference = job
    quiet_flower()
    from fedcluster.inprocess import run

    X, labels, means, parts = data(seed, partition)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "data"
        folder.mkdir()
        for i, index in enumerate(parts):
            np.save(folder / f"client_{i:03d}.npy", X[index])
        config = {
            "k": K,
            "num-rounds": 60,
            "fraction": fraction,
            "dataset": "npy-dir",
            "data-dir": str(folder),
            "seed": seed,
            "reference": False,
            "output-dir": str(Path(tmp) / "out"),
            "eval-every": 1,
            **SETTINGS[setting],
        }
        if batch:
            config.update({"batch-size": 32, "local-epochs": 2})
        result = run(config, num_nodes=CLIENTS)
        centers = np.load(Path(tmp) / "out" / "centers.npy")
    final = kmeans_cost(X, centers) / len(X)
    curve = [r.get("cost") for r in result["rounds"]]
    seen = [c for c in curve if c is not None]
    return final / reference, final / min(seen) if seen else float("nan"), [c / reference if c else None for c in curve]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_bench_flags(parser, quick="3 seeds, the 2-component split, fraction 0.3 and 1, full batch")
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--jobs", type=int, default=default_jobs())
    parser.add_argument(
        "--batch",
        choices=("full", "mini", "both"),
        default="both",
        help="full batch rows, mini-batch (B = 32, E = 2) rows, or both",
    )
    parser.add_argument(
        "--diagnose",
        action="store_true",
        help="the 1- and 2-component rows at fraction 0.3 and 1 with other starts / no reassignment",
    )
    parser.add_argument(
        "--figures",
        type=Path,
        default=None,
        help="write cost-per-round SVGs into this folder (with --out they go beside the page instead)",
    )
    args = parser.parse_args()
    if args.diagnose:
        SETTINGS.clear()
        SETTINGS.update(DIAGNOSTIC)
        args.batch, args.figures = "full", None
    seeds = list(range(3 if args.quick else args.seeds))
    partitions = ("2 components",) if args.quick else ("1 component", "2 components") if args.diagnose else PARTITIONS
    fractions = (0.3, 1.0) if args.quick or args.diagnose else (0.1, 0.3, 0.5, 1.0)
    batches = {"full": (False,), "mini": (True,), "both": (False, True)}["full" if args.quick else args.batch]
    with page_output(args.out, __file__):
        print_header("FedKMeans under partial participation (50 clients, d = 30, k = 20, 60 rounds)", __doc__)
        pairs = [(p, seed) for p in partitions for seed in seeds]
        references = dict(zip(pairs, parallel_map(reference_of, pairs, args.jobs)))
        jobs = [
            (p, f, b, s, seed)
            for p in partitions
            for f in fractions
            for b in batches
            for s in SETTINGS
            for seed in seeds
        ]
        results = dict(zip(jobs, parallel_map(one, [job + (references[job[0], job[4]],) for job in jobs], args.jobs)))
        rows = []
        for p in partitions:
            for f in fractions:
                for b in batches:
                    for s in SETTINGS:
                        ratios = [results[(p, f, b, s, seed)][0] for seed in seeds]
                        above = [results[(p, f, b, s, seed)][1] for seed in seeds]
                        rows.append(
                            [
                                p,
                                f"{f:g}",
                                "B=32 E=2" if b else "full",
                                s,
                                f"{np.median(ratios):.4f}",
                                f"{np.max(ratios):.4f}",
                                f"{np.max(above):.4f}",
                            ]
                        )
        print(
            markdown_table(
                [
                    "data",
                    "fraction",
                    "batch",
                    "setting",
                    "cost / best central (median)",
                    "worst",
                    "final / best seen (worst)",
                ],
                rows,
            )
        )
        print(f"\n{len(seeds)} seeds; best central = min(KMeans n_init=10, KMeans from the true means).")
        if args.figures or args.out:
            for p in partitions:
                if (p, 0.3, False, "defaults", seeds[0]) not in results or p not in ("2 components", "Dirichlet(0.1)"):
                    continue
                series = {}
                for s in SETTINGS:
                    raw = [results[(p, 0.3, False, s, seed)][2] for seed in seeds]
                    longest = max(map(len, raw))  # a run stopped by tol keeps its last cost
                    curves = np.array([c + c[-1:] * (longest - len(c)) for c in raw], dtype=float)
                    rounds = np.arange(1, curves.shape[1] + 1)
                    series[s] = (rounds.tolist(), np.median(curves, axis=0).tolist(), None)
                name = f"cost-per-round-{p.replace(' ', '-').replace('(', '').replace(')', '').lower()}.svg"
                path, link = figure_path(args.out, args.figures, __file__, name)
                svg_line_chart(
                    path,
                    f"FedKMeans, {p}, fraction 0.3, full batch ({len(seeds)} seeds, median)",
                    "round",
                    "cost / best central",
                    series,
                )
                print(f"\n![FedKMeans, {p}, fraction 0.3: cost per round]({link})")


if __name__ == "__main__":
    main()
