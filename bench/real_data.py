"""Real data: every point algorithm with its defaults on Gagolewski's clustering benchmark
suite, beside central scikit-learn ``KMeans(n_init=10)``.

The data are NOT part of this repository. Get the public suite (version 1) once::

    git clone https://github.com/gagolews/clustering-data-v1 ~/clustering-data-v1

and give its folder with ``--battery``. Each dataset ``<battery>/<name>.data.gz`` (one
point per line) comes with ``<name>.labels0.gz``, the reference partition (labels 1..k;
0 = noise): k is its number of clusters. Datasets are used raw (no scaling), as a user
would hand them to an estimator.

Every dataset is split over clients three ways (``--splits``):

- ``iid``: a random permutation cut into 10 equal clients;
- ``dirichlet``: label skew, every reference cluster (noise as its own group) spread over
  10 clients by Dirichlet(0.3) proportions; clients left empty are dropped;
- ``pathological``: max(k, 5) clients, client i holds reference cluster i mod k and, on a
  coin flip, one other; a cluster's points are shared evenly by its holders (noise points
  go to random clients).

The estimators run with ``n_clusters`` and ``random_state`` only (``fedkmeans-0.3`` adds
``fraction=0.3``), as a new user would call them. Scored on the pooled data: the k-means
cost of the returned centers over the best central cost of the seeds (``KMeans(n_init=10,
random_state=seed)``, the lowest over the seeds: a federated run is not credited with the
central run's bad luck), the adjusted Rand index of the returned labels against the
reference (noise points left out), and the seconds per fit (one thread per process).

Usage::

    python bench/real_data.py --battery DIR                      # every dataset of BATTERIES, 3 seeds
    python bench/real_data.py --battery DIR --quick              # 3 small datasets, 1 seed
    python bench/real_data.py --battery DIR --out docs/results   # also write real-data.{md,json.gz,svg}
    python bench/real_data.py --battery DIR --compare OLD.json.gz   # per-case change against an earlier run
    python bench/real_data.py --from-json docs/results/real-data.json.gz --out docs/results   # re-render only
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):  # one thread per worker
    os.environ.setdefault(_var, "1")

import argparse
import fnmatch
import functools
import gzip
import json
import math
import statistics
import sys
import time
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from _common import add_bench_flags, default_jobs, machine_info, markdown_table, parallel_map, quiet_flower

BATTERIES = ("fcps", "graves", "other", "sipu", "uci", "wut")
SPLITS = ("iid", "dirichlet", "pathological")
QUICK = ("fcps/lsun", "uci/wine", "sipu/r15")
CLIENTS = 10
ALPHA = 0.3
# name -> (FederatedKMeans keyword arguments); "central" is scikit-learn's KMeans(n_init=10).
ALGORITHMS: dict[str, dict[str, Any]] = {
    "fedkmeans": {"algorithm": "fedkmeans"},
    "fedkmeans-0.3": {"algorithm": "fedkmeans", "fraction": 0.3},
    "kfed": {"algorithm": "kfed"},
    "da-ufl": {"algorithm": "da-ufl"},
}
# Targets of issue 24 (worst seed per case against central): share of cases within a bound.
TARGETS = {
    "fedkmeans": (0.01, 0.90, 0.05, 1.0),
    "fedkmeans-0.3": (0.01, 0.90, 0.05, 1.0),
    "kfed": (None, None, 0.05, 0.85),
    "da-ufl": (None, None, 0.05, 0.90),
}


# ------------------------------------------------------------------------------ data
def dataset_names(battery: Path, batteries: tuple[str, ...], patterns: list[str]) -> list[str]:
    """``<battery>/<name>`` of every dataset with data and reference labels under ``battery``."""
    names = []
    for group in batteries:
        for data in sorted((battery / group).glob("*.data.gz")):
            name = f"{group}/{data.name[: -len('.data.gz')]}"
            if (battery / f"{name}.labels0.gz").is_file() and (
                not patterns or any(fnmatch.fnmatch(name, p) for p in patterns)
            ):
                names.append(name)
    return names


@functools.lru_cache(maxsize=4)
def load(battery: str, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(points, reference labels; 0 = noise) of one dataset."""
    with gzip.open(Path(battery) / f"{name}.data.gz", "rt") as f:
        X = np.loadtxt(f, ndmin=2)
    with gzip.open(Path(battery) / f"{name}.labels0.gz", "rt") as f:
        y = np.loadtxt(f, dtype=np.int64, ndmin=1)
    if X.shape[0] != y.shape[0]:
        raise SystemExit(f"{name}: {X.shape[0]} points but {y.shape[0]} labels")
    return X, y


