"""One seed, one result, whatever ids the nodes get: Flower's node ids are random per run,
so nothing a run computes may follow from them (tests/engine/test_engine.py compares
`flwr run` with the in-process runner for every algorithm; this checks the mechanism
fast, with node ids permuted and far apart)."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import write_npy_dir
from fedcluster import protocol
from fedcluster.kernel import DeviceData
from fedcluster.inprocess import run

POINT_RUNS = {
    "fedkmeans": {"k": 4, "num-rounds": 6, "fraction": 0.5},
    "kfed": {"k": 4},
    "da-ufl": {"k": 4, "outer-iterations": 4},
    "feddp-kmeans": {"k": 4, "dataset": "feddp-mixture", "epsilon": 2.0, "noise-seed": 9},  # noise is fresh by default
    "gmm": {"k": 4, "em-rounds": 10},
}


def shuffled_ids(count: int, seed: int) -> list[int]:
    """Large, random, in no particular order: as a SuperLink hands them out."""
    return [int(i) for i in np.random.default_rng(seed).choice(2**40, size=count, replace=False)]


def centers_of(config: dict, num_nodes: int, tmp_path, name: str, node_ids=None) -> np.ndarray:
    out = tmp_path / name
    run({**config, "output-dir": str(out), "reference": False}, num_nodes=num_nodes, node_ids=node_ids)
    return np.load(out / "centers.npy")


@pytest.mark.parametrize("algorithm", sorted(POINT_RUNS))
def test_node_ids_do_not_change_a_point_run(algorithm, tmp_path):
    rng = np.random.default_rng(1)
    parts = [rng.normal(size=(30 + 5 * i, 3)) + 5 * (i % 4) for i in range(8)]
    config = {
        "algorithm": algorithm,
        "seed": 4,
        "dataset": "npy-dir",
        "data-dir": str(write_npy_dir(tmp_path / "d", parts)),
        **POINT_RUNS[algorithm],
    }
    plain = centers_of(config, 8, tmp_path, "plain")
    for seed in (0, 1):
        np.testing.assert_array_equal(centers_of(config, 8, tmp_path, f"ids{seed}", shuffled_ids(8, seed)), plain)


@pytest.mark.parametrize("algorithm", ["fedspectral", "fedspectral-plus"])
def test_node_ids_do_not_change_a_graph_run(algorithm, tmp_path):
    rng = np.random.default_rng(2)
    u, v = np.triu_indices(60, 1)
    keep = rng.random(u.size) < np.where(u // 20 == v // 20, 0.3, 0.02)
    edges = np.stack([u[keep], v[keep]], axis=1)
    owner = rng.integers(4, size=edges.shape[0])
    folder = tmp_path / "g"
    folder.mkdir()
    for c in range(4):
        np.savetxt(folder / f"client_{c}.txt", edges[owner == c], fmt="%d")
    config = {
        "algorithm": algorithm,
        "k": 3,
        "num-nodes": 60,
        "dataset": "edge-dir",
        "data-dir": str(folder),
        "seed": 1,
        "reference": False,
    }
    outputs = []
    for name, ids in (("plain", None), ("shuffled", shuffled_ids(4, 3))):
        run({**config, "output-dir": str(tmp_path / name)}, num_nodes=4, node_ids=ids)
        outputs.append([np.load(tmp_path / name / f"{a}.npy") for a in ("labels", "embedding")])
    for a, b in zip(*outputs):
        np.testing.assert_array_equal(a, b)


def test_a_device_seed_mixes_the_phase_seed_with_its_partition():
    seeds = {protocol.device_seed(7, partition) for partition in range(50)}
    assert len(seeds) == 50  # every partition its own stream
    assert protocol.device_seed(7, 3) == protocol.device_seed(7, 3) != protocol.device_seed(8, 3)
    with_partition = DeviceData(points=np.zeros((1, 1)), extra={"node-config": {"partition-id": 3}, "node-id": 99})
    without = DeviceData(points=np.zeros((1, 1)), extra={"node-id": 99})
    assert (with_partition.identity, with_partition.partition) == (3, 3)
    assert (without.identity, without.partition) == (99, None)


@pytest.mark.parametrize(
    "value,expected",
    [
        (3, 3),
        (3.0, 3),
        (-1, None),
        (2.5, None),
        (float("nan"), None),
        (float("inf"), None),
        (2**60, None),
        (True, None),
        ("3", None),
        (None, None),
    ],
)
def test_a_stated_partition_is_used_only_when_it_is_a_whole_number(value, expected):
    assert protocol.partition_of({protocol.PARTITION: value}) == expected
