"""Loaders, generators and partitioners of fedcluster.data."""

from __future__ import annotations

import ast
import inspect

import numpy as np
import pytest

from fedcluster import data
from fedcluster.data import DataError


# --- Loaders -------------------------------------------------------------------------


def test_load_npy_round_trip(tmp_path):
    points = np.random.default_rng(0).normal(size=(7, 3))
    np.save(tmp_path / "client.npy", points)
    loaded = data.load_points(tmp_path / "client.npy")
    assert loaded.dtype == np.float64
    np.testing.assert_array_equal(loaded, points)


def test_load_integer_npy_becomes_float(tmp_path):
    np.save(tmp_path / "ints.npy", np.arange(6, dtype=np.int32).reshape(3, 2))
    loaded = data.load_points(str(tmp_path / "ints.npy"))
    assert loaded.dtype == np.float64
    np.testing.assert_array_equal(loaded, [[0, 1], [2, 3], [4, 5]])


def test_one_dimensional_npy_is_one_feature(tmp_path):
    np.save(tmp_path / "line.npy", np.array([1.0, 2.0, 3.0]))
    loaded = data.load_points(tmp_path / "line.npy")
    assert loaded.shape == (3, 1)
    np.testing.assert_array_equal(loaded[:, 0], [1.0, 2.0, 3.0])


def test_csv_without_header(tmp_path):
    (tmp_path / "plain.csv").write_text("1,2\n3.5,-4e1\n\n5,6\n")
    np.testing.assert_array_equal(data.load_points(tmp_path / "plain.csv"), [[1, 2], [3.5, -40], [5, 6]])


def test_csv_with_header_is_skipped(tmp_path):
    (tmp_path / "header.csv").write_text("x,y\n1,2\n3,4\n")
    np.testing.assert_array_equal(data.load_points(tmp_path / "header.csv"), [[1, 2], [3, 4]])


def test_one_column_csv_is_one_feature(tmp_path):
    (tmp_path / "column.csv").write_text("value\n1\n2\n")
    assert data.load_points(tmp_path / "column.csv").shape == (2, 1)


def test_missing_file_names_the_file(tmp_path):
    with pytest.raises(DataError, match="nowhere.npy.*does not exist"):
        data.load_points(tmp_path / "nowhere.npy")


def test_data_error_is_a_value_error():
    assert issubclass(DataError, ValueError)


def test_nan_file_reports_count_and_first_row(tmp_path):
    points = np.ones((6, 2))
    points[2, 1] = np.nan
    points[4, 0] = np.inf
    np.save(tmp_path / "bad.npy", points)
    with pytest.raises(DataError, match=r"bad\.npy has 2 of 6 rows with NaN or infinite.*row 2") as error:
        data.load_points(tmp_path / "bad.npy")
    assert "bad.npy" in str(error.value)


def test_nan_in_csv(tmp_path):
    (tmp_path / "nan.csv").write_text("1,2\nnan,3\n")
    with pytest.raises(DataError, match=r"nan\.csv has 1 of 2 rows.*row 1"):
        data.load_points(tmp_path / "nan.csv")


@pytest.mark.parametrize("shape", [(0, 3), (4, 0), (0,)])
def test_empty_npy(tmp_path, shape):
    np.save(tmp_path / "empty.npy", np.zeros(shape))
    with pytest.raises(DataError, match=r"empty\.npy is empty"):
        data.load_points(tmp_path / "empty.npy")


@pytest.mark.parametrize("text", ["", "\n\n", "a,b\n"])
def test_empty_csv(tmp_path, text):
    (tmp_path / "empty.csv").write_text(text)
    with pytest.raises(DataError, match=r"empty\.csv is empty"):
        data.load_points(tmp_path / "empty.csv")


def test_three_dimensional_npy_is_rejected(tmp_path):
    np.save(tmp_path / "cube.npy", np.zeros((2, 3, 4)))
    with pytest.raises(DataError, match=r"cube\.npy holds an array of shape \(2, 3, 4\)"):
        data.load_points(tmp_path / "cube.npy")


