"""DA-UFL (Servetnyk et al. 2020) Sec. IV: UFLBin, UFLSOM, UFLUni and central k-means
against SNR (their Fig. 5) and outer iterations to converge (their Fig. 4); then DA-UFL
against FedKMeans on the same overlapping data.

Setup (``fedcluster.data.daufl_paper``): 16 classes × 50 points, std 1 (the paper does not
give it), means on {−7.5, −2.5, 2.5, 7.5}²; J = 5 agents uniform in [−10, 10]²; agent j
sees a point at distance d with probability 1 − exp(−0.025·SNR/d). k = 16, ξ_max = 0.05,
η = 1, the run-config defaults otherwise (the SOM grid and epochs, 10 bins per dimension).

Part 1 drives the DA-UFL kernels and server functions of ``fedcluster.algorithms.da_ufl.model`` directly
(the strategy's exact math without the transport) so that all four methods start from the
SAME initialization, as in the paper: k-means++ (single draw) on the agents' SOM codebooks
weighted by total counts. Central k-means = the same perturbed outer loop on the DISTINCT
observed points in one place (the cloud). Metrics on the distinct observed points: k-means
cost per point (objective (1) up to the factor ½) and its ratio to central, VI (nats),
Rand index and ARI against the true classes; mean ± std over the seeds.

Part 2 runs the real system in-process (``fedcluster.inprocess.run``: ServerApp + ClientApp) with
run-config defaults for ``algorithm=da-ufl`` (each weighting) and ``algorithm=fedkmeans``
on the same agents' files, and evaluates the final centers on the distinct points.

Usage::

    python bench/da_ufl_repro.py               # 10 seeds, SNR 5..30 dB
    python bench/da_ufl_repro.py --quick       # 3 seeds, 3 SNRs (Part 2: 2 SNRs)
    python bench/da_ufl_repro.py --quick --out DIR   # also writes DIR/da_ufl_repro.md
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

from _common import (
    add_bench_flags,
    figure_path,
    markdown_table,
    mean_std,
    page_output,
    print_header,
    quiet_flower,
    run_inprocess,
    svg_line_chart,
)

from fedcluster.algorithms.da_ufl import model as da_ufl
from fedcluster.config import DEFAULTS
from fedcluster.data import daufl_paper
from fedcluster.kernel import DeviceData
from fedcluster.device import run_task
from fedcluster.lloyd import kmeans_cost, nearest
from fedcluster.metrics import adjusted_rand, rand_index, variation_of_information

K = 16
XI = 0.05
MAX_OUTER = 100


def da_loop(agents, point_weights, init, seed, xi=XI, eta=1.0, max_inner=50, eps=1e-6):
    """Algorithm 1's outer and inner loops on arrays: (centers, outer iterations)."""
    rng = np.random.default_rng([seed, 99])
    centers, previous = init.copy(), None
    for t1 in range(1, MAX_OUTER + 1):
        labels = [
            da_ufl.perturbed_labels(X, centers, t1, xi, np.random.default_rng(rng.integers(2**31))) for X in agents
        ]
        changed = None if previous is None else sum(int((a != b).sum()) for a, b in zip(labels, previous))
        anchor, z = centers, np.zeros_like(centers)
        for _ in range(max_inner):
            g, W = np.zeros_like(centers), np.zeros(K)
            for X, lab, w in zip(agents, labels, point_weights):
                gj, wj = da_ufl.weighted_gradient(X, lab, w, centers)
                g, W = g + gj, W + wj
            z = z + g
            new = da_ufl.dual_averaging_update(anchor, z, W, eta)
            move = da_ufl.max_move(new, centers)
            centers = new
            if move <= eps or changed == 0:
                break
        if changed == 0:
            return centers, t1
        previous = labels
    return centers, MAX_OUTER


def scores(Xu, yu, centers, central_cost=None):
    labels = nearest(Xu, centers)
    cost = kmeans_cost(Xu, centers) / len(Xu)
    return {
        "cost": cost,
        "ratio": cost / central_cost if central_cost else 1.0,
        "vi": variation_of_information(yu, labels),
        "rand": rand_index(yu, labels),
        "ari": adjusted_rand(yu, labels),
    }


