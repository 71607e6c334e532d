"""Federated GMM on the real-data suite against central scikit-learn (issue 45).

Every dataset of the battery (``--battery``; the layout bench/real_data.py reads), standardized
as a user would (StandardScaler on the pooled points), split over clients IID and
label-skewed (Dirichlet α = 0.3 over the reference labels, bench/real_data.py's splits),
``FederatedGaussianMixture(k)`` with its defaults and ``covariance_type`` full and diag, k the
number of reference clusters; beside it ``GaussianMixture(k, n_init=5)`` on the pooled points.
Reported per case: the mean log-likelihood per point of both on the pooled points and the gap;
the summary: the share of cases within 0.05 nats and the worst gap. With ``--pfl-python`` and
``--pfl-runner`` (apple/pfl-research's federated GMM, run outside the project; diag only) its
mean log-likelihood on the same clients too (on the ``--pfl-datasets`` only, when given); without
them that column is left out.

    python bench/gmm.py --battery DIR [--datasets 'uci/*,sipu/r15'] [--out docs/results]
        [--pfl-python PY --pfl-runner run_pfl_gmm.py [--pfl-datasets 'uci/*']]
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


def shares(gaps: list[float]) -> dict:
    return {
        "cases": len(gaps),
        "within_0.05": sum(g <= WITHIN for g in gaps) / max(len(gaps), 1),
        "within_0.5": sum(g <= 0.5 for g in gaps) / max(len(gaps), 1),
        "worst_gap": max(gaps) if gaps else None,
    }


def summary(records: list[dict]) -> dict:
    """The shares within 0.05 and 0.5 nats of central and the worst gap; with pfl-research's
    column, the same for it and for fedcluster on the diag cases pfl ran."""
    out = shares([r["gap"] for r in records])
    ran = [r for r in records if r.get("pfl") is not None]
    if ran:
        out["pfl_diag"] = shares([r["central"] - r["pfl"] for r in ran])
        out["fedcluster_diag"] = shares([r["gap"] for r in ran])
    return out


def share_line(name: str, totals: dict) -> str:
    return (
        f"{name}: {totals['cases']} cases, {100 * totals['within_0.05']:.0f} % within 0.05 nats, "
        f"{100 * totals['within_0.5']:.0f} % within 0.5, worst gap {totals['worst_gap']:.4f}"
    )


def case_key(record: dict) -> tuple[str, str, str]:
    return record["dataset"], record["split"], record["covariance"]


def table_row(r: dict, pfl: bool, before: dict | None) -> str:
    row = (
        f"| {r['dataset']} | {r['n']} | {r['d']} | {r['k']} | {r['split']} | {r['covariance']} | "
        f"{r['federated']:.4f} | {r['central']:.4f} | {r['gap']:.4f} | "
        f"{r['rounds']}{'' if r['converged'] else '*'} |"
    )
    if before is not None:
        earlier = before.get(case_key(r))
        row += f" {earlier['gap']:.4f} |" if earlier else " – |"
    if pfl:
        row += f" {r['pfl']:.4f} |" if r.get("pfl") is not None else " – |"
    return row


def markdown(records: list[dict], totals: dict, command: str, earlier: dict | None = None, label: str = "") -> str:
    """The page; ``earlier``: an earlier run's cases by (dataset, split, covariance), its
    gap shown beside this run's and its summary over the same cases; ``label`` says what
    that run was (its gmm.json's ``label``)."""
    pfl = "pfl_diag" in totals
    before = {key: earlier[key] for key in map(case_key, records) if key in earlier} if earlier else None
    lines = [
        "# Federated GMM against central scikit-learn (real data)",
        "",
        f"Written by `{command}`. Standardized data, {len(SPLITS)} splits (IID, Dirichlet α = 0.3 over the reference "
        "labels), 10 clients; `FederatedGaussianMixture(k)` with its defaults beside "
        "`GaussianMixture(k, n_init=5)` on the pooled points; mean log-likelihood per point (nats), higher is better; "
        "gap = central − federated.",
        "",
        f"**{share_line('This run', totals)}.**",
    ]
    if before is not None:
        then = shares([b["gap"] for b in before.values()])
        lines += ["", f"{share_line('The earlier run (' + (label or '--earlier') + ')', then)}."]
    lines += [
        "",
        "| dataset | n | d | k | split | covariance | federated | central | gap | EM rounds |"
        + (" earlier gap |" if before is not None else "")
        + (" pfl-research |" if pfl else ""),
        "|---|---|---|---|---|---|---|---|---|---|" + ("---|" if before is not None else "") + ("---|" if pfl else ""),
    ]
    lines += [table_row(r, pfl, before) for r in records]
    lines += ["", "\\* did not converge within the default em-rounds."]
    if not pfl:
        lines += ["", "pfl-research's column: not run (give `--pfl-python` and `--pfl-runner`)."]
    else:
        lines += [
            "",
            "pfl-research: its federated GMM (`GaussianMixtureModel`: EM from one component grown to k by splitting "
            "the heaviest, components under 1 % weight pruned; the runner's defaults), run from its public repository "
            "outside the project on the same clients; it fits diagonal covariances only, so its column is filled on "
            "the diag rows it ran. On those rows:",
            "",
            f"- {share_line('pfl-research', totals['pfl_diag'])};",
            f"- {share_line('fedcluster', totals['fedcluster_diag'])}.",
        ]
    return "\n".join(lines) + "\n"


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--battery", required=True, type=Path, help="the real-data battery folder")
    parser.add_argument("--datasets", default="", help="comma-separated patterns (default: every dataset)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--pfl-python", default=None, help="python of pfl-research's environment")
    parser.add_argument("--pfl-runner", default=None, help="its GMM runner script")
    parser.add_argument("--pfl-datasets", default="", help="comma-separated patterns pfl runs on (default: all)")
    parser.add_argument("--earlier", type=Path, default=None, help="an earlier run's gmm.json: its gaps beside")
    parser.add_argument("--render", type=Path, default=None, help="write the page from this run's gmm.json, no run")
    add_bench_flags(parser, quick=f"{', '.join(QUICK)} only", out="folder for gmm.md and gmm.json")
    args = parser.parse_args()
    if not args.battery.is_dir():
        parser.error(f"--battery {args.battery}: no such folder")
    if bool(args.pfl_python) != bool(args.pfl_runner):
        parser.error("--pfl-python and --pfl-runner go together")
    args.saved = {}
    for flag in ("earlier", "render"):
        path = getattr(args, flag)
        try:
            args.saved[flag] = json.loads(path.read_text()) if path else None
            if path:
                args.saved[flag]["cases"][0]["gap"]
        except (OSError, ValueError, KeyError, IndexError, TypeError) as error:
            parser.error(f"--{flag} {path}: not a gmm.json of this bench ({error})")
    return args


def command_line(args: argparse.Namespace) -> str:
    command = "python bench/gmm.py --battery DIR" + (f" --datasets '{args.datasets}'" if args.datasets else "")
    if args.pfl_python:
        command += " --pfl-python PY --pfl-runner RUNNER"
        command += f" --pfl-datasets '{args.pfl_datasets}'" if args.pfl_datasets else ""
    return command + (" --earlier EARLIER.json" if args.earlier else "")


def run_all(args: argparse.Namespace) -> list[dict]:
    from real_data import BATTERIES

    patterns = list(QUICK) if args.quick else [p for p in args.datasets.split(",") if p]
    names = dataset_names(args.battery, BATTERIES, patterns)
    if not names:
        raise SystemExit(f"no dataset under {args.battery} matches {args.datasets!r}")
    pfl = (args.pfl_python, args.pfl_runner) if args.pfl_python else None
    pfl_names = set(dataset_names(args.battery, BATTERIES, [p for p in args.pfl_datasets.split(",") if p]))
    records = []
    for name in names:
        for kind in SPLITS:
            for covariance in COVARIANCES:
                chosen = pfl if name in pfl_names else None
                record = run_case(str(args.battery), name, kind, covariance, args.seed, chosen)
                records.append(record)
                print(json.dumps(record), flush=True)
    return records


def main() -> int:
    args = arguments()
    rendered = args.saved["render"]
    records = rendered["cases"] if rendered else run_all(args)
    command = rendered.get("command", command_line(args)) if rendered else command_line(args)
    totals = summary(records)
    print(json.dumps(totals))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        saved_earlier = args.saved["earlier"] or {}
        earlier = {case_key(r): r for r in saved_earlier["cases"]} if saved_earlier else None
        with page_output(args.out, __file__):
            print(markdown(records, totals, command, earlier, saved_earlier.get("label", "")), end="")
        saved = {"summary": totals, "command": command, "cases": records}
        (args.out / "gmm.json").write_text(json.dumps(saved, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
