"""Data: file loaders, synthetic generators of every paper's setup, and partitioners.

Three parts, all NumPy only at import time (a device imports this module to load its own
file; scikit-learn is imported only inside :func:`digits_partition`):

* **Loaders** read one device's points from a ``.npy`` or ``.csv`` file and validate them,
  raising :class:`DataError` with a message that names the file and the problem.
* **Generators** reproduce the synthetic setups of the papers (docs/ALGORITHMS.md):
  :func:`triebe_clients` (FedKMeans), :func:`kfed_mixture` (k-FED Table 1),
  :func:`feddp_mixture` and :func:`feddp_server_data` (FedDP-KMeans), :func:`daufl_paper`
  (DA-UFL: overlapping, unbalanced observations of one event set), and a general
  :func:`gaussian_mixture`. Every generator takes a ``seed`` (an int or a
  ``numpy.random.Generator``) and is deterministic given it.
* **Partitioners** split ``n`` points over clients. Each returns a list of index arrays,
  one per client, that together hold every index ``0 .. n - 1`` exactly once; each array
  is sorted.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Sequence

import numpy as np

__all__ = [
    "DataError",
    "load_points",
    "load_table",
    "list_client_files",
    "folder_files",
    "client_file",
    "mixture_means",
    "gaussian_mixture",
    "triebe_clients",
    "kfed_mixture",
    "feddp_mixture",
    "feddp_server_data",
    "daufl_paper",
    "partition_iid",
    "partition_dirichlet",
    "partition_one_source",
    "partition_components",
    "digits_partition",
]


class DataError(ValueError):
    """A data file or directory that cannot be used; the message names it and says why."""


def _as_generator(seed: int | np.random.Generator) -> np.random.Generator:
    """A ``numpy.random.Generator`` from an int seed (or the generator itself)."""
    if isinstance(seed, np.random.Generator):
        return seed
    if seed is None or isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed must be an int or a numpy.random.Generator, got {seed!r}")
    return np.random.default_rng(int(seed))


# ---------------------------------------------------------------------------------------
# Loaders
# ---------------------------------------------------------------------------------------


def load_points(path: str | os.PathLike, columns: Sequence[str] = ()) -> np.ndarray:
    """Load one device's points from a ``.npy``, ``.csv`` or ``.parquet`` file.

    ``.npy``: a numeric array saved with ``numpy.save`` (pickled object arrays are
    refused). ``.csv``: comma-separated values, one point per line, blank lines ignored; a
    first line with a value that is not a number where the next line has one is a header
    (its names name the columns; without one they are 0, 1, ...). ``.parquet``: a table
    (needs pyarrow, ``fedcluster[parquet]``). In a CSV or Parquet file the features are
    ``columns`` when given (by name, or position from 0), else every numeric column; a text
    column is left out with a :class:`~fedcluster.tables.DataWarning` naming it
    (:mod:`fedcluster.tables`).

    A 1-D array of shape ``(n,)`` (or a one-column CSV) is read as ``n`` points of
    dimension 1, shape ``(n, 1)``.

    Parameters
    ----------
    path : str or path-like
        The file; its suffix (``.npy``, ``.csv`` or ``.parquet``, any case) selects the format.
    columns : sequence of str, optional
        The feature columns of a CSV or Parquet file (a ``.npy`` file has no names: refused).

    Returns
    -------
    points : ndarray of shape (n, d), float64
        With ``n >= 1``, ``d >= 1`` and every value finite.

    Raises
    ------
    DataError
        If the file is missing, unreadable, of an unsupported type, not numeric, not 1-D
        or 2-D, empty, or holds NaN/inf values (a missing CSV value is NaN), or a column
        named in ``columns`` is absent or not numeric. The message names the file.
    """
    return load_table(path, columns).points


def load_table(path: str | os.PathLike, columns: Sequence[str] = (), keep: Sequence[str] = ()):
    """:func:`load_points` with the file's ``keep`` columns as they are (a
    :class:`fedcluster.tables.Table` whose ``points`` are validated)."""
    import warnings

    from .tables import DataWarning, Table, read_table

    path = Path(path)
    try:
        exists, regular = path.exists(), path.is_file()
    except OSError as exc:  # a name too long for the file system, ...
        raise DataError(f"data file {str(path)[:200]} cannot be looked up: {exc.strerror}") from None
    if not exists:
        raise DataError(f"data file {path} does not exist")
    if not regular:
        raise DataError(f"data file {path} is not a regular file")
    suffix = path.suffix.lower()
    if suffix not in POINT_SUFFIXES:
        raise DataError(f"data file {path} has unsupported type {path.suffix!r}: expected .npy, .csv or .parquet")
    if suffix == ".npy":
        table = Table(points=_read_npy(path), names=[])
        if columns or keep:  # an array's columns are named by their positions, 0, 1, ...
            table = _npy_columns(path, table.points, columns, keep)
    else:
        table = read_table(path, columns, keep, error=DataError)
        if table.dropped:
            warnings.warn(
                f"data file {path}: text column(s) {', '.join(map(repr, table.dropped))} left out "
                f"(name the features in run-config columns to choose them)",
                DataWarning,
                stacklevel=2,
            )
    table.points = _validate_points(table.points, path)
    return table


def _npy_columns(path: Path, array: np.ndarray, columns: Sequence[str], keep: Sequence[str]):
    from .tables import select_columns

    if array.ndim != 2 or array.dtype.kind not in "biuf":
        _validate_points(array, path)  # names what is wrong with it
        raise DataError(f"data file {path} holds a 1-D array: it has no columns to choose")
    names = [str(i) for i in range(array.shape[1])]
    return select_columns(path, names, [array[:, i] for i in range(array.shape[1])], columns, keep, DataError)


# The files that hold one device's points, by suffix (lower case).
POINT_SUFFIXES = (".npy", ".csv", ".parquet")


def _read_npy(path: Path) -> np.ndarray:
    try:
        return np.load(path, allow_pickle=False)
    except PermissionError as error:
        raise DataError(f"data file {path} cannot be read: permission denied") from error
    except (OSError, ValueError, EOFError) as error:
        # ValueError also covers object arrays, which would need pickle.
        raise DataError(f"data file {path} is not a readable numeric .npy array: {error}") from error


def _validate_points(array: np.ndarray, path: Path) -> np.ndarray:
    """Check dtype, shape and finiteness of a loaded array; return it as float64 (n, d)."""
    if array.dtype.kind not in "iuf":
        raise DataError(f"data file {path} holds values of type {array.dtype}, expected integers or floats")
    if array.ndim == 1:
        array = array.reshape(-1, 1)
    if array.ndim != 2:
        raise DataError(
            f"data file {path} holds an array of shape {array.shape}: expected 2 dimensions "
            f"(points x features) or 1 (one feature)"
        )
    if array.shape[0] == 0 or array.shape[1] == 0:
        raise DataError(f"data file {path} is empty: array of shape {array.shape}")
    points = array.astype(np.float64)
    bad_rows = np.flatnonzero(~np.isfinite(points).all(axis=1))
    if bad_rows.size:
        raise DataError(
            f"data file {path} has {bad_rows.size} of {points.shape[0]} rows with NaN or infinite "
            f"values; the first is row {bad_rows[0]} (counting data rows from 0)"
        )
    return check_scale(points, str(path))


# Squared distances of values beyond these overflow (or underflow to 0) in float64.
LARGEST_VALUE = 1e150
SMALLEST_SCALE = 1e-150

# Generated data sets (run-config num-points, dim, separation): every simulated device
# builds the whole set and the server its pooled reference, a few copies of num-points × dim
# numbers of 8 bytes each; component means a separation of standard deviations apart, beyond
# which the points of one component are a far point plus noise the arithmetic of later
# statistics no longer resolves (docs: the offsets such data behave like).
GENERATED_VALUES_MAX = 10**8
GENERATED_DIM_MAX = 100_000
SEPARATION_MAX = 1e6


def check_scale(points: np.ndarray, source: str) -> np.ndarray:
    """Refuse points whose squared norms overflow or underflow float64, with a hint."""
    magnitude = float(np.max(np.abs(points))) if points.size else 0.0
    if magnitude > LARGEST_VALUE:
        raise DataError(
            f"data {source} has values up to {magnitude:.3g}: squared distances would overflow "
            f"float64; rescale the data (e.g. divide by {magnitude:.0e}) before clustering"
        )
    if 0.0 < magnitude < SMALLEST_SCALE:
        raise DataError(
            f"data {source} has values no larger than {magnitude:.3g}: squared distances would "
            f"underflow float64 to zero; rescale the data (e.g. multiply by {1 / magnitude:.0e})"
        )
    return points


def _natural_key(path: Path) -> list:
    """Sort key that orders digit runs by value: client_2 before client_10."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", path.name)]


