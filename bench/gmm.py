"""Federated GMM on the real-data suite against central scikit-learn (issue 45).

Every dataset of the battery (``--battery``; the layout bench/real_data.py reads), standardized
as a user would (StandardScaler on the pooled points), split over clients IID and
label-skewed (Dirichlet α = 0.3 over the reference labels, bench/real_data.py's splits),
``FederatedGaussianMixture(k)`` with its defaults and ``covariance_type`` full and diag, k the
number of reference clusters; beside it ``GaussianMixture(k, n_init=5)`` on the pooled points.
Reported per case: the mean log-likelihood per point of both on the pooled points and the gap;
the summary: the share of cases within 0.05 nats and the worst gap. With ``--pfl-python`` and
``--pfl-runner`` (apple/pfl-research's federated GMM, run outside the project; diag only) its
mean log-likelihood on the same clients too; without them that column is left out.

    python bench/gmm.py --battery DIR [--datasets 'uci/*,sipu/r15'] [--out docs/results]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import add_bench_flags, page_output  # noqa: E402
from real_data import QUICK, dataset_names, load, n_clusters, split  # noqa: E402

SPLITS = ("iid", "dirichlet")
COVARIANCES = ("full", "diag")
WITHIN = 0.05  # nats per point: the target (90 % of cases), and 0.5 in all


def pfl_score(python: str, runner: str, parts: list[np.ndarray], X: np.ndarray, k: int) -> float | None:
    """pfl-research's federated GMM (diag) on the same clients: its mean log-likelihood per
    point as the runner reports it; None when it fails (the reason printed)."""
    with tempfile.TemporaryDirectory() as folder:
        for i, part in enumerate(parts):
            np.save(Path(folder) / f"client_{i:03d}.npy", part)
        done = subprocess.run(
            [python, runner, "--clients-dir", folder, "-k", str(k)], capture_output=True, text=True, timeout=3600
        )
    try:
        return float(json.loads(done.stdout.strip().splitlines()[-1])["mean_loglik"])
    except (IndexError, KeyError, ValueError):
        print(f"  pfl failed: {(done.stderr or done.stdout)[-300:]}", file=sys.stderr)
        return None


def run_case(battery: str, name: str, kind: str, covariance: str, seed: int, pfl: tuple[str, str] | None) -> dict:
    from sklearn.mixture import GaussianMixture
    from sklearn.preprocessing import StandardScaler

    from fedcluster import FederatedGaussianMixture

    X, y = load(battery, name)
    X = StandardScaler().fit_transform(X)
    k = n_clusters(y)
    parts = [X[index] for index in split(y, kind, seed)]
    started = time.perf_counter()
    model = FederatedGaussianMixture(k, covariance_type=covariance, random_state=seed).fit(parts)
    seconds = time.perf_counter() - started
    central = GaussianMixture(k, covariance_type=covariance, n_init=5, random_state=seed).fit(X)
    record = {
        "dataset": name,
        "split": kind,
        "covariance": covariance,
        "k": k,
        "n": int(X.shape[0]),
        "d": int(X.shape[1]),
        "federated": float(model.score(X)),
        "central": float(central.score(X)),
        "rounds": int(model.n_iter_),
        "converged": bool(model.converged_),
        "seconds": seconds,
    }
    record["gap"] = record["central"] - record["federated"]
    if pfl and covariance == "diag":
        record["pfl"] = pfl_score(*pfl, parts, X, k)
    return record


def summary(records: list[dict]) -> dict:
    gaps = [r["gap"] for r in records]
    return {
        "cases": len(records),
        "within_0.05": sum(g <= WITHIN for g in gaps) / max(len(gaps), 1),
        "within_0.5": sum(g <= 0.5 for g in gaps) / max(len(gaps), 1),
        "worst_gap": max(gaps) if gaps else None,
    }


def markdown(records: list[dict], totals: dict, command: str) -> str:
    pfl = any("pfl" in r for r in records)
    lines = [
        "# Federated GMM against central scikit-learn (real data)",
        "",
        f"Written by `{command}`. Standardized data, {len(SPLITS)} splits (IID, Dirichlet α = 0.3 over the reference "
        "labels), 10 clients; `FederatedGaussianMixture(k)` with its defaults beside "
        "`GaussianMixture(k, n_init=5)` on the pooled points; mean log-likelihood per point (nats), higher is better; "
        "gap = central − federated.",
        "",
        f"**{totals['cases']} cases: {100 * totals['within_0.05']:.0f} % within 0.05 nats, "
        f"{100 * totals['within_0.5']:.0f} % within 0.5, worst gap {totals['worst_gap']:.4f}.**",
        "",
        "| dataset | n | d | k | split | covariance | federated | central | gap | EM rounds |"
        + (" pfl-research |" if pfl else ""),
        "|---|---|---|---|---|---|---|---|---|---|" + ("---|" if pfl else ""),
    ]
    for r in records:
        row = (
            f"| {r['dataset']} | {r['n']} | {r['d']} | {r['k']} | {r['split']} | {r['covariance']} | "
            f"{r['federated']:.4f} | {r['central']:.4f} | {r['gap']:.4f} | "
            f"{r['rounds']}{'' if r['converged'] else '*'} |"
        )
        if pfl:
            row += f" {r['pfl']:.4f} |" if r.get("pfl") is not None else " – |"
        lines.append(row)
    lines += ["", "\\* did not converge within the default em-rounds."]
    if not pfl:
        lines += ["", "pfl-research's column: not run (give `--pfl-python` and `--pfl-runner`)."]
    else:
        lines += [
            "",
            "pfl-research: its federated GMM (diag only), run from its public repository outside the project.",
        ]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--battery", required=True, type=Path, help="the real-data battery folder")
    parser.add_argument("--datasets", default="", help="comma-separated patterns (default: every dataset)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--pfl-python", default=None, help="python of pfl-research's environment")
    parser.add_argument("--pfl-runner", default=None, help="its GMM runner script")
    add_bench_flags(parser, quick=f"{', '.join(QUICK)} only", out="folder for gmm.md and gmm.json")
    args = parser.parse_args()
    if not args.battery.is_dir():
        parser.error(f"--battery {args.battery}: no such folder")
    if bool(args.pfl_python) != bool(args.pfl_runner):
        parser.error("--pfl-python and --pfl-runner go together")
    from real_data import BATTERIES

    patterns = list(QUICK) if args.quick else [p for p in args.datasets.split(",") if p]
    names = dataset_names(args.battery, BATTERIES, patterns)
    if not names:
        parser.error(f"no dataset under {args.battery} matches {args.datasets!r}")
    pfl = (args.pfl_python, args.pfl_runner) if args.pfl_python else None
    records = []
    for name in names:
        for kind in SPLITS:
            for covariance in COVARIANCES:
                record = run_case(str(args.battery), name, kind, covariance, args.seed, pfl)
                records.append(record)
                print(json.dumps(record), flush=True)
    totals = summary(records)
    print(json.dumps(totals))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        command = "python bench/gmm.py --battery DIR" + (f" --datasets '{args.datasets}'" if args.datasets else "")
        with page_output(args.out, __file__):
            print(markdown(records, totals, command), end="")
        (args.out / "gmm.json").write_text(json.dumps({"summary": totals, "cases": records}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