def one(snr, seed):
    X, y, observed, _ = daufl_paper(5, 50, snr, seed)
    observed = observed[observed.sum(1) > 0]
    agents = [X[row] for row in observed]
    union = observed.any(0)
    Xu, yu = X[union], y[union]
    # phase 1: SOM codebooks; phase 2: counts against the codebook P and against the grid
    som = {"grid": DEFAULTS["som-grid"] or da_ufl.som_grid(K), "epochs": DEFAULTS["som-epochs"]}
    codebooks = [
        run_task("som_codebook", DeviceData(points=A), {}, {**som, "seed": seed * 100 + j})[0]["codebook"]
        for j, A in enumerate(agents)
    ]
    P = np.concatenate(codebooks)
    som_counts = np.stack([np.bincount(nearest(A, P), minlength=len(P)) for A in agents]).astype(float)
    low, high = np.min([A.min(0) for A in agents], 0), np.max([A.max(0) for A in agents], 0)
    grid_counts = np.stack([np.bincount(da_ufl.grid_index(A, low, high, 10), minlength=100) for A in agents]).astype(
        float
    )
    w_som, w_bin = da_ufl.bin_weights(som_counts), da_ufl.bin_weights(grid_counts)
    init = da_ufl.weighted_init(P, som_counts, K, np.random.default_rng(seed), restarts=0)
    weights = {
        "UFLBin": [w_bin[j][da_ufl.grid_index(A, low, high, 10)] for j, A in enumerate(agents)],
        "UFLSOM": [w_som[j][nearest(A, P)] for j, A in enumerate(agents)],
        "UFLUni": [np.full(len(A), 1 / len(agents)) for A in agents],
    }
    central, central_outer = da_loop([Xu], [np.ones(len(Xu))], init, seed)
    central_cost = kmeans_cost(Xu, central) / len(Xu)
    out = {"central k-means": {**scores(Xu, yu, central, central_cost), "outer": central_outer}}
    for name, w in weights.items():
        centers, outer = da_loop(agents, w, init, seed)
        out[name] = {**scores(Xu, yu, centers, central_cost), "outer": outer}
    overlap = observed.sum(0)[union].mean()
    return out, {"seen": int(union.sum()), "copies": float(overlap), "held": int(observed.sum())}


def system(snr, seed):
    """Part 2: the real ServerApp + ClientApp on the same agents' files."""
    X, y, observed, _ = daufl_paper(5, 50, snr, seed)
    observed = observed[observed.sum(1) > 0]
    union = observed.any(0)
    Xu, yu = X[union], y[union]
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for j, row in enumerate(observed):
            np.save(Path(tmp) / f"agent_{j}.npy", X[row])
        base = {"k": K, "dataset": "npy-dir", "data-dir": tmp, "seed": seed, "reference": False}
        for name, config in (
            ("da-ufl som", {"algorithm": "da-ufl", "weighting": "som"}),
            ("da-ufl bin", {"algorithm": "da-ufl", "weighting": "bin"}),
            ("da-ufl uniform", {"algorithm": "da-ufl", "weighting": "uniform"}),
            ("fedkmeans", {"algorithm": "fedkmeans"}),
        ):
            result = run_inprocess({**base, **config}, len(observed))
            centers = np.asarray(result["centers"])
            rows[name] = {
                **scores(Xu, yu, centers),
                "rounds": len(result["rounds"]),
                "bytes": result["communication"]["bytes_up"] + result["communication"]["bytes_down"],
            }
    from fedcluster.metrics import central_kmeans

    _, total = central_kmeans(Xu, K, seed, n_init=10)
    for row in rows.values():
        row["ratio"] = row["cost"] / (total / len(Xu))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_bench_flags(parser, quick="3 seeds, SNR 10/20/30 dB (Part 2: 10/20 dB)")
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument(
        "--figures",
        type=Path,
        default=Path("bench/results/da-ufl"),
        help="folder for objective-vs-snr.svg and outer-iterations.svg without --out (with it: beside the page)",
    )
    args = parser.parse_args()
    seeds = range(3 if args.quick else args.seeds)
    snrs = (10.0, 20.0, 30.0) if args.quick else (5.0, 10.0, 15.0, 20.0, 25.0, 30.0)
    with page_output(args.out, __file__):
        print_header("DA-UFL reproduction (Servetnyk et al. 2020, Sec. IV)", __doc__)
        quiet_flower()
        methods = ("UFLBin", "UFLSOM", "UFLUni", "central k-means")
        rows, conv = [], []
        curves = {m: {"ratio": [], "outer": []} for m in methods}
        for snr in snrs:
            results = [one(snr, s) for s in seeds]
            data = results[0][1]
            seen = np.mean([r[1]["seen"] for r in results])
            copies = np.mean([r[1]["copies"] for r in results])
            for m in methods:
                values = [r[0][m] for r in results]
                rows.append(
                    [
                        f"{snr:g}",
                        m,
                        mean_std([v["cost"] for v in values]),
                        mean_std([v["ratio"] for v in values]),
                        mean_std([v["vi"] for v in values]),
                        mean_std([v["rand"] for v in values]),
                        mean_std([v["ari"] for v in values]),
                        mean_std([v["outer"] for v in values], 1),
                    ]
                )
                for key in ("ratio", "outer"):
                    column = [v[key] for v in values]
                    curves[m][key].append((np.mean(column), np.std(column, ddof=1) if len(column) > 1 else 0.0))
            conv.append([f"{snr:g}", f"{seen:.0f}", f"{copies:.2f}"])
            del data
        print(f"\n### Part 1: Fig. 5 / Fig. 4 ({len(seeds)} seeds, mean ± std; same init for all methods)\n")
        print(
            markdown_table(
                ["SNR dB", "method", "cost / point", "cost / central", "VI", "Rand", "ARI", "outer iterations"], rows
            )
        )
        print("\nData: distinct points seen by some agent (of 800) and copies per seen point:\n")
        print(markdown_table(["SNR dB", "seen", "copies / point"], conv))
        for key, name, label in (
            ("ratio", "objective-vs-snr.svg", "cost / central k-means"),
            ("outer", "outer-iterations.svg", "outer iterations to converge"),
        ):
            path, link = figure_path(args.out, args.figures, __file__, name)
            print(f"\n![DA-UFL: {label} against SNR]({link})")
            svg_line_chart(
                path,
                f"DA-UFL, paper Sec. IV: {label}",
                "SNR (dB)",
                f"{label} (mean ± std, {len(seeds)} seeds)",
                {m: (list(snrs), [c[0] for c in curves[m][key]], [c[1] for c in curves[m][key]]) for m in methods},
            )
        rows, system_ratio = [], {}
        for snr in (10.0, 20.0) if args.quick else (10.0, 20.0, 30.0):
            results = [system(snr, s) for s in seeds]
            for name in results[0]:
                values = [r[name] for r in results]
                system_ratio[snr, name] = float(np.mean([v["ratio"] for v in values]))
                rows.append(
                    [
                        f"{snr:g}",
                        name,
                        mean_std([v["ratio"] for v in values]),
                        mean_std([v["ari"] for v in values]),
                        mean_std([v["rounds"] for v in values], 1),
                        f"{np.mean([v['bytes'] for v in values]) / 1000:.0f}",
                    ]
                )
        print(
            f"\n### Part 2: the system, run-config defaults ({len(seeds)} seeds): DA-UFL vs FedKMeans on the same "
            "agents\n"
        )
        print(
            "cost / central = cost per distinct point over scikit-learn KMeans (n_init = 10) on the distinct points.\n"
        )
        print(markdown_table(["SNR dB", "run", "cost / central", "ARI", "rounds", "kB sent"], rows))
        print(claims(list(snrs), curves, system_ratio))


