"""Label a device that did not take part in a k-FED run ("new devices join for free").

The device runs k-FED's local step on its own data and maps each of its local centers to
the nearest stored global center: O(k·k') distances, no other device and no new round
involved (docs/ALGORITHMS.md section 4). NumPy only: it runs on the device.

Command line::

    fedcluster-kfed-assign RESULT_DIR DEVICE_DATA.npy [--out labels.npy [--overwrite]] [--k-prime K]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from fedcluster.data import DataError, load_points
from fedcluster.algorithms.kfed.protocol import NODE_K_PRIME_MAX
from fedcluster.tools.assign import run_centers
from fedcluster.tools.cli import ToolParser, integer, output_file, outside, refuse, save_npy
from fedcluster.scaling import Scaling
from fedcluster.algorithms.kfed.model import (
    auto_local_means,
    induced_labels,
    kfed_assign_new_device,
    local_kprime_means,
)


def _run_record(result_dir: Path) -> dict:
    file = result_dir / "result.json"
    try:
        record = json.loads(file.read_text())
    except (OSError, ValueError, RecursionError):
        raise DataError(
            f"{file} is missing or unreadable: is {result_dir} the folder of a finished k-FED run?"
        ) from None
    if not isinstance(record, dict):
        raise DataError(f"{file} holds a JSON {type(record).__name__}, not a run's record (a JSON object)")
    return record


def _run_k_prime(record: dict, file: Path) -> int:
    """The run's k-prime (0: every device chose), from its recorded config."""
    config = record.get("config", {})
    if not isinstance(config, dict):
        raise DataError(f"{file}: its config is a JSON {type(config).__name__}, not a record of run-config keys")
    value = config.get("k-prime", 0)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= NODE_K_PRIME_MAX:
        raise DataError(
            f"{file}: its config's k-prime must be a whole number in [0, {NODE_K_PRIME_MAX}], got {value!r}"
        )
    return value


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
    record = _run_record(result_dir)
    algorithm = str(record.get("algorithm", "unknown"))[:40]
    if algorithm != "kfed":
        raise DataError(
            f"{result_dir} holds a {algorithm} run, not a k-FED one: a new device joins a k-FED run "
            "(for other runs label points with fedcluster-assign)"
        )
    if k_prime is None:
        k_prime = _run_k_prime(record, result_dir / "result.json")
    global_centers = run_centers(result_dir)
    points = np.asarray(points, dtype=np.float64)
    if points.ndim != 2 or points.shape[1] != global_centers.shape[1]:
        raise DataError(
            f"the device's data has shape {points.shape}, the run's centers have dimension {global_centers.shape[1]}"
        )
    scaling = Scaling.of_folder(result_dir)
    if scaling is not None:  # a standardized run: the device clusters in its units too
        points, global_centers = scaling.apply(points), scaling.apply(global_centers)
    if k_prime:
        local_centers, _, local_labels = local_kprime_means(points, k_prime, np.random.default_rng(seed))
    else:  # the run let every device choose: so does this one
        local_centers, _, local_labels = auto_local_means(points, global_centers.shape[0], np.random.default_rng(seed))
    return induced_labels(local_labels, kfed_assign_new_device(local_centers, global_centers))


def main(argv: list[str] | None = None) -> int:
    parser = ToolParser(prog="fedcluster-kfed-assign", description=__doc__.split("\n\n")[0])
    parser.add_argument("result_dir", help="folder of a finished k-FED run (centers.npy, result.json)")
    parser.add_argument("data", help="the new device's points (.npy or .csv, rows = points)")
    parser.add_argument("--out", help="write the labels here (.npy); default: print a summary")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out file")
    parser.add_argument(
        "--k-prime",
        type=integer(0, NODE_K_PRIME_MAX),
        default=None,
        help=f"local clusters, up to {NODE_K_PRIME_MAX}; 0: the device chooses, up to k (default: the run's rule)",
    )
    parser.add_argument("--seed", type=integer(0, 2**32 - 1), default=0)
    args = parser.parse_args(argv)
    try:
        out = (
            outside(output_file(args.out, "--out", overwrite=args.overwrite), args.result_dir, "--out")
            if args.out is not None
            else None
        )
        labels = label_new_device(args.result_dir, load_points(args.data), k_prime=args.k_prime, seed=args.seed)
        if out is not None:
            save_npy(out, labels, overwrite=args.overwrite)
    except (DataError, ValueError, OSError) as exc:
        return refuse("fedcluster-kfed-assign", exc)
    sizes = np.bincount(labels)
    summary = {"points": int(labels.size), "cluster_sizes": {str(i): int(s) for i, s in enumerate(sizes) if s}}
    if out is not None:
        summary["labels"] = str(out)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