def list_client_files(data_dir: str | os.PathLike, pattern: str | None = "*.npy") -> list[Path]:
    """The files in ``data_dir`` matching the glob ``pattern`` (None: every ``.npy``,
    ``.csv`` and ``.parquet`` file, :data:`POINT_SUFFIXES`), in natural sort order.

    Natural order compares runs of digits by value, so ``client_2.npy`` comes before
    ``client_10.npy`` (with zero-padded names it is the plain alphabetical order).
    Only regular files are listed; the directory is not searched recursively unless the
    pattern says so (``"**/*.npy"``).

    Parameters
    ----------
    data_dir : str or path-like
        Directory holding one file per client.
    pattern : str or None, default "*.npy"
        Glob pattern, relative to ``data_dir``; None: the point files.

    Returns
    -------
    list of pathlib.Path

    Raises
    ------
    DataError
        If ``data_dir`` is missing or not a directory, or no file matches.
    """
    directory = Path(data_dir)
    try:
        exists, folder = directory.exists(), directory.is_dir()
    except OSError as exc:  # a name too long for the file system, ...
        raise DataError(f"data directory {str(directory)[:200]} cannot be looked up: {exc.strerror}") from None
    if not exists:
        raise DataError(f"data directory {directory} does not exist")
    if not folder:
        raise DataError(f"data directory {directory} is not a directory")
    refuse_run_folder(directory)
    stat = directory.stat()  # adding, removing or renaming a file changes the folder's mtime
    key = (str(directory), pattern, stat.st_dev, stat.st_ino, stat.st_mtime_ns)
    if key in _LISTINGS:  # every simulated device of a process lists the same folder once
        return list(_LISTINGS[key])
    if pattern is None:
        files = [path for path in directory.iterdir() if path.suffix.lower() in POINT_SUFFIXES and path.is_file()]
    else:
        files = [path for path in directory.glob(pattern) if path.is_file()]
    results = sorted(path.name for path in files if path.suffix == ".npy" and path.stem in RESULT_ARRAYS)
    if results:
        raise DataError(
            f"data directory {directory} holds {', '.join(results[:3])}: the name of an array a fedcluster run "
            f"writes, not a client's data (it would join as a device): move it out of the data folder"
        )
    if not files:
        wanted = repr(pattern) if pattern else "'*.npy', '*.csv' or '*.parquet'"
        raise DataError(f"data directory {directory} has no file matching {wanted}{_folder_hint(directory, pattern)}")
    listing = sorted(files, key=lambda path: (_natural_key(path), str(path)))
    if len(_LISTINGS) >= 64:
        _LISTINGS.clear()
    _LISTINGS[key] = tuple(listing)
    return listing


