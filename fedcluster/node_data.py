"""Which data a device holds, resolved from the run config and the node config.

* Deployment: the node config names a file (``data-path``): ``.npy``/``.csv``/``.parquet``
  points (the run config's ``columns``) or a ``.txt`` edge list. Nothing else is consulted.
* Simulation: the node config gives ``partition-id`` and ``num-partitions``; the run
  config's ``dataset`` says what partition ``partition-id`` is:

  - ``dir`` (``npy-dir``) / ``edge-dir``: the partition-id-th ``.npy``/``.csv``/``.parquet``
    / ``*.txt`` file of ``data-dir`` in natural order; ``num-partitions`` (the SuperNodes)
    must be the number of files;
  - ``file``: the rows of ``data-file`` split over ``num-partitions`` by ``partition``
    (``iid``; ``dirichlet``, ``one-source``, ``components`` over ``label-column``'s values;
    ``column``: one device per value of ``label-column``), seed ``seed``;
  - ``gaussian-mixture``: ``num-points`` points of a ``components``-component mixture in
    ``dim`` dimensions (``separation``, seed ``seed``), split over ``num-partitions``
    clients by ``partition`` (``iid``, ``dirichlet`` with ``dirichlet-alpha``,
    ``one-source``, ``components`` with ``classes-per-client``);
  - ``triebe``: Triebe's 1-D toy setup, ``num-partitions`` clients of 10 points;
  - ``digits``: scikit-learn's digits, ``classes-per-client`` classes per client
    (simulation convenience; needs scikit-learn on the simulated device);
  - ``feddp-mixture``: FedDP-KMeans' mixture (Scott et al. 2025, App. G.1): ``num-points``
    split into equal i.i.d. client datasets, ``dim`` dimensions, ``components`` (= k)
    means ~ U[0, 1]^dim, variance 0.5; its server data is :func:`generated_server_points`;
  - ``da-ufl-paper``: DA-UFL's model (Servetnyk et al. 2020): 16 classes of
    ``num-points``/16 points (``class-std``) on a 4 × 4 grid in 2-D, every partition an
    agent at a random position observing each point with probability
    1 − exp(−0.025·SNR/d) (``snr-db``): the partitions overlap and are unbalanced.

Generated datasets are built once per process and cached. NumPy only (except digits).
"""

from __future__ import annotations

import os
import warnings
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

import fedcluster.data as data
from fedcluster.kernel import DeviceData
from fedcluster.tables import DataWarning, column_list


def device_data(run_config: dict[str, Any], node_config: dict[str, Any]) -> DeviceData:
    """Load THIS device's data (see the module docstring)."""
    path = str(node_config.get("data-path", "") or "")
    if path:
        data.refuse_run_folder(Path(path).expanduser().parent)
        return load_path(path, run_config)
    if "partition-id" not in node_config or "num-partitions" not in node_config:
        raise data.DataError(
            "this node has neither a data-path in its node config nor a partition-id/"
            "num-partitions (simulation): start the SuperNode with "
            "--node-config 'data-path=\"/path/to/points.npy\"'"
        )
    partition = int(node_config["partition-id"])
    partitions = int(node_config["num-partitions"])
    dataset = run_config["dataset"]
    if dataset in data.FOLDER_DATASETS:
        file = folder_file(run_config, partition, partitions)
        return load_path(str(file), run_config)
    if dataset == "file":
        points = file_partition(run_config, partition, partitions)
        return DeviceData(points=points, source=f"{run_config['data-file']} partition {partition}/{partitions}")
    points, _ = generated_partition(run_config, partition, partitions)
    if points.shape[0] == 0:
        raise data.DataError(
            f"partition {partition} of {partitions} of dataset {dataset!r} is empty "
            "(too few points for this many clients, or a partition that left it out)"
        )
    return DeviceData(points=points, source=f"{dataset} partition {partition}/{partitions}")


def load_path(path: str, run_config: dict[str, Any]) -> DeviceData:
    """A device's own file: ``.txt`` is an edge list, anything else points."""
    if path.endswith(".txt"):
        from .graph import load_edge_list  # graph data layer

        num_nodes = int(run_config.get("num-nodes", 0) or 0) or None
        return DeviceData(edges=load_edge_list(path, num_nodes), source=path)
    return DeviceData(points=data.load_points(path, column_list(run_config.get("columns", ""))), source=path)


