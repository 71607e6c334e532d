"""What secure aggregation costs: FedDP-KMeans without server data, plain vs
``secure-aggregation = true``, in the same run.

Both runs are in-process (the same ClientApp and Flower messages as a deployment) on the
same data and seeds: a Gaussian mixture split over the devices (200 points each), the
default start without server data (the histogram) and 3 relative Lloyd rounds at ε = 1.
Reported per Lloyd round (the session of keys is set up once, in the first secured phase,
and reported on its own line): round trips, the bytes of every message (``.npy`` payloads,
``server_app.messages.payload_bytes``), and the round's seconds. In-process, the devices
run one after the other on this machine, so a round's seconds are the server's plus EVERY
device's compute; in a deployment the devices work in parallel and a round costs its round
trips (seconds each, docs/results/deployment_seconds.md) plus one device's compute, listed
as "device s / round". The secure run is the default: the devices add their shares of the
noise (``secagg-noise = devices``), so its centers are not the plain run's; that they are,
with the server's noise, is tested (tests/protocol/test_secagg.py).

Usage::

    python bench/secure_aggregation.py                 # 10 and 100 devices
    python bench/secure_aggregation.py --quick --out DIR   # 10 and 30 devices
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

from _common import add_bench_flags, markdown_table, page_output, print_header, run_inprocess
from speed import DeviceSeconds

PAYLOADS = {"d = 10, k = 5": (10, 5), "d = 100, k = 10": (100, 10)}
POINTS_PER_DEVICE = 200
ROUNDS = 3


def config(devices: int, d: int, k: int, secure: bool, out: Path) -> dict:
    return {"algorithm": "feddp-kmeans", "dataset": "gaussian-mixture", "dim": d, "dimension": d, "k": k,
            "components": k, "num-points": POINTS_PER_DEVICE * devices, "seed": 1, "noise-seed": 2, "epsilon": 1.0,
            "lloyd-rounds": ROUNDS, "clip-norm": 4.0 * np.sqrt(d), "reference": False, "evaluate-cost": False,
            "secure-aggregation": secure, "output-dir": str(out)}


def measure(devices: int, d: int, k: int, secure: bool, tmp: Path) -> dict:
    out = tmp / f"{devices}-{d}-{secure}"
    with DeviceSeconds() as clock:
        result = run_inprocess(config(devices, d, k, secure, out), num_nodes=devices)
    rounds = result["rounds"]
    round_phases = [p for p in result["phases"] if p["phase"].startswith("lloyd") and not p["phase"].endswith(("setup", "share-keys"))]
    trips = sorted({p["round_trip"] for p in round_phases})
    session = [p for p in result["phases"] if p["phase"].endswith(("setup", "share-keys"))]
    return {
        "trips": len(trips) / len(rounds),
        "bytes": sum(r["bytes_up"] + r["bytes_down"] for r in rounds) / len(rounds),
        "seconds": sum(r["seconds"] for r in rounds) / len(rounds),
        "device": sum(clock.per_trip.get(t, 0.0) for t in trips) / len(rounds) / devices,
        "session_trips": len(session),
        "session_bytes": sum(p["bytes_up"] + p["bytes_down"] for p in session),
        "session_seconds": sum(p["seconds"] for p in session),
    }


def kib(value: float) -> str:
    return f"{value / 1024:.1f}"


def table(quick: bool) -> None:
    print_header("Secure aggregation's cost: FedDP-KMeans without server data, plain vs secure (in-process"
                 + (", --quick: 10 and 30 devices" if quick else "") + ")", __doc__)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for devices in ((10, 30) if quick else (10, 100)):
            for name, (d, k) in PAYLOADS.items():
                plain = measure(devices, d, k, False, Path(tmp))
                secure = measure(devices, d, k, True, Path(tmp))
                rows.append([
                    devices, name, f"{plain['trips']:.0f} / {secure['trips']:.0f}",
                    f"{kib(plain['bytes'])} / {kib(secure['bytes'])} ({secure['bytes'] / plain['bytes']:.2f}×)",
                    f"{plain['seconds']:.3f} / {secure['seconds']:.3f} ({secure['seconds'] / plain['seconds']:.1f}×)",
                    f"{plain['device'] * 1e3:.2f} / {secure['device'] * 1e3:.2f} ms",
                    f"{secure['session_trips']} trips, {kib(secure['session_bytes'])} KiB, {secure['session_seconds']:.1f} s",
                ])
    print(markdown_table(["devices", "payload", "round trips / round", "KiB / round (plain / secure)",
                          "s / round in-process", "device s / round (one device)", "session (once)"], rows))
    print(f"\n{ROUNDS} Lloyd rounds per run, {POINTS_PER_DEVICE} points per device; the session is set up in the "
          "histogram phase, before the rounds.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_bench_flags(parser, quick="10 and 30 devices")
    args = parser.parse_args()
    with page_output(args.out, __file__):
        table(args.quick)


if __name__ == "__main__":
    main()
