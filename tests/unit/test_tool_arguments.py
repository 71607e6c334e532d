"""Every command-line tool refuses a bad argument, or a file it cannot use, up front with one
line naming it and what it must be (exit code 2 for an argument, as argparse; 1 for a file's
contents), never with a traceback, and never replaces a file without its overwrite flag."""

from __future__ import annotations

import json
import resource
import subprocess
import sys

import numpy as np
import pytest

from fedcluster.algorithms.fedspectral import split_tool as graph_cli
from fedcluster.algorithms.kfed import assign_tool as newdevice
from fedcluster.tools import assign, certs, local_cluster, plot


def refused(capsys, main, argv, code: int) -> str:
    """``main(argv)`` refuses with exit ``code`` and ONE line on stderr, which is returned."""
    try:
        got = main(argv)
    except SystemExit as exc:
        got = exc.code
    err = capsys.readouterr().err
    assert got == code, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and ": error: " in lines[0] and "Traceback" not in err, err
    return lines[0]


def tool(module: str, argv: list[str], timeout: float = 60) -> subprocess.CompletedProcess:
    """A tool in a child process with at most 2 GiB of memory and ``timeout`` seconds (an
    argument that once made a tool allocate without bound, or hang)."""

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (2 * 2**30, 2 * 2**30))

    code = f"import sys; from {module} import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run(
        [sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=timeout, preexec_fn=limit
    )


@pytest.fixture
def kfed_run(tmp_path):
    folder = tmp_path / "kfed"
    folder.mkdir()
    np.save(folder / "centers.npy", np.array([[0.0, 0.0], [10.0, 10.0]]))
    (folder / "result.json").write_text(json.dumps({"algorithm": "kfed", "config": {"k": 2, "k-prime": 2}}))
    np.save(
        tmp_path / "points.npy",
        np.random.default_rng(0).normal(size=(40, 2)) + np.repeat([[0.0, 0.0], [10.0, 10.0]], 20, axis=0),
    )
    return folder, tmp_path / "points.npy"


# ------------------------------------------------------------------ fedcluster-run
@pytest.mark.parametrize("text", ["k=", "k=3 =", "k=0", "no-such-key=1"])
def test_run_refuses_a_bad_run_config_by_name(capsys, text):
    from fedcluster.inprocess.run import main

    line = refused(capsys, main, ["--run-config", text], 2)
    assert "argument --run-config" in line


def test_run_refuses_a_run_config_key_given_twice_by_name(capsys):
    from fedcluster.inprocess.run import main

    line = refused(capsys, main, ["--run-config", "k=5 num-rounds=2 k=6"], 2)
    assert "argument --run-config" in line and "'k' is given twice" in line


def _data_file(folder, case: str) -> str:
    """A node's file no run can use (what the run's devices would refuse)."""
    rng = np.random.default_rng(0)
    if case == "nan":
        points = rng.normal(size=(20, 3))
        points[4, 1] = np.nan
        np.save(folder / "nan.npy", points)
    elif case == "empty":
        np.save(folder / "empty.npy", np.zeros((0, 3)))
    elif case == "object":
        np.save(folder / "object.npy", np.array([[1, "a"], [2, None]], dtype=object), allow_pickle=True)
    elif case == "strings":
        np.save(folder / "strings.npy", np.full((4, 3), "x"))
    elif case == "bad csv":
        (folder / "bad.csv").write_text("1,2,3\n4,5\n")
    elif case == "3-D":
        np.save(folder / "3-D.npy", np.ones((2, 2, 3)))
    elif case == "binary":
        (folder / "binary.txt").write_bytes(bytes(range(256)))
    elif case == "edges for points":
        (folder / "edges.txt").write_text("0 1\n1 2\n")
    elif case == "other dimension":
        np.save(folder / "other.npy", rng.normal(size=(20, 2)))
    return str(next(p for p in folder.iterdir() if p.name != "good.npy"))


@pytest.mark.parametrize(
    "case", ["nan", "empty", "object", "strings", "bad csv", "3-D", "binary", "edges for points", "other dimension"]
)
def test_run_refuses_a_data_path_no_node_could_use_naming_the_file(capsys, tmp_path, case):
    """The run would drop that node and go on with the others, silently another data set."""
    from fedcluster.inprocess.run import main

    np.save(tmp_path / "good.npy", np.random.default_rng(1).normal(size=(30, 3)))
    bad = _data_file(tmp_path, case)
    line = refused(
        capsys,
        main,
        [
            "--data-path",
            bad,
            "--data-path",
            str(tmp_path / "good.npy"),
            "--run-config",
            f"k=2 num-rounds=2 output-dir='{tmp_path / 'out'}'",
        ],
        2,
    )
    assert "argument --data-path" in line and bad.rsplit("/", 1)[-1] in line and not (tmp_path / "out").exists()


