"""Engine tier: real Flower processes on loopback (simulation and deployment)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from conftest import split_email_eu_core, write_npy_dir
from flower_processes import Flower, flower_available

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.engine,
    pytest.mark.skipif(not flower_available(), reason="flwr / flower-superlink / flower-supernode not installed"),
]


@pytest.fixture
def flower(tmp_path):
    handle = Flower(tmp_path)
    yield handle
    handle.stop()


def lloyd_reference(X, k):
    from sklearn.cluster import KMeans

    return KMeans(k, n_init=10, random_state=0).fit(X).inertia_ / X.shape[0]


@pytest.mark.slow  # 20-55 s: Ray start-up or real SuperNode processes
def test_flwr_run_simulation_with_npy_dir(flower, tmp_path):
    rng = np.random.default_rng(0)
    means = np.array([[0, 0], [8, 0], [0, 8], [8, 8]], dtype=float)
    parts = [np.concatenate([means[i % 4] + rng.normal(size=(40, 2)), means[(i + 1) % 4] + rng.normal(size=(20, 2))]) for i in range(4)]
    data_dir = write_npy_dir(tmp_path / "data", parts)
    out = tmp_path / "out"
    flower.start_superlink(simulation=True)
    run_id = flower.submit(
        ROOT,
        f"k=4 num-rounds=5 dataset='npy-dir' data-dir='{data_dir}' output-dir='{out}' node-settle-s=1.0",
        "num-supernodes=4",
    )
    entry = flower.wait_for_run(run_id, timeout=240)
    assert entry["status"] == "finished:completed", (entry, flower.run_log(run_id))
    result = json.loads((out / "result.json").read_text())
    assert result["nodes"]["connected"] == 4
    X = np.concatenate(parts)
    assert result["final"]["num_points"] == X.shape[0]
    assert result["final"]["cost"] <= 1.02 * lloyd_reference(X, 4)
    assert np.load(out / "centers.npy").shape == (4, 2)


@pytest.mark.slow  # 20-55 s: Ray start-up or real SuperNode processes
def test_flwr_run_reports_a_failed_run(flower, tmp_path):
    flower.start_superlink(simulation=True)
    run_id = flower.submit(
        ROOT, f"k=2 dataset='npy-dir' data-dir='{tmp_path / 'missing'}' output-dir='{tmp_path / 'o'}' node-settle-s=1.0", "num-supernodes=2"
    )
    entry = flower.wait_for_run(run_id, timeout=240)
    assert entry["status"] == "finished:failed", entry


@pytest.mark.slow  # 20-55 s: Ray start-up or real SuperNode processes
def test_deployment_two_supernodes_with_their_own_files(flower, tmp_path):
    rng = np.random.default_rng(1)
    a = np.concatenate([rng.normal(size=(50, 3)), rng.normal(size=(50, 3)) + 10])
    b = np.concatenate([rng.normal(size=(60, 3)) + 10, rng.normal(size=(40, 3)) - 10])
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", b)
    flower.start_superlink(simulation=False)
    for index, name in enumerate(("a.npy", "b.npy")):
        flower.start_supernode(index, f'data-path="{tmp_path / name}"')
    out = tmp_path / "out"
    run_id = flower.submit(ROOT, f"k=3 num-rounds=3 min-nodes=2 output-dir='{out}' reference=false round-timeout=60.0")
    entry = flower.wait_for_run(run_id, timeout=300)
    assert entry["status"] == "finished:completed", (entry, flower.run_log(run_id))
    result = json.loads((out / "result.json").read_text())
    X = np.concatenate([a, b])
    assert result["final"]["num_points"] == 200
    assert result["final"]["cost"] <= 1.02 * lloyd_reference(X, 3)


@pytest.mark.slow  # 20-55 s: Ray start-up or real SuperNode processes
def test_flwr_run_kfed_simulation(flower, tmp_path):
    from fedcluster.data import kfed_mixture

    devices, _ = kfed_mixture(d=20, k=9, k_prime=3, m0=2, points_per_component=40, separation=50.0, seed=0)
    data_dir = write_npy_dir(tmp_path / "data", devices)
    out = tmp_path / "out"
    flower.start_superlink(simulation=True)
    run_id = flower.submit(
        ROOT,
        f"algorithm='kfed' k=9 dataset='npy-dir' data-dir='{data_dir}' output-dir='{out}' node-settle-s=1.0",
        f"num-supernodes={len(devices)}",
    )
    entry = flower.wait_for_run(run_id, timeout=240)
    assert entry["status"] == "finished:completed", (entry, flower.run_log(run_id))
    result = json.loads((out / "result.json").read_text())
    assert result["kfed"]["devices"] == len(devices)
    assert result["reference"]["ratio"] <= 1.0 + 1e-9
    assert np.load(out / "device_centers.npy").shape == (len(devices) * 3, 20)


@pytest.mark.slow  # 20-55 s: Ray start-up or real SuperNode processes
def test_flwr_run_simulation_on_email_eu_core(tmp_path):
    from flower_processes import Flower, flower_available

    if not flower_available():
        pytest.skip("flwr / flower-superlink / flower-supernode not installed")
    data_dir = split_email_eu_core(tmp_path)
    out = tmp_path / "out"
    flower = Flower(tmp_path)
    try:
        flower.start_superlink(simulation=True)
        run_id = flower.submit(
            ROOT,
            f"algorithm='fedspectral-plus' k=10 num-rounds=16 num-nodes=1005 edge-copies=2 dataset='edge-dir' "
            f"data-dir='{data_dir}' output-dir='{out}' node-settle-s=1.0",
            "num-supernodes=5",
        )
        entry = flower.wait_for_run(run_id, timeout=240)
        assert entry["status"] == "finished:completed", (entry, flower.logs())
    finally:
        flower.stop()
    result = json.loads((out / "result.json").read_text())
    assert result["nodes"]["connected"] == 5
    assert np.load(out / "labels.npy").shape == (1005,)
    assert result["central_reference"]["sine_to_central"] <= 1e-3
    # Labels: k-means on email-Eu-core is itself noisy (other k-means seeds of the CENTRAL
    # embedding agree with seed 0 only at ARI 0.77-0.79; ties between identical rows make
    # even a converged embedding vary), so the bar is the central noise floor; the sine
    # above is the noise-free check. A random labelling scores ARI ~0.
    assert result["central_reference"]["ari"] >= 0.75


@pytest.mark.slow  # three flwr runs, ~20 s each (Ray start-up)
def test_flwr_run_da_ufl_simulation_each_variant(flower, tmp_path):
    """DA-UFL's three variants through `flwr run` on the paper's overlapping agents."""
    flower.start_superlink(simulation=True)
    for weighting in ("som", "bin", "uniform"):
        out = tmp_path / weighting
        run_id = flower.submit(
            ROOT,
            f"algorithm='da-ufl' weighting='{weighting}' k=16 dataset='da-ufl-paper' num-points=800 snr-db=20.0 "
            f"output-dir='{out}' node-settle-s=1.0",
            "num-supernodes=5",
        )
        entry = flower.wait_for_run(run_id, timeout=240)
        assert entry["status"] == "finished:completed", (weighting, entry, flower.run_log(run_id))
        result = json.loads((out / "result.json").read_text())
        assert result["da_ufl"]["weighting"] == weighting and result["da_ufl"]["converged"]
        assert result["da_ufl"]["agents"] == 5 and result["nodes"]["excluded"] == {}
        # Simulation node ids (hence the agents' seeds) differ from run to run, and DA-UFL's
        # defaults end 15-30 % above central k-means on about 3 seeds in 10 of this data (30
        # in-process seeds); its quality is checked on fixed seeds in tests/protocol. Here:
        # it ran through Flower and found a clustering in that range.
        assert result["reference"]["ratio"] < 1.4, (weighting, result["reference"])
        assert np.load(out / "centers.npy").shape == (16, 2)
