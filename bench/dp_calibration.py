"""FedDP-KMeans privacy calibration with Poisson client sampling: seconds per calibration.

``calibrate_to_total`` (fedcluster/privacy/calibration.py) finds the noise of every step
so that the PLD total of a run is its ε at δ. With client sampling (q < 1) every Gaussian
step needs an inner PLD search, and building the PLD of a Poisson-sampled Gaussian is
the cost. Each row is one FedDP-KMeans run's steps (FedDP-Init + FedDP-Lloyds, the
paper's rule-of-thumb split, Lloyd fraction 0.25, sensitivities 1) at δ = 1e-6:

- ours: ``calibrate_to_total`` as it is (a pilot search on a 10x coarser PLD grid, then
  the search on the accounting grid from its answer, PLDs kept and composed again),
  best of ``--repeat`` runs;
- baseline: the previous algorithm, still reachable as
  ``without_pilot`` below (one search on the accounting grid, every
  PLD built anew), timed once in the same run;
- ε: the total as certified by the calibration (PLD accountant on the search grid
  ``SEARCH_DISCRETIZATION``; it must lie in [ε·(1 − 1e-3), ε]) for both, and, unless
  ``--quick``, ours re-accounted as the run's ledger reports it (grid 1e-4).

The cache of ``calibrate_to_total`` is bypassed: every timing is a fresh calibration.

Usage::

    python bench/dp_calibration.py            # 36 rows, ≈ 8 min on 2 busy cores (the baseline)
    python bench/dp_calibration.py --quick    # 4 rows (client, q 0.01/0.1, ε 1/4, 2 rounds)
    python bench/dp_calibration.py --quick --out DIR   # also writes DIR/dp_calibration.md
"""

from __future__ import annotations

import argparse
import os
import time

from _common import add_bench_flags, markdown_table, page_output, print_header

from fedcluster.algorithms.feddp_kmeans import model as feddp_kmeans
from fedcluster.privacy import PrivacyLedger, calibration
from fedcluster.privacy.ledger import SEARCH_DISCRETIZATION

DELTA = 1e-6
LLOYD_FRACTION = 0.25


def specs_for(level: str, sampling_rate: float, lloyd_rounds: int) -> tuple:
    """The steps of one FedDP-KMeans run (FedDP-Init, then ``lloyd_rounds`` Lloyd rounds)."""
    weights = feddp_kmeans.step_weights("feddp", lloyd_rounds, feddp_kmeans.RULE_OF_THUMB[level], LLOYD_FRACTION)
    return tuple(feddp_kmeans.step_specs(weights, {name: 1.0 for name in weights}, lloyd_rounds, sampling_rate))


def without_pilot(epsilon: float, specs: tuple, tolerance: float) -> calibration.Calibration:
    """The search before the pilot (the baseline): one search on the accounting grid, every
    step warm-started through ``calibrate_step``'s guesses."""
    guesses: dict = {}
    return calibration._search_scale(
        epsilon,
        DELTA,
        specs,
        (epsilon * (1.0 - tolerance), epsilon),
        calibration.SEARCH_DISCRETIZATION,
        lambda spec, eps: calibration.calibrate_step(spec, eps, DELTA, guesses),
    )[0]


def timed(specs: tuple, epsilon: float, pilot: bool, repeat: int) -> tuple[float, calibration.Calibration]:
    """Best-of-``repeat`` seconds of a fresh calibration, and the calibration."""
    best, result = float("inf"), None
    for _ in range(repeat):
        start = time.perf_counter()
        result = (
            calibration._calibrate_to_total(epsilon, DELTA, specs, 1e-3)
            if pilot
            else without_pilot(epsilon, specs, 1e-3)
        )
        best = min(best, time.perf_counter() - start)
    return best, result


def reported(result: calibration.Calibration) -> float:
    """The total as the run's ledger reports it (PLD, ``REPORT_DISCRETIZATION``)."""
    ledger = PrivacyLedger("data-point")
    for step in result.steps:
        ledger.record(step.name, step.mechanism_instance(), step.compositions, step.sampling_rate)
    return ledger.epsilon(DELTA)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_bench_flags(parser, quick="client level, q 0.01/0.1, ε 1/4, 2 Lloyd rounds")
    parser.add_argument("--repeat", type=int, default=3, help="best of this many runs of ours (default 3)")
    parser.add_argument("--no-baseline", action="store_true", help="time ours only")
    args = parser.parse_args()

    with page_output(args.out, __file__):
        print_header("FedDP-KMeans DP calibration with Poisson client sampling (seconds per calibration)", __doc__)
        levels = ("client",) if args.quick else tuple(feddp_kmeans.RULE_OF_THUMB)
        rates = (0.01, 0.1) if args.quick else (0.01, 0.1, 0.5)
        epsilons = (1.0, 4.0) if args.quick else (1.0, 4.0, 16.0)
        rounds = (2,) if args.quick else (2, 10)
        rows, ours_total, base_total, ratios = [], 0.0, 0.0, []
        for level in levels:
            for q in rates:
                for lloyd_rounds in rounds:
                    specs = specs_for(level, q, lloyd_rounds)
                    for epsilon in epsilons:
                        seconds, result = timed(specs, epsilon, True, args.repeat)
                        ours_total += seconds
                        row = [level, q, lloyd_rounds, f"{epsilon:g}", f"{seconds:.2f}"]
                        if args.no_baseline:
                            row += ["", ""]
                        else:
                            base_seconds, base = timed(specs, epsilon, False, 1)
                            base_total += base_seconds
                            ratios.append(base_seconds / seconds)
                            row += [f"{base_seconds:.2f}", f"{base_seconds / seconds:.1f}x"]
                        in_band = epsilon * (1 - 1e-3) <= result.total_epsilon <= epsilon
                        row += [f"{result.total_epsilon:.5f}" + ("" if in_band else " (out of band!)")]
                        row += ["" if args.no_baseline else f"{base.total_epsilon:.5f}"]
                        row += ["" if args.quick else f"{reported(result):.5f}"]
                        rows.append(row)
                        print(" | ".join(str(c) for c in row), flush=True)
        print()
        print(
            markdown_table(
                [
                    "level",
                    "q",
                    "Lloyd rounds",
                    "ε",
                    "ours s",
                    "baseline s",
                    "baseline / ours",
                    f"ε ours (grid {SEARCH_DISCRETIZATION:g})",
                    f"ε baseline (grid {SEARCH_DISCRETIZATION:g})",
                    "ε ours (ledger, 1e-4)",
                ],
                rows,
            )
        )
        print(f"\nours: {ours_total:.1f} s in total, max {max(float(r[4]) for r in rows):.2f} s per calibration")
        if ratios:
            print(
                f"baseline: {base_total:.1f} s in total; speed-up median {sorted(ratios)[len(ratios) // 2]:.1f}x, "
                f"min {min(ratios):.1f}x"
            )
        print(f"load avg at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
