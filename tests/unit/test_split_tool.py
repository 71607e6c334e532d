"""``fedcluster-split-graph``: the files it writes and the commands it prints."""

from __future__ import annotations

import re

import numpy as np

from fedcluster.algorithms.fedspectral import split_tool as graph_cli


def _split(tmp_path, capsys, clients=3):
    edges = tmp_path / "edges.txt"
    edges.write_text("".join(f"{u} {v}\n" for u, v in [(0, 1), (1, 2), (2, 3), (3, 0), (0, 2), (4, 5), (5, 6)]))
    assert graph_cli.main([str(edges), "--clients", str(clients), "--copies", "2", "--out", str(tmp_path / "out")]) == 0
    return capsys.readouterr().out


def test_writes_one_file_per_client_every_edge_twice(tmp_path, capsys):
    _split(tmp_path, capsys)
    files = sorted((tmp_path / "out").glob("client_*.txt"))
    assert [f.name for f in files] == ["client_000.txt", "client_001.txt", "client_002.txt"]
    total = sum(np.loadtxt(f, dtype=int, ndmin=2).shape[0] for f in files)
    assert total == 2 * 7


def test_deployment_hint_uses_the_superlinks_real_port(tmp_path, capsys):
    """The SuperNodes connect to the SuperLink's one HTTP port (flwr 1.41: 8000, Fleet +
    Control + Runtime APIs); the gRPC Fleet port 9092 of older Flowers is gone."""
    from flwr.supercore.constant import SUPERLINK_UVICORN_DEFAULT_PORT

    out = _split(tmp_path, capsys)
    hint = out.split("deployment", 1)[1]
    ports = set(re.findall(r"--superlink SERVER:(\d+)", hint))
    assert ports == {str(SUPERLINK_UVICORN_DEFAULT_PORT)}, hint
    assert "9092" not in hint
    assert "Fleet" in hint  # says which API the port serves


def test_deployment_hint_gives_each_supernode_its_own_port_and_file(tmp_path, capsys):
    out = _split(tmp_path, capsys, clients=3)
    lines = [line for line in out.splitlines() if "flower-supernode" in line]
    assert len(lines) == 3
    assert len({re.search(r"--port (\d+)", line).group(1) for line in lines}) == 3
    assert len({re.search(r"client_\d+\.txt", line).group(0) for line in lines}) == 3
    assert all("--insecure" not in line and "--root-certificates" in line for line in lines)


def test_k_in_the_printed_commands_comes_from_k_or_is_left_to_choose(tmp_path, capsys):
    """No k is made up: without --k the commands say k=K and the output says K must be
    chosen; with --k they carry it; a k beyond the graph's nodes is refused."""
    out = _split(tmp_path, capsys)
    commands = [line for line in out.splitlines() if "flwr run" in line]
    assert len(commands) == 2 and all(" k=K " in line for line in commands), out
    assert "K: the number of clusters, 1 to 7" in out and "--k K" in out
    edges = tmp_path / "edges.txt"
    assert graph_cli.main([str(edges), "--clients", "2", "--k", "3", "--out", str(tmp_path / "k3")]) == 0
    commands = [line for line in capsys.readouterr().out.splitlines() if "flwr run" in line]
    assert len(commands) == 2 and all(" k=3 " in line for line in commands)
    assert graph_cli.main([str(edges), "--clients", "2", "--k", "8", "--out", str(tmp_path / "k8")]) == 2
    assert "--k: must be between 1 and the graph's 7 nodes, got 8" in capsys.readouterr().err
    assert not (tmp_path / "k8").exists()