def n_clusters(y: np.ndarray) -> int:
    return int(np.unique(y[y > 0]).size)


def split(y: np.ndarray, kind: str, seed: int) -> list[np.ndarray]:
    """Index arrays, one per client (see the module docstring)."""
    rng = np.random.default_rng([seed, zlib.crc32(kind.encode())])
    n = y.shape[0]
    if kind == "iid":
        return [np.sort(part) for part in np.array_split(rng.permutation(n), CLIENTS)]
    if kind == "dirichlet":
        clients: list[list[np.ndarray]] = [[] for _ in range(CLIENTS)]
        for group in np.unique(y):
            members = rng.permutation(np.flatnonzero(y == group))
            shares = rng.dirichlet(np.full(CLIENTS, ALPHA))
            cuts = np.round(np.cumsum(shares)[:-1] * members.size).astype(int)
            for client, part in zip(clients, np.split(members, cuts)):
                client.append(part)
        parts = [np.sort(np.concatenate(c)) for c in clients]
        return [p for p in parts if p.size]
    if kind == "pathological":
        classes = np.unique(y[y > 0])
        k = classes.size
        m = max(k, 5)
        holders: dict[int, list[int]] = {int(c): [] for c in classes}
        for i in range(m):
            holders[int(classes[i % k])].append(i)
            if k > 1 and rng.random() < 0.5:
                other = (i % k + 1 + int(rng.integers(k - 1))) % k
                holders[int(classes[other])].append(i)
        clients = [[] for _ in range(m)]
        for c, who in holders.items():
            for client, part in zip(who, np.array_split(rng.permutation(np.flatnonzero(y == c)), len(who))):
                clients[client].append(part)
        noise = np.flatnonzero(y <= 0)
        owner = rng.integers(m, size=noise.size)
        for i in range(m):
            clients[i].append(noise[owner == i])
        parts = [np.sort(np.concatenate(c)) for c in clients]
        return [p for p in parts if p.size]
    raise ValueError(f"unknown split {kind!r}")


# ------------------------------------------------------------------------------ runs
def cost_of(X: np.ndarray, centers: np.ndarray) -> float:
    from fedcluster.lloyd import kmeans_cost

    return float(kmeans_cost(X, centers))


def ari(y: np.ndarray, labels: np.ndarray) -> float:
    from sklearn.metrics import adjusted_rand_score

    keep = y > 0
    return float(adjusted_rand_score(y[keep], labels[keep]))