def test_scalar_npy_is_rejected(tmp_path):
    np.save(tmp_path / "scalar.npy", np.float64(3.0))
    with pytest.raises(DataError, match=r"scalar\.npy holds an array of shape \(\)"):
        data.load_points(tmp_path / "scalar.npy")


def test_string_npy_is_rejected(tmp_path):
    np.save(tmp_path / "words.npy", np.array([["a", "b"]]))
    with pytest.raises(DataError, match=r"words\.npy holds values of type"):
        data.load_points(tmp_path / "words.npy")


def test_object_npy_is_rejected(tmp_path):
    np.save(tmp_path / "objects.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(DataError, match=r"objects\.npy is not a readable numeric \.npy"):
        data.load_points(tmp_path / "objects.npy")


def test_corrupt_npy_is_rejected(tmp_path):
    (tmp_path / "corrupt.npy").write_bytes(b"this is not numpy")
    with pytest.raises(DataError, match=r"corrupt\.npy"):
        data.load_points(tmp_path / "corrupt.npy")


def test_non_numeric_csv_row_names_file_and_line(tmp_path):
    (tmp_path / "words.csv").write_text("x,y\n1,2\n3,oops\n")
    with pytest.raises(DataError, match=r"words\.csv, line 3: non-numeric"):
        data.load_points(tmp_path / "words.csv")


def test_ragged_csv_names_file_and_line(tmp_path):
    (tmp_path / "ragged.csv").write_text("1,2\n3,4,5\n")
    with pytest.raises(DataError, match=r"ragged\.csv, line 2: expected 2 comma-separated values, found 3"):
        data.load_points(tmp_path / "ragged.csv")


def test_unsupported_suffix(tmp_path):
    (tmp_path / "points.txt").write_text("1 2\n")
    with pytest.raises(DataError, match=r"points\.txt has unsupported type '\.txt'"):
        data.load_points(tmp_path / "points.txt")


def test_directory_is_not_a_data_file(tmp_path):
    (tmp_path / "folder.npy").mkdir()
    with pytest.raises(DataError, match=r"folder\.npy is not a regular file"):
        data.load_points(tmp_path / "folder.npy")


# --- Client files --------------------------------------------------------------------


def test_list_client_files_natural_order(tmp_path):
    for index in (10, 2, 0, 1):
        np.save(tmp_path / f"client_{index}.npy", np.zeros((1, 1)))
    (tmp_path / "notes.txt").write_text("ignored")
    names = [path.name for path in data.list_client_files(tmp_path, "client_*.npy")]
    assert names == ["client_0.npy", "client_1.npy", "client_2.npy", "client_10.npy"]


def test_list_client_files_missing_directory(tmp_path):
    with pytest.raises(DataError, match=r"no_such_dir does not exist"):
        data.list_client_files(tmp_path / "no_such_dir", "*.npy")


def test_list_client_files_without_match(tmp_path):
    (tmp_path / "a.csv").write_text("1\n")
    with pytest.raises(DataError, match=r"no file matching '\*\.npy'"):
        data.list_client_files(tmp_path, "*.npy")


def test_a_folder_of_point_files_lists_npy_csv_and_parquet_in_natural_order(tmp_path):
    for name in ("c10.csv", "c2.npy", "c1.parquet", "notes.txt", "c3.CSV"):
        (tmp_path / name).write_text("1,2\n")
    assert [f.name for f in data.folder_files("dir", tmp_path)] == ["c1.parquet", "c2.npy", "c3.CSV", "c10.csv"]
    assert data.folder_files("npy-dir", tmp_path) == data.folder_files("dir", tmp_path)  # the earlier name


def test_a_folder_without_point_files_says_what_it_holds(tmp_path):
    (tmp_path / "a.txt").write_text("0 1\n")
    with pytest.raises(DataError, match=r"holds 1 \.txt files\): dataset='dir' reads one \.npy, \.csv or \.parquet"):
        data.folder_files("dir", tmp_path)


def test_client_file_picks_by_partition_id_and_reports_range(tmp_path):
    for index in range(3):
        np.save(tmp_path / f"part{index}.npy", np.full((1, 1), index))
    assert data.client_file(tmp_path, "part*.npy", 2).name == "part2.npy"
    with pytest.raises(DataError, match=r"partition id 3 is out of range.*has 3 client files"):
        data.client_file(tmp_path, "part*.npy", 3)
    with pytest.raises(DataError, match=r"partition id -1 is out of range"):
        data.client_file(tmp_path, "part*.npy", -1)


# --- Generators ----------------------------------------------------------------------


def assert_same_lists(first, second):
    assert len(first) == len(second)
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a, b)


