"""``fedcluster-local-cluster``: what it refuses before it starts anything (the real
cluster is in tests/engine/test_deployment.py)."""

from __future__ import annotations

import numpy as np
import pytest

from fedcluster.tools import local_cluster
from fedcluster.tools.local_cluster import demo_data, main


def test_no_data_is_named(tmp_path, capsys):
    assert main(["--workdir", str(tmp_path / "w")]) == 1
    assert "no data: give --data FILE" in capsys.readouterr().err
    assert not (tmp_path / "w" / "logs").exists()  # nothing was started


def test_a_missing_data_file_is_named(tmp_path, capsys):
    assert main(["--workdir", str(tmp_path / "w"), "--data", str(tmp_path / "nope.npy")]) == 1
    err = capsys.readouterr().err
    assert "data file(s) not found" in err and "nope.npy" in err


def test_an_app_folder_without_a_flower_app_is_named(tmp_path, capsys):
    assert main(["--workdir", str(tmp_path / "w"), "--demo-nodes", "2", "--app", str(tmp_path)]) == 1
    assert "no Flower app in" in capsys.readouterr().err


def test_data_dir_gives_one_node_per_file_in_order(tmp_path):
    for name in ("b.npy", "a.npy", "c.txt", "notes.md"):
        (tmp_path / name).write_text("x")

    class Args:
        data = None
        data_dir = str(tmp_path)

    assert [p.name for p in local_cluster.data_files_from(Args)] == ["a.npy", "b.npy", "c.txt"]


def test_demo_data_is_non_iid(tmp_path):
    paths = demo_data(tmp_path, 3)
    arrays = [np.load(p) for p in paths]
    assert all(a.shape == (100, 2) for a in arrays)
    assert not np.allclose(arrays[0].mean(0), arrays[1].mean(0), atol=1.0)


def test_a_second_process_under_a_taken_name_does_not_hide_the_first_from_stop(tmp_path):
    """The engine test of an unregistered SuperNode starts 'supernode-1' again; the module's
    own 'supernode-1' must still be stopped (it once leaked, one per CI run)."""
    import sys

    cluster = local_cluster.LocalCluster(tmp_path, [])
    cluster.logs.mkdir(parents=True)
    first = cluster._start("supernode-1", [sys.executable, "-c", "import time; time.sleep(60)"], tmp_path)
    second = cluster._start("supernode-1", [sys.executable, "-c", "import time; time.sleep(60)"], tmp_path)
    assert sorted(cluster.processes) == ["supernode-1", "supernode-1-2"]
    cluster.stop()
    assert first.poll() is not None and second.poll() is not None


def test_the_run_log_is_followed_and_the_serverapps_lines_printed_as_they_come(tmp_path, capsys):
    """The run's log stream (``flwr log --stream``, here a stand-in printing what it prints)
    reaches the user line by line: the ServerApp's own lines (a line per round), not
    Flower's, colors removed."""
    import sys

    stream = (
        "\x1b[92mINFO \x1b[0m:      Starting logstream for run_id `7`\n"
        "\x1b[92mINFO \x1b[0m:      [fedcluster] round 1: 3/3 replies, 7.21 s, cost 1.5\n"
        "\x1b[92mINFO \x1b[0m:      [RUN 7, ROUND 1]\n"
        "\x1b[92mINFO \x1b[0m:      [fedcluster] round 2: 3/3 replies, 6.90 s, cost 1.25\n"
    )

    class Stand(local_cluster.LocalCluster):
        def log_command(self, run_id):
            return [sys.executable, "-c", f"import sys; sys.stdout.write({stream!r})"]

    with Stand(tmp_path, []) as cluster:
        cluster.follow("7", local_cluster.print_progress).join(timeout=30)
    assert capsys.readouterr().out.splitlines() == [
        "[fedcluster] round 1: 3/3 replies, 7.21 s, cost 1.5",
        "[fedcluster] round 2: 3/3 replies, 6.90 s, cost 1.25",
    ]


class _RunsAtOnce(local_cluster.LocalCluster):
    """The tool's cluster without processes: run 7 is submitted and finished at once."""

    def start(self):
        pass

    def submit(self, app, run_config):
        return "7"

    def wait(self, run_id, timeout, poll=2.0):
        return "finished:completed"

    def run_log(self, run_id):
        return ""


def test_the_tool_prints_the_rounds_while_the_run_goes(tmp_path, monkeypatch, capsys):
    """``fedcluster-local-cluster`` follows the log of the run it submitted and prints its
    round lines before it ends (it used to say only "running")."""
    import sys

    class Cluster(_RunsAtOnce):
        def log_command(self, run_id):
            line = "INFO :      [fedcluster] round 1: 3/3 replies, 7.21 s, cost 1.5\n"
            return [sys.executable, "-c", f"import sys; sys.stdout.write({line!r} if {run_id!r} == '7' else '')"]

    monkeypatch.setattr(local_cluster, "LocalCluster", Cluster)
    assert main(["--workdir", str(tmp_path / "w"), "--demo-nodes", "2"]) == 0
    assert "[fedcluster] round 1: 3/3 replies, 7.21 s, cost 1.5" in capsys.readouterr().out.splitlines()


@pytest.mark.parametrize(
    "flwr, argv, expected",
    [
        ("1.42.0", [], True),  # the verified release: one fedcluster-device per SuperNode
        ("1.41.2", [], False),  # another: Flower's stock SuperNodes, said on stdout
        ("1.42.0", ["--no-device-worker"], False),
        ("1.41.2", ["--device-worker"], True),
    ],
)
def test_supernodes_get_a_device_worker_by_default_where_it_was_verified(
    tmp_path, monkeypatch, capsys, flwr, argv, expected
):
    import importlib.metadata

    started = []

    class Cluster(_RunsAtOnce):
        def start(self):
            started.append(self.device_worker)

        def follow(self, run_id, echo):
            return type("Done", (), {"join": lambda self, timeout=None: None})()

    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda name: flwr if name == "flwr" else real(name))
    monkeypatch.setattr(local_cluster, "LocalCluster", Cluster)
    assert main(["--workdir", str(tmp_path / "w"), "--demo-nodes", "2", *argv]) == 0
    assert started == [expected]
    said = "Flower's stock ones (flwr 1.41.2" in capsys.readouterr().out
    assert said == (flwr == "1.41.2" and not argv)
