"""Engine tier: real Flower processes on loopback (simulation and deployment)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from conftest import write_npy_dir
from fedcluster.tools.flower import FlowerProcesses, flower_installed, run_config_text

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.engine,
    pytest.mark.skipif(not flower_installed(), reason="flwr / flower-superlink / flower-supernode not installed"),
]


@pytest.fixture
def flower(tmp_path):
    handle = FlowerProcesses(tmp_path / "flower", connection="test")
    yield handle
    handle.stop()


def lloyd_reference(X, k):
    from sklearn.cluster import KMeans

    return KMeans(k, n_init=10, random_state=0).fit(X).inertia_ / X.shape[0]


def flwr_run(flower, config: dict, num_nodes: int, out: Path) -> dict:
    """One `flwr run` simulation of ``config`` into ``out``; its result.json."""
    run_id = flower.submit(
        ROOT, run_config_text({**config, "output-dir": str(out), "node-settle-s": 1.0}), f"num-supernodes={num_nodes}"
    )
    status = flower.wait(run_id, timeout=240)
    assert status == "finished:completed", (status, flower.run_log(run_id))
    return json.loads((out / "result.json").read_text())


def assert_same_as_inprocess(config: dict, num_nodes: int, out: Path, arrays: tuple[str, ...] = ("centers",)) -> None:
    """One seed, one result on every engine: the in-process runner (hence the estimators,
    tests/protocol/test_estimators.py) writes the arrays `flwr run` wrote, to 1e-9, though
    Flower's node ids are random per run."""
    from fedcluster.inprocess import run

    inprocess = out.parent / f"{out.name}-inprocess"
    run({**config, "output-dir": str(inprocess)}, num_nodes=num_nodes)
    for name in arrays:
        np.testing.assert_allclose(
            np.load(out / f"{name}.npy"),
            np.load(inprocess / f"{name}.npy"),
            rtol=0,
            atol=1e-9,
            err_msg=f"{config['algorithm']}: {name}.npy differs between flwr run and in-process",
        )


@pytest.mark.slow  # 20-55 s: Ray start-up or real SuperNode processes
def test_flwr_run_simulation_with_npy_dir(flower, tmp_path):
    rng = np.random.default_rng(0)
    means = np.array([[0, 0], [8, 0], [0, 8], [8, 8]], dtype=float)
    parts = [
        np.concatenate([means[i % 4] + rng.normal(size=(40, 2)), means[(i + 1) % 4] + rng.normal(size=(20, 2))])
        for i in range(4)
    ]
    data_dir = write_npy_dir(tmp_path / "data", parts)
    out = tmp_path / "out"
    flower.start_superlink(simulation=True)
    # fraction 0.5: which devices train each round follows the run seed on every engine
    config = {
        "algorithm": "fedkmeans",
        "k": 4,
        "num-rounds": 5,
        "fraction": 0.5,
        "seed": 3,
        "dataset": "npy-dir",
        "data-dir": str(data_dir),
    }
    result = flwr_run(flower, config, 4, out)
    assert result["nodes"]["connected"] == 4
    X = np.concatenate(parts)
    assert result["final"]["num_points"] == X.shape[0]
    assert result["final"]["cost"] <= 1.02 * lloyd_reference(X, 4)
    assert np.load(out / "centers.npy").shape == (4, 2)
    assert_same_as_inprocess(config, 4, out)


@pytest.mark.slow  # 20-55 s: Ray start-up or real SuperNode processes
def test_flwr_run_reports_a_failed_run(flower, tmp_path):
    flower.start_superlink(simulation=True)
    run_id = flower.submit(
        ROOT,
        f"k=2 dataset='npy-dir' data-dir='{tmp_path / 'missing'}' output-dir='{tmp_path / 'o'}' node-settle-s=1.0",
        "num-supernodes=2",
    )
    status = flower.wait(run_id, timeout=240)
    assert status == "finished:failed", (status, flower.run_log(run_id))


@pytest.mark.slow  # 20-55 s: Ray start-up or real SuperNode processes
def test_flwr_run_of_a_csv_folder_on_too_few_supernodes_is_a_failed_run_naming_both(flower, tmp_path):
    """Three CSV files (a header and a text column), Flower's default of two SuperNodes:
    the run stops, `flwr ls` says failed, and the log names both numbers and the remedy."""
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    for i in range(3):
        (data_dir / f"client_{i}.csv").write_text("name,x,y\n" + "".join(f"p{j},{j + i},{2 * j}\n" for j in range(9)))
    flower.start_superlink(simulation=True)
    run_id = flower.submit(
        ROOT, f"k=2 dataset='dir' data-dir='{data_dir}' output-dir='{tmp_path / 'o'}'", "num-supernodes=2"
    )
    status = flower.wait(run_id, timeout=240)
    log = flower.run_log(run_id)
    assert status == "finished:failed", (status, log)
    assert "3 client files in" in log and "but 2 SuperNodes" in log and "num-supernodes=3" in log, log