def test_triebe_clients_paper_setup():
    clients, labels = data.triebe_clients(seed=0)
    assert len(clients) == 50 and len(labels) == 50
    assert all(points.shape == (10, 1) for points in clients)
    # round robin: client i draws from Gaussian i % 5, ten clients per Gaussian
    np.testing.assert_array_equal([label[0] for label in labels], np.arange(50) % 5)
    assert all(np.all(label == label[0]) for label in labels)
    pooled = np.concatenate(clients)[:, 0]
    pooled_labels = np.concatenate(labels)
    for source, mean in enumerate([1, 2, 3, 4, 5]):
        values = pooled[pooled_labels == source]
        assert abs(values.mean() - mean) < 0.1  # standard error 0.2 / sqrt(100) = 0.02
        assert 0.15 < values.std() < 0.25


def test_triebe_clients_random_sources_and_determinism():
    first = data.triebe_clients(seed=4, source_assignment="random")
    second = data.triebe_clients(seed=4, source_assignment="random")
    other = data.triebe_clients(seed=5, source_assignment="random")
    assert_same_lists(first[0], second[0])
    assert_same_lists(first[1], second[1])
    assert not np.array_equal(np.concatenate(first[0]), np.concatenate(other[0]))


def test_gaussian_mixture_shapes_separation_and_determinism():
    X, y = data.gaussian_mixture(2000, 200, 8, seed=1, separation=30.0, std=1.0)
    assert X.shape == (2000, 200) and y.shape == (2000,)
    assert set(np.unique(y)) == set(range(8))
    means = np.array([X[y == j].mean(axis=0) for j in range(8)])
    pairwise = [np.linalg.norm(means[i] - means[j]) for i in range(8) for j in range(i + 1, 8)]
    assert np.mean(pairwise) == pytest.approx(30.0, rel=0.1)
    within = X - means[y]
    assert within.std() == pytest.approx(1.0, rel=0.05)
    X2, y2 = data.gaussian_mixture(2000, 200, 8, seed=1, separation=30.0)
    np.testing.assert_array_equal(X, X2)
    np.testing.assert_array_equal(y, y2)
    X3, _ = data.gaussian_mixture(2000, 200, 8, seed=2, separation=30.0)
    assert not np.array_equal(X, X3)


def test_gaussian_mixture_weights():
    _, y = data.gaussian_mixture(20000, 2, 3, seed=0, weights=[1, 0, 3])
    counts = np.bincount(y, minlength=3) / 20000
    assert counts[1] == 0
    assert counts[0] == pytest.approx(0.25, abs=0.02)


def test_mixture_means_pairwise_distance_is_separation():
    means = data.mixture_means(40, 500, 12.0, seed=3)
    differences = means[:, None, :] - means[None, :, :]
    distances = np.linalg.norm(differences, axis=2)[np.triu_indices(40, 1)]
    assert distances.mean() == pytest.approx(12.0, rel=0.02)


