"""Label a device's own points with a finished run's centers, on the device.

Every point takes its nearest center of ``RUN_DIR/centers.npy`` (FedKMeans, DA-UFL,
FedDP-KMeans, k-FED's global centers). The points and their labels never leave the
machine this runs on. NumPy only. For k-FED's own induced rule (a point takes the global
cluster of its local center) use ``fedcluster-kfed-assign``; graph runs store one label per
graph node in ``labels.npy`` already.

Command line::

    fedcluster-assign RUN_DIR POINTS.npy [--out LABELS.npy] [--overwrite]

The labels go to ``fedcluster-labels/<name>.npy`` beside the points by default (as with
the run-config ``write-labels``): a sub-folder, so a data folder listing never reads them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from fedcluster.shared_kernels import labels_path
from .cli import ToolParser, output_file, outside, refuse, save_npy
from ..data import LARGEST_VALUE, RUN_MARKER, DataError, load_points
from ..lloyd import nearest
from ..scaling import Scaling


def run_centers(run_dir: str | Path) -> np.ndarray:
    """The final centers of a finished run's folder, with an error that says what is wrong."""
    folder = Path(run_dir)
    if not folder.is_dir():
        raise DataError(f"{folder} is not a folder: give the output folder of a finished run")
    marker = folder / RUN_MARKER
    if marker.is_file():
        try:
            status = json.loads(marker.read_text()).get("status")
        except (ValueError, AttributeError, UnicodeDecodeError):
            raise DataError(
                f"{marker} is not a run's marker (unreadable): is {folder} the output folder of a run?"
            ) from None
        if status != "finished":
            raise DataError(
                f"{folder} holds an unfinished run ({RUN_MARKER} says status {str(status)[:40]!r}): its "
                "centers are not final; wait for it to finish, or resume it (resume = true)"
            )
    file = folder / "centers.npy"
    if not file.is_file():
        if (folder / "labels.npy").is_file():
            raise DataError(f"{folder} is a graph run: its labels.npy already holds one cluster per graph node")
        raise DataError(f"{file} does not exist: is {folder} the output folder of a finished run?")
    centers = np.load(file)
    if centers.ndim != 2 or centers.shape[0] == 0 or not np.all(np.isfinite(centers)):
        raise DataError(f"{file} holds no usable centers (shape {centers.shape})")
    magnitude = float(np.max(np.abs(centers)))
    if magnitude > LARGEST_VALUE:  # the bound device data is held to: distances would overflow
        raise DataError(
            f"{file} holds centers with values up to {magnitude:.3g}: squared distances to them would "
            f"overflow float64 (the limit is {LARGEST_VALUE:g}, as for device data); these are not "
            "centers a run of this project writes"
        )
    return centers


def assign_labels(run_dir: str | Path, points: np.ndarray) -> np.ndarray:
    """The nearest center of every point: an (n,) int64 array (in the standardized space
    when the run was standardized)."""
    centers = run_centers(run_dir)
    points = np.asarray(points, dtype=np.float64)
    if points.ndim != 2 or points.shape[1] != centers.shape[1]:
        raise DataError(f"the points have shape {points.shape}, the run's centers have dimension {centers.shape[1]}")
    scaling = Scaling.of_folder(run_dir)
    if scaling is not None and scaling.mean.shape != (centers.shape[1],):
        raise DataError(
            f"the run's standardize record has {scaling.mean.size} features, its centers {centers.shape[1]}"
        )
    return (scaling.nearest(points, centers) if scaling is not None else nearest(points, centers)).astype(np.int64)


def main(argv: list[str] | None = None) -> int:
    parser = ToolParser(prog="fedcluster-assign", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", help="output folder of a finished run (centers.npy)")
    parser.add_argument("points", help="this device's points (.npy or .csv, rows = points)")
    parser.add_argument("--out", help="labels file (.npy); default: fedcluster-labels/<name>.npy beside POINTS")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing labels file")
    args = parser.parse_args(argv)
    points_path = Path(args.points)
    try:
        if args.out is not None:
            out = outside(output_file(args.out, "--out", overwrite=args.overwrite), args.run_dir, "--out")
        else:  # its own sub-folder beside the points, made here
            out = output_file(
                labels_path(str(points_path)), "--out (default)", overwrite=args.overwrite, create_parent=True
            )
        labels = assign_labels(args.run_dir, load_points(str(points_path)))
        save_npy(out, labels, overwrite=args.overwrite)
    except (DataError, ValueError, OSError) as exc:
        return refuse("fedcluster-assign", exc)
    sizes = np.bincount(labels)
    print(
        json.dumps(
            {
                "points": int(labels.size),
                "labels": str(out),
                "cluster_sizes": {str(i): int(s) for i, s in enumerate(sizes) if s},
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