def run_case(job: tuple[str, str, str, dict, str, int]) -> dict[str, Any]:
    """One fit: ``(battery, dataset, algorithm, its FederatedKMeans arguments, split, seed)`` -> its record."""
    battery, name, algorithm, arguments, kind, seed = job
    X, y = load(battery, name)
    k = n_clusters(y)
    record: dict[str, Any] = {
        "dataset": name,
        "algorithm": algorithm,
        "split": kind,
        "seed": seed,
        "n": int(X.shape[0]),
        "d": int(X.shape[1]),
        "k": k,
    }
    started, cpu = time.perf_counter(), time.process_time()
    if algorithm == "central":
        from sklearn.cluster import KMeans

        model = KMeans(n_clusters=k, n_init=10, random_state=seed).fit(X)
        centers, labels, warnings, clients = model.cluster_centers_, model.labels_, [], 1
    else:
        quiet_flower()
        import logging

        from flwr.common.logger import FLOWER_LOGGER

        FLOWER_LOGGER.setLevel(logging.ERROR)
        from fedcluster.estimators import FederatedKMeans

        parts = split(y, kind, seed)
        model = FederatedKMeans(n_clusters=k, random_state=seed, **arguments)
        try:
            model.fit([X[p] for p in parts])
        except Exception as exc:  # recorded, never hidden: a failed fit is a failed case
            record.update(
                error=f"{type(exc).__name__}: {exc}",
                seconds=time.perf_counter() - started,
                cpu_seconds=time.process_time() - cpu,
            )
            return record
        centers = model.cluster_centers_
        labels = np.empty(X.shape[0], dtype=np.int64)
        for p, lab in zip(parts, model.labels_):
            labels[p] = lab
        warnings, clients = list(model.result_.get("warnings", [])), len(parts)
        # an honest federation: any reply refused (invalid or taken for a lie) is a false alarm
        record["refused"] = [
            f"{p['phase']}: {f['kind']}: {f['reason'][:200]}"
            for p in model.result_["phases"]
            for f in p["failures"]
            if f["kind"] in ("invalid", "inconsistent")
        ]
    record.update(
        seconds=time.perf_counter() - started,
        cpu_seconds=time.process_time() - cpu,
        cost=cost_of(X, centers),
        ari=ari(y, labels),
        clients=clients,
        warnings=warnings,
    )
    return record


def jobs_of(battery: Path, names: list[str], algorithms: list[str], splits: list[str], seeds: int) -> list[tuple]:
    jobs = []
    for name in names:
        for seed in range(seeds):
            jobs.append((str(battery), name, "central", {}, "pooled", seed))
            for algorithm in algorithms:
                for kind in splits:
                    jobs.append((str(battery), name, algorithm, ALGORITHMS[algorithm], kind, seed))
    # the largest datasets first: the workers finish together
    size = {name: load(str(battery), name)[0].size * n_clusters(load(str(battery), name)[1]) for name in names}
    return sorted(jobs, key=lambda job: -size[job[1]])


# ------------------------------------------------------------------------------ report
def cases(records: list[dict[str, Any]]) -> dict[str, dict[tuple[str, str], dict[str, Any]]]:
    """algorithm -> (dataset, split) -> worst seed's ratio, median ARI, median seconds."""
    central: dict[str, float] = {}
    for r in records:
        if r["algorithm"] == "central":
            central[r["dataset"]] = min(central.get(r["dataset"], math.inf), r["cost"])
    out: dict[str, dict[tuple[str, str], dict[str, Any]]] = {}
    grouped: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in records:
        grouped.setdefault((r["algorithm"], r["dataset"], r["split"]), []).append(r)
    for (algorithm, name, kind), runs in grouped.items():
        failed = [r for r in runs if "error" in r]
        ratios = [r["cost"] / central[name] if central[name] > 0 else 1.0 for r in runs if "error" not in r]
        out.setdefault(algorithm, {})[(name, kind)] = {
            "worst": math.inf if failed or not ratios else max(ratios),
            "median": statistics.median(ratios) if ratios else math.inf,
            "ari": statistics.median([r["ari"] for r in runs if "error" not in r] or [math.nan]),
            "seconds": statistics.median([r["seconds"] for r in runs]),
            "cpu": statistics.median([r.get("cpu_seconds", r["seconds"]) for r in runs]),
            "refused": sum(bool(r.get("refused")) for r in runs),
            "why": next((r["refused"][0] for r in runs if r.get("refused")), ""),
            "warned": sum(bool(r.get("warnings")) for r in runs),
            "errors": [r["error"] for r in failed],
            "k": runs[0]["k"],
        }
    return out