@pytest.mark.slow  # 20-55 s: Ray start-up or real SuperNode processes
def test_flwr_run_kfed_simulation(flower, tmp_path):
    from fedcluster.data import kfed_mixture

    devices, _ = kfed_mixture(d=20, k=9, k_prime=3, m0=2, points_per_component=40, separation=50.0, seed=0)
    data_dir = write_npy_dir(tmp_path / "data", devices)
    out = tmp_path / "out"
    flower.start_superlink(simulation=True)
    config = {"algorithm": "kfed", "k": 9, "dataset": "npy-dir", "data-dir": str(data_dir)}
    result = flwr_run(flower, config, len(devices), out)
    assert result["kfed"]["devices"] == len(devices)
    assert result["reference"]["ratio"] <= 1.0 + 1e-9
    assert np.load(out / "device_centers.npy").shape == (len(devices) * 3, 20)
    assert_same_as_inprocess(config, len(devices), out, ("centers", "device_centers"))


@pytest.mark.slow  # ~20 s (Ray start-up)
def test_flwr_run_da_ufl_simulation(flower, tmp_path):
    """DA-UFL through `flwr run` on the paper's overlapping agents: the in-process runner's
    result (its other weightings run in-process in tests/protocol/test_da_ufl_strategy.py)."""
    flower.start_superlink(simulation=True)
    out = tmp_path / "som"
    config = {
        "algorithm": "da-ufl",
        "weighting": "som",
        "k": 16,
        "dataset": "da-ufl-paper",
        "num-points": 800,
        "snr-db": 20.0,
    }
    result = flwr_run(flower, config, 5, out)
    assert result["da_ufl"]["weighting"] == "som" and result["da_ufl"]["converged"]
    assert result["da_ufl"]["agents"] == 5 and result["nodes"]["excluded"] == {}
    assert result["reference"]["ratio"] < 1.4, result["reference"]
    assert np.load(out / "centers.npy").shape == (16, 2)
    assert_same_as_inprocess(config, 5, out)


def planted_graph_clients(directory: Path, clients: int = 4, blocks: int = 3, size: int = 30, seed: int = 0) -> Path:
    """A planted-partition graph (dense blocks, sparse between) split over edge files."""
    rng = np.random.default_rng(seed)
    n = blocks * size
    u, v = np.triu_indices(n, 1)
    same = (u // size) == (v // size)
    keep = rng.random(u.size) < np.where(same, 0.3, 0.02)
    edges = np.stack([u[keep], v[keep]], axis=1)
    owner = rng.integers(clients, size=edges.shape[0])
    directory.mkdir(parents=True)
    for c in range(clients):
        np.savetxt(directory / f"client_{c}.txt", edges[owner == c], fmt="%d")
    return directory


@pytest.mark.slow  # four flwr runs, ~20 s each (Ray start-up)
def test_flwr_run_equals_inprocess_for_feddp_and_both_spectral_algorithms(flower, tmp_path):
    """The algorithms the tests above do not run through `flwr run`: one seed, one result."""
    flower.start_superlink(simulation=True)
    feddp = {
        "algorithm": "feddp-kmeans",
        "k": 4,
        "dataset": "feddp-mixture",
        "epsilon": 2.0,
        "seed": 5,
        "noise-seed": 9,
    }
    flwr_run(flower, feddp, 5, tmp_path / "feddp")
    assert_same_as_inprocess(feddp, 5, tmp_path / "feddp")
    # secure aggregation without server data: a session's keys live in Flower's context.state
    # between messages, which Ray workers do not share
    secure = {
        "algorithm": "feddp-kmeans",
        "k": 3,
        "dataset": "gaussian-mixture",
        "dim": 3,
        "dimension": 3,
        "epsilon": 2.0,
        "lloyd-rounds": 2,
        "clip-norm": 20.0,
        "seed": 5,
        "noise-seed": 9,
        "evaluate-cost": False,
        "secure-aggregation": True,
        "secagg-noise": "server",
    }  # the devices' own noise is never seeded
    result = flwr_run(flower, secure, 4, tmp_path / "secure")
    assert result["privacy"]["secure_aggregation"]["sums"] == 3
    assert_same_as_inprocess(secure, 4, tmp_path / "secure")
    graph = planted_graph_clients(tmp_path / "graph")
    for algorithm in ("fedspectral", "fedspectral-plus"):
        config = {
            "algorithm": algorithm,
            "k": 3,
            "num-nodes": 90,
            "dataset": "edge-dir",
            "data-dir": str(graph),
            "seed": 2,
        }
        out = tmp_path / algorithm
        flwr_run(flower, config, 4, out)
        assert_same_as_inprocess(config, 4, out, ("labels", "embedding"))
