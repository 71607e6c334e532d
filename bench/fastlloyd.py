"""FedDP-KMeans without server data beside FastLloyd (Diaa et al., USENIX Security 2025),
on FastLloyd's seven datasets and its own setup.

FastLloyd runs from its public repository, fetched by the user and run outside this project
(``bench/peers/fastlloyd_run.py`` imports it from the checkout given and calls its own
single-process simulation, the variant its paper calls FastLloyd). Setup, as FastLloyd's:
iris, wine, breast cancer (scikit-learn's), fcps/lsun, uci/yeast, sipu/s1, sipu/birch2
(Gagolewski's battery, ``--battery``), each min-max scaled to [-1, 1], k = its number of
reference clusters, 2 clients (equal halves of a seeded permutation, the same for every
method), δ = 1/(n ln n), ε in {0.1, 0.25, 0.5, 1}, seeds 1..5. Metric: the k-means cost of
the final centers on all the scaled points over that of scikit-learn's
``KMeans(k, n_init=10, random_state=0)``; each cell is the median over the seeds.

Columns, each with its threat model:

* **FastLloyd** -- no server data; the clients mask their sums and counts (one shared seed:
  the server plus any one client can unmask), the server adds Gaussian noise to the masked
  total. Needs n public (its δ and its number of iterations).
* **ours, secure aggregation** -- ``DPFederatedKMeans(k, epsilon, delta, run_config={"clip-norm":
  sqrt(d), "secure-aggregation": True, "evaluate-cost": False})``, no server data,
  defaults otherwise: the private histogram start and relative Lloyd rounds, as many as
  ``lloyd_rounds_for`` gives for the clients' number of points (n treated as public, as
  FastLloyd treats it). The server receives only masked vectors and learns only their sum
  (SecAgg with pairwise masks from key agreement, docs/security.md), and each client adds
  its share of Skellam noise before masking, so the server never holds a sum without noise
  (RDP accounting). FastLloyd's threat model, or a stronger one: no shared seed, and the
  noise is not added by the server. The clients draw that noise from OS entropy (no seed
  the server could know), so this column changes from run to run; the others are seeded.
* **ours, central DP** -- the same without ``secure-aggregation``: the server sees every
  client's clipped statistics and adds the noise (PLD accounting), a WEAKER threat model
  than FastLloyd's masking. With ``secure-aggregation`` and ``secagg-noise = "server"`` the
  server sees only the sum, and the run gives these centers with the same noise draws
  (tests/protocol/test_secagg.py); it then still sees that sum without noise.
* **ours, 5 % server data** -- 5 % of the points (seeded) are the server's own, the clients
  split the rest; ``DPFederatedKMeans(k, epsilon, delta).fit(clients, server_data=...)``
  with its defaults: Δ is the server data's radius around its mean (the point the devices
  clip around), the histogram start counts the devices' points by server points (which the
  devices see), relative Lloyd rounds as many as ``lloyd_rounds_for`` gives, central DP. A
  weaker threat model again (the server holds data like the devices', and sees every
  client's clipped statistics).

Every ε of ours is its ledger's total at δ (PLD; RDP for the devices' Skellam noise), at most the ε asked
(checked, printed).

A second table checks the two defaults these datasets could have steered, the radius of the
relative Lloyd rounds r = α·Δ/k^(1/d) (ours α = 1/2, FastLloyd's 0.8) and the split of the
devices' noise between the Lloyd sums and counts, on twelve datasets outside FastLloyd's
seven (``--held-out``: the rest of the battery's sipu and uci sets and scikit-learn's
digits, k = their reference clusters, the same scaling, clients, δ and seeds): FastLloyd
beside ours with central DP at α = 0.8 and at the default, and ours with secure
aggregation, its default split of the Lloyd rounds' noise and the paper's shares.

Getting FastLloyd (outside this repository)::

    git clone https://github.com/D-Diaa/FastLloyd /tmp/fastlloyd
    python3 -m venv /tmp/fastlloyd-venv
    /tmp/fastlloyd-venv/bin/pip install numpy scipy "scikit-learn==1.8.0" pandas diffprivlib tqdm matplotlib

(diffprivlib 0.6.6 does not import with scikit-learn 1.9.)

Usage::

    python bench/fastlloyd.py --battery DIR --fastlloyd /tmp/fastlloyd --fastlloyd-python /tmp/fastlloyd-venv/bin/python
    python bench/fastlloyd.py --battery DIR --fastlloyd ... --out docs/results   # also fastlloyd.md and
    fastlloyd-ratio.svg
    python bench/fastlloyd.py --battery DIR --quick                           # ours only, iris and lsun, 2 seeds, no
    held-out
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (
    ROOT,
    add_bench_flags,
    default_jobs,
    figure_path,
    markdown_table,
    page_output,  # noqa: E402
    parallel_map,
    print_header,
    quiet_flower,
    svg_line_chart,
)
import real_data  # noqa: E402  (its battery loader)
from fedcluster.lloyd import kmeans_cost  # noqa: E402

# name -> (source: scikit-learn's dataset or the battery's, FastLloyd's k: its configs.defaults.num_clusters = the
# reference clusters)
DATASETS = {
    "iris": ("iris", 3),
    "wine": ("wine", 3),
    "breast": ("breast", 2),
    "lsun": ("fcps/lsun", 3),
    "yeast": ("uci/yeast", 10),
    "s1": ("sipu/s1", 15),
    "birch2": ("sipu/birch2", 100),
}
# held-out datasets for the check of the relative rounds' radius and the devices' noise split: battery name (or digits)
HELD_OUT = (
    "sipu/a1",
    "sipu/a2",
    "sipu/aggregation",
    "sipu/d31",
    "sipu/r15",
    "sipu/s2",
    "sipu/unbalance",
    "uci/ecoli",
    "uci/glass",
    "uci/ionosphere",
    "uci/statlog",
    "digits",
)
FASTLLOYD_ALPHA = 0.8  # FastLloyd's radius factor (bench/peers/fastlloyd_run.py sets it as its experiments do)
EPSILONS = (0.1, 0.25, 0.5, 1.0)
SERVER_SHARE = 0.05
RUNNER = ROOT / "bench" / "peers" / "fastlloyd_run.py"


def load(name: str, battery: Path | None) -> np.ndarray:
    """The dataset scaled to [-1, 1] per coordinate (FastLloyd's ``normalize``)."""
    return scaled(raw(DATASETS[name][0] if name in DATASETS else name, battery)[0])


def held_out_k(name: str, battery: Path | None) -> int:
    """A held-out dataset's k: its number of reference clusters."""
    return real_data.n_clusters(raw(name, battery)[1])


def raw(source: str, battery: Path | None) -> tuple[np.ndarray, np.ndarray]:
    """(points, reference labels) of a dataset: scikit-learn's by their name, the others from the battery."""
    from sklearn import datasets

    bundled = {
        "iris": datasets.load_iris,
        "wine": datasets.load_wine,
        "breast": datasets.load_breast_cancer,
        "digits": datasets.load_digits,
    }
    if source in bundled:
        found = bundled[source]()
        return found.data, found.target + 1  # labels from 1, as the battery's (0 = noise)
    if battery is None:
        raise SystemExit(f"{source} is in Gagolewski's battery: give its folder with --battery")
    if not (battery / f"{source}.data.gz").exists():
        raise SystemExit(f"{battery / source}.data.gz not found (--battery should hold {source}.data.gz)")
    return real_data.load(str(battery), source)


def scaled(X: np.ndarray) -> np.ndarray:
    """Each coordinate min-max scaled to [-1, 1]."""
    X = np.asarray(X, dtype=np.float64)
    span = X.max(axis=0) - X.min(axis=0)
    span[span == 0] = 1.0
    return 2.0 * (X - X.min(axis=0)) / span - 1.0


def clients_of(n: int, seed: int, server: bool) -> np.ndarray:
    """Each row's client (0, 1), or -1 for the server's rows: a seeded permutation, 5 % to
    the server when ``server``, the rest in two equal halves."""
    order = np.random.default_rng(seed).permutation(n)
    owner = np.empty(n, dtype=int)
    held = int(round(SERVER_SHARE * n)) if server else 0
    owner[order[:held]] = -1
    rest = order[held:]
    owner[rest[: len(rest) // 2]], owner[rest[len(rest) // 2 :]] = 0, 1
    return owner


def run_ours(task: tuple) -> dict:
    name, X, k, eps, seed, server, overrides = (
        task  # server: True (5 % server data), False, or "secure"; overrides: run config
    )
    quiet_flower()
    warnings.simplefilter("ignore")
    import fedcluster

    n, d = X.shape
    delta = 1.0 / (n * math.log(n))
    owner = clients_of(n, seed, server is True)
    secure = {"secure-aggregation": True, "evaluate-cost": False} if server == "secure" else {}
    # without server data Δ = √d, the bound of the [-1, 1] cube; with it, the server data's radius around its mean
    bound = {} if server is True else {"clip-norm": math.sqrt(d)}
    model = fedcluster.DPFederatedKMeans(
        k, epsilon=eps, delta=delta, random_state=seed, run_config={**bound, "noise-seed": seed, **secure, **overrides}
    )
    model.fit([X[owner == 0], X[owner == 1]], server_data=X[owner == -1] if server is True else None)
    privacy = model.privacy_
    return {
        "cost": kmeans_cost(X, model.cluster_centers_),
        "epsilon": privacy["epsilon"],
        "rounds": privacy["lloyd_rounds"],
        "init": model.result_["init"]["method"],
    }


def run_fastlloyd(task: tuple) -> dict:
    name, X, k, eps, seed, fastlloyd, python = task
    with tempfile.TemporaryDirectory(prefix="fedcluster-fastlloyd-") as folder:
        data, assign, out = (Path(folder) / f for f in ("X.npy", "ids.npy", "centers.npy"))
        np.save(data, X)
        np.save(assign, clients_of(X.shape[0], seed, server=False))
        env = {
            **os.environ,
            "OPENBLAS_NUM_THREADS": "1",
            "OMP_NUM_THREADS": "1",
            "TQDM_DISABLE": "1",
            "MPLBACKEND": "Agg",
        }
        done = subprocess.run(
            [
                python,
                str(RUNNER),
                "--fastlloyd",
                str(fastlloyd),
                "--data",
                str(data),
                "--assign",
                str(assign),
                "--k",
                str(k),
                "--epsilon",
                str(eps),
                "--seed",
                str(seed),
                "--out",
                str(out),
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=3600,
        )
        if done.returncode != 0:
            raise RuntimeError(f"FastLloyd on {name} eps={eps} seed={seed} failed:\n{done.stderr[-2000:]}")
        facts = json.loads(done.stdout.strip().splitlines()[-1])
        return {"cost": kmeans_cost(X, np.load(out)), "rounds": facts["iterations"]}


def main(argv: list[str] | None = None) -> int:
    parser = add_bench_flags(
        argparse.ArgumentParser(
            description=__doc__.split("Usage::")[0], formatter_class=argparse.RawDescriptionHelpFormatter
        ),
        quick="ours only, iris and lsun, 2 seeds",
        out="also write DIR/fastlloyd.md and DIR/fastlloyd-ratio.svg",
    )
    parser.add_argument("--battery", type=Path, help="Gagolewski's battery folder (fcps/, uci/, sipu/)")
    parser.add_argument("--fastlloyd", type=Path, help="a FastLloyd checkout (github.com/D-Diaa/FastLloyd)")
    parser.add_argument("--fastlloyd-python", default=sys.executable, help="the Python with FastLloyd's dependencies")
    parser.add_argument("--datasets", nargs="+", choices=list(DATASETS), default=list(DATASETS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5], help="FastLloyd needs seeds >= 1")
    parser.add_argument(
        "--held-out",
        nargs="*",
        choices=list(HELD_OUT),
        default=list(HELD_OUT),
        help="datasets outside FastLloyd's seven for the radius and noise-split check (none: skip it)",
    )
    parser.add_argument("--jobs", type=int, default=default_jobs())
    args = parser.parse_args(argv)
    if args.quick:
        args.datasets, args.seeds, args.fastlloyd, args.held_out = ["iris", "lsun"], args.seeds[:2], None, []
    from_battery = [name for name in args.datasets if "/" in DATASETS[name][0]] + [n for n in args.held_out if "/" in n]
    if args.battery is None and from_battery:
        parser.error(
            f"{', '.join(from_battery)} are in Gagolewski's battery: give its folder with --battery "
            "(or leave them out with --datasets / --held-out)"
        )
    if args.fastlloyd is not None and not (args.fastlloyd / "configs" / "params.py").exists():
        parser.error(f"--fastlloyd {args.fastlloyd} is not a FastLloyd checkout (no configs package with params)")
    if min(args.seeds) < 1:
        parser.error("seeds must be >= 1 (FastLloyd seeds its noise with seed x iteration: seed 0 repeats it)")

    with page_output(args.out, __file__):
        print_header("FedDP-KMeans without server data beside FastLloyd", __doc__)
        if args.fastlloyd is not None:
            commit = subprocess.run(
                ["git", "-C", str(args.fastlloyd), "rev-parse", "HEAD"], capture_output=True, text=True
            )
            print(f"FastLloyd checkout at commit {commit.stdout.strip() or 'unknown (not a git checkout)'}.\n")
        data = {name: load(name, args.battery) for name in args.datasets}
        from sklearn.cluster import KMeans

        central = {
            name: KMeans(DATASETS[name][1], n_init=10, random_state=0).fit(X).inertia_ for name, X in data.items()
        }
        cells = [(name, eps, seed) for name in args.datasets for eps in EPSILONS for seed in args.seeds]
        ours = parallel_map(run_ours, [(n, data[n], DATASETS[n][1], e, s, False, {}) for n, e, s in cells], args.jobs)
        served = parallel_map(run_ours, [(n, data[n], DATASETS[n][1], e, s, True, {}) for n, e, s in cells], args.jobs)
        secured = parallel_map(
            run_ours, [(n, data[n], DATASETS[n][1], e, s, "secure", {}) for n, e, s in cells], args.jobs
        )
        theirs = (
            parallel_map(
                run_fastlloyd,
                [(n, data[n], DATASETS[n][1], e, s, args.fastlloyd, args.fastlloyd_python) for n, e, s in cells],
                args.jobs,
            )
            if args.fastlloyd
            else None
        )
        over = [
            (c, r["epsilon"]) for c, r in zip(cells * 3, ours + served + secured) if r["epsilon"] > c[1] * (1 + 1e-9)
        ]
        print(
            "Every ε of ours recomputed by its ledger (PLD; RDP for the devices' Skellam noise) at or below the ε "
            "asked: "
            f"{'yes' if not over else 'NO: ' + repr(over)}.\n"
        )

        def median(results, name, eps):
            return statistics.median(r["cost"] / central[name] for c, r in zip(cells, results) if c[:2] == (name, eps))

        def marked(value: float, other: float | None) -> str:  # bold: at or below FastLloyd's
            return f"**{value:.3f}**" if other is not None and value <= other else f"{value:.3f}"

        def rounds(results, name, eps):
            return "/".join(sorted({str(r["rounds"]) for c, r in zip(cells, results) if c[:2] == (name, eps)}))

        rows, logs, wins, ratio_series = (
            [],
            {"secure": [], "central": [], "server": []},
            {"secure": 0, "central": 0, "server": 0},
            {},
        )
        for name in args.datasets:
            n, d = data[name].shape
            for eps in EPSILONS:
                mine, central_dp, server = (
                    median(secured, name, eps),
                    median(ours, name, eps),
                    median(served, name, eps),
                )
                row = [f"{name} (n={n}, d={d}, k={DATASETS[name][1]})", eps]
                other = median(theirs, name, eps) if theirs is not None else None
                if theirs is not None:
                    for key, value in (("secure", mine), ("central", central_dp), ("server", server)):
                        logs[key].append(math.log(value / other))
                        wins[key] += value <= other
                    ratio_series.setdefault(name, ([], [], None))
                    ratio_series[name][0].append(eps)
                    ratio_series[name][1].append(mine / other)
                    row += [f"{other:.3f}", rounds(theirs, name, eps)]
                row += [marked(mine, other), rounds(secured, name, eps)]
                if theirs is not None:
                    row.append(f"{mine / other:.3f}")
                row += [f"{central_dp:.3f}", marked(server, other)]
                rows.append(row)
        headers = ["dataset", "ε"]
        if theirs is not None:
            headers += ["FastLloyd", "its iterations"]
        headers += ["ours, secure aggregation", "our Lloyd rounds"]
        if theirs is not None:
            headers += ["ours (secure) / FastLloyd"]
        headers += ["ours, central DP", f"ours, {SERVER_SHARE:.0%} server data"]
        print(
            f"Cost over central k-means' (median of seeds {', '.join(map(str, args.seeds))}); bold: ours at or "
            "below FastLloyd's (the secure and the server-data columns).\n"
        )
        print(markdown_table(headers, rows))
        print()
        if theirs is not None:
            for key, label in (
                ("secure", "with secure aggregation (FastLloyd's threat model)"),
                ("central", "with central DP"),
                ("server", f"with {SERVER_SHARE:.0%} server data (central DP)"),
            ):
                print(
                    f"Ours {label} at or below FastLloyd in {wins[key]} of {len(logs[key])} cells; geometric mean of "
                    f"ours / FastLloyd {math.exp(sum(logs[key]) / len(logs[key])):.3f}.\n"
                )
            print(
                "Target: without server data (secure aggregation) at or below in every cell, and at least 10 % lower "
                "on "
                "the geometric mean; with server data at or below in every cell.\n"
            )
            path, link = figure_path(args.out, Path(tempfile.gettempdir()), __file__, "ratio.svg")
            svg_line_chart(
                path,
                "ours (secure aggregation) / FastLloyd, median cost",
                "ε",
                "cost ratio (below 1: ours lower)",
                ratio_series,
            )
            print(f"![ours / FastLloyd per dataset]({link})\n")
        if args.held_out:
            held_out_check(args)
    return 0


def held_out_check(args: argparse.Namespace) -> None:
    """The held-out table: FastLloyd (when given), ours with central DP at FastLloyd's α and
    at the default, and ours with secure aggregation (default split, and the paper's shares),
    on datasets outside FastLloyd's seven."""
    from sklearn.cluster import KMeans

    from fedcluster.algorithms.feddp_kmeans.model import RELATIVE_RADIUS_ALPHA, RULE_OF_THUMB

    data = {name: (load(name, args.battery), held_out_k(name, args.battery)) for name in args.held_out}
    central = {name: KMeans(k, n_init=10, random_state=0).fit(X).inertia_ for name, (X, k) in data.items()}
    cells = [(name, eps, seed) for name in args.held_out for eps in EPSILONS for seed in args.seeds]

    def radius(name: str) -> dict[str, float]:  # FastLloyd's α·Δ/k^(1/d), Δ = √d
        (_, d), k = data[name][0].shape, data[name][1]
        return {"lloyd-radius": FASTLLOYD_ALPHA * math.sqrt(d) / k ** (1 / d)}

    paper_shares = {"budget-split": ",".join(f"{w:g}" for w in RULE_OF_THUMB["data-point"])}
    columns = {
        "default": parallel_map(run_ours, [(n, *data[n], e, s, False, {}) for n, e, s in cells], args.jobs),
        "fastlloyd-alpha": parallel_map(
            run_ours, [(n, *data[n], e, s, False, radius(n)) for n, e, s in cells], args.jobs
        ),
        "secure": parallel_map(run_ours, [(n, *data[n], e, s, "secure", {}) for n, e, s in cells], args.jobs),
        "secure-paper": parallel_map(
            run_ours, [(n, *data[n], e, s, "secure", paper_shares) for n, e, s in cells], args.jobs
        ),
    }
    if args.fastlloyd:
        columns["fastlloyd"] = parallel_map(
            run_fastlloyd,
            [(n, data[n][0], data[n][1], e, s, args.fastlloyd, args.fastlloyd_python) for n, e, s in cells],
            args.jobs,
        )
    over = [
        c
        for key in ("default", "fastlloyd-alpha", "secure", "secure-paper")
        for c, r in zip(cells, columns[key])
        if r["epsilon"] > c[1] * (1 + 1e-9)
    ]
    print(f"## The relative rounds' radius and the devices' noise split on {len(args.held_out)} other datasets\n")
    print(
        f"Ours with central DP (no server data, Δ = √d) at r = α·Δ/k^(1/d) with FastLloyd's α = {FASTLLOYD_ALPHA} and "
        f"with the default α = {RELATIVE_RADIUS_ALPHA:g}; with secure aggregation (its defaults, as in the table "
        f"above: the Lloyd rounds' share split 2√d : 1 between sums and counts), and with the paper's shares instead "
        f"(budget-split {paper_shares['budget-split']}); every ε at or below the ε asked: "
        f"{'yes' if not over else 'NO: ' + repr(over)}. Cost over central k-means', median of seeds "
        f"{', '.join(map(str, args.seeds))}.\n"
    )
    medians = {
        key: {
            (n, e): statistics.median(r["cost"] / central[n] for c, r in zip(cells, results) if c[:2] == (n, e))
            for n in args.held_out
            for e in EPSILONS
        }
        for key, results in columns.items()
    }
    rows = []
    for name in args.held_out:
        (n, d), k = data[name][0].shape, data[name][1]
        for eps in EPSILONS:
            row = [f"{name} (n={n}, d={d}, k={k})", eps]
            row += [f"{medians['fastlloyd'][name, eps]:.3f}"] if args.fastlloyd else []
            row += [
                f"{medians[key][name, eps]:.3f}" for key in ("fastlloyd-alpha", "default", "secure", "secure-paper")
            ]
            rows.append(row)
    headers = (
        ["dataset", "ε"]
        + (["FastLloyd"] if args.fastlloyd else [])
        + [
            f"ours, central DP, α = {FASTLLOYD_ALPHA}",
            f"ours, central DP, α = {RELATIVE_RADIUS_ALPHA:g} (default)",
            "ours, secure aggregation",
            "ours, secure aggregation, the paper's shares",
        ]
    )
    print(markdown_table(headers, rows))
    print()

    def geometric(numerator: str, denominator: str) -> tuple[int, float]:
        ratios = [medians[numerator][cell] / medians[denominator][cell] for cell in medians[numerator]]
        return sum(r <= 1 for r in ratios), math.exp(sum(map(math.log, ratios)) / len(ratios))

    pairs = [
        ("default", "fastlloyd-alpha", f"Central DP, α = {RELATIVE_RADIUS_ALPHA:g} against α = {FASTLLOYD_ALPHA}"),
        ("secure", "secure-paper", "Secure aggregation, 2√d : 1 against the paper's shares"),
    ]
    if args.fastlloyd:
        pairs += [
            (key, "fastlloyd", f"{label} against FastLloyd")
            for key, label in (
                ("fastlloyd-alpha", f"Central DP, α = {FASTLLOYD_ALPHA}"),
                ("default", f"Central DP, α = {RELATIVE_RADIUS_ALPHA:g}"),
                ("secure", "Secure aggregation"),
                ("secure-paper", "Secure aggregation with the paper's shares"),
            )
        ]
    for numerator, denominator, label in pairs:
        at_or_below, mean = geometric(numerator, denominator)
        print(
            f"{label}: at or below in {at_or_below} of {len(medians[numerator])} cells, geometric mean of the ratio "
            f"{mean:.3f}.\n"
        )


if __name__ == "__main__":
    raise SystemExit(main())