def folder_file(run_config: dict[str, Any], partition: int, partitions: int) -> Path:
    """The file of a folder dataset that simulated device ``partition`` of ``partitions``
    reads; DataError when the SuperNodes are not one per file."""
    files = data.folder_files(run_config["dataset"], run_config["data-dir"])
    if partitions != len(files):
        raise data.DataError(count_mismatch(len(files), f"client files in {run_config['data-dir']}", partitions))
    return data.client_file(run_config["data-dir"], data.FOLDER_DATASETS[run_config["dataset"]], partition)


def count_mismatch(files: int, what: str, nodes: int) -> str:
    """The error of a simulation whose SuperNodes are not one per client's data."""
    return (
        f"{files} {what} but {nodes} SuperNodes: run with --federation-config 'num-supernodes={files}' "
        f"(fedcluster-run: --num-nodes {files})"
    )


def generated_partition(run_config: dict[str, Any], partition: int, partitions: int) -> tuple[np.ndarray, np.ndarray]:
    """Points and true labels of one partition of a generated dataset."""
    if not 0 <= partition < partitions:
        raise data.DataError(f"partition-id {partition} is out of range for {partitions} partitions")
    clients_points, clients_labels = _generated(_spec_key(run_config), partitions)
    return clients_points[partition], clients_labels[partition]


def pooled_points(run_config: dict[str, Any], partitions: int) -> tuple[np.ndarray, np.ndarray | None] | None:
    """All the federation's points, for the central REFERENCE only (never sent anywhere).

    Available for generated datasets, and for ``dir`` and ``file`` when the server can read
    the data (a simulation on one machine): every client file, the whole file; None otherwise.
    """
    dataset = run_config["dataset"]
    if dataset in ("dir", "npy-dir"):
        directory = Path(run_config["data-dir"])
        if not directory.is_dir():
            return None
        columns = column_list(run_config["columns"])
        with warnings.catch_warnings():  # each device said it of its own file
            warnings.simplefilter("ignore", DataWarning)
            files = data.folder_files(dataset, directory)
            return np.concatenate([data.load_points(f, columns) for f in files]), None
    if dataset == "file":
        if not Path(run_config["data-file"]).is_file():
            return None
        return _file_table(_file_key(run_config))[0], None
    if dataset == "edge-dir":
        return None
    clients_points, clients_labels = _generated(_spec_key(run_config), partitions)
    return np.concatenate(clients_points), np.concatenate(clients_labels)


def generated_server_points(run_config: dict[str, Any]) -> np.ndarray | None:
    """Server-side data of a generated dataset that defines one (``feddp-mixture``: 20
    points per component of the clients' mixture plus 100 uniform points in [0, 1]^dim,
    App. G.1), else None. Built from the mixture's parameters, never from client data."""
    if run_config["dataset"] != "feddp-mixture":
        return None
    seed = int(run_config["seed"])
    components = int(run_config["components"]) or int(run_config["k"])
    # feddp_mixture draws the means first, so one client of one point yields the same means.
    _, _, means = data.feddp_mixture(1, 1, int(run_config["dim"]), components, 0.5, seed)
    return data.feddp_server_data(means, 20, 100, 0.5, seed=np.random.default_rng([seed, 2]))


_SPEC_KEYS = (
    "dataset",
    "seed",
    "num-points",
    "dim",
    "components",
    "k",
    "separation",
    "partition",
    "dirichlet-alpha",
    "classes-per-client",
    "snr-db",
    "class-std",
)


def _spec_key(run_config: dict[str, Any]) -> tuple:
    return tuple((key, run_config.get(key)) for key in _SPEC_KEYS)