@pytest.mark.parametrize("d,k,k_prime,m0", [(100, 16, 4, 5), (20, 10, 3, 2)])
def test_kfed_mixture_structure(d, k, k_prime, m0):
    points, labels = data.kfed_mixture(d, k, k_prime, m0, points_per_component=50, separation=20.0, seed=0)
    number_of_groups = -(-k // k_prime)
    assert len(points) == len(labels) == number_of_groups * m0
    all_labels = np.concatenate(labels)
    np.testing.assert_array_equal(np.bincount(all_labels), np.full(k, 50))
    for device, (device_points, device_labels) in enumerate(zip(points, labels)):
        assert device_points.shape == (device_labels.size, d)
        group = device // m0
        expected = set(range(group * k_prime, min((group + 1) * k_prime, k)))
        assert set(np.unique(device_labels)) == expected
        # each device gets 1/m0 of each of its components' points
        assert np.all(np.abs(np.bincount(device_labels)[sorted(expected)] - 50 / m0) <= 1)


def test_kfed_mixture_components_are_unit_gaussians_around_separated_means():
    points, labels = data.kfed_mixture(300, 9, 3, 2, points_per_component=400, separation=50.0, seed=2)
    X, y = np.concatenate(points), np.concatenate(labels)
    means = np.array([X[y == j].mean(axis=0) for j in range(9)])
    assert (X - means[y]).std() == pytest.approx(1.0, rel=0.02)
    distances = np.linalg.norm(means[:, None] - means[None], axis=2)[np.triu_indices(9, 1)]
    assert distances.mean() == pytest.approx(50.0, rel=0.05)


def test_kfed_mixture_deterministic():
    first = data.kfed_mixture(10, 4, 2, 3, 30, 10.0, seed=7)
    second = data.kfed_mixture(10, 4, 2, 3, 30, 10.0, seed=7)
    assert_same_lists(first[0], second[0])
    assert_same_lists(first[1], second[1])
    third = data.kfed_mixture(10, 4, 2, 3, 30, 10.0, seed=8)
    assert not np.array_equal(first[0][0], third[0][0])


def test_feddp_mixture_and_server_data():
    points, labels, means = data.feddp_mixture(20, 500, seed=0)
    assert len(points) == 20 and points[0].shape == (500, 100) and means.shape == (10, 100)
    assert means.min() >= 0 and means.max() <= 1
    X, y = np.concatenate(points), np.concatenate(labels)
    assert (X - means[y]).var() == pytest.approx(0.5, rel=0.02)
    assert np.bincount(y, minlength=10).min() > 800  # equal weights: about 1000 each
    server = data.feddp_server_data(means, seed=1)
    assert server.shape == (300, 100)
    uniform_part = server[200:]
    assert uniform_part.min() >= 0 and uniform_part.max() <= 1
    within = server[:200] - np.repeat(means, 20, axis=0)
    assert within.var() == pytest.approx(0.5, rel=0.05)
    again = data.feddp_mixture(20, 500, seed=0)
    assert_same_lists(points, again[0])
    np.testing.assert_array_equal(server, data.feddp_server_data(means, seed=1))


# --- Partitioners --------------------------------------------------------------------


def assert_exact_cover(parts, n):
    joined = np.concatenate(parts) if parts else np.empty(0, int)
    assert joined.size == n
    np.testing.assert_array_equal(np.sort(joined), np.arange(n))


@pytest.mark.parametrize("n,num_clients", [(100, 7), (5, 8), (0, 3), (64, 64)])
def test_partition_iid_covers_and_balances(n, num_clients):
    parts = data.partition_iid(n, num_clients, np.random.default_rng(0))
    assert len(parts) == num_clients
    assert_exact_cover(parts, n)
    sizes = [part.size for part in parts]
    assert max(sizes) - min(sizes) <= 1


def test_partition_iid_is_random_and_deterministic():
    first = data.partition_iid(50, 5, np.random.default_rng(1))
    assert_same_lists(first, data.partition_iid(50, 5, np.random.default_rng(1)))
    assert not np.array_equal(first[0], np.arange(10))


def label_purity(labels, parts):
    """Mean over clients of the fraction of the client's points with its most common label."""
    return np.mean([np.bincount(labels[part]).max() / part.size for part in parts if part.size])


@pytest.mark.parametrize("alpha", [0.01, 0.3, 5.0])
def test_partition_dirichlet_covers_and_leaves_no_client_empty(alpha):
    labels = np.random.default_rng(0).integers(10, size=300)
    parts = data.partition_dirichlet(labels, 40, alpha, np.random.default_rng(3))
    assert len(parts) == 40
    assert_exact_cover(parts, 300)
    assert min(part.size for part in parts) >= 1


def test_partition_dirichlet_skew_grows_as_alpha_shrinks():
    labels = np.random.default_rng(0).integers(10, size=5000)
    purity = {
        alpha: np.mean(
            [
                label_purity(labels, data.partition_dirichlet(labels, 20, alpha, np.random.default_rng(seed)))
                for seed in range(5)
            ]
        )
        for alpha in (0.05, 0.5, 100.0)
    }
    assert purity[0.05] > purity[0.5] > purity[100.0]
    assert purity[0.05] > 0.6  # with 20 clients and 10 labels, a client usually holds 1-2 labels
    assert purity[100.0] < 0.2  # close to i.i.d.: about 1/10 plus sampling noise


def test_partition_one_source_gives_one_label_per_client():
    labels = np.repeat(np.arange(5), [100, 50, 30, 10, 10])
    labels = np.random.default_rng(1).permutation(labels)
    parts = data.partition_one_source(labels, 20, np.random.default_rng(2))
    assert len(parts) == 20
    assert_exact_cover(parts, labels.size)
    held = [np.unique(labels[part]) for part in parts]
    assert all(values.size == 1 for values in held)
    assert set(np.concatenate(held)) == set(range(5))
    # clients are shared in proportion to label sizes, so client sizes stay close
    sizes = np.array([part.size for part in parts])
    assert sizes.max() <= 2 * sizes.min()


def test_partition_one_source_rejects_too_few_clients():
    with pytest.raises(ValueError, match="at least as many clients as labels"):
        data.partition_one_source(np.arange(6) % 3, 2, np.random.default_rng(0))


@pytest.mark.parametrize("num_clients,components", [(10, 2), (7, 3), (4, 10), (30, 1)])
def test_partition_components_gives_exact_label_count(num_clients, components):
    labels = np.random.default_rng(5).integers(10, size=2000)
    parts = data.partition_components(labels, num_clients, components, np.random.default_rng(6))
    assert len(parts) == num_clients
    assert_exact_cover(parts, labels.size)
    assert all(np.unique(labels[part]).size == components for part in parts)


def test_partition_components_rejects_impossible_cover():
    with pytest.raises(ValueError, match="cannot cover"):
        data.partition_components(np.arange(100) % 10, 3, 2, np.random.default_rng(0))


def test_partitioners_accept_int_seeds():
    labels = np.arange(40) % 4
    assert_same_lists(
        data.partition_dirichlet(labels, 5, 0.5, 9), data.partition_dirichlet(labels, 5, 0.5, np.random.default_rng(9))
    )


def test_digits_partition_classes_per_client():
    pytest.importorskip("sklearn")
    for classes in (1, 2):
        points, labels = data.digits_partition(20, classes, seed=0)
        assert len(points) == 20
        assert sum(part.shape[0] for part in points) == 1797
        assert all(part.shape[1] == 64 for part in points)
        assert all(np.unique(label).size == classes for label in labels)
    again = data.digits_partition(20, 2, seed=0)
    assert_same_lists(points, again[0])


def test_data_module_imports_only_numpy_at_top():
    tree = ast.parse(inspect.getsource(data))
    names = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module.split(".")[0])
    assert names <= {"__future__", "os", "re", "pathlib", "typing", "numpy"}