def summary(table: dict[str, dict[tuple[str, str], dict[str, Any]]], order: list[str]) -> str:
    rows = []
    central = table.get("central", {})
    central_seconds = {name: c["cpu"] for (name, _), c in central.items()}
    central_ari = {name: c["ari"] for (name, _), c in central.items()}
    for algorithm in order:
        entries = table.get(algorithm)
        if not entries:
            continue
        worst = [c["worst"] for c in entries.values()]
        n = len(worst)
        within1 = sum(w <= 1.01 for w in worst)
        within5 = sum(w <= 1.05 for w in worst)
        time_ratio = statistics.median(c["cpu"] / max(central_seconds[name], 1e-9) for (name, _), c in entries.items())
        ari_gap = statistics.median(c["ari"] - central_ari[name] for (name, _), c in entries.items())
        target = TARGETS.get(algorithm)
        met = ""
        if target:
            checks = []
            if target[0] is not None:
                checks.append(within1 >= target[1] * n)
            checks.append(within5 >= target[3] * n)
            met = "yes" if all(checks) else "**no**"
        rows.append(
            [
                algorithm,
                f"{within1} ({100 * within1 / n:.0f} %)",
                f"{within5} ({100 * within5 / n:.0f} %)",
                n,
                f"{statistics.median(worst):.4f}",
                f"{max(worst):.3f}",
                f"{ari_gap:+.3f}",
                f"{statistics.median(c['seconds'] for c in entries.values()):.2f}",
                f"{time_ratio:.1f}×",
                sum(c["warned"] > 0 for c in entries.values()),
                sum(c["refused"] > 0 for c in entries.values()),
                met,
            ]
        )
    return markdown_table(
        [
            "algorithm",
            "within 1 %",
            "within 5 %",
            "cases",
            "median worst",
            "max worst",
            "ARI − central (median)",
            "s / fit (median)",
            "CPU time / central",
            "cases warned",
            "cases with a reply refused",
            "target met",
        ],
        rows,
    )


def refusals(table, order: list[str]) -> list[str]:
    """The cases where an honest device's reply was refused, with the first reason."""
    rows = [
        [algorithm, name, kind, c["refused"], c["why"]]
        for algorithm in order
        for (name, kind), c in sorted(table.get(algorithm, {}).items())
        if c.get("refused")
    ]
    if not rows:
        return ["No honest device's reply was refused in any case.\n"]
    return [
        "### Replies refused in honest federations\n",
        markdown_table(["algorithm", "dataset", "split", "seeds", "first reason"], rows),
        "",
    ]


def per_split(table, order: list[str], splits: list[str]) -> str:
    rows = []
    for algorithm in order:
        entries = table.get(algorithm, {})
        row = [algorithm]
        for kind in splits:
            worst = [c["worst"] for (name, s), c in entries.items() if s == kind]
            row.append(
                f"{sum(w <= 1.01 for w in worst)} / {sum(w <= 1.05 for w in worst)} / {len(worst)}" if worst else ""
            )
        rows.append(row)
    return markdown_table(["algorithm"] + [f"{s} (≤ 1 % / ≤ 5 % / cases)" for s in splits], rows)


def detail(table, order: list[str]) -> str:
    keys = sorted({key for algorithm in order for key in table.get(algorithm, {})})
    rows = []
    for name, kind in keys:
        row = [name, kind, table["fedkmeans"][(name, kind)]["k"] if (name, kind) in table.get("fedkmeans", {}) else ""]
        for algorithm in order:
            c = table.get(algorithm, {}).get((name, kind))
            if c is None:
                row.append("")
            elif c["errors"]:
                row.append("failed")
            else:
                mark = "" if c["worst"] <= 1.05 else " ⚠" if c["worst"] <= 1.2 else " ✗"
                row.append(f"{c['worst']:.3f}{mark}")
        rows.append(row)
    return markdown_table(["dataset", "split", "k"] + order, rows)


