"""Internet scale on paper: FedKMeans for 10⁵–10⁶ devices, extrapolated from measurements.

Measured in this run (in-process runner, FedKMeans, IID Gaussian mixture, d = 8, k = 8,
100 points per device, the ``deployment`` preset: no measurement phase beyond the
algorithm's own):

1. **A device, per round it is sampled in**: bytes down and up (``result.json``
   ``rounds[].bytes_*`` over the devices sent to) and the CPU seconds of its training task
   (``fedkmeans_train`` through :func:`fedcluster.device.run_task`, request parsing and
   the device's own reply check included) on one core of this machine at 100, 1 000 and
   10 000 points: what a phone's battery pays, in this machine's seconds.
2. **The server**: three runs, (N, S) = (N₁, S₁), (N₂, S₁) and (N₁, S₂) devices and
   devices sampled per round (defaults 10 000 / 30 000 devices, 500 / 1 000 sampled):
   seconds per round on the server alone (each round trip's seconds less the seconds the
   grid spent inside the devices' ClientApps; median of rounds 2+, round 1 also gathers
   every device's statistics once), fitted as ``a + b·N + c·S`` (b from the medians, and
   the largest b the rounds' spread allows, which the extrapolation uses); the start-up's server
   seconds per device (the data summary and the initialization contact every device);
   the bytes the server's memory of the devices' statistics takes per device
   (``fedcluster.algorithms.fedkmeans.model.Memory``'s arrays, per row; the rows
   grow by doubling, so up to twice that is allocated). These runs train one center set
   (``n-init = 1``); the default trains up to 16 side by side until a set can no longer
   win, at most half of the rounds: memory and server step up to 16 × these then.
3. **Extrapolated** to 10⁵ and 10⁶ devices with 1 000 and 10 000 sampled per round: the
   server's seconds per round (the fit), its start-up seconds and memory (per device ×
   N), what a SuperLink holds per round (S messages each way of the measured sizes) and
   during the start-up survey (N). Each figure names the measurement it comes from. A
   straight-line fit measured up to N₂ says nothing about effects that appear only
   beyond it (swap, a SuperLink's database): read it as a floor.

Usage::

    python bench/internet_scale.py [--populations 10000 30000] [--samples 500 1000] [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import add_bench_flags, markdown_table, page_output, print_header, run_inprocess  # noqa: E402
from speed import DeviceSeconds, start_phase  # noqa: E402

import numpy as np  # noqa: E402

D, K, POINTS = 8, 8, 100


def config(population: int, sampled: int, rounds: int) -> dict:
    return {
        "algorithm": "fedkmeans",
        "dataset": "gaussian-mixture",
        "partition": "iid",
        "num-points": population * POINTS,
        "dim": D,
        "k": K,
        "num-rounds": rounds,
        "n-init": 1,
        "reference": False,
        "preset": "deployment",
        "fraction": sampled / population,
    }


def device_seconds(points: int, repeats: int) -> float:
    """Median seconds of one ``fedkmeans_train`` task on ``points`` points (one core)."""
    from fedcluster.kernel import DeviceData
    from fedcluster.device import run_task

    rng = np.random.default_rng(0)
    data = DeviceData(points=rng.normal(size=(points, D)), source=f"{points} points")
    request = {"centers": rng.normal(size=(1, K, D))}
    config = {"local-epochs": 1, "batch-size": 0, "client-lr": 1.0, "seed": 1}
    run_task("fedkmeans_train", data, request, config)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        run_task("fedkmeans_train", data, request, config)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def server_run(population: int, sampled: int, rounds: int) -> dict:
    """One run; the server's seconds per round (rounds 2+), start-up seconds, bytes."""
    with DeviceSeconds() as devices:
        result = run_inprocess(config(population, sampled, rounds), population)
    trips = {}
    for phase in result["phases"]:
        if phase["round"] is not None and phase["round"] > 1:
            trips.setdefault(phase["round"], set()).add(phase["round_trip"])
    per_round = []
    for record in result["rounds"]:
        if record["round"] > 1:
            inside = sum(devices.per_trip.get(trip, 0.0) for trip in trips.get(record["round"], ()))
            per_round.append(record["seconds"] - inside)
    later = [r for r in result["rounds"] if r["round"] > 1]
    start_phases = [p for p in result["phases"] if start_phase(p)]
    return {
        "population": population,
        "sampled": sampled,
        "server_rounds": per_round,
        "server_round": statistics.median(per_round),
        "round": statistics.median(r["seconds"] for r in later),
        "sent": sorted({r["sent"] for r in later}),
        "down": statistics.median(r["bytes_down"] / r["sent"] for r in later),
        "up": statistics.median(r["bytes_up"] / max(r["replies"], 1) for r in later),
        "start_server": devices.server_seconds(result["phases"], start_phase),
        "start_down": sum(p["bytes_down"] for p in start_phases) / population,
        "start_up": sum(p["bytes_up"] for p in start_phases) / population,
        "memory_bytes": memory_bytes_per_device(),
    }


