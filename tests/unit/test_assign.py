"""fedcluster-assign: a device labels its own points with a run's centers."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fedcluster.tools.assign import main


def run_folder(tmp_path, centers):
    folder = tmp_path / "run"
    folder.mkdir()
    np.save(folder / "centers.npy", np.asarray(centers, dtype=np.float64))
    return folder


def test_labels_are_the_nearest_centers_written_beside_the_points(tmp_path, capsys):
    folder = run_folder(tmp_path, [[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]])
    points = np.array([[1.0, 1.0], [9.0, 1.0], [0.0, 7.0], [6.0, 0.0], [-3.0, 4.0]])
    np.save(tmp_path / "mine.npy", points)
    assert main([str(folder), str(tmp_path / "mine.npy")]) == 0
    np.testing.assert_array_equal(np.load(tmp_path / "fedcluster-labels" / "mine.npy"), [0, 1, 2, 1, 0])
    summary = json.loads(capsys.readouterr().out)
    assert summary["points"] == 5 and summary["cluster_sizes"] == {"0": 2, "1": 2, "2": 1}


def test_existing_labels_are_not_overwritten_without_asking(tmp_path, capsys):
    folder = run_folder(tmp_path, [[0.0], [5.0]])
    np.save(tmp_path / "p.npy", np.array([[1.0], [4.0]]))
    (tmp_path / "fedcluster-labels").mkdir()
    np.save(tmp_path / "fedcluster-labels" / "p.npy", np.array([7, 7]))
    assert main([str(folder), str(tmp_path / "p.npy")]) == 2  # an argument (the default --out) refused
    assert "--overwrite" in capsys.readouterr().err
    np.testing.assert_array_equal(np.load(tmp_path / "fedcluster-labels" / "p.npy"), [7, 7])
    assert main([str(folder), str(tmp_path / "p.npy"), "--overwrite"]) == 0
    np.testing.assert_array_equal(np.load(tmp_path / "fedcluster-labels" / "p.npy"), [0, 1])


@pytest.mark.parametrize(
    "setup,message",
    [
        ("missing", "is not a folder"),
        ("empty", "centers.npy does not exist"),
        ("graph", "graph run"),
        ("dimension", "dimension 3"),
        ("huge", "would overflow float64"),
        ("scale-zero", "scale finite and positive"),
        ("scale-tiny", "below 1e-150"),
        ("scale-length", "standardize record has 3 features"),
        ("record-list", "holds a JSON list"),
        ("record-text", "must hold the lists"),
        ("deep", "not readable JSON"),
    ],
)
def test_errors_name_the_problem(setup, message, tmp_path, capsys):
    np.save(tmp_path / "p.npy", np.zeros((4, 2)))
    folder = tmp_path / "run"
    if setup != "missing":
        folder.mkdir()
    if setup == "graph":
        np.save(folder / "labels.npy", np.zeros(10, dtype=np.int64))
    if setup == "dimension":
        np.save(folder / "centers.npy", np.zeros((2, 3)))
    if setup == "huge":  # distances overflow: every point would be labelled 0
        np.save(folder / "centers.npy", np.array([[1e300, 0.0], [-1e300, 0.0]]))
    if setup.startswith(("scale", "record", "deep")):  # a hand-edited result.json beside good centers
        np.save(folder / "centers.npy", np.array([[0.0, 0.0], [1.0, 1.0]]))
        records = {
            "scale-zero": {"standardize": {"mean": [0, 0], "scale": [0, 1]}},  # every label 0, once
            "scale-tiny": {"standardize": {"mean": [0, 0], "scale": [1e-300, 1]}},
            "scale-length": {"standardize": {"mean": [0, 0, 0], "scale": [1, 1, 1]}},
            "record-list": [1, 2],
            "record-text": {"standardize": "yes"},
        }
        text = "[" * 100_000 + "]" * 100_000 if setup == "deep" else json.dumps(records[setup])
        (folder / "result.json").write_text(text)
    assert main([str(folder), str(tmp_path / "p.npy")]) == 1
    assert message in capsys.readouterr().err
    assert not (tmp_path / "fedcluster-labels").exists()


def test_labels_never_land_where_a_data_folder_listing_reads_them(tmp_path):
    from fedcluster.data import list_client_files

    folder = run_folder(tmp_path, [[0.0], [5.0]])
    data = tmp_path / "data"
    data.mkdir()
    np.save(data / "client_0.npy", np.array([[1.0], [4.0]]))
    np.savetxt(data / "client_1.csv", np.array([[1.0], [4.0]]), delimiter=",")
    assert main([str(folder), str(data / "client_0.npy")]) == 0
    assert main([str(folder), str(data / "client_1.csv")]) == 0
    assert [f.name for f in list_client_files(data)] == ["client_0.npy"]
    assert sorted(p.name for p in (data / "fedcluster-labels").iterdir()) == ["client_0.npy", "client_1_csv.npy"]