def test_run_refuses_a_population_it_cannot_hold_before_making_it():
    done = tool("fedcluster.inprocess.run", ["--num-nodes", str(10**9)])
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "argument --num-nodes: must be a whole number in [1, 100000], got 1000000000" in done.stderr


# ------------------------------------------------------------------ fedcluster-kfed-assign
def test_kfed_assign_refuses_a_result_whose_config_is_not_a_record(capsys, kfed_run):
    folder, points = kfed_run
    (folder / "result.json").write_text(json.dumps({"algorithm": "kfed", "config": [1, 2]}))
    line = refused(capsys, newdevice.main, [str(folder), str(points)], 1)
    assert "result.json" in line and "config is a JSON list" in line


@pytest.mark.parametrize(
    "where, words",
    [("missing/labels.npy", "does not exist"), ("folder", "must end in .npy"), ("labels", "must end in .npy")],
)
def test_kfed_assign_refuses_an_out_path_it_cannot_write_as_given(capsys, kfed_run, tmp_path, where, words):
    folder, points = kfed_run
    (tmp_path / "folder").mkdir()
    before = sorted(tmp_path.rglob("*"))
    line = refused(capsys, newdevice.main, [str(folder), str(points), "--out", str(tmp_path / where)], 2)
    assert "argument --out" in line and words in line
    assert sorted(tmp_path.rglob("*")) == before  # nothing written (once: <folder>.npy, labels.npy)


def test_kfed_assign_never_replaces_an_existing_file_without_overwrite(capsys, kfed_run, tmp_path):
    folder, points = kfed_run
    out = tmp_path / "labels.npy"
    out.write_bytes(b"mine")
    line = refused(capsys, newdevice.main, [str(folder), str(points), "--out", str(out)], 2)
    assert "--overwrite" in line and out.read_bytes() == b"mine"
    assert newdevice.main([str(folder), str(points), "--out", str(out), "--overwrite"]) == 0
    assert json.loads(capsys.readouterr().out)["labels"] == str(out)
    assert np.load(out).shape == (40,)


# ------------------------------------------------------------------ fedcluster-assign
def test_assign_refuses_an_out_without_npy_so_the_printed_path_is_the_written_one(capsys, kfed_run, tmp_path):
    folder, points = kfed_run
    line = refused(capsys, assign.main, [str(folder), str(points), "--out", str(tmp_path / "labels")], 2)
    assert "argument --out" in line and "must end in .npy" in line
    assert not (tmp_path / "labels.npy").exists()
    assert assign.main([str(folder), str(points), "--out", str(tmp_path / "labels.npy")]) == 0
    assert json.loads(capsys.readouterr().out)["labels"] == str(tmp_path / "labels.npy")
    line = refused(capsys, assign.main, [str(folder), str(points), "--out", str(tmp_path / "labels.npy")], 2)
    assert "exists" in line and "--overwrite" in line


@pytest.mark.parametrize("tool_main", [assign.main, newdevice.main], ids=["assign", "kfed-assign"])
def test_assign_never_writes_into_the_run_folder(capsys, kfed_run, tool_main):
    folder, points = kfed_run
    before = sorted(folder.iterdir())
    line = refused(capsys, tool_main, [str(folder), str(points), "--out", str(folder / "labels.npy")], 2)
    assert "argument --out" in line and "inside the run folder" in line and sorted(folder.iterdir()) == before


def test_assign_refuses_an_unfinished_run_by_its_marker(capsys, kfed_run, tmp_path):
    folder, points = kfed_run
    (folder / "fedcluster-run.json").write_text(json.dumps({"fedcluster": "run folder", "status": "running"}))
    line = refused(capsys, assign.main, [str(folder), str(points), "--out", str(tmp_path / "labels.npy")], 1)
    assert "unfinished run" in line and "'running'" in line and not (tmp_path / "labels.npy").exists()
    (folder / "fedcluster-run.json").write_text(json.dumps({"fedcluster": "run folder", "status": "finished"}))
    assert assign.main([str(folder), str(points), "--out", str(tmp_path / "labels.npy")]) == 0


# ------------------------------------------------------------------ fedcluster-plot
@pytest.mark.parametrize("centers", [np.zeros(3), np.zeros((3, 2, 2))], ids=["1-D", "3-D"])
def test_plot_refuses_centers_that_are_not_a_matrix_by_file(capsys, tmp_path, centers):
    pytest.importorskip("matplotlib")
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "result.json").write_text(json.dumps({"algorithm": "fedkmeans", "rounds": []}))
    np.save(folder / "centers.npy", centers)
    np.save(tmp_path / "points.npy", np.zeros((5, 2)))
    line = refused(capsys, plot.main, [str(folder), "--points", str(tmp_path / "points.npy")], 1)
    assert "centers.npy holds no usable centers" in line
    assert not list(folder.glob("*.png"))  # refused before anything was drawn