def memory_bytes_per_device() -> float:
    """The bytes one device's row takes in the server's memory of one center set
    (:class:`fedcluster.algorithms.fedkmeans.model.Memory`'s arrays, per row)."""
    from fedcluster.algorithms.fedkmeans.model import Memory

    memory = Memory(K, D)
    memory.reserve(range(16))
    return sum(getattr(memory, name).nbytes for name in memory._ARRAYS) / memory.present.size


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_bench_flags(parser, quick="populations 2000 / 6000, samples 100 / 200, 4 rounds")
    parser.add_argument("--populations", type=int, nargs=2, help="N1 < N2 (default 10000 30000)")
    parser.add_argument("--samples", type=int, nargs=2, help="S1 < S2 devices sampled per round (default 500 1000)")
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args(argv)
    n1, n2 = args.populations or ((2000, 6000) if args.quick else (10_000, 30_000))
    s1, s2 = args.samples or ((100, 200) if args.quick else (500, 1000))
    rounds = 4 if args.quick else args.rounds
    if not (n1 < n2 and s1 < s2 <= n1):
        parser.error("need N1 < N2 and S1 < S2 <= N1")

    with page_output(args.out, __file__):
        print_header("Internet scale on paper: FedKMeans for 10⁶ devices", __doc__)
        print("## 1. A device, per round it is sampled in\n", flush=True)
        compute = {points: device_seconds(points, 30 if points >= 10_000 else 200) for points in (100, 1_000, 10_000)}
        runs = [server_run(n, s, rounds) for n, s in ((n1, s1), (n2, s1), (n1, s2))]
        first = runs[0]
        print(
            markdown_table(
                [
                    "bytes down / round",
                    "bytes up / round",
                    "CPU s, 100 points",
                    "CPU s, 1 000 points",
                    "CPU s, 10 000 points",
                    "start-up bytes down / up (once)",
                ],
                [
                    [
                        f"{first['down']:.0f}",
                        f"{first['up']:.0f}",
                        f"{compute[100]:.2e}",
                        f"{compute[1000]:.2e}",
                        f"{compute[10000]:.2e}",
                        f"{first['start_down']:.0f} / {first['start_up']:.0f}",
                    ]
                ],
            )
        )
        print(
            "\nA device not sampled in a round receives nothing and computes nothing (devices contacted per "
            f"round, rounds 2+: {', '.join(str(r['sent']) for r in runs)}).\n"
        )

        print("## 2. The server, measured\n")
        print(
            markdown_table(
                [
                    "devices N",
                    "sampled S",
                    "s / round (median, rounds 2+)",
                    "server s / round",
                    "start-up server s",
                    "start-up server s / 1000 devices",
                    "memory bytes / device",
                ],
                [
                    [
                        r["population"],
                        r["sampled"],
                        f"{r['round']:.3f}",
                        f"{r['server_round']:.3f}",
                        f"{r['start_server']:.1f}",
                        f"{r['start_server'] / r['population'] * 1000:.2f}",
                        f"{r['memory_bytes']:.0f}",
                    ]
                    for r in runs
                ],
            )
        )
        b = max(0.0, (runs[1]["server_round"] - runs[0]["server_round"]) / (n2 - n1))
        # what the rounds' spread still allows: the slowest round at N2 against the fastest at N1
        b_most = max(b, (max(runs[1]["server_rounds"]) - min(runs[0]["server_rounds"])) / (n2 - n1))
        c = (runs[2]["server_round"] - runs[0]["server_round"]) / (s2 - s1)
        a = max(0.0, runs[0]["server_round"] - b * n1 - c * s1)
        start_per_device = statistics.mean(r["start_server"] / r["population"] for r in runs)
        memory = max(r["memory_bytes"] for r in runs)
        print(
            f"\nFit of the server's seconds per round: a + b·N + c·S with a = {a:.3g} s, b = {b:.3g} s per device "
            f"in the population (medians of runs 1–2, at least 0), c = {c:.3g} s per sampled device (runs 1 and 3); "
            f"the rounds' spread allows b up to {b_most:.3g} s (the slowest round of run 2 against the fastest of run "
            "1), "
            "which the extrapolation uses: its seconds are an upper bound of the fit.\n"
        )

        print("## 3. Extrapolated\n")
        rows = []
        for population in (100_000, 1_000_000):
            for sampled in (1_000, 10_000):
                rows.append(
                    [
                        f"{population:,}",
                        f"{sampled:,}",
                        f"{a + b_most * population + c * sampled:.2f}",
                        f"{start_per_device * population:.0f}",
                        f"{memory * population / 2**20:.0f}",
                        f"{sampled * (first['down'] + first['up']) / 2**20:.1f}",
                        f"{population * (first['start_down'] + first['start_up']) / 2**20:.0f}",
                    ]
                )
        print(
            markdown_table(
                [
                    "devices",
                    "sampled / round",
                    "server s / round, at most (fit of §2, b at its bound)",
                    "start-up server s (§2 per device × N)",
                    "server memory of the devices' statistics MiB, one center set (§2 bytes / device × N)",
                    "SuperLink holds per round MiB (S × §1 bytes down + up)",
                    "start-up survey MiB through the SuperLink (N × §1)",
                ],
                rows,
            )
        )
        print(
            "\nThe device's side does not change with N: per round it is sampled in, the bytes and CPU seconds of §1."
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