# Folder listings already made in this process, by folder, pattern and the folder's identity
# and modification time (a listing per device made a simulation's start quadratic in its
# devices).
_LISTINGS: dict[tuple, tuple[Path, ...]] = {}


# The datasets that read a folder of one file per client, by the pattern that lists them
# (None: the point files; npy-dir is dir's earlier name).
FOLDER_DATASETS: dict[str, str | None] = {"dir": None, "npy-dir": None, "edge-dir": "*.txt"}


def folder_files(dataset: str, data_dir: str | os.PathLike) -> list[Path]:
    """The client files of a folder dataset (:data:`FOLDER_DATASETS`), one per client."""
    return list_client_files(data_dir, FOLDER_DATASETS[dataset])


# The file that marks a folder as a run's results folder (fedcluster.server.run_folder).
RUN_MARKER = "fedcluster-run.json"
# The arrays a run writes, as <name>.npy (docs/reference.md, "Outputs"): never a client's file.
RESULT_ARRAYS = frozenset(
    {
        "bin_counts",
        "bin_representatives",
        "candidate_weights",
        "candidates",
        "centers",
        "client_labels",
        "covariances",
        "device_assignment",
        "device_centers",
        "device_counts",
        "device_nodes",
        "embedding",
        "init_centers",
        "labels",
        "last_centers",
        "projected_centers",
        "projection",
        "server_weights",
        "weights",
    }
)


def refuse_run_folder(directory: str | os.PathLike) -> None:
    """A folder that holds a run's results is never read as client data: its arrays
    (``centers.npy``, ...) would join the federation as devices."""
    directory = Path(directory)
    for name in (RUN_MARKER, "result.json"):
        if (directory / name).is_file():
            raise DataError(
                f"{directory} holds the results of a fedcluster run ({name}), not a client's data: "
                f"point the data at the clients' own files"
            )


