"""Data in the files people have: a folder of CSV or Parquet files gives the centers the same
data in .npy give (in-process and through the estimator); one file split over simulated
devices; one node per client file, or the run stops naming both numbers; the result says
how many devices' data it covers, and which files no node read."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import fedcluster
from conftest import write_npy_dir
from fedcluster.config import ConfigError
from fedcluster.inprocess import run
from fedcluster.inprocess.grid import InProcessGrid
from fedcluster.server.base import FederationError


def clients(seed=0, n=4, d=3):
    rng = np.random.default_rng(seed)
    return [rng.normal(size=(40 + 5 * i, d)) + 6.0 * (i % 3) for i in range(n)]


def write_csv_dir(folder, arrays):
    """One CSV per client: a header, a numeric id, a text column with a quoted comma, then
    the features in full precision."""
    folder.mkdir(parents=True)
    for i, array in enumerate(arrays):
        lines = ["id,name," + ",".join(f"f{j}" for j in range(array.shape[1]))]
        lines += [f'{row},"client {i}, row {row}",' + ",".join(map(repr, map(float, x))) for row, x in enumerate(array)]
        (folder / f"client_{i}.csv").write_text("\n".join(lines) + "\n")
    return folder


def write_parquet_dir(folder, arrays):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    folder.mkdir(parents=True)
    for i, array in enumerate(arrays):
        columns = {"name": [f"row {r}" for r in range(array.shape[0])]}
        columns.update({f"f{j}": array[:, j] for j in range(array.shape[1])})
        pq.write_table(pa.table(columns), folder / f"client_{i}.parquet")
    return folder


def base(tmp_path, folder, name, **extra):
    return {"k": 3, "num-rounds": 5, "seed": 2, "dataset": "dir", "data-dir": str(folder),
            "output-dir": str(tmp_path / name), **extra}  # fmt: skip


def test_csv_and_parquet_folders_give_the_npy_folders_centers(tmp_path):
    arrays = clients()
    npy = run(base(tmp_path, write_npy_dir(tmp_path / "npy", arrays), "o-npy", dataset="npy-dir"), num_nodes=4)
    features = "f0,f1,f2"
    csv = run(base(tmp_path, write_csv_dir(tmp_path / "csv", arrays), "o-csv", columns=features), num_nodes=4)
    with pytest.warns(match="text column"):  # the devices name the text column they leave out
        parquet = run(base(tmp_path, write_parquet_dir(tmp_path / "pq", arrays), "o-pq"), num_nodes=4)
    centers = np.load(tmp_path / "o-npy" / "centers.npy")
    for name in ("o-csv", "o-pq"):
        np.testing.assert_array_equal(np.load(tmp_path / name / "centers.npy"), centers)
    for result in (npy, csv, parquet):  # the data are on this machine: the central comparison is made
        assert result["reference"]["num_points"] == sum(a.shape[0] for a in arrays)
        assert result["coverage"] == {"devices": 4, "of": 4, "refused": [], "unread_files": []}


def test_the_estimator_reads_a_folder_of_csv_or_parquet_files(tmp_path):
    arrays = [a[:, :2] for a in clients()]
    model = fedcluster.FederatedKMeans(3, random_state=5, max_iter=4)
    centers = model.fit(arrays).cluster_centers_
    folders = [write_parquet_dir(tmp_path / "pq", arrays), tmp_path / "csv"]
    write_npy_dir(folders[1], [np.column_stack([np.arange(a.shape[0]), a]) for a in arrays])  # .npy beside .csv
    for i, array in enumerate(arrays):
        np.savetxt(folders[1] / f"client_{i + 10}.csv", array, delimiter=",", header="x,y", comments="", fmt="%.17g")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        np.testing.assert_array_equal(model.fit(folders[0]).cluster_centers_, centers)
    with pytest.raises(ValueError, match=r"client_10\.csv has 2 features, .*client_000\.npy has 3"):
        model.fit(folders[1])  # a mixed folder: every file one client, all of one dimension


def test_a_csv_folder_with_a_text_column_and_no_columns_key_runs_on_the_numeric_ones(tmp_path):
    arrays = clients()
    folder = write_csv_dir(tmp_path / "csv", arrays)
    with pytest.warns(match=r"text column\(s\) 'name' left out"):
        result = run(base(tmp_path, folder, "o"), num_nodes=4)
    assert result["coverage"]["devices"] == 4
    assert np.load(tmp_path / "o" / "centers.npy").shape == (3, 4)  # id, f0, f1, f2: the id is a number
    with pytest.raises(FederationError, match=r"column 'name' named in run-config columns is not numeric"):
        run(base(tmp_path, folder, "o2", columns="f0,name"), num_nodes=4)


def test_a_simulation_with_fewer_supernodes_than_files_stops_naming_both_numbers(tmp_path):
    """What a flwr simulation's devices are told (partition-id of num-partitions = the
    SuperNodes): each refuses, and the run fails with the numbers and the remedy."""
    folder = write_csv_dir(tmp_path / "csv", clients())
    nodes = [{"partition-id": i, "num-partitions": 2} for i in range(2)]
    hint = r"4 client files in .*csv but 2 SuperNodes: run with --federation-config 'num-supernodes=4'"
    with pytest.raises(FederationError, match=hint):
        run(base(tmp_path, folder, "o", columns="f0,f1,f2"), node_configs=nodes)
    with pytest.raises(ConfigError, match=r"4 client files in .*csv but 2 nodes: run with --num-nodes 4"):
        run(base(tmp_path, folder, "o", columns="f0,f1,f2"), num_nodes=2)


def test_the_server_refuses_a_settled_count_of_nodes_other_than_the_files(tmp_path):
    """min-nodes = 0 (a flwr simulation): the nodes counted once their number settled are
    the SuperNodes, checked against the files before any is asked."""
    from fedcluster.client.app import app as client_app
    from fedcluster.server.app import run_algorithm

    folder = write_npy_dir(tmp_path / "npy", clients(n=3))
    nodes = [{"partition-id": i, "num-partitions": 5} for i in range(5)]
    config = {**base(tmp_path, folder, "o"), "node-settle-s": 0.1}
    grid = InProcessGrid(client_app, config, nodes)
    with pytest.raises(FederationError, match=r"3 client files in .*npy but 5 SuperNodes"):
        run_algorithm(grid, config, journal=False)


def test_the_coverage_line_names_the_refused_file_and_its_row(tmp_path, caplog):
    arrays = clients()
    arrays[3] = arrays[3].copy()
    arrays[3][12, 1] = np.nan
    folder = write_csv_dir(tmp_path / "csv", arrays)
    caplog.set_level("INFO")
    result = run(base(tmp_path, folder, "o", columns="f0,f1,f2"), num_nodes=4)
    assert result["coverage"]["devices"] == 3 and result["coverage"]["of"] == 4
    summary = next(r.getMessage() for r in caplog.records if "result covers" in r.getMessage())
    first = summary.splitlines()[0]
    assert first.startswith("[fedcluster] result covers 3 of 4 devices' data (1 refused: 1003: data file ")
    assert "client_3.csv has 1 of 55 rows with NaN" in first and "row 12" in first


@pytest.mark.parametrize(
    "text, reason",
    [("", "is empty"), ("x,y\n", "is empty"), ("f0,f1,f2\n1,2,what\n3,4,5\n", "line 2: non-numeric")],
)
def test_an_empty_or_unreadable_client_file_is_named_in_the_coverage(tmp_path, text, reason):
    folder = write_csv_dir(tmp_path / "csv", clients(n=3))
    (folder / "client_1.csv").write_text(text)
    result = run(base(tmp_path, folder, "o", columns="f0,f1,f2"), num_nodes=3)
    (refused,) = result["coverage"]["refused"]
    assert result["coverage"]["devices"] == 2 and "client_1.csv" in refused and reason in refused


def test_the_files_no_node_read_are_named_by_the_partitions_the_nodes_stated(tmp_path):
    """Nodes holding files 0, 2 and 3 of four: file 1 is the one no node read (the warning
    named the last files, as if nodes always held the first ones)."""
    folder = write_npy_dir(tmp_path / "npy", clients())
    nodes = [{"partition-id": i, "num-partitions": 4} for i in (0, 2, 3)]
    result = run(base(tmp_path, folder, "o"), node_configs=nodes)
    assert result["coverage"] == {"devices": 3, "of": 4, "refused": [], "unread_files": ["client_001.npy"]}


# ------------------------------------------------------------------ one file, split
def write_labelled(tmp_path):
    rng = np.random.default_rng(3)
    species = np.repeat(["ant", "bee", "cat"], 40)
    X = rng.normal(size=(120, 2)) + np.repeat([[0, 0], [8, 0], [0, 8]], 40, axis=0)
    lines = ["x,species,y"] + [f"{float(a)!r},{s},{float(b)!r}" for (a, b), s in zip(X, species)]
    (tmp_path / "all.csv").write_text("\n".join(lines) + "\n")
    return tmp_path / "all.csv", X, species


@pytest.mark.parametrize("partition", ["iid", "dirichlet", "column"])
def test_one_file_is_split_over_the_devices_by_the_named_partitioner(tmp_path, partition):
    from fedcluster.node_data import device_data, pooled_points
    from fedcluster.config import with_defaults

    path, X, species = write_labelled(tmp_path)
    config = with_defaults(
        {
            "dataset": "file",
            "data-file": str(path),
            "partition": partition,
            "dirichlet-alpha": 0.1,
            "label-column": "" if partition == "iid" else "species",
        }  # fmt: skip
    )
    parts = [device_data(config, {"partition-id": i, "num-partitions": 3}).points for i in range(3)]
    together = np.concatenate(parts)
    assert together.shape == X.shape  # every row once, the label column no feature
    np.testing.assert_array_equal(np.unique(together, axis=0), np.unique(X, axis=0))
    np.testing.assert_array_equal(pooled_points(config, 3)[0], X)
    if partition == "column":  # one device per species, in their sorted order
        for part, value in zip(parts, ("ant", "bee", "cat")):
            np.testing.assert_array_equal(np.sort(part, axis=0), np.sort(X[species == value], axis=0))
    result = run({**config, "k": 3, "num-rounds": 3, "output-dir": str(tmp_path / "o")}, num_nodes=3)
    assert result["final"]["num_points"] == 120 and result["reference"]["num_points"] == 120


def test_a_column_partition_with_another_count_of_values_names_both(tmp_path):
    path, _, _ = write_labelled(tmp_path)
    config = {"dataset": "file", "data-file": str(path), "partition": "column", "label-column": "species", "k": 2}
    with pytest.raises(FederationError, match=r"3 values of label-column 'species' in .*all\.csv but 2 SuperNodes"):
        run({**config, "output-dir": str(tmp_path / "o")}, num_nodes=2)
    with pytest.raises(ConfigError, match="needs run-config label-column"):
        run({**config, "label-column": ""}, num_nodes=3)