def comparison(table, old_table, order: list[str], timed: bool = True) -> str:
    """Per algorithm, the cases' change against the earlier run; ``timed``: both runs kept
    CPU seconds per fit (else no time is compared: wall seconds depend on the load)."""
    rows = []
    for algorithm in order:
        new, old = table.get(algorithm, {}), old_table.get(algorithm, {})
        common = sorted(set(new) & set(old))
        if not common:
            continue
        change = [new[key]["worst"] / old[key]["worst"] for key in common]
        worse = [(key, c) for key, c in zip(common, change) if c > 1.01]
        worst = max(worse, key=lambda item: item[1]) if worse else None
        times = [new[key]["cpu"] / max(old[key]["cpu"], 1e-9) for key in common]
        slowest = max(zip(times, common))
        rows.append(
            [
                algorithm,
                len(common),
                sum(c < 0.99 for c in change),
                len(worse),
                f"{worst[0][0]} {worst[0][1]} {worst[1]:.3f}×" if worst else "none",
                f"{max(change):.4f}×",
                f"{statistics.median(times):.2f}×" if timed else "–",
                f"{slowest[0]:.2f}× ({slowest[1][0]} {slowest[1][1]})" if timed else "–",
            ]
        )
    return markdown_table(
        [
            "algorithm",
            "cases",
            "better by > 1 %",
            "worse by > 1 %",
            "worst change",
            "largest change",
            "CPU s / fit, new / old (median)",
            "(largest)",
        ],
        rows,
    )