@lru_cache(maxsize=4)
def _generated(spec: tuple, partitions: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    cfg = dict(spec)
    seed = int(cfg["seed"])
    dataset = cfg["dataset"]
    if dataset == "triebe":
        return data.triebe_clients(num_clients=partitions, seed=seed)
    if dataset == "digits":
        return data.digits_partition(partitions, int(cfg["classes-per-client"]), seed)
    if dataset == "feddp-mixture":
        # Scott et al. 2025, App. G.1: every client draws num-points/partitions points
        # i.i.d. from the whole mixture (means ~ U[0,1]^dim, variance 0.5).
        per_client = int(cfg["num-points"]) // partitions
        if per_client < 1:
            raise data.DataError(
                f"num-points={cfg['num-points']} is fewer than one point per client for {partitions} clients"
            )
        points, labels, _ = data.feddp_mixture(
            partitions, per_client, int(cfg["dim"]), int(cfg["components"]) or int(cfg["k"]), 0.5, seed
        )
        return points, labels
    if dataset == "da-ufl-paper":
        # Servetnyk et al. 2020, Sec. IV: 16 classes of num-points/16 points on the
        # {-7.5,-2.5,2.5,7.5}^2 grid; every partition is an agent that observes a point
        # with probability 1 - exp(-0.025 SNR / distance): overlapping, unbalanced.
        X, y, observed, _ = data.daufl_paper(
            partitions, max(int(cfg["num-points"]) // 16, 1), float(cfg["snr-db"]), seed, std=float(cfg["class-std"])
        )
        return [X[row] for row in observed], [y[row] for row in observed]
    if dataset != "gaussian-mixture":
        raise data.DataError(f"dataset {dataset!r} is not a generated dataset")
    components = int(cfg["components"]) or int(cfg["k"])
    X, y = data.gaussian_mixture(
        int(cfg["num-points"]), int(cfg["dim"]), components, seed, separation=float(cfg["separation"])
    )
    rng = np.random.default_rng([seed, 1])
    scheme = cfg["partition"]
    if scheme == "iid":
        parts = data.partition_iid(X.shape[0], partitions, rng)
    elif scheme == "dirichlet":
        parts = data.partition_dirichlet(y, partitions, float(cfg["dirichlet-alpha"]), rng)
    elif scheme == "one-source":
        parts = data.partition_one_source(y, partitions, rng)
    else:
        parts = data.partition_components(y, partitions, int(cfg["classes-per-client"]), rng)
    return [X[p] for p in parts], [y[p] for p in parts]


def file_partition(run_config: dict[str, Any], partition: int, partitions: int) -> np.ndarray:
    """The rows of ``data-file`` simulated device ``partition`` of ``partitions`` holds."""
    if not 0 <= partition < partitions:
        raise data.DataError(f"partition-id {partition} is out of range for {partitions} partitions")
    points, parts = _file_parts(_file_key(run_config), partitions)
    rows = parts[partition]
    if rows.size == 0:
        raise data.DataError(
            f"partition {partition} of {partitions} of {run_config['data-file']} is empty "
            f"(partition={run_config['partition']!r} gave it no row: fewer devices, or another partition)"
        )
    return points[rows]


def _file_key(run_config: dict[str, Any]) -> tuple:
    """What a split of data-file depends on: the file as it is now, and the keys that split it."""
    path = str(run_config["data-file"])
    try:
        stat = os.stat(path)
        version = (stat.st_mtime_ns, stat.st_size)
    except OSError:
        version = None  # load_table names the problem
    keys = ("columns", "label-column", "partition", "dirichlet-alpha", "classes-per-client", "seed")
    return (path, version, *((key, run_config[key]) for key in keys))


@lru_cache(maxsize=2)
def _file_table(key: tuple) -> tuple[np.ndarray, np.ndarray | None]:
    path, _, *items = key
    cfg = dict(items)
    label = cfg["label-column"] if cfg["partition"] != "iid" else ""
    table = data.load_table(path, column_list(cfg["columns"]), (label,) if label else ())
    return table.points, table.kept.get(label)


@lru_cache(maxsize=2)
def _file_parts(key: tuple, partitions: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """data-file's points and every device's rows (the project's partitioners, seeded)."""
    points, labels = _file_table(key)
    path, _, *items = key
    cfg = dict(items)
    rng = np.random.default_rng([int(cfg["seed"]), 1])
    scheme = cfg["partition"]
    if scheme == "iid":
        return points, data.partition_iid(points.shape[0], partitions, rng)
    if scheme == "column":
        values = np.unique(labels)
        if values.size != partitions:
            what = f"values of label-column {cfg['label-column']!r} in {path}"
            raise data.DataError(count_mismatch(values.size, what, partitions))
        return points, [np.flatnonzero(labels == value) for value in values]
    try:
        if scheme == "dirichlet":
            return points, data.partition_dirichlet(labels, partitions, float(cfg["dirichlet-alpha"]), rng)
        if scheme == "one-source":
            return points, data.partition_one_source(labels, partitions, rng)
        return points, data.partition_components(labels, partitions, int(cfg["classes-per-client"]), rng)
    except ValueError as exc:
        raise data.DataError(f"partition={scheme!r} of {path} by label-column {cfg['label-column']!r}: {exc}") from None
