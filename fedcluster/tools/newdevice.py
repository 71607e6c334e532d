"""Label a device that did not take part in a k-FED run ("new devices join for free").

The device runs k-FED's local step on its own data and maps each of its local centers to
the nearest stored global center: O(k·k') distances, no other device and no new round
involved (docs/ALGORITHMS.md section 4). NumPy only: it runs on the device.

Command line::

    fedcluster-kfed-assign RESULT_DIR DEVICE_DATA.npy [--out labels.npy] [--k-prime K]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from ..data import DataError, load_points
from ..scaling import Scaling
from ..kfed import auto_local_means, induced_labels, kfed_assign_new_device, local_kprime_means


def _run_algorithm(result_dir: Path) -> str:
    file = result_dir / "result.json"
    try:
        record = json.loads(file.read_text())
    except (OSError, ValueError):
        raise DataError(f"{file} is missing or unreadable: is {result_dir} the folder of a finished k-FED run?") from None
    return str(record.get("algorithm", "unknown")) if isinstance(record, dict) else "unknown"


def label_new_device(
    result_dir: str | Path,
    points: np.ndarray,
    *,
    k_prime: int | None = None,
    seed: int = 0,
) -> np.ndarray:
    """Global cluster id of every point of a new device, from a finished run's folder.

    ``result_dir`` holds ``centers.npy`` and ``result.json`` (for the run's k' rule);
    ``k_prime`` overrides it. Returns an (n,) int64 array.
    """
    result_dir = Path(result_dir)
    centers_file = result_dir / "centers.npy"
    if not centers_file.is_file():
        raise DataError(f"{centers_file} does not exist: is {result_dir} the folder of a finished run?")
    algorithm = _run_algorithm(result_dir)
    if algorithm != "kfed":
        raise DataError(f"{result_dir} holds a {algorithm} run, not a k-FED one: a new device joins a k-FED run "
                        "(for other runs label points with fedcluster-assign)")
    global_centers = np.load(centers_file)
    points = np.asarray(points, dtype=np.float64)
    if points.ndim != 2 or points.shape[1] != global_centers.shape[1]:
        raise DataError(
            f"the device's data has shape {points.shape}, the run's centers have dimension {global_centers.shape[1]}"
        )
    scaling = Scaling.of_folder(result_dir)
    if scaling is not None:  # a standardized run: the device clusters in its units too
        points, global_centers = scaling.apply(points), scaling.apply(global_centers)
    if k_prime is None:
        config = json.loads((result_dir / "result.json").read_text()).get("config", {})
        k_prime = int(config.get("k-prime", 0))
    if k_prime:
        local_centers, _, local_labels = local_kprime_means(points, k_prime, np.random.default_rng(seed))
    else:  # the run let every device choose: so does this one
        local_centers, _, local_labels = auto_local_means(points, global_centers.shape[0], np.random.default_rng(seed))
    return induced_labels(local_labels, kfed_assign_new_device(local_centers, global_centers))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fedcluster-kfed-assign", description=__doc__.split("\n\n")[0])
    parser.add_argument("result_dir", help="folder of a finished k-FED run (centers.npy, result.json)")
    parser.add_argument("data", help="the new device's points (.npy or .csv, rows = points)")
    parser.add_argument("--out", help="write the labels here (.npy); default: print a summary")
    parser.add_argument("--k-prime", type=int, default=None, help="local clusters (default: the run's rule)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        labels = label_new_device(args.result_dir, load_points(args.data), k_prime=args.k_prime, seed=args.seed)
    except (DataError, ValueError, OSError) as exc:
        print(f"fedcluster-kfed-assign: error: {exc}", file=sys.stderr)
        return 1
    if args.out:
        np.save(args.out, labels)
    sizes = np.bincount(labels)
    print(json.dumps({"points": int(labels.size), "cluster_sizes": {str(i): int(s) for i, s in enumerate(sizes) if s}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
