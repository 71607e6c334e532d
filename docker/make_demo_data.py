"""Write the docker demo cluster's data: one .npy file of points per SuperNode, non-IID.

Four unit-variance Gaussian clusters in the plane, centred on the corners of a square of
side 10; each of the three devices sees a different, unevenly weighted subset of them
(label skew), so no single device could find the four clusters alone:

    node-1/client.npy   cluster A: 300 points, cluster B: 100 points
    node-2/client.npy   cluster B: 200 points, cluster C: 250 points
    node-3/client.npy   cluster C:  50 points, cluster D: 300 points, cluster A: 50 points

1250 points in all; the demo runs k=4. SuperNode i mounts only ``node-i/`` (at /data) and
reads /data/client.npy. ``demo_data.json`` records what was written. Needs only NumPy:

    python3 docker/make_demo_data.py [--out docker/data] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

MEANS = {"A": (0.0, 0.0), "B": (10.0, 0.0), "C": (10.0, 10.0), "D": (0.0, 10.0)}
CLIENTS = [
    {"A": 300, "B": 100},
    {"B": 200, "C": 250},
    {"C": 50, "D": 300, "A": 50},
]


def make(out: Path, seed: int = 0) -> dict:
    """Write node-<i>/client.npy (float64, rows = points) and demo_data.json into ``out``."""
    rng = np.random.default_rng(seed)
    out.mkdir(parents=True, exist_ok=True)
    manifest = {"seed": seed, "dim": 2, "means": MEANS, "clients": []}
    for index, composition in enumerate(CLIENTS):
        points = np.concatenate([np.asarray(MEANS[name]) + rng.normal(size=(count, 2)) for name, count in composition.items()])
        points = points[rng.permutation(points.shape[0])]
        path = out / f"node-{index + 1}" / "client.npy"
        path.parent.mkdir(exist_ok=True)
        np.save(path, points)
        manifest["clients"].append({"file": str(path.relative_to(out)), "num_points": int(points.shape[0]), "clusters": composition})
    manifest["num_points"] = sum(client["num_points"] for client in manifest["clients"])
    (out / "demo_data.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "data", help="folder to write (default: docker/data)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    manifest = make(args.out, args.seed)
    for client in manifest["clients"]:
        print(f"{args.out / client['file']}: {client['num_points']} points, clusters {client['clusters']}")
    print(f"{manifest['num_points']} points in {len(manifest['clients'])} files")


if __name__ == "__main__":
    main()
