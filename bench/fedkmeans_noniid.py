"""FedKMeans on non-IID data: federated cost over the pooled central optimum.

Scenarios (k-means cost per point of the final federated centers on the pooled data,
divided by the cost of scikit-learn ``KMeans(k-means++, n_init=10)`` on the same pooled
points: ``result["reference"]["ratio"]``; target: median over 5 seeds <= 1.02):

* ``gmm``: Gaussian mixture, d = 10, 8 components (unit variance, means about
  ``separation`` = 5 apart, so neighbouring clusters overlap a little), 8000 points,
  20 clients, Dirichlet(α = 0.3) label skew; k = 8.
* ``digits-1``: scikit-learn's handwritten digits (1797 x 64), 20 clients, ONE digit class
  per client (every class on 2 clients); k = 10.
* ``digits-2``: the same, TWO classes per client; k = 10.
* ``digits-1-10c``: 10 clients, one class each (every client holds exactly one class).

Seed s generates the data AND drives the server (initialization, sampling). Rows use the
run-config defaults (that is what outside checks use); ``--tuned`` adds one tuned row per
scenario (see TUNED), ``--random-init`` one with the data-free ``random-box`` initialization.

Columns: median and max of the ratio over the seeds, the median ratio of the initial centers
(best initialization candidate, before any FedKMeans round), how many seeds met the target, the
median first round whose global cost already met the target (from the per-round cost in
result.json, recorded only with ``eval-every`` >= 1; "init" = the initial centers already
did), rounds run, seconds per run.

Usage::

    python bench/fedkmeans_noniid.py            # 5 seeds, defaults
    python bench/fedkmeans_noniid.py --tuned    # plus a tuned row
    python bench/fedkmeans_noniid.py --random-init  # plus data-free init
    python bench/fedkmeans_noniid.py --quick    # 2 seeds, fewer points
    python bench/fedkmeans_noniid.py --quick --out DIR   # also writes DIR/fedkmeans_noniid.md
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import (
    add_bench_flags,
    default_jobs,
    markdown_table,
    page_output,
    parallel_map,
    print_header,
    run_inprocess,
)  # noqa: E402

TARGET = 1.02

# scenario -> (number of clients, run-config overrides)
SCENARIOS: dict[str, tuple[int, dict]] = {
    "gmm d=10 k=8 Dir(0.3)": (
        20,
        {
            "dataset": "gaussian-mixture",
            "dim": 10,
            "components": 8,
            "k": 8,
            "num-points": 8000,
            "separation": 5.0,
            "partition": "dirichlet",
            "dirichlet-alpha": 0.3,
        },
    ),
    "digits 1 class/client": (20, {"dataset": "digits", "classes-per-client": 1, "k": 10}),
    "digits 2 classes/client": (20, {"dataset": "digits", "classes-per-client": 2, "k": 10}),
    "digits 1 class/client, 10 clients": (10, {"dataset": "digits", "classes-per-client": 1, "k": 10}),
}

# One tuned setting, the same for every scenario: more rounds, more initial candidates.
TUNED = {"num-rounds": 50, "init-candidates": 20}
# The data-free initialization (uniform in the federated bounding box), to show how much of
# the result the default initialization contributes.
RANDOM_INIT = {"init": "random-box"}


def job(args: tuple) -> dict:
    scenario, seed, extra = args
    clients, overrides = SCENARIOS[scenario]
    config = {**overrides, **extra, "seed": seed}
    started = time.perf_counter()
    result = run_inprocess(config, clients)
    seconds = time.perf_counter() - started
    reference = result["reference"]
    central = reference["central_cost"]
    init_costs = result.get("init", {}).get("candidate_costs") or []
    first = None
    init_ratio = min(init_costs) / reference["num_points"] / central if init_costs else float("nan")
    if init_costs and min(init_costs) / reference["num_points"] <= TARGET * central:
        first = 0
    elif not any(record.get("cost") is not None for record in result["rounds"]):
        first = "unmeasured"  # eval-every = 0 (the default): the rounds record no cost
    else:
        for record in result["rounds"]:
            cost = record.get("cost")
            if cost is not None and cost <= TARGET * central:
                first = record["round"]
                break
    return {
        "ratio": reference["ratio"],
        "init_ratio": init_ratio,
        "first": first,
        "rounds": len(result["rounds"]),
        "seconds": seconds,
        "wall": result["wall_time_s"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_bench_flags(parser, quick="2 seeds, 3000 Gaussian points")
    parser.add_argument("--seeds", type=int, default=None, help="number of seeds (default 5, quick 2)")
    parser.add_argument("--tuned", action="store_true", help=f"also one tuned row per scenario: {TUNED}")
    parser.add_argument("--random-init", action="store_true", help=f"also a row with the data-free init: {RANDOM_INIT}")
    parser.add_argument("--jobs", type=int, default=default_jobs(), help="worker processes (default: usable CPUs)")
    args = parser.parse_args(argv)
    seeds = list(range(args.seeds or (2 if args.quick else 5)))
    if args.quick:
        SCENARIOS["gmm d=10 k=8 Dir(0.3)"][1]["num-points"] = 3000

    with page_output(args.out, __file__):
        print_header("FedKMeans on non-IID data vs the pooled central optimum", __doc__)
        for name, (clients, overrides) in SCENARIOS.items():
            print(f"- {name}: {clients} clients, {overrides}")
        print(
            f"\nseeds {seeds[0]}..{seeds[-1]}, target median ratio <= {TARGET}, {args.jobs} worker process(es)\n",
            flush=True,
        )

        settings = [("defaults", {})] + ([(f"tuned {TUNED}", TUNED)] if args.tuned else [])
        settings += [(f"{RANDOM_INIT}", RANDOM_INIT)] if args.random_init else []
        started = time.perf_counter()
        work = [(scenario, seed, extra) for scenario in SCENARIOS for _, extra in settings for seed in seeds]
        results = parallel_map(job, work, args.jobs)
        rows = []
        position = 0
        for scenario in SCENARIOS:
            for label, _ in settings:
                runs = results[position : position + len(seeds)]
                position += len(seeds)
                ratios = [r["ratio"] for r in runs]
                median = statistics.median(ratios)
                firsts = [r["first"] for r in runs]
                reached = [f for f in firsts if isinstance(f, int)]
                if len(reached) > len(runs) / 2:
                    first = statistics.median_low([f if isinstance(f, int) else 10**9 for f in firsts])
                    first_text = "init" if first == 0 else str(first)
                elif "unmeasured" in firsts:
                    first_text = "not measured (eval-every = 0)"
                else:
                    first_text = "never (median)"
                rows.append(
                    [
                        scenario,
                        label,
                        f"{median:.4f}",
                        f"{max(ratios):.4f}",
                        f"{statistics.median(r['init_ratio'] for r in runs):.4f}",
                        f"{sum(r <= TARGET for r in ratios)}/{len(ratios)}",
                        "yes" if median <= TARGET else f"NO (+{(median - TARGET) * 100:.1f} pts)",
                        first_text,
                        statistics.median(r["rounds"] for r in runs),
                        f"{statistics.median(r['seconds'] for r in runs):.1f}",
                    ]
                )
        print(
            markdown_table(
                [
                    "scenario",
                    "setting",
                    "median ratio",
                    "max ratio",
                    "initial centers' ratio (median)",
                    f"seeds ≤ {TARGET}",
                    "target met",
                    f"first round ≤ {TARGET} (median)",
                    "rounds run",
                    "s / run",
                ],
                rows,
            )
        )
        print(
            "\nratio = federated cost per point / pooled scikit-learn KMeans(n_init=10) cost per point, "
            f"on the pooled points; {len(seeds)} seeds."
        )
        print(f"total wall time {time.perf_counter() - started:.0f} s")
        return 0


if __name__ == "__main__":
    sys.exit(main())
