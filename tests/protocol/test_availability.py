"""Devices that come and go (issue 26): the in-process runner's availability model —
devices offline at random, leaving for good, joining late — and a server that asks only
the devices that are connected, samples among them, and holds no absence against anyone.
Graph runs, which need every client's edges, fail loudly instead."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import central_cost, spread_clusters, write_npy_dir
from fedcluster.lloyd import kmeans_cost
from fedcluster.inprocess import Availability, run

NODES = 10


def blobs(tmp_path):
    rng = np.random.default_rng(5)
    means = rng.normal(scale=12.0, size=(4, 3))
    parts = [np.vstack([means[(i + j) % 4] + rng.normal(size=(25, 3)) for j in range(2)]) for i in range(NODES)]
    return write_npy_dir(tmp_path / "data", parts), np.vstack(parts)


def watched_run(config, availability):
    """The run, and every (message type, node) a message was delivered to."""
    seen = []

    def hook(node, message, reply):
        seen.append((message.metadata.message_type, node))
        return reply

    return run(config, num_nodes=NODES, availability=availability, reply_hook=hook), seen


def failures(result, kind=None):
    return [f for p in result["phases"] for f in p["failures"] if kind is None or f["kind"] == kind]


# ------------------------------------------------------------------ the model
def test_availability_is_a_fixed_schedule_with_the_asked_share_offline():
    model = Availability(offline=0.3, seed=2, leave={1001: 4}, join={1002: 3})
    schedule = [[model.online(node, trip) for node in range(1000, 1200)] for trip in range(50)]
    assert schedule == [[model.online(node, trip) for node in range(1000, 1200)] for trip in range(50)]
    shares = np.mean([[model.online(node, trip) for node in range(1003, 1200)] for trip in range(50)])
    assert 0.66 < shares < 0.74
    assert not any(model.online(1001, trip) for trip in range(4, 50))
    assert not any(model.online(1002, trip) for trip in range(3))
    assert all(Availability().online(node, trip) for node in range(5) for trip in range(5))
    every_other = Availability(away={7: range(1, 100, 2)})
    assert [every_other.online(7, trip) for trip in range(4)] == [True, False, True, False]
    assert all(every_other.online(8, trip) for trip in range(4))


@pytest.mark.parametrize(
    "bad, match",
    [
        ({"offline": 1.0}, "offline must be a probability"),
        ({"offline": -0.1}, "offline must be a probability"),
        ({"offline": "0.2"}, "offline must be a probability"),
        ({"leave": {1000: -1}}, r"leave\[1000\] must be a round trip"),
        ({"join": {1000: 2.5}}, r"join\[1000\] must be a round trip"),
        ({"seed": -3}, "seed must be an integer"),
        ({"away": {1000: 3}}, r"away\[1000\] must be a container"),
    ],
)
def test_availability_refuses_what_it_cannot_mean(bad, match):
    with pytest.raises(ValueError, match=match):
        Availability(**bad)


# ------------------------------------------------------------------ point runs
def test_fedkmeans_asks_only_connected_devices_and_loses_nobody(tmp_path):
    """A device offline in a round trip is neither sampled nor sent to (the grid would
    answer NODE_UNAVAILABLE and, before, the server excluded it for good); the run keeps
    all ten devices and lands where the always-connected run does."""
    data, X = blobs(tmp_path)
    config = {
        "k": 4,
        "num-rounds": 8,
        "fraction": 0.5,
        "dataset": "npy-dir",
        "data-dir": str(data),
        "seed": 3,
        "reference": False,
    }
    model = Availability(offline=0.3, seed=7)
    result, seen = watched_run({**config, "output-dir": str(tmp_path / "away")}, model)
    assert failures(result) == [] and result["nodes"]["excluded"] == {}
    assert sum(p["away"] for p in result["phases"]) > 0
    train = [p for p in result["phases"] if p["phase"] == "train"]
    assert len(train) == 8
    first = [node for node in range(1000, 1000 + NODES) if model.online(node, 0)]  # the run starts with them
    joined = {j["node"]: j["round"] or 0 for j in result["nodes"]["joined"]}  # the others join when they come
    assert sorted(first + list(joined)) == list(range(1000, 1000 + NODES))
    for p in train:  # half of the run's devices connected in that round trip (the grid counts from 0)
        members = first + [node for node, joined_in in joined.items() if joined_in < p["round"]]
        connected = sum(model.online(node, p["round_trip"] - 1) for node in members)
        assert p["away"] == 0 and p["sent"] == max(connected // 2, 1), (p, connected)
    assert sum(r["away"] for r in result["rounds"]) > 0
    run({**config, "output-dir": str(tmp_path / "always")}, num_nodes=NODES)
    cost = kmeans_cost(X, np.load(tmp_path / "away" / "centers.npy"))
    assert cost <= 1.02 * kmeans_cost(X, np.load(tmp_path / "always" / "centers.npy"))


def test_a_device_that_leaves_for_good_is_not_asked_again(tmp_path):
    data, _ = blobs(tmp_path)
    config = {
        "k": 4,
        "num-rounds": 6,
        "dataset": "npy-dir",
        "data-dir": str(data),
        "output-dir": str(tmp_path / "o"),
        "reference": False,
        "stop-when-fixed": False,  # all 6 rounds: the device leaves in the middle
    }
    result, seen = watched_run(config, Availability(leave={1003: 4}))
    trains = {node: sum(kind == "train.fedkmeans_train" and n == node for kind, n in seen) for node in (1003, 1004)}
    assert 1 <= trains[1003] < trains[1004] == 6, trains  # gone after round 2; NODE_UNAVAILABLE never came
    assert result["nodes"]["excluded"] == {} and failures(result) == []
    later = [r for r in result["rounds"] if r["round"] > 2]
    assert len(later) == 4 and all(r["away"] == 1 and r["sent"] == 9 for r in later)
    assert [p["away"] for p in result["phases"] if p["phase"] == "final-evaluation"] == [1]
    assert result["nodes"]["away_at_end"] == [1003] and result["nodes"]["active"] == NODES
    assert result["final"]["num_points"] == 9 * 50  # the final evaluation covers who is there


def test_a_device_that_joins_late_is_admitted_and_then_sampled(tmp_path):
    data, _ = blobs(tmp_path)
    config = {
        "k": 4,
        "num-rounds": 8,
        "fraction": 0.5,
        "dataset": "npy-dir",
        "data-dir": str(data),
        "output-dir": str(tmp_path / "o"),
        "reference": False,
        "min-nodes": NODES - 1,
    }
    result, seen = watched_run(config, Availability(join={1009: 3}))
    assert [j["node"] for j in result["nodes"]["joined"]] == [1009]
    assert any(node == 1009 for _, node in seen)
    assert result["final"]["num_points"] == NODES * 50 and failures(result) == []


@pytest.mark.parametrize(
    "algorithm, extra",
    [
        ("kfed", {}),
        ("da-ufl", {"outer-iterations": 3}),
        ("feddp-kmeans", {"dataset": "feddp-mixture", "lloyd-rounds": 2, "noise-seed": 1}),
    ],
)
def test_every_point_algorithm_runs_with_devices_offline_at_random(algorithm, extra, tmp_path):
    data, _ = blobs(tmp_path)
    config = {
        "algorithm": algorithm,
        "k": 4,
        "dataset": "npy-dir",
        "data-dir": str(data),
        "reference": False,
        "output-dir": str(tmp_path / "o"),
        **extra,
    }
    result = run(config, num_nodes=NODES, availability=Availability(offline=0.2, seed=4))
    assert failures(result, "unavailable") == []
    assert result["nodes"]["excluded"] == {}  # an agent away is never held to account (DA-UFL's once were)
    assert sum(p["away"] for p in result["phases"]) + len(result["nodes"]["joined"]) > 0
    assert (tmp_path / "o" / "centers.npy").is_file()


@pytest.mark.parametrize(
    "seed, model",
    [
        (2, Availability(offline=0.4, seed=2)),  # three devices away at the evaluation: 4.6x central's cost
        (1, Availability(offline=0.2, seed=1, leave={1002: 4}, join={1006: 3})),  # four away at the start: 1.05x
    ],
)
def test_kfed_asks_devices_away_again_and_lands_near_central(tmp_path, seed, model):
    """k-FED's one shot and its evaluation asked only the devices connected then: a merge
    was chosen on the points of the others (one that drops the clusters of the devices away
    looks cheapest there), and devices away at the start never sent their centers. Both are
    asked again (each device still sends its local centers once)."""
    data, X = spread_clusters(tmp_path, seed)
    config = {
        "algorithm": "kfed",
        "k": 5,
        "dataset": "npy-dir",
        "data-dir": str(data),
        "seed": seed,
        "reference": False,
        "output-dir": str(tmp_path / "o"),
    }
    result = run(config, num_nodes=NODES, availability=model)
    assert result["nodes"]["excluded"] == {} and result["kfed"]["devices"] >= NODES - 1
    assert kmeans_cost(X, np.load(tmp_path / "o" / "centers.npy")) <= 1.05 * central_cost(X, 5)


def test_a_graph_run_asks_a_client_away_and_takes_it_out_saying_so(tmp_path):
    """Every client's edges are needed, so a graph run does not skip a client that is away:
    it is sent to, reported unavailable and taken out, and the result says what it covers."""
    from fedcluster.graph import split_edges, write_client_edge_files

    rng = np.random.default_rng(0)
    edges = np.unique(np.sort(rng.integers(0, 40, size=(200, 2)), axis=1), axis=0)
    write_client_edge_files(split_edges(edges[edges[:, 0] != edges[:, 1]], 4, 1, 0), tmp_path / "g")
    config = {
        "algorithm": "fedspectral-plus",
        "k": 2,
        "num-nodes": 40,
        "dataset": "edge-dir",
        "num-rounds": 4,
        "data-dir": str(tmp_path / "g"),
        "output-dir": str(tmp_path / "o"),
        "node-settle-s": 0.2,
    }
    result = run(config, num_nodes=4, availability=Availability(leave={1002: 2}))
    assert list(result["nodes"]["excluded"]) == ["1002"] and "NODE_UNAVAILABLE" in result["nodes"]["excluded"]["1002"]
    assert [f["kind"] for f in failures(result)] == ["unavailable"]
    assert all(p["away"] == 0 for p in result["phases"])


def test_the_grid_is_asked_who_is_connected_once_per_round_trip(tmp_path, monkeypatch):
    # in a deployment every get_node_ids() is an RPC to the SuperLink: sampling a round and
    # sending to the sampled nodes share one answer
    from fedcluster.inprocess.grid import InProcessGrid

    calls = []
    original = InProcessGrid.get_node_ids
    monkeypatch.setattr(InProcessGrid, "get_node_ids", lambda self: calls.append(1) or original(self))
    data_dir, _ = blobs(tmp_path)
    result = run(
        {
            "k": 4,
            "num-rounds": 6,
            "fraction": 0.5,
            "dataset": "npy-dir",
            "data-dir": str(data_dir),
            "output-dir": str(tmp_path / "out"),
        },
        num_nodes=NODES,
    )
    trips = result["communication"]["round_trips"]
    assert trips >= 6 and len(calls) <= trips + 3, (len(calls), trips)  # + the start's node discovery


# ------------------------------------------------------------------ a sample short of liars
def test_liars_refused_in_a_sample_are_stood_in_for_by_nodes_not_sampled(tmp_path):
    """fraction = 0.5 samples five of ten; three colluders (1001, 1004, 1007) move their
    first center far outside their box in every training reply. When all three were in the
    sample, two valid replies of five stopped the run ('3 required') though seven honest
    devices were connected. The server now asks as many of the nodes not sampled in their
    place, in one more round trip, and the round goes on; the liars are still named."""
    from flwr.app import Array

    data, X = blobs(tmp_path)
    liars = {1001, 1004, 1007}

    def moved(node, message, reply):
        if node in liars and not reply.has_error() and message.metadata.message_type == "train.fedkmeans_train":
            record = reply.content.array_records["arrays"]
            centers = record["centers"].numpy().copy()
            centers[:, 0] += 100.0
            record["centers"] = Array(centers)
        return reply

    config = {
        "k": 4,
        "fraction": 0.5,
        "dataset": "npy-dir",
        "data-dir": str(data),
        "reference": False,
        "output-dir": str(tmp_path / "o"),
    }
    stood_in = 0
    for seed in range(4):  # seeds whose samples hold all three liars in some round
        result = run(
            {**config, "seed": seed, "output-dir": str(tmp_path / f"o{seed}")}, num_nodes=NODES, reply_hook=moved
        )
        assert {f["node"] for f in failures(result)} <= liars and result["nodes"]["excluded"] == {}
        assert kmeans_cost(X, np.load(tmp_path / f"o{seed}" / "centers.npy")) <= 1.05 * central_cost(X, 4)
        stood_in += sum(p["phase"] == "train" for p in result["phases"]) - len(result["rounds"])
    assert stood_in > 0  # some round asked stand-ins