def claims(snrs: list[float], curves: dict, system_ratio: dict) -> str:
    """The paper's claims, judged on this run's means (Part 1 unless said)."""
    ratio = {m: [c[0] for c in curves[m]["ratio"]] for m in curves}
    outer = {m: [c[0] for c in curves[m]["outer"]] for m in curves}
    at = lambda flags: ", ".join(f"{s:g}" for s, f in zip(snrs, flags) if f) or "none"  # noqa: E731
    beat = [min(b, o) < u for b, o, u in zip(ratio["UFLBin"], ratio["UFLSOM"], ratio["UFLUni"])]
    lines = [
        "\n### The paper's claims, judged by this run (means over the seeds)\n",
        f"- Bin or SOM weights beat uniform weights (lower cost / central): at {sum(beat)} of {len(snrs)} SNRs "
        f"(dB: {at(beat)}).",
        *[
            f"- {m} within 2 % of central k-means: at {sum(r <= 1.02 for r in ratio[m])} of {len(snrs)} SNRs "
            f"(worst {max(ratio[m]):.4f})."
            for m in ("UFLBin", "UFLSOM", "UFLUni")
        ],
    ]
    gaps = [abs(o - c) / c for m in ("UFLBin", "UFLSOM", "UFLUni") for o, c in zip(outer[m], outer["central k-means"])]
    lines.append(
        f"- As many outer iterations as central k-means: the largest gap is {max(gaps):.0%} of central's "
        f"(outer iterations {min(min(v) for v in outer.values()):.1f}–{max(max(v) for v in outer.values()):.1f})."
    )
    for snr in sorted({s for s, _ in system_ratio}):
        best = min((v, n) for (s, n), v in system_ratio.items() if s == snr and n != "fedkmeans")
        lines.append(
            f"- Part 2 at {snr:g} dB: best DA-UFL weighting {best[1]} {best[0]:.4f} against FedKMeans "
            f"{system_ratio[snr, 'fedkmeans']:.4f} (cost / central)."
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