def _folder_hint(directory: Path, pattern: str | None) -> str:
    """Why a folder of client files matched nothing: what it holds instead, and what to do."""
    held: dict[str, int] = {}
    for path in directory.iterdir():
        if path.is_file():
            suffix = path.suffix.lower() or "(no suffix)"
            held[suffix] = held.get(suffix, 0) + 1
    hint = " (it holds " + (", ".join(f"{n} {suffix}" for suffix, n in sorted(held.items())) or "no") + " files)"
    if pattern is None:
        return hint + ": dataset='dir' reads one .npy, .csv or .parquet file per client"
    if pattern == "*.txt":
        return hint + ": dataset='edge-dir' reads one *.txt edge list per client; points: dataset='dir'"
    return hint


def client_file(data_dir: str | os.PathLike, pattern: str | None, partition_id: int) -> Path:
    """The ``partition_id``-th file (from 0) of :func:`list_client_files`.

    Raises
    ------
    DataError
        If the directory has no matching file, or ``partition_id`` is not in
        ``0 .. number_of_files - 1`` (the message says how many files there are).
    """
    files = list_client_files(data_dir, pattern)
    if not 0 <= partition_id < len(files):
        raise DataError(
            f"partition id {partition_id} is out of range: data directory {data_dir} has "
            f"{len(files)} client files (valid ids 0 to {len(files) - 1})"
        )
    return files[partition_id]


# ---------------------------------------------------------------------------------------
# Generators
# ---------------------------------------------------------------------------------------


DAUFL_GRID = (-7.5, -2.5, 2.5, 7.5)


def daufl_paper(
    num_agents: int,
    points_per_class: int,
    snr_db: float,
    seed: int | np.random.Generator,
    *,
    std: float = 1.0,
    alpha: float = 0.025,
    area: float = 10.0,
) -> tuple[np.ndarray, ...]:
    """The DA-UFL setup (Servetnyk et al. 2020, Sec. IV): overlapping, unbalanced agents.

    16 spherical Gaussian classes (``std`` per coordinate; the paper does not give it)
    with means on the grid {−7.5, −2.5, 2.5, 7.5}², ``points_per_class`` points each (the
    paper: 50). ``num_agents`` agents at positions uniform in [−area, area]² (the paper:
    "placed randomly"); agent j observes point n independently with probability
    ``1 − exp(−alpha · SNR / d_jn)`` (energy detector under Rayleigh fading), d_jn the
    distance between agent and point, SNR = 10^(snr_db / 10) in linear scale, the same
    for every agent. A point may be seen by several agents or by none.

    Returns
    -------
    X : (16·points_per_class, 2) all points; y : their classes;
    observed : (num_agents, N) bool, who sees what; positions : (num_agents, 2).
    """
    if num_agents < 1 or points_per_class < 1:
        raise ValueError(f"need num_agents >= 1 and points_per_class >= 1, got {num_agents}, {points_per_class}")
    rng = _as_generator(seed)
    means = np.array([(a, b) for a in DAUFL_GRID for b in DAUFL_GRID])
    y = np.repeat(np.arange(16), points_per_class)
    X = means[y] + rng.normal(0.0, std, size=(y.size, 2))
    positions = rng.uniform(-area, area, size=(num_agents, 2))
    distance = np.sqrt(((positions[:, None, :] - X[None, :, :]) ** 2).sum(-1))
    snr = 10.0 ** (snr_db / 10.0)
    with np.errstate(divide="ignore"):
        probability = 1.0 - np.exp(-alpha * snr / distance)
    observed = rng.random(probability.shape) < probability
    return X, y, observed, positions


def mixture_means(k: int, d: int, separation: float, seed: int | np.random.Generator) -> np.ndarray:
    """k random component means whose pairwise distances are about ``separation``.

    The means are drawn i.i.d. from ``N(0, s^2 I_d)`` with ``s = separation / sqrt(2 d)``.
    The difference of two means is then ``N(0, 2 s^2 I_d)``, whose squared norm has
    expectation ``2 s^2 d = separation^2``; in high dimension every pairwise distance
    concentrates near ``separation`` (relative spread about ``1 / sqrt(2 d)``).

    Returns
    -------
    means : ndarray of shape (k, d)
    """
    if k < 1 or d < 1:
        raise ValueError(f"need k >= 1 and d >= 1, got k={k}, d={d}")
    if separation < 0:
        raise ValueError(f"separation must be >= 0, got {separation}")
    rng = _as_generator(seed)
    return rng.normal(0.0, separation / np.sqrt(2.0 * d), size=(k, d))


