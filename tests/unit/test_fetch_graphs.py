"""``fedcluster-fetch-graphs`` against a local file:// mirror (CI has no internet)."""

from __future__ import annotations

import gzip
import hashlib
from pathlib import Path

import pytest

from conftest import graphs_dir
from fedcluster.tools import fetch_graphs
from fedcluster.tools.fetch_graphs import GRAPHS, Graph, main


def gz(path: Path, data: bytes) -> None:
    with gzip.open(path, "wb") as handle:
        handle.write(data)


@pytest.fixture
def tiny(monkeypatch, tmp_path):
    """One small made-up graph in place of SNAP's, served from a file:// mirror."""
    text = b"0 1\n1 2\n2 0\n"
    graph = Graph("tiny.txt", hashlib.sha256(text).hexdigest(), len(text), "a triangle")
    monkeypatch.setattr(fetch_graphs, "GRAPHS", (graph,))
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    gz(mirror / "tiny.txt.gz", text)
    return text, mirror


def test_downloads_decompresses_and_verifies(tiny, tmp_path, capsys):
    text, mirror = tiny
    out = tmp_path / "graphs"
    assert main(["--out", str(out), "--base-url", mirror.as_uri()]) == 0
    assert (out / "tiny.txt").read_bytes() == text
    assert [p.name for p in out.iterdir()] == ["tiny.txt"]  # no partial files left
    assert main(["--out", str(out), "--base-url", mirror.as_uri()]) == 0
    assert "already there, checksum ok" in capsys.readouterr().out


def test_a_corrupted_file_fails_with_a_clear_message_and_writes_nothing(tiny, tmp_path, capsys):
    _, mirror = tiny
    gz(mirror / "tiny.txt.gz", b"0 1\n1 2\n2 9\n")  # one byte changed
    out = tmp_path / "graphs"
    assert main(["--out", str(out), "--base-url", mirror.as_uri()]) == 1
    err = capsys.readouterr().err
    assert "tiny.txt: checksum mismatch" in err and "expected" in err and "nothing written" in err
    assert not any(out.iterdir())


def test_a_truncated_gzip_fails_with_a_clear_message(tiny, tmp_path, capsys):
    _, mirror = tiny
    data = (mirror / "tiny.txt.gz").read_bytes()
    (mirror / "tiny.txt.gz").write_bytes(data[: len(data) // 2])
    out = tmp_path / "graphs"
    assert main(["--out", str(out), "--base-url", mirror.as_uri()]) == 1
    assert "not a complete gzip file" in capsys.readouterr().err
    assert not any(out.iterdir())


def test_a_missing_file_names_the_url(tiny, tmp_path, capsys):
    _, mirror = tiny
    (mirror / "tiny.txt.gz").unlink()
    assert main(["--out", str(tmp_path / "g"), "--base-url", mirror.as_uri()]) == 1
    err = capsys.readouterr().err
    assert "cannot download" in err and "tiny.txt.gz" in err


def test_a_tampered_local_copy_is_replaced(tiny, tmp_path):
    text, mirror = tiny
    out = tmp_path / "graphs"
    out.mkdir()
    (out / "tiny.txt").write_bytes(b"garbage\n")
    assert main(["--out", str(out), "--base-url", mirror.as_uri()]) == 0
    assert (out / "tiny.txt").read_bytes() == text


def test_the_recorded_checksums_are_snaps_files(tmp_path):
    """The real table against the offline cache: gzip each file as SNAP serves it, fetch
    from that mirror, and every checksum and size must match."""
    cache = graphs_dir()
    if cache is None:
        pytest.skip("SNAP graphs not found (FEDCLUSTER_GRAPHS, ./graphs or ../shared/data/graphs)")
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    for graph in GRAPHS:
        gz(mirror / graph.remote, (cache / graph.name).read_bytes())
    out = tmp_path / "graphs"
    assert main(["--out", str(out), "--base-url", mirror.as_uri()]) == 0
    for graph in GRAPHS:
        assert (out / graph.name).stat().st_size == graph.size
        assert (out / graph.name).read_bytes() == (cache / graph.name).read_bytes()


def test_default_base_url_is_snap():
    assert fetch_graphs.DEFAULT_BASE_URL.startswith("https://snap.stanford.edu/")
    assert {g.remote for g in GRAPHS} == {
        "email-Eu-core.txt.gz",
        "email-Eu-core-department-labels.txt.gz",
        "facebook_combined.txt.gz",
    }