def test_a_folder_is_listed_once_until_a_file_comes_or_goes(tmp_path, monkeypatch):
    """Every simulated device of a process asks for the same folder's listing: it is read
    from the folder once, and again only when a file is added or removed."""
    import os
    from pathlib import Path

    from fedcluster.data import list_client_files

    for i in range(3):
        np.save(tmp_path / f"client_{i}.npy", np.zeros((2, 2)))
    reads = []
    iterdir = Path.iterdir
    monkeypatch.setattr(Path, "iterdir", lambda self: reads.append(self) or iterdir(self))
    first = list_client_files(tmp_path, None)
    assert [list_client_files(tmp_path, None) for _ in range(5)] == [first] * 5 and len(reads) == 1
    np.save(tmp_path / "client_3.npy", np.zeros((2, 2)))
    os.utime(tmp_path, ns=(1, os.stat(tmp_path).st_mtime_ns + 1000))  # a coarse clock still sees a change
    assert [p.name for p in list_client_files(tmp_path, None)][-1] == "client_3.npy" and len(reads) == 2
    (tmp_path / "client_0.npy").unlink()
    os.utime(tmp_path, ns=(1, os.stat(tmp_path).st_mtime_ns + 1000))
    assert "client_0.npy" not in [p.name for p in list_client_files(tmp_path, None)]