def test_plot_never_replaces_its_pictures_without_overwrite(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "result.json").write_text(json.dumps({"algorithm": "fedkmeans", "rounds": [{"round": 1, "cost": 1.0}]}))
    (folder / "cost.png").write_bytes(b"mine")
    line = refused(capsys, plot.main, [str(folder)], 2)
    assert "cost.png" in line and "--overwrite" in line and (folder / "cost.png").read_bytes() == b"mine"
    assert plot.main([str(folder), "--overwrite"]) == 0 and (folder / "cost.png").read_bytes() != b"mine"


# ------------------------------------------------------------------ fedcluster-split-graph
@pytest.mark.parametrize(
    "text, words",
    [
        ("0 1\n1 %d\n" % 2**63, "line 2: node id 9223372036854775808"),
        ("# nothing\n", "holds no edge"),
        ("1 1\n2 2\n", "no edge between two different nodes"),
        ("0 1\n\udc80\udc81\n", "not a text edge list"),
    ],
)
def test_split_graph_refuses_an_edge_list_it_cannot_split_by_line(capsys, tmp_path, text, words):
    (tmp_path / "edges.txt").write_bytes(text.encode("utf-8", "surrogateescape"))
    line = refused(
        capsys, graph_cli.main, [str(tmp_path / "edges.txt"), "--clients", "2", "--out", str(tmp_path / "o")], 1
    )
    assert words in line and not (tmp_path / "o").exists()


def test_split_graph_never_writes_client_files_into_a_run_folder(capsys, kfed_run, tmp_path):
    folder, _ = kfed_run
    (tmp_path / "edges.txt").write_text("0 1\n1 2\n")
    line = refused(capsys, graph_cli.main, [str(tmp_path / "edges.txt"), "--clients", "2", "--out", str(folder)], 2)
    assert "argument --out" in line and "result.json" in line and not list(folder.glob("client_*"))


def test_split_graph_refuses_more_clients_than_it_can_write_without_hanging(tmp_path):
    (tmp_path / "edges.txt").write_text("0 1\n1 2\n")
    done = tool(
        "fedcluster.algorithms.fedspectral.split_tool",
        [str(tmp_path / "edges.txt"), "--clients", str(10**7), "--out", str(tmp_path / "o")],
    )
    assert done.returncode == 2 and "argument --clients: must be a whole number in [1, 10000]" in done.stderr
    assert not (tmp_path / "o").exists()


# ------------------------------------------------------------------ fedcluster-local-cluster, fedcluster-make-certs
@pytest.mark.parametrize("kind", ["file", "not empty"])
def test_local_cluster_refuses_a_workdir_it_would_write_into_before_starting_anything(capsys, tmp_path, kind):
    workdir = tmp_path / "w"
    if kind == "file":
        workdir.write_text("mine")
    else:
        workdir.mkdir()
        (workdir / "notes.txt").write_text("mine")
    line = refused(capsys, local_cluster.main, ["--workdir", str(workdir), "--demo-nodes", "2"], 2)
    assert "argument --workdir" in line
    assert (workdir.read_text() if kind == "file" else sorted(p.name for p in workdir.iterdir())) in (
        "mine",
        ["notes.txt"],
    )


@pytest.mark.parametrize("port", ["-1", "0", "99999"])
def test_make_certs_refuses_a_port_no_superlink_can_have(capsys, tmp_path, port):
    line = refused(capsys, certs.main, ["--out", str(tmp_path / "c"), "--port", port], 2)
    assert "argument --port: must be a whole number in [1, 65535]" in line and not (tmp_path / "c").exists()


def test_every_console_script_answers_help():
    """Every script of pyproject.toml builds its parser (argument types included) and says its name."""
    import tomllib
    from pathlib import Path

    scripts = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())["project"]["scripts"]
    for name, target in scripts.items():
        module = target.split(":")[0]
        done = tool(module, ["--help"])
        assert done.returncode == 0 and name in done.stdout, (name, done.stderr[-500:])


def test_run_refuses_a_data_dir_it_cannot_read_as_an_argument(capsys, tmp_path):
    from fedcluster.inprocess.run import main

    line = refused(capsys, main, ["--run-config", f"dataset='npy-dir' data-dir='{tmp_path / 'nowhere'}'"], 2)
    assert "argument --run-config: run-config data-dir: data directory" in line and "nowhere does not exist" in line
