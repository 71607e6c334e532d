"""A run-config value is refused up front, by key, with the range it must be in, or the run
works: the values the checks once accepted and the run died on, and runs at the edges of the
declared ranges (whole runs through the in-process runner)."""

from __future__ import annotations

import numpy as np
import pytest

from fedcluster import data
from fedcluster.algorithms.feddp_kmeans import config as feddp_kmeans
from fedcluster.config import ConfigError
from fedcluster.inprocess import run

SMALL = {"k": 3, "num-points": 300, "dim": 2, "reference": False}
FEDDP = {**SMALL, "algorithm": "feddp-kmeans", "dataset": "feddp-mixture", "lloyd-rounds": 2}


def edges(tmp_path):
    rng = np.random.default_rng(0)
    folder = tmp_path / "edges"
    folder.mkdir()
    for client in range(3):
        pairs = rng.integers(0, 20, size=(40, 2)) + 20 * rng.integers(0, 3, size=(40, 1))
        np.savetxt(folder / f"client_{client:03d}.txt", pairs, fmt="%d")
    return {"algorithm": "fedspectral-plus", "k": 3, "dataset": "edge-dir", "data-dir": str(folder), "num-rounds": 2}


# The values issue 42 found accepted by the checks, then fatal to the run (overflow, a
# calibration that cannot end, an allocation of gigabytes).
FATAL = [
    ("fedkmeans", {**SMALL, "separation": 1e200}, "separation"),
    ("kfed", {**SMALL, "algorithm": "kfed", "separation": 1e300}, "separation"),
    ("da-ufl", {**SMALL, "algorithm": "da-ufl", "separation": 1e300}, "separation"),
    ("feddp data-point", {**FEDDP, "clip-norm": 1e300}, "clip-norm"),
    ("feddp absolute", {**FEDDP, "clip-norm": 1e300, "lloyd-update": "absolute"}, "clip-norm"),
    ("feddp client", {**FEDDP, "clip-norm": 1e300, "privacy-level": "client"}, "clip-norm"),
    ("feddp epsilon", {**FEDDP, "epsilon": 1e300}, "epsilon"),
    ("feddp clip-sums", {**FEDDP, "privacy-level": "client", "clip-sums": 1e300}, "clip-sums"),
    ("num-points", {**SMALL, "num-points": 10**9}, "num-points"),
    ("dim", {**SMALL, "dim": 10**6}, "dim"),
    ("max-bins", {**SMALL, "algorithm": "da-ufl", "weighting": "bin", "bins": 10_000, "max-bins": 10**8}, "max-bins"),
]


@pytest.mark.parametrize("config, key", [pytest.param(c, k, id=name) for name, c, k in FATAL])
def test_a_value_the_run_cannot_take_is_refused_before_any_node_by_key_with_its_range(tmp_path, config, key):
    with pytest.raises(ConfigError, match=rf"run-config {key} must be in \[[^]]+\]( or inf)?, got"):
        run({**config, "output-dir": str(tmp_path / "out")}, num_nodes=3)
    assert not (tmp_path / "out").exists()


def test_a_graph_the_server_cannot_hold_is_refused_by_num_nodes(tmp_path):
    graph = edges(tmp_path)
    with pytest.raises(ConfigError, match=r"run-config num-nodes must be in \[0, 1000000\], got 1000000000"):
        run({**graph, "num-nodes": 10**9, "output-dir": str(tmp_path / "out")}, num_nodes=3)
    with pytest.raises(ConfigError, match=r"num-nodes × \(k \+ oversample\) = 1000000 × 40 must be at most"):
        run({**graph, "num-nodes": 10**6, "k": 20, "output-dir": str(tmp_path / "out")}, num_nodes=3)


def test_a_generated_set_larger_than_a_device_can_build_is_refused_by_its_product(tmp_path):
    with pytest.raises(ConfigError, match=r"num-points × dim = 10000000 × 100 must be at most 100000000"):
        run({**SMALL, "num-points": 10**7, "dim": 100, "output-dir": str(tmp_path)}, num_nodes=3)


@pytest.mark.parametrize("algorithm", ["fedkmeans", "kfed", "da-ufl"])
def test_the_largest_separation_works(tmp_path, algorithm):
    result = run(
        {**SMALL, "algorithm": algorithm, "separation": data.SEPARATION_MAX, "output-dir": str(tmp_path)}, num_nodes=3
    )
    assert np.isfinite(result["final"]["cost"]) and result["final"]["num_points"] == 300


@pytest.mark.parametrize(
    "extra",
    [
        {"clip-norm": feddp_kmeans.CLIP_MAX},
        {"clip-norm": feddp_kmeans.CLIP_MAX, "lloyd-update": "absolute"},
        {"privacy-level": "client", "clip-sums": feddp_kmeans.CLIP_MAX},
        {"privacy-level": "client", "clip-outer": feddp_kmeans.CLIP_MAX**2},
        {"epsilon": feddp_kmeans.EPSILON.low},
    ],
    ids=["clip-norm", "clip-norm absolute", "clip-sums", "clip-outer", "smallest epsilon"],
)
def test_feddp_at_the_edges_of_its_ranges_works(tmp_path, extra):
    result = run({**FEDDP, **extra, "output-dir": str(tmp_path)}, num_nodes=3)
    assert np.isfinite(result["final"]["cost"]) and result["privacy"]["epsilon"] <= result["config"]["epsilon"]


# Found by sweeping every key with extreme values: refused before any node, by key.
SWEPT = [
    ("round-timeout", {**SMALL, "round-timeout": 1e-300}, r"run-config round-timeout must be in \[0.1, "),
    ("client-lr", {**SMALL, "client-lr": 1e-9}, r"run-config client-lr must be in \[1e-06, 1\]"),
    (
        "separation integer",
        {**SMALL, "separation": 10**400},
        r"run-config separation must be a finite number, got an integer of 401 digits",
    ),
    ("delta", {**FEDDP, "delta": 1e-20}, r"run-config delta must be in \[1e-12, 1\)"),
    (
        "sampling rate",
        {**FEDDP, "privacy-level": "client", "client-sampling-rate": 1e-6},
        r"client-sampling-rate must be in \[0.0001, 1\]",
    ),
    (
        "step-epsilons",
        {**FEDDP, "init": "histogram", "step-epsilons": "1e300,1e300,1e300"},
        r"step-epsilons must each be at most 100",
    ),
    (
        "min-nodes",
        {**SMALL, "min-nodes": 4, "node-wait-s": 1.0},
        r"run-config min-nodes = 4 can never be met: this run has 3 nodes",
    ),
    (
        "server-data",
        {**FEDDP, "dataset": "gaussian-mixture", "server-data": "no-such-file.npy"},
        r"run-config server-data: data file no-such-file.npy does not exist",
    ),
]


@pytest.mark.parametrize("config, words", [pytest.param(c, w, id=name) for name, c, w in SWEPT])
def test_a_value_the_sweep_found_fatal_is_refused_before_any_node(tmp_path, config, words):
    with pytest.raises(ConfigError, match=words):
        run({**config, "output-dir": str(tmp_path / "out")}, num_nodes=3)