def gaussian_mixture(
    n: int,
    d: int,
    k: int,
    seed: int | np.random.Generator,
    separation: float = 10.0,
    std: float = 1.0,
    weights: Sequence[float] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """``n`` points from a mixture of k spherical Gaussians in ``d`` dimensions.

    Means from :func:`mixture_means` (pairwise distances about ``separation``, in the
    same units as ``std``, so ``separation / std`` is the separation in standard
    deviations). Every point picks its component with probabilities ``weights`` (equal
    by default) and adds ``N(0, std^2 I_d)`` noise.

    Parameters
    ----------
    n, d, k : int
        Number of points, dimension, number of components.
    seed : int or numpy.random.Generator
    separation : float, default 10.0
        Typical distance between two component means.
    std : float, default 1.0
        Standard deviation of every coordinate within a component.
    weights : sequence of k floats, optional
        Mixing weights (normalized here); default equal.

    Returns
    -------
    X : ndarray of shape (n, d)
    y : ndarray of shape (n,), int64
        Component of every point.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if std < 0:
        raise ValueError(f"std must be >= 0, got {std}")
    rng = _as_generator(seed)
    means = mixture_means(k, d, separation, rng)
    if weights is None:
        probabilities = np.full(k, 1.0 / k)
    else:
        probabilities = np.asarray(weights, dtype=np.float64)
        if probabilities.shape != (k,) or np.any(probabilities < 0) or probabilities.sum() <= 0:
            raise ValueError(f"weights must be {k} non-negative numbers with a positive sum, got {weights}")
        probabilities = probabilities / probabilities.sum()
    y = rng.choice(k, size=n, p=probabilities).astype(np.int64)
    X = means[y] + rng.normal(0.0, std, size=(n, d))
    return X, y


def triebe_clients(
    num_clients: int = 50,
    points_per_client: int = 10,
    means: Sequence[float] = (1, 2, 3, 4, 5),
    scale: float = 0.2,
    seed: int | np.random.Generator = 0,
    source_assignment: str = "round_robin",
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The FedKMeans toy setup (Triebe & Rajagopal 2019): 1-D, one Gaussian per client.

    Client i draws all of its ``points_per_client`` points from ONE Gaussian
    ``N(means[s_i], scale^2)``. The source ``s_i`` is ``i % len(means)`` with
    ``source_assignment="round_robin"`` (the default: with 50 clients and 5 means every
    source has exactly 10 clients), or uniform at random with ``"random"`` (the paper's
    "randomly sampled from one of 5 Gaussians"; some source may then get few clients).

    Returns
    -------
    clients : list of ndarray of shape (points_per_client, 1)
    labels : list of ndarray of shape (points_per_client,), int64
        The source index ``s_i`` of every point (constant within a client).
    """
    if num_clients < 1 or points_per_client < 1:
        raise ValueError(f"need num_clients >= 1 and points_per_client >= 1, got {num_clients} and {points_per_client}")
    means = np.asarray(means, dtype=np.float64).reshape(-1)
    if means.size == 0:
        raise ValueError("means must hold at least one value")
    rng = _as_generator(seed)
    if source_assignment == "round_robin":
        sources = np.arange(num_clients) % means.size
    elif source_assignment == "random":
        sources = rng.integers(means.size, size=num_clients)
    else:
        raise ValueError(f"source_assignment must be 'round_robin' or 'random', got {source_assignment!r}")
    clients, labels = [], []
    for source in sources:
        clients.append(rng.normal(means[source], scale, size=(points_per_client, 1)))
        labels.append(np.full(points_per_client, source, dtype=np.int64))
    return clients, labels


def kfed_mixture(
    d: int,
    k: int,
    k_prime: int,
    m0: int,
    points_per_component: int,
    separation: float,
    seed: int | np.random.Generator,
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The k-FED Table 1 setup (Dennis, Li & Smith 2021, Sec. 4.1).

    * k Gaussian components in ``d`` dimensions, identity covariance (standard deviation
      1 per coordinate), means from :func:`mixture_means` with pairwise distances about
      ``separation`` (the paper's constant c, in standard deviations);
      ``points_per_component`` points each.
    * Components ``0 .. k-1`` are split in order into ``ceil(k / k_prime)`` groups of
      ``k_prime`` consecutive components (the last group holds the ``k mod k_prime``
      remaining ones when ``k_prime`` does not divide k).
    * Every group is spread over its own ``m0`` devices: each component's points are
      shuffled and dealt out so that every device of the group receives ``1 / m0`` of
      them (sizes differing by at most one). So a device holds data from exactly the
      components of its group, and devices of different groups share no component.

    Devices are ordered group by group: devices ``g * m0 .. g * m0 + m0 - 1`` belong to
    group g.

    Parameters
    ----------
    d, k : int
        Dimension and number of components.
    k_prime : int
        Components per group (the paper's k'; Table 1 reads as ``k_prime = sqrt(k)``).
    m0 : int
        Devices per group.
    points_per_component : int
        Points of every component, over all its devices (at least ``m0``, so that no
        device misses a component).
    separation : float
        Typical distance between two component means.
    seed : int or numpy.random.Generator

    Returns
    -------
    device_points : list of ndarray of shape (n_z, d)
    device_labels : list of ndarray of shape (n_z,), int64
        True component (0 .. k-1) of every point.
    """
    if not 1 <= k_prime <= k:
        raise ValueError(f"k_prime must be between 1 and k={k}, got {k_prime}")
    if m0 < 1:
        raise ValueError(f"m0 must be >= 1, got {m0}")
    if points_per_component < m0:
        raise ValueError(
            f"points_per_component={points_per_component} is smaller than m0={m0}: some device would miss a component"
        )
    rng = _as_generator(seed)
    means = mixture_means(k, d, separation, rng)
    device_points: list[np.ndarray] = []
    device_labels: list[np.ndarray] = []
    for first in range(0, k, k_prime):
        group = range(first, min(first + k_prime, k))
        parts_points: list[list[np.ndarray]] = [[] for _ in range(m0)]
        parts_labels: list[list[np.ndarray]] = [[] for _ in range(m0)]
        for component in group:
            points = means[component] + rng.normal(size=(points_per_component, d))
            shares = np.array_split(rng.permutation(points_per_component), m0)
            for device, share in enumerate(shares):
                parts_points[device].append(points[share])
                parts_labels[device].append(np.full(share.size, component, dtype=np.int64))
        for device in range(m0):
            order = rng.permutation(sum(part.shape[0] for part in parts_points[device]))
            device_points.append(np.concatenate(parts_points[device])[order])
            device_labels.append(np.concatenate(parts_labels[device])[order])
    return device_points, device_labels


def feddp_mixture(
    num_clients: int,
    points_per_client: int,
    d: int = 100,
    k: int = 10,
    variance: float = 0.5,
    seed: int | np.random.Generator = 0,
) -> tuple[list[np.ndarray], list[np.ndarray], np.ndarray]:
    """The FedDP-KMeans synthetic setup (Scott et al. 2025, App. G.1).

    Means ``~ U[0, 1]^d``, covariance ``variance * I``, equal weights; every client draws
    its ``points_per_client`` points i.i.d. from the whole mixture. Paper sizes:
    100 clients x 1000 points (data-point privacy), 1000 / 2000 / 5000 clients x 50
    points (client-level privacy).

    Returns
    -------
    client_points : list of ndarray of shape (points_per_client, d)
    client_labels : list of ndarray of shape (points_per_client,), int64
    means : ndarray of shape (k, d)
        Pass them to :func:`feddp_server_data`.
    """
    if num_clients < 1 or points_per_client < 1 or d < 1 or k < 1:
        raise ValueError(
            f"need num_clients, points_per_client, d, k >= 1, got {num_clients}, {points_per_client}, {d}, {k}"
        )
    if variance < 0:
        raise ValueError(f"variance must be >= 0, got {variance}")
    rng = _as_generator(seed)
    means = rng.uniform(0.0, 1.0, size=(k, d))
    std = np.sqrt(variance)
    client_points, client_labels = [], []
    for _ in range(num_clients):
        labels = rng.integers(k, size=points_per_client).astype(np.int64)
        client_points.append(means[labels] + rng.normal(0.0, std, size=(points_per_client, d)))
        client_labels.append(labels)
    return client_points, client_labels, means


def feddp_server_data(
    means: np.ndarray,
    per_component: int = 20,
    uniform: int = 100,
    variance: float = 0.5,
    seed: int | np.random.Generator = 0,
) -> np.ndarray:
    """The FedDP-KMeans server dataset: in-distribution points plus uniform outliers.

    ``per_component`` points from every component ``N(means[j], variance * I)``, followed
    by ``uniform`` points from ``U[0, 1]^d`` (related but out-of-distribution data).
    Paper: 20 per component with k = 10, plus 100 uniform: 300 points.

    Returns
    -------
    server_points : ndarray of shape (k * per_component + uniform, d)
        Component 0's points first, then component 1's, ..., then the uniform points.
    """
    means = np.asarray(means, dtype=np.float64)
    if means.ndim != 2:
        raise ValueError(f"means must be a (k, d) array, got shape {means.shape}")
    if per_component < 0 or uniform < 0:
        raise ValueError(f"per_component and uniform must be >= 0, got {per_component}, {uniform}")
    rng = _as_generator(seed)
    k, d = means.shape
    mixture = np.repeat(means, per_component, axis=0) + rng.normal(0.0, np.sqrt(variance), size=(k * per_component, d))
    return np.concatenate([mixture, rng.uniform(0.0, 1.0, size=(uniform, d))])


# ---------------------------------------------------------------------------------------
# Partitioners
# ---------------------------------------------------------------------------------------


def _check_num_clients(num_clients: int) -> None:
    if num_clients < 1:
        raise ValueError(f"num_clients must be >= 1, got {num_clients}")


def _check_partition_labels(labels: np.ndarray) -> np.ndarray:
    labels = np.asarray(labels)
    if labels.ndim != 1:
        raise ValueError(f"labels must be a 1-D array, got shape {labels.shape}")
    return labels


def partition_iid(n: int, num_clients: int, rng: int | np.random.Generator) -> list[np.ndarray]:
    """Split ``0 .. n-1`` uniformly at random into ``num_clients`` parts of near-equal size.

    Sizes differ by at most one; when ``n < num_clients`` the last clients are empty.

    Returns
    -------
    list of ``num_clients`` sorted int64 index arrays covering ``0 .. n-1`` exactly once.
    """
    _check_num_clients(num_clients)
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    rng = _as_generator(rng)
    permutation = rng.permutation(n).astype(np.int64)
    return [np.sort(part) for part in np.array_split(permutation, num_clients)]


def partition_dirichlet(
    labels: np.ndarray, num_clients: int, alpha: float, rng: int | np.random.Generator
) -> list[np.ndarray]:
    """Label-skewed split: every label's points are shared out by Dirichlet proportions.

    For every label, the shares of the clients are drawn from ``Dirichlet(alpha, ...,
    alpha)`` (one draw per label) and the label's shuffled points are cut at the
    cumulative shares. Small ``alpha`` gives each label to few clients (strong skew);
    large ``alpha`` approaches an i.i.d. split.

    No empty clients: when ``n >= num_clients``, every empty client receives one point
    taken from the currently largest client (a random point of it), repeated until no
    client is empty. This moves at most ``num_clients - 1`` points.

    Returns
    -------
    list of ``num_clients`` sorted int64 index arrays covering every index exactly once.
    """
    labels = _check_partition_labels(labels)
    _check_num_clients(num_clients)
    if not alpha > 0:
        raise ValueError(f"alpha must be > 0, got {alpha}")
    rng = _as_generator(rng)
    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for label in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == label))
        shares = rng.dirichlet(np.full(num_clients, float(alpha)))
        cuts = np.round(np.cumsum(shares)[:-1] * members.size).astype(np.int64)
        for client, piece in enumerate(np.split(members, cuts)):
            parts[client].append(piece)
    clients = [np.concatenate(part).astype(np.int64) if part else np.empty(0, np.int64) for part in parts]
    if labels.size >= num_clients:
        for client in range(num_clients):
            if clients[client].size == 0:
                largest = int(np.argmax([part.size for part in clients]))
                moved = int(rng.integers(clients[largest].size))
                clients[client] = clients[largest][moved : moved + 1]
                clients[largest] = np.delete(clients[largest], moved)
    return [np.sort(part) for part in clients]


def _clients_per_label(sizes: np.ndarray, num_clients: int) -> np.ndarray:
    """Share ``num_clients`` among labels of ``sizes`` points: at least one each, the rest
    by the highest-averages (D'Hondt) rule, so that points per client stay balanced.

    When ``num_clients <= sizes.sum()`` no label gets more clients than it has points.
    """
    allocation = np.ones(sizes.size, dtype=np.int64)
    for _ in range(num_clients - sizes.size):
        allocation[np.argmax(sizes / (allocation + 1))] += 1
    return allocation


def partition_one_source(labels: np.ndarray, num_clients: int, rng: int | np.random.Generator) -> list[np.ndarray]:
    """Every client holds points of exactly one label; every label goes to some client.

    The clients are shared among the labels at least one per label, the rest in
    proportion to the labels' sizes (highest-averages rule), so clients hold similar
    numbers of points; a label's shuffled points are then split near-equally among its
    clients. Which client ids get which label is a random permutation.

    Raises
    ------
    ValueError
        If ``num_clients`` is smaller than the number of distinct labels (some label
        would have no client) or larger than the number of points (some client would be
        empty).

    Returns
    -------
    list of ``num_clients`` sorted int64 index arrays covering every index exactly once.
    """
    labels = _check_partition_labels(labels)
    _check_num_clients(num_clients)
    values, sizes = np.unique(labels, return_counts=True)
    if num_clients < values.size:
        raise ValueError(
            f"one label per client needs at least as many clients as labels: "
            f"{num_clients} clients for {values.size} labels"
        )
    if num_clients > labels.size:
        raise ValueError(f"{num_clients} clients for only {labels.size} points: some client would be empty")
    rng = _as_generator(rng)
    allocation = _clients_per_label(sizes, num_clients)
    pieces: list[np.ndarray] = []
    for value, count in zip(values, allocation):
        members = rng.permutation(np.flatnonzero(labels == value)).astype(np.int64)
        pieces.extend(np.array_split(members, count))
    client_order = rng.permutation(num_clients)
    clients: list[np.ndarray] = [np.empty(0, np.int64)] * num_clients
    for piece, client in zip(pieces, client_order):
        clients[client] = np.sort(piece)
    return clients


def partition_components(
    labels: np.ndarray, num_clients: int, components_per_client: int, rng: int | np.random.Generator
) -> list[np.ndarray]:
    """Every client holds points of exactly ``components_per_client`` labels (the k-FED
    heterogeneity: k' components per device).

    The distinct labels are put in a random cyclic order, and client c takes the
    ``components_per_client`` consecutive labels starting at position
    ``c * components_per_client`` (wrapping around). Every label is held by at least one
    client as long as ``num_clients * components_per_client >= number of labels``, and
    labels are spread over clients as evenly as the counts allow. Each label's shuffled
    points are then split near-equally among the clients holding it.

    Raises
    ------
    ValueError
        If ``components_per_client`` exceeds the number of labels, if some label would be
        held by no client, or if some label has fewer points than clients holding it
        (a client would then miss one of its labels).

    Returns
    -------
    list of ``num_clients`` sorted int64 index arrays covering every index exactly once.
    """
    labels = _check_partition_labels(labels)
    _check_num_clients(num_clients)
    values = np.unique(labels)
    number_of_labels = values.size
    if not 1 <= components_per_client <= number_of_labels:
        raise ValueError(
            f"components_per_client must be between 1 and the number of labels "
            f"{number_of_labels}, got {components_per_client}"
        )
    if num_clients * components_per_client < number_of_labels:
        raise ValueError(
            f"{num_clients} clients x {components_per_client} labels each cannot cover {number_of_labels} labels"
        )
    rng = _as_generator(rng)
    cyclic_order = rng.permutation(number_of_labels)
    holders: list[list[int]] = [[] for _ in range(number_of_labels)]
    for client in range(num_clients):
        for slot in range(components_per_client):
            position = (client * components_per_client + slot) % number_of_labels
            holders[cyclic_order[position]].append(client)
    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for label_code, value in enumerate(values):
        members = rng.permutation(np.flatnonzero(labels == value)).astype(np.int64)
        if members.size < len(holders[label_code]):
            raise ValueError(
                f"label {value!r} has {members.size} points but {len(holders[label_code])} clients "
                f"should hold it; use fewer clients or fewer labels per client"
            )
        for client, piece in zip(holders[label_code], np.array_split(members, len(holders[label_code]))):
            parts[client].append(piece)
    return [np.sort(np.concatenate(part)) for part in parts]


def digits_partition(
    num_clients: int, classes_per_client: int, seed: int | np.random.Generator
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """scikit-learn's handwritten digits (1797 points, 64 features, 10 classes), federated.

    Every client holds ``classes_per_client`` digit classes (one or two in the usual
    non-i.i.d. demos), via :func:`partition_components`. The features are the raw pixel
    intensities 0..16, as float64.

    Returns
    -------
    client_points : list of ndarray of shape (n_i, 64)
    client_labels : list of ndarray of shape (n_i,), int64
    """
    from sklearn.datasets import load_digits

    digits = load_digits()
    points = np.asarray(digits.data, dtype=np.float64)
    labels = np.asarray(digits.target, dtype=np.int64)
    parts = partition_components(labels, num_clients, classes_per_client, _as_generator(seed))
    return [points[part] for part in parts], [labels[part] for part in parts]
