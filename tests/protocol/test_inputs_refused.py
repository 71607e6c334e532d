"""Bad inputs are refused before any work, with the problem named; nothing is silently
overwritten; a degenerate but valid data set finishes cleanly."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import write_npy_dir
from fedcluster.config import ConfigError
from fedcluster.inprocess import run
from fedcluster.server.base import FederationError


def blobs(tmp_path, scale=1.0, name="data"):
    rng = np.random.default_rng(0)
    return write_npy_dir(tmp_path / name, [scale * (rng.normal(size=(30, 2)) + 5 * i) for i in range(3)])


def config(data, out, **extra):
    return {"k": 2, "num-rounds": 2, "dataset": "npy-dir", "data-dir": str(data), "output-dir": str(out), **extra}


def test_an_output_dir_that_is_a_file_is_refused_before_any_phase(tmp_path):
    target = tmp_path / "taken"
    target.write_text("not a folder")
    with pytest.raises(FederationError, match="is a file, not a folder"):
        run(config(blobs(tmp_path), target), num_nodes=3)
    with pytest.raises(FederationError, match="cannot be written"):
        run(config(blobs(tmp_path), target / "below"), num_nodes=3)
    assert target.read_text() == "not a folder"


def test_an_output_dir_inside_the_data_folder_is_refused(tmp_path):
    data = blobs(tmp_path)
    with pytest.raises(FederationError, match="inside the data folder"):
        run(config(data, data / "results"), num_nodes=3)
    assert sorted(p.name for p in data.iterdir()) == ["client_000.npy", "client_001.npy", "client_002.npy"]


def test_a_previous_result_is_never_silently_overwritten(tmp_path):
    data, out = blobs(tmp_path), tmp_path / "out"
    first = run(config(data, out, seed=1), num_nodes=3)
    assert first["output_dir"] == str(out.resolve())
    with pytest.raises(FederationError, match="holds a finished run.*overwrite=true"):
        run(config(data, out, seed=2), num_nodes=3)
    assert json.loads((out / "result.json").read_text())["config"]["seed"] == 1  # untouched
    third = run(config(data, out, seed=3, overwrite=True), num_nodes=3)
    assert third["output_dir"] == str(out.resolve())
    assert json.loads((out / "result.json").read_text())["config"]["seed"] == 3


def test_a_folder_holding_files_the_run_did_not_write_is_never_written_into(tmp_path):
    data, out = blobs(tmp_path), tmp_path / "mine"
    out.mkdir()
    np.save(out / "centers.npy", np.arange(4.0))  # the user's own
    for extra in ({}, {"overwrite": True}):
        with pytest.raises(FederationError, match="files this run did not write.*centers.npy"):
            run(config(data, out, **extra), num_nodes=3)
    assert sorted(p.name for p in out.iterdir()) == ["centers.npy"]
    np.testing.assert_array_equal(np.load(out / "centers.npy"), np.arange(4.0))


def test_a_finished_folder_holding_a_users_file_or_link_is_not_replaced_even_with_overwrite(tmp_path):
    """Only the exact names the run writes are its own (a '.tmp' file of the user's is not),
    and no output is ever written or removed through a symbolic link."""
    data, out = blobs(tmp_path), tmp_path / "out"
    run(config(data, out), num_nodes=3)
    (out / "my-notes.tmp").write_text("mine")
    with pytest.raises(FederationError, match="files its run did not write.*my-notes.tmp"):
        run(config(data, out, overwrite=True), num_nodes=3)
    (out / "my-notes.tmp").unlink()
    victim = tmp_path / "precious.npy"
    np.save(victim, np.arange(5.0))
    (out / "centers.npy").unlink()
    (out / "centers.npy").symlink_to(victim)
    with pytest.raises(FederationError, match="symbolic links.*centers.npy"):
        run(config(data, out, overwrite=True), num_nodes=3)
    np.testing.assert_array_equal(np.load(victim), np.arange(5.0))
    assert (out / "centers.npy").is_symlink() and (out / "result.json").exists()


def test_a_folder_another_run_is_writing_is_refused(tmp_path):
    from fedcluster.config import with_defaults
    from fedcluster.server.run_folder import RunFolder

    data, out = blobs(tmp_path), tmp_path / "busy"
    other = RunFolder.open(with_defaults(config(data, out)))  # another process would hold it the same way
    try:
        for extra in ({}, {"overwrite": True}, {"resume": True}):
            with pytest.raises(FederationError, match="in use by another run"):
                run(config(data, out, **extra), num_nodes=3)
    finally:
        other.close()
    run(config(data, out, overwrite=True), num_nodes=3)  # once it let go (it never finished: replaced on request)


def test_a_results_folder_is_never_read_as_client_data(tmp_path):
    from fedcluster.config import ConfigError
    from fedcluster.data import DataError

    data, out = blobs(tmp_path), tmp_path / "out"
    run(config(data, out), num_nodes=3)
    with pytest.raises((FederationError, DataError, ConfigError), match="results of a fedcluster run"):
        run(config(out, tmp_path / "second"), num_nodes=3)


def test_a_results_array_beside_the_client_files_is_never_read_as_a_client(tmp_path):
    from fedcluster.config import ConfigError
    from fedcluster.data import DataError

    data = blobs(tmp_path)
    run(config(data, tmp_path / "out"), num_nodes=3)
    (data / "centers.npy").write_bytes((tmp_path / "out" / "centers.npy").read_bytes())  # a results file, copied
    with pytest.raises((FederationError, DataError, ConfigError), match="centers.npy: the name of an array"):
        run(config(data, tmp_path / "second"), num_nodes=3)


def test_resume_without_an_unfinished_run_is_refused_by_name(tmp_path):
    data = blobs(tmp_path)
    with pytest.raises(FederationError, match="resume=true needs output-dir"):
        run({**config(data, tmp_path / "x", resume=True), "output-dir": ""}, num_nodes=3)
    with pytest.raises(FederationError, match="holds no unfinished run"):
        run(config(data, tmp_path / "empty", resume=True), num_nodes=3)
    run(config(data, tmp_path / "done"), num_nodes=3)
    with pytest.raises(FederationError, match="finished"):
        run(config(data, tmp_path / "done", resume=True), num_nodes=3)


@pytest.mark.parametrize("scale, words", [(1e160, "overflow"), (1e-160, "underflow")])
def test_data_whose_squares_overflow_or_underflow_is_refused_with_a_hint_to_rescale(tmp_path, scale, words):
    data = blobs(tmp_path, scale)
    with pytest.raises(FederationError) as failure:
        run(config(data, tmp_path / "out"), num_nodes=3)
    assert words in str(failure.value) and "rescale" in str(failure.value)


def test_one_device_with_badly_scaled_data_leaves_the_run(tmp_path):
    data = blobs(tmp_path)
    np.save(data / "client_001.npy", np.full((30, 2), 1e200))
    result = run(config(data, tmp_path / "out"), num_nodes=3)
    assert "rescale" in result["nodes"]["excluded"]["1001"]
    assert result["final"]["num_points"] == 60


def test_a_constant_data_set_finishes_cleanly(tmp_path):
    data = write_npy_dir(tmp_path / "data", [np.full((20, 3), 7.0) for _ in range(3)])
    result = run(config(data, tmp_path / "out", k=1), num_nodes=3)
    assert result["final"]["cost"] == 0.0 and result["final"]["num_points"] == 60
    np.testing.assert_array_equal(np.load(tmp_path / "out" / "centers.npy"), np.full((1, 3), 7.0))


def test_fewer_nodes_than_point_files_is_refused_naming_both_numbers(tmp_path):
    data = blobs(tmp_path)
    with pytest.raises(ConfigError, match=r"3 client files in .*data but 2 nodes: run with --num-nodes 3"):
        run(config(data, tmp_path / "out"), num_nodes=2)
    assert not (tmp_path / "out").exists()


def test_fewer_nodes_than_graph_files_is_refused(tmp_path):
    folder = tmp_path / "graph"
    folder.mkdir()
    for i in range(3):
        (folder / f"client_{i:03d}.txt").write_text(f"{i} {i + 1}\n")
    with pytest.raises(ConfigError, match=r"3 client files in .*graph but 2 nodes: run with --num-nodes 3"):
        run(
            {
                "algorithm": "fedspectral-plus",
                "k": 2,
                "num-nodes": 4,
                "dataset": "edge-dir",
                "data-dir": str(folder),
                "output-dir": str(tmp_path / "out"),
            },
            num_nodes=2,
        )


def test_the_in_process_runner_enforces_round_timeout(tmp_path):
    """A node whose ClientApp takes longer than round-timeout does not answer; the run goes
    on without it and says why, without waiting another round-timeout."""
    import time

    data = blobs(tmp_path)

    from fedcluster.client import app as client_module

    original = client_module.run_task

    def slow_task(name, data_, arrays, cfg):
        if "client_001" in data_.source and name == "fedkmeans_train":
            time.sleep(0.6)
        return original(name, data_, arrays, cfg)

    client_module.run_task = slow_task
    try:
        started = time.monotonic()
        result = run(config(data, tmp_path / "out", **{"round-timeout": 0.5, "max-missed-phases": 100}), num_nodes=3)
        took = time.monotonic() - started
    finally:
        client_module.run_task = original
    train = [p for p in result["phases"] if p["phase"] == "train"]
    assert all(p["replies"] == 2 for p in train)
    assert all(f["kind"] == "timeout" and f["node"] == 1001 for p in train for f in p["failures"])
    # the deadline counts from sending: no phase waits another round-timeout after the slow node
    assert all(p["seconds"] < 0.6 + 0.4 for p in train), [p["seconds"] for p in train]
    assert took > 1.2


# ---------------------------------------------------------------- labels stay on the devices
def test_write_labels_saves_each_devices_labels_beside_its_file_and_sends_none(tmp_path):
    from conftest import write_npy_dir

    rng = np.random.default_rng(2)
    parts = [rng.normal(size=(30 + i, 2)) + 6 * (i % 3) for i in range(5)]
    data = write_npy_dir(tmp_path / "data", parts)
    config = {
        "k": 3,
        "num-rounds": 3,
        "dataset": "npy-dir",
        "data-dir": str(data),
        "reference": False,
        "write-labels": True,
    }
    result = run({**config, "output-dir": str(tmp_path / "out")}, num_nodes=5)
    assert result["labels_written"]["devices"] == 5
    centers = np.load(tmp_path / "out" / "centers.npy")
    for file, X in zip(sorted(data.glob("*.npy")), parts):
        saved = np.load(data / "fedcluster-labels" / file.name)
        naive = np.array([int(np.argmin([((x - c) ** 2).sum() for c in centers])) for x in X])
        np.testing.assert_array_equal(saved, naive)
    phase = [p for p in result["phases"] if p["phase"] == "write-labels"][0]
    assert phase["bytes_up"] / 5 < 8 * 30  # one flag per device (an .npy header and 8 bytes), never 30+ labels
    # the labels folder is never read as client data by the next run
    again = run({**config, "output-dir": str(tmp_path / "out2"), "write-labels": False}, num_nodes=5)
    assert again["final"]["num_points"] == sum(map(len, parts)) and not again["warnings"]


def test_write_labels_on_generated_data_says_nothing_was_written(tmp_path):
    result = run(
        {"k": 3, "num-rounds": 1, "write-labels": True, "reference": False, "output-dir": str(tmp_path / "o")},
        num_nodes=3,
    )
    assert result["labels_written"]["devices"] == 0
    assert any("no data file" in w for w in result["warnings"])


def test_write_labels_is_refused_for_graph_runs():
    from fedcluster.config import ConfigError, with_defaults

    with pytest.raises(ConfigError, match="labels.npy"):
        with_defaults({"algorithm": "fedspectral-plus", "num-nodes": 10, "write-labels": True})