def figure(table, order: list[str], path: Path, old_table=None) -> None:
    """Share of cases whose worst seed is within x of central, per algorithm (log x); with
    ``old_table`` (``--compare``) the earlier run's curves dashed in the same colours."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for number, algorithm in enumerate(order):
        for source, style, suffix in ((table, "-", ""), (old_table or {}, "--", " (earlier run)")):
            worst = sorted(min(c["worst"], 100.0) - 1 for c in source.get(algorithm, {}).values())
            if not worst:
                continue
            xs = np.maximum(np.array(worst), 1e-5)
            ys = np.arange(1, len(xs) + 1) / len(xs)
            ax.step(
                xs,
                ys,
                style,
                where="post",
                label=algorithm + suffix,
                lw=1.8 if style == "-" else 1.0,
                color=f"C{number}",
            )
    for bound in (0.01, 0.05):
        ax.axvline(bound, color="grey", lw=0.8, ls="--")
    ax.set_xscale("log")
    ax.set_xlim(1e-5, 20)
    ax.set_ylim(0, 1.01)
    ax.set_xlabel("worst seed's cost / best central KMeans(n_init=10) cost − 1  (values ≤ 1e-5 drawn at 1e-5)")
    ax.set_ylabel("share of (dataset, split) cases")
    ax.set_title("Real data (Gagolewski's suite v1): how close to central")
    ax.legend(loc="lower left", bbox_to_anchor=(0.0, 0.1), fontsize="small", ncol=2 if old_table else 1)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def report(
    records: list[dict[str, Any]],
    header: str,
    splits: list[str],
    old: list[dict[str, Any]] | None,
    old_header: str = "",
    name: str = "real-data",
) -> str:
    table = cases(records)
    order = ["central", *algorithms_in(records)] if "central" in table else algorithms_in(records)
    federated = [a for a in order if a != "central"]
    names = sorted({r["dataset"] for r in records})
    failed = [
        f"{r['algorithm']} {r['dataset']} {r['split']} seed {r['seed']}: {r['error']}" for r in records if "error" in r
    ]
    parts = [
        "# Real data: Gagolewski's clustering benchmark suite, beside central k-means\n",
        "Written by `bench/real_data.py` (its docstring says how the data are split and scored). Each case is one "
        "(dataset, split); its score is the WORST seed's k-means cost on the pooled data over the best central "
        "`KMeans(n_init=10)` cost of the seeds. The estimators run with `n_clusters` and `random_state` only.\n",
        "```",
        header,
        "```\n",
        f"{len(names)} datasets × {len(splits)} splits; seeds per case: {max(r['seed'] for r in records) + 1}.\n",
        "## Summary\n",
        summary(table, federated),
        "",
        "`target met`: FedKMeans within 1 % on ≥ 90 % of the cases and within 5 % on all; k-FED within 5 % on ≥ 85 %; "
        "DA-UFL within 5 % on ≥ 90 %. `CPU time / central`: median over cases of the CPU seconds of a fit "
        "over central scikit-learn's, each in its own process with one thread (a federated fit runs a whole "
        "in-process federation; target ≤ 5×). `cases with a reply refused`: an honest device's reply refused "
        "as invalid or a lie in some seed (each is a false alarm; target 0).\n",
        *refusals(table, federated),
        "## By split\n",
        per_split(table, federated, splits),
        "",
        f"![share of cases within a cost ratio]({name}.svg)\n",
    ]
    if old is not None:
        old_table = cases(old)
        timed = all("cpu_seconds" in r for r in old + records if "error" not in r)
        slow = [
            f"{a} {name} {kind} ({table[a][(name, kind)]['cpu']:.2f} s against "
            f"{old_table[a][(name, kind)]['cpu']:.2f} s)"
            for a in federated
            for (name, kind) in sorted(table[a])
            if (name, kind) in old_table.get(a, {})
            and table[a][(name, kind)]["cpu"] > 2 * old_table[a][(name, kind)]["cpu"]
        ]
        parts += [
            "## Against the earlier run\n",
            "Per case, this run's worst seed over the earlier run's (same "
            "datasets, splits and seeds); the earlier run:\n",
            "```",
            old_header,
            "```\n",
            comparison(table, old_table, federated, timed),
            "",
            (
                f"Cases more than 2× slower per fit (CPU) than in the earlier run: {len(slow)}"
                + (": " + "; ".join(slow) + "." if slow else ".")
                if timed
                else "The earlier run kept wall seconds only, which depend on the machine's load: no time per fit "
                "is compared with it (`CPU time / central` above is this run's, each fit beside central in the "
                "same conditions).\n"
            ),
        ]
    parts += ["## Every case (worst seed; ⚠ above 5 %, ✗ above 20 %)\n", detail(table, federated), ""]
    if failed:
        parts += ["## Failed fits\n", *[f"- {line}" for line in failed], ""]
    return "\n".join(parts)


def public(header: str) -> str:
    """A run's header without this machine's paths (the battery is DIR, python is python)."""
    import re

    header = re.sub(r"\S*/bin/python[\d.]*", "python", header)
    header = re.sub(r"(--battery) \S+", r"\1 DIR", header)
    header = re.sub(
        r"(--out|--compare|--from-json) (\S+)",
        lambda m: f"{m.group(1)} {Path(m.group(2)).name if Path(m.group(2)).is_absolute() else m.group(2)}",
        header,
    )
    return re.sub(r" \((/|[A-Za-z]:\\)[^)]*\)$", "", header, flags=re.M)


def algorithms_in(records: list[dict[str, Any]]) -> list[str]:
    """The federated rows of a run, ALGORITHMS' order first, then the variants as they came."""
    seen = list(dict.fromkeys(r["algorithm"] for r in records if r["algorithm"] != "central"))
    return [a for a in ALGORITHMS if a in seen] + [a for a in seen if a not in ALGORITHMS]


