"""Defaults that fit the data they meet, through the whole federation: FedKMeans never ends
on an unmeasured re-seed and returns the cheapest centers it measured, k-FED's devices
choose k' and the server warns about a given k' that was too small, ``standardize`` is the
StandardScaler → KMeans pipeline, federated."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from sklearn.cluster import KMeans

import fedcluster
from conftest import state_partition, write_npy_dir
from fedcluster.inprocess import run


def with_a_tiny_cluster(seed=0):
    """Three blobs of 500 points and a genuine 3-point cluster far away (uci/statlog has
    one, on one device): the tiny cluster stays below ρ = 1 % of the largest for the whole run."""
    rng = np.random.default_rng(seed)
    big = np.concatenate([rng.normal(size=(500, 2)) + m for m in ([0, 0], [8, 0], [0, 8])])
    tiny = rng.normal(scale=0.3, size=(3, 2)) + [30, 30]  # on one device, which summarizes it
    parts = [big[i::5] for i in range(5)]
    parts[0] = np.concatenate([parts[0], tiny])
    return parts, np.concatenate(parts)


def central_cost(X, k):
    return min(KMeans(k, n_init=10, random_state=s).fit(X).inertia_ for s in range(3))


def fedkmeans_run(tmp_path, parts, **config):
    directory = write_npy_dir(tmp_path / "data", parts)
    return run(
        {
            "k": 4,
            "dataset": "npy-dir",
            "data-dir": str(directory),
            "output-dir": str(tmp_path / "out"),
            "reference": False,
            "n-init": 1,
            **config,
        },
        num_nodes=len(parts),
    )


def test_no_reseed_on_the_last_round(tmp_path):
    """reassign-patience = num-rounds: the tiny cluster's patience runs out on the last
    round, where nothing could measure a re-seed any more: it is not re-seeded."""
    parts, X = with_a_tiny_cluster()
    result = fedkmeans_run(tmp_path, parts, **{"num-rounds": 6, "reassign-patience": 6})
    assert all(r["reassigned"] == [] for r in result["rounds"])
    centers = np.load(tmp_path / "out" / "centers.npy")
    assert (((X[:, None] - centers[None]) ** 2).sum(-1).min(1).sum()) <= 1.001 * central_cost(X, 4)


def test_a_reseed_the_next_round_measures_as_worse_is_undone(tmp_path):
    parts, X = with_a_tiny_cluster(1)
    result = fedkmeans_run(tmp_path, parts, **{"num-rounds": 8, "reassign-patience": 2})
    rounds = result["rounds"]
    moved = [r["round"] for r in rounds if r["reassigned"]]
    undone = [r["round"] for r in rounds if r.get("reseed_undone")]
    assert moved and undone and undone[0] == moved[0] + 1, (moved, undone)
    assert len(moved) == 1  # the cluster whose re-seed was undone is never re-seeded again
    centers = np.load(tmp_path / "out" / "centers.npy")
    cost = ((X[:, None] - centers[None]) ** 2).sum(-1).min(1).sum()
    assert cost <= 1.001 * central_cost(X, 4)
    assert result["final"]["total_cost"] == pytest.approx(cost, rel=1e-9)


@pytest.mark.parametrize("fraction", [1.0, 0.5])
def test_the_estimator_returns_the_cheapest_centers_every_client_measured(fraction):
    rng = np.random.default_rng(5)
    clients = [rng.normal(size=(60, 3)) + (i % 4) * 3.0 for i in range(8)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", fedcluster.FederatedRunWarning)
        model = fedcluster.FederatedKMeans(4, random_state=2, fraction=fraction, max_iter=8).fit(clients)
    last = model.result_.get("last")
    # a warning only when the last centers cost more than 1 % above the returned ones
    warned = any("last_centers.npy" in str(w.message) for w in caught)
    assert warned == bool(last and last["cost"] > 1.01 * model.result_["final"]["cost"]), (last, model.result_["final"])
    measured = [r["cost"] for r in model.history_ if r.get("cost") is not None]
    measured.append(model.result_.get("last", model.result_["final"])["cost"])
    points = sum(map(len, clients))
    assert model.inertia_ / points == pytest.approx(min(measured), rel=1e-9)
    naive = sum(((X[:, None] - model.cluster_centers_[None]) ** 2).sum(-1).min(1).sum() for X in clients)
    assert model.inertia_ == pytest.approx(naive, rel=1e-9)


def test_center_sets_travel_in_one_message_and_the_cheapest_is_returned(tmp_path):
    sizes = []

    def hook(node, message, reply):
        if message.metadata.message_type == "train.fedkmeans_train":
            sizes.append(message.content.array_records["arrays"]["centers"].numpy().shape[0])
        return reply

    parts, X = with_a_tiny_cluster(2)
    directory = write_npy_dir(tmp_path / "data", parts)
    result = run(
        {
            "k": 4,
            "dataset": "npy-dir",
            "data-dir": str(directory),
            "output-dir": str(tmp_path / "out"),
            "reference": False,
            "n-init": 5,
            "num-rounds": 6,
        },
        num_nodes=5,
        reply_hook=hook,
    )
    assert result["init"]["sets"] == 5 and sizes[0] == 5
    assert sizes == sorted(sizes, reverse=True) and sizes[-1] == 1  # sets stop; the last half trains one
    assert len(sizes) == 5 * len(result["rounds"])  # one message per node and round, whatever the sets
    per_set = [s["sampled_cost_of_received"] for r in result["rounds"] for s in r.get("sets", [])]
    assert result["final"]["cost"] <= min(per_set) * (1 + 1e-9)


# ----------------------------------------------------------------------------- k-FED
def grid_of_blobs(seed=0, devices=6):
    rng = np.random.default_rng(seed)
    X = np.concatenate([rng.normal(size=(90, 2)) + 6.0 * np.array(divmod(i, 3)) for i in range(9)])
    order = rng.permutation(len(X))
    return [X[order[i::devices]] for i in range(devices)], X


def test_kfed_devices_choose_k_prime_and_a_given_one_too_small_is_warned_about():
    clients, X = grid_of_blobs()  # IID: every device holds all nine clusters
    with warnings.catch_warnings():
        warnings.simplefilter("error", fedcluster.FederatedRunWarning)
        chosen = fedcluster.FederatedKMeans(9, algorithm="kfed", random_state=0).fit(clients)
    assert chosen.result_["kfed"]["device_k_prime"]["min"] == 9
    assert chosen.inertia_ <= 1.01 * central_cost(X, 9)
    with pytest.warns(fedcluster.FederatedRunWarning, match="k-prime=3 looks too small"):
        paper = fedcluster.FederatedKMeans(9, algorithm="kfed", random_state=0, run_config={"k-prime": 3}).fit(clients)
    assert paper.result_["kfed"]["induced_over_nearest"] > 1.2
    assert paper.inertia_ > chosen.inertia_


# ----------------------------------------------------------------------------- standardize
@pytest.mark.parametrize("algorithm", ["fedkmeans", "kfed", "da-ufl"])
def test_standardize_is_the_standard_scaler_kmeans_pipeline_federated(algorithm):
    from sklearn.datasets import load_wine
    from sklearn.preprocessing import StandardScaler

    X, _ = load_wine(return_X_y=True)  # features from ~0.1 to ~1000: raw k-means sees one of them
    clients = [X[i::6] for i in range(6)]
    model = fedcluster.FederatedKMeans(3, algorithm=algorithm, random_state=0, run_config={"standardize": True}).fit(
        clients
    )
    scaler = StandardScaler().fit(X)
    np.testing.assert_allclose(model.scaling_.mean, scaler.mean_, rtol=1e-9)
    np.testing.assert_allclose(model.scaling_.scale, scaler.scale_, rtol=1e-9)
    Z = scaler.transform(X)
    central = central_cost(Z, 3)
    scaled_centers = scaler.transform(model.cluster_centers_)  # centers come back in the original units
    cost = ((Z[:, None] - scaled_centers[None]) ** 2).sum(-1).min(1).sum()
    assert cost <= 1.01 * central
    assert model.inertia_ == pytest.approx(cost, rel=1e-9)  # inertia_ is in the standardized units
    expected = ((Z[:, None] - scaled_centers[None]) ** 2).sum(-1).argmin(1)
    np.testing.assert_array_equal(model.predict(X), expected)
    np.testing.assert_array_equal(np.concatenate(model.labels_), np.concatenate([expected[i::6] for i in range(6)]))
    raw = fedcluster.FederatedKMeans(3, algorithm=algorithm, random_state=0).fit(clients)
    raw_cost = ((Z[:, None] - scaler.transform(raw.cluster_centers_)[None]) ** 2).sum(-1).min(1).sum()
    assert raw_cost > 1.2 * central  # what standardize is for


def test_standardize_is_refused_where_it_does_not_apply():
    with pytest.raises(
        ValueError, match="standardize = True is not read by algorithm 'feddp-kmeans'.*privacy guarantee"
    ):
        fedcluster.DPFederatedKMeans(3, epsilon=1.0, run_config={"standardize": True}).fit(
            [np.random.default_rng(0).normal(size=(50, 2))] * 3, server_data=np.zeros((10, 2))
        )


def edge_labels(points, centers):
    """Every point to its nearest center, except the q points farthest along the line from
    center j to the data's far side, which go to j: the (j, q) that moves a center most
    while the group's mean stays nearest its center (the server's Voronoi check)."""
    labels = ((points[:, None] - centers[None]) ** 2).sum(-1).argmin(1)
    best, choice = 0.0, None
    for j, c in enumerate(centers):
        order = np.argsort(-((points - c) @ (points.mean(0) - c)))
        q = np.arange(1, len(points) + 1)
        means = np.cumsum(points[order], axis=0) / q[:, None]
        inside = ((means[:, None] - centers[None]) ** 2).sum(-1).argmin(1) == j
        pull = np.where(inside, q * np.sqrt(((means - c) ** 2).sum(1)), 0.0)
        if pull.max() > best:
            best, choice = float(pull.max()), (j, order[: int(np.argmax(pull)) + 1])
    labels[choice[1]] = choice[0]
    return labels


def test_a_last_round_that_made_things_worse_is_warned_about_and_not_returned(tmp_path):
    """Node 1000 forges its last training reply: a false partition of its real points
    (:func:`edge_labels`), with two local epochs, where no check binds a training reply to
    one fixed set of points (with one, ``partitions_violation`` drops it: tests/protocol/
    test_fedkmeans.py): the last centers cost more than
    1 % above round T-1's. The cheaper centers are returned, the last kept beside them, and
    the run warns; a difference below 1 % is only logged."""

    parts, X = with_a_tiny_cluster(3)
    rounds = 5

    def forge(node, message, reply):
        if (
            node != 1000
            or reply.has_error()
            or message.metadata.message_type != "train.fedkmeans_train"
            or message.metadata.group_id != str(rounds)
        ):
            return reply
        sent = message.content.array_records["arrays"]["centers"].numpy()
        state_partition(reply.content.array_records["arrays"], sent, parts[0], lambda s: edge_labels(parts[0], sent[s]))
        return reply

    directory = write_npy_dir(tmp_path / "data", parts)
    config = {
        "k": 4,
        "dataset": "npy-dir",
        "data-dir": str(directory),
        "output-dir": str(tmp_path / "out"),
        "reference": False,
        "n-init": 1,
        "num-rounds": rounds,
        "local-epochs": 2,
    }
    result = run(config, num_nodes=len(parts), reply_hook=forge)
    assert result["last"]["cost"] > 1.01 * result["final"]["cost"]
    assert any("last_centers.npy the last" in text for text in result["warnings"]), result["warnings"]
    C, last = np.load(tmp_path / "out" / "centers.npy"), np.load(tmp_path / "out" / "last_centers.npy")
    cost = lambda centers: ((X[:, None] - centers[None]) ** 2).sum(-1).min(1).sum()
    assert cost(C) < cost(last)