def read_json(path: Path) -> dict[str, Any]:
    """A saved run (``.json`` or ``.json.gz``)."""
    raw = path.read_bytes()
    return json.loads(gzip.decompress(raw) if path.suffix == ".gz" else raw)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--battery", type=Path, help="folder of the suite (a clone of gagolews/clustering-data-v1)")
    parser.add_argument(
        "--batteries", default=",".join(BATTERIES), help=f"comma-separated (default {','.join(BATTERIES)})"
    )
    parser.add_argument(
        "--datasets", default="", help="comma-separated patterns such as 'sipu/a*,uci/*' (default: all)"
    )
    parser.add_argument("--max-points", type=int, default=20_000, help="skip larger datasets (default 20000; 0 = none)")
    parser.add_argument("--splits", default=",".join(SPLITS))
    parser.add_argument("--algorithms", default=",".join(ALGORITHMS))
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME=JSON",
        help="an extra row: FederatedKMeans keyword arguments as JSON, e.g. "
        "'da-ufl-8=" + '{"algorithm": "da-ufl", "run_config": {"som-grid": 8}}' + "' (repeatable)",
    )
    parser.add_argument("--seeds", type=int, default=None, help="seeds per case (default 3, quick 1)")
    parser.add_argument("--jobs", type=int, default=default_jobs())
    add_bench_flags(
        parser,
        quick=f"{', '.join(QUICK)}, 1 seed",
        out="folder to write real-data.md, real-data.json.gz and real-data.svg into (see --name)",
    )
    parser.add_argument(
        "--name", default="real-data", help="file name of the page, data and figure in --out (default real-data)"
    )
    parser.add_argument("--compare", type=Path, help="an earlier real-data.json(.gz): per-case changes")
    parser.add_argument("--from-json", type=Path, help="re-render a saved run instead of running")
    args = parser.parse_args(argv)
    splits = [s for s in args.splits.split(",") if s]
    for variant in args.variant:
        name, _, text = variant.partition("=")
        try:
            ALGORITHMS[name] = json.loads(text)
        except json.JSONDecodeError as exc:
            parser.error(f"--variant {variant!r}: {exc}")
    earlier = read_json(args.compare) if args.compare else None
    old, old_header = (earlier["records"], earlier.get("header", "")) if earlier else (None, "")
    if args.from_json:
        saved = read_json(args.from_json)
        records, header = saved["records"], saved["header"]
        splits = saved.get("splits", splits)
    else:
        if args.battery is None or not args.battery.is_dir():
            parser.error("--battery DIR: a clone of https://github.com/gagolews/clustering-data-v1 (see --help)")
        chosen = [a for a in args.algorithms.split(",") if a] + [v.partition("=")[0] for v in args.variant]
        unknown = [a for a in chosen if a not in ALGORITHMS]
        if unknown or any(s not in SPLITS for s in splits):
            parser.error(f"algorithms: {', '.join(ALGORITHMS)}; splits: {', '.join(SPLITS)}")
        patterns = list(QUICK) if args.quick else [p for p in args.datasets.split(",") if p]
        names = dataset_names(args.battery.resolve(), tuple(args.batteries.split(",")), patterns)
        if args.max_points:
            names = [n for n in names if load(str(args.battery.resolve()), n)[0].shape[0] <= args.max_points]
        if not names:
            parser.error(f"no dataset with labels found under {args.battery}")
        seeds = args.seeds or (1 if args.quick else 3)
        header = machine_info()
        print(header, flush=True)
        print(f"{len(names)} datasets: {', '.join(names)}", flush=True)
        jobs = jobs_of(args.battery.resolve(), names, chosen, splits, seeds)
        started = time.perf_counter()
        records = parallel_map(run_case, jobs, args.jobs)
        header += f"\nwall    : {time.perf_counter() - started:.0f} s for {len(jobs)} fits in {args.jobs} processes"
    header, old_header = public(header), public(old_header)
    text = report(records, header, splits, old, old_header, args.name)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"{args.name}.md").write_text(text)
        saved = json.dumps({"header": header, "splits": splits, "records": records}, separators=(",", ":"))
        (args.out / f"{args.name}.json.gz").write_bytes(gzip.compress(saved.encode(), mtime=0))
        figure(cases(records), algorithms_in(records), args.out / f"{args.name}.svg", cases(old) if old else None)
        print(f"wrote {args.out / args.name}.md, .json.gz, .svg", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
