"""DA-UFL through the whole system: ServerApp + ClientApp in-process, each variant."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array

from conftest import central_cost, spread_clusters, write_npy_dir
from fedcluster.config import with_defaults
from fedcluster.inprocess import run
from fedcluster.server.base import FederationError

PAPER = {"algorithm": "da-ufl", "k": 16, "dataset": "da-ufl-paper", "num-points": 800, "snr-db": 20.0}


@pytest.mark.parametrize("weighting", ["som", "bin", "uniform"])
@pytest.mark.parametrize("seed", [0, 1])
def test_each_variant_converges_near_central_kmeans(tmp_path, weighting, seed):
    result = run({**PAPER, "weighting": weighting, "seed": seed, "output-dir": str(tmp_path)}, num_nodes=5)
    info = result["da_ufl"]
    assert info["weighting"] == weighting and info["agents"] == 5 and info["converged"]
    assert info["bins"] == (100 if weighting == "bin" else 5 * 8 * 8)  # auto SOM: about 4k = 64 units per agent
    assert 1 <= info["outer_iterations"] < 100
    assert result["rounds"][-1]["labels_changed"] == 0
    assert all(r["inner_iterations"] >= 1 and r["replies"] >= 5 for r in result["rounds"])
    final = result["final"]
    assert final["num_points"] == result["reference"]["num_points"] and final["cost"] > 0
    # the reference counts every agent's copy of a point, as plain averaging does
    assert result["reference"]["ratio"] < 1.03
    assert np.load(tmp_path / "centers.npy").shape == (16, 2)
    counts = np.load(tmp_path / "bin_counts.npy")
    assert counts.shape[0] == 5 and counts.sum() == final["num_points"]


def test_one_agent_uniform_without_perturbation_is_lloyd_from_the_same_start(tmp_path):
    rng = np.random.default_rng(0)
    X = np.concatenate([rng.normal(size=(40, 2)) + c for c in ((0, 0), (4, 0), (0, 4))])
    (tmp_path / "data").mkdir()
    np.save(tmp_path / "data" / "a.npy", X)
    out = tmp_path / "out"
    run(
        {
            "algorithm": "da-ufl",
            "k": 3,
            "weighting": "uniform",
            "xi-max": 0.0,
            "eps-glo": 0.0,
            "inner-iterations": 1,
            "dataset": "npy-dir",
            "data-dir": str(tmp_path / "data"),
            "output-dir": str(out),
            "init-restarts": 0,
        },
        num_nodes=1,
    )
    centers = np.load(out / "init_centers.npy")
    for _ in range(100):  # plain Lloyd by loops, until stable
        labels = [int(np.argmin(((x - centers) ** 2).sum(1))) for x in X]
        new = np.array([X[np.array(labels) == j].mean(0) if j in labels else centers[j] for j in range(3)])
        if np.array_equal(new, centers):
            break
        centers = new
    np.testing.assert_allclose(np.load(out / "centers.npy"), centers, atol=1e-12)


def test_bin_variant_refuses_a_huge_grid_and_points_to_som(tmp_path):
    config = {
        "algorithm": "da-ufl",
        "k": 3,
        "weighting": "bin",
        "dim": 8,
        "num-points": 300,
        "output-dir": str(tmp_path),
    }
    with pytest.raises(FederationError, match=r"bins=10 with d=8.*weighting='som'"):
        run(config, num_nodes=3)
    result = run(
        {**config, "weighting": "som", "overwrite": True}, num_nodes=3
    )  # the SOM variant runs in any dimension
    assert result["da_ufl"]["bins"] == 3 * 16 and result["reference"]["ratio"] < 1.1


def test_a_hostile_step_reply_drops_the_node_not_the_run(tmp_path):
    def hook(node, message, reply):
        if node == 1001 and not reply.has_error() and message.metadata.message_type == "train.daufl_step":
            record = reply.content.array_records["arrays"]
            record["gradient"] = Array(np.full(record["gradient"].numpy().shape, np.nan))
        return reply

    result = run(
        {**PAPER, "k": 4, "num-points": 400, "reference": False, "output-dir": str(tmp_path)},
        num_nodes=3,
        reply_hook=hook,
    )
    failures = [f for phase in result["phases"] if phase["phase"] == "daufl-step" for f in phase["failures"]]
    assert failures and all(str(f["node"]) == "1001" and "gradient" in f["reason"] for f in failures)
    assert all(r["replies"] == 2 * r["inner_iterations"] for r in result["rounds"])
    assert np.isfinite(result["final"]["cost"])


def test_trimmed_mean_keeps_one_lying_agent_in_ten_from_steering_the_centers(tmp_path):
    # Agent 1003 claims, in every step, that its points of every cluster sit 50 units away
    # (a finite gradient with honest weights: nothing for the bounds to refuse).
    def liar(node, message, reply):
        if node == 1003 and not reply.has_error() and message.metadata.message_type == "train.daufl_step":
            record = reply.content.array_records["arrays"]
            weight = record["weight"].numpy()
            record["gradient"] = Array(np.repeat(-50.0 * weight[:, None], record["gradient"].numpy().shape[1], axis=1))
        return reply

    config = {**PAPER, "k": 16, "seed": 0, "reference": False}
    costs, dropped = {}, {}
    for how in ("mean", "trimmed-mean"):
        honest = run({**config, "aggregation": how, "output-dir": str(tmp_path / f"h-{how}")}, num_nodes=10)
        hostile = run({**config, "aggregation": how, "output-dir": str(tmp_path / how)}, num_nodes=10, reply_hook=liar)
        costs[how] = hostile["final"]["cost"] / honest["final"]["cost"]
        dropped[how] = {(f["node"], "declared" in f["reason"]) for p in hostile["phases"] for f in p["failures"]}
    # Every point weighs the same (uniform weighting, the default): the sums its gradients
    # imply do not add up to the sum its data summary declared, so every step reply of the
    # liar is dropped, whatever the aggregation (once 2x the cost with the mean).
    assert costs["mean"] < 1.1 and dropped["mean"] == {(1003, True)}, (costs, dropped)
    assert costs["trimmed-mean"] < 1.1 and dropped["trimmed-mean"] == {(1003, True)}, (costs, dropped)


@pytest.mark.parametrize("factor", [20.0, 100.0])
def test_a_step_that_would_throw_the_centers_out_of_the_data_drops_its_sender_only(tmp_path, factor):
    """One agent of ten multiplies its gradient (weights honest): with the paper's mean the
    centers once went to 1e69 or NaN and the run died naming honest nodes. The mean such a
    reply implies for a cluster lies outside the box its sender declared: that agent alone
    is excluded, and the run ends near the honest one."""

    def inflate(node, message, reply):
        if node == 1003 and not reply.has_error() and message.metadata.message_type == "train.daufl_step":
            record = reply.content.array_records["arrays"]
            record["gradient"] = Array(record["gradient"].numpy() * factor)
        return reply

    # SOM weights: points weigh differently, so no declared sum binds the gradients (with
    # uniform weights the moments check drops such a reply first); the box check must.
    config = {**PAPER, "k": 16, "seed": 0, "reference": False, "aggregation": "mean", "weighting": "som"}
    honest = run({**config, "output-dir": str(tmp_path / "honest")}, num_nodes=10)
    hostile = run({**config, "output-dir": str(tmp_path / "hostile")}, num_nodes=10, reply_hook=inflate)
    assert list(hostile["nodes"]["excluded"]) == ["1003"], hostile["nodes"]["excluded"]
    assert "outside the bounding box its data summary declared" in hostile["nodes"]["excluded"]["1003"]
    assert np.all(np.isfinite(np.load(tmp_path / "hostile" / "centers.npy")))
    assert hostile["final"]["cost"] <= 1.05 * honest["final"]["cost"], (hostile["final"], honest["final"])


def test_an_agent_putting_its_points_in_the_wrong_cluster_is_dropped(tmp_path):
    """Agent 1003 keeps its sums true (they add up to its declared moments) but claims all
    its points belong to the cluster farthest from their mean (once 1.3x the cost on the
    robust bench): a mean its labels cannot produce, so every such step reply is dropped."""

    def wrong_cluster(node, message, reply):
        if node == 1003 and not reply.has_error() and message.metadata.message_type == "train.daufl_step":
            record = reply.content.array_records["arrays"]
            sent = message.content.array_records["arrays"]["centers"].numpy()
            gradient, weight = record["gradient"].numpy(), record["weight"].numpy()
            total = (weight[:, None] * sent - gradient).sum(0)  # w × the sum of its points
            j = int(((sent - total / weight.sum()) ** 2).sum(1).argmax())
            new_weight = np.zeros_like(weight)
            new_weight[j] = weight.sum()
            new_gradient = new_weight[:, None] * sent
            new_gradient[j] -= total
            record["gradient"], record["weight"] = Array(new_gradient), Array(new_weight)
        return reply

    config = {**PAPER, "k": 16, "seed": 0, "reference": False, "output-dir": str(tmp_path)}
    assert with_defaults(config)["weighting"] == "uniform"
    result = run(config, num_nodes=10, reply_hook=wrong_cluster)
    failures = [f for p in result["phases"] if p["phase"] == "daufl-step" for f in p["failures"]]
    assert failures and all(f["node"] == 1003 and "not a nearest-center assignment" in f["reason"] for f in failures)


def test_a_codebook_outside_the_agents_box_is_dropped_and_the_run_goes_on(tmp_path):
    """With the defaults, one agent of ten answered the SOM phase with units of float64's
    largest value: the server's k-means++ on the codebooks met inf and the run died with a
    raw error, naming no one. A codebook is weighted means of the agent's points, so it
    must lie in the box the agent declared; this one is dropped, its sender named."""

    def huge(node, message, reply):
        if node == 1003 and not reply.has_error() and message.metadata.message_type == "query.som_codebook":
            record = reply.content.array_records["arrays"]
            record["codebook"] = Array(np.full(record["codebook"].numpy().shape, np.finfo(float).max))
        return reply

    config = {**PAPER, "seed": 0, "reference": False, "output-dir": str(tmp_path / "hostile")}
    result = run(config, num_nodes=10, reply_hook=huge)
    failures = [(f["node"], f["reason"]) for p in result["phases"] for f in p["failures"]]
    assert failures and {node for node, _ in failures} == {1003}, failures
    assert "codebook" in failures[0][1] and "bounding box" in failures[0][1]
    assert np.all(np.isfinite(np.load(tmp_path / "hostile" / "centers.npy")))


# ---------------------------------------------------------------- agents that come and go
def cost_of_run(X, out):
    from fedcluster.lloyd import kmeans_cost

    return kmeans_cost(X, np.load(out / "centers.npy"))


def three_hold_a_cluster(tmp_path, seed):
    """Ten agents, four clusters in 2-D: agents 1, 2 and 3 alone hold cluster 0."""
    rng = np.random.default_rng(seed)
    means = rng.normal(scale=8.0, size=(4, 2))
    parts = [
        np.vstack([means[0] + rng.normal(size=(80, 2)), means[1] + rng.normal(size=(10, 2))])
        if i in (1, 2, 3)
        else np.vstack([means[1 + i % 3] + rng.normal(size=(60, 2)), means[1 + (i + 1) % 3] + rng.normal(size=(5, 2))])
        for i in range(10)
    ]
    return write_npy_dir(tmp_path / "data", parts), np.vstack(parts)


def step_failures(result):
    return [f for p in result["phases"] if p["phase"] == "daufl-step" for f in p["failures"]]


@pytest.mark.parametrize("weighting", ["uniform", "som", "bin"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_agents_offline_at_random_are_never_excluded_and_the_run_lands_near_central(tmp_path, weighting, seed):
    """The project's availability model, offline = 0.2: once a raw IndexError in the
    server's step (every agent of a step away or dropped), agents away when the bin counts
    were taken excluded, and 1.06x central's cost from a step that mixed the accumulated
    gradients of some agents with the weights of others."""
    from fedcluster.inprocess import Availability

    data, X = spread_clusters(tmp_path, seed)
    config = {
        "algorithm": "da-ufl",
        "k": 5,
        "weighting": weighting,
        "dataset": "npy-dir",
        "data-dir": str(data),
        "seed": seed,
        "reference": False,
        "output-dir": str(tmp_path / "o"),
    }
    result = run(config, num_nodes=10, availability=Availability(offline=0.2, seed=seed))
    assert result["nodes"]["excluded"] == {} and sum(p["away"] for p in result["phases"]) > 0
    assert result["da_ufl"]["agents"] == 10 and result["da_ufl"]["converged"]
    assert cost_of_run(X, tmp_path / "o") <= 1.05 * central_cost(X, 5)


@pytest.mark.parametrize("seed", [0, 1])
def test_three_agents_away_every_other_round_trip_take_part_and_are_never_excluded(tmp_path, seed):
    """Agents 1001-1003, the only ones holding cluster 0, are offline in every other round
    trip: they were excluded when away at the bin counts (then 3.6x central's cost), or
    never admitted when away at the start (up to 68x)."""
    from fedcluster.inprocess import Availability

    data, X = three_hold_a_cluster(tmp_path, seed)
    config = {
        "algorithm": "da-ufl",
        "k": 4,
        "dataset": "npy-dir",
        "data-dir": str(data),
        "seed": seed,
        "reference": False,
        "init-restarts": 0,
        "output-dir": str(tmp_path / "o"),
    }
    for parity in (0, 1):
        every_other = Availability(away={node: range(parity, 10**6, 2) for node in (1001, 1002, 1003)})
        result = run({**config, "output-dir": str(tmp_path / f"o{parity}")}, num_nodes=10, availability=every_other)
        assert result["nodes"]["excluded"] == {} and result["da_ufl"]["agents"] == 10, result["nodes"]
        assert cost_of_run(X, tmp_path / f"o{parity}") <= 1.05 * central_cost(X, 4)


def every_other_step(nodes, spoil):
    """A reply hook: ``nodes`` spoil (``spoil(reply)``: None = no reply) every second step reply."""
    seen = {}

    def hook(node, message, reply):
        if node in nodes and message.metadata.message_type == "train.daufl_step":
            seen[node] = seen.get(node, 0) + 1
            if seen[node] % 2 == 0:
                return spoil(reply)
        return reply

    return hook


@pytest.mark.parametrize("seed", [0, 1])
def test_agents_late_in_every_other_step_are_never_blamed(tmp_path, seed):
    """Three agents of ten (holding cluster 0 alone) answer every other step too late: the
    server's step stays that of every agent (each counts as it last answered), so nothing
    leaves the data's box. Once honest agents were excluded as liars by the test that left
    replies out, or the run stopped with 'no sound step is left'."""
    data, X = three_hold_a_cluster(tmp_path, seed)
    config = {
        "algorithm": "da-ufl",
        "k": 4,
        "dataset": "npy-dir",
        "data-dir": str(data),
        "seed": seed,
        "reference": False,
        "round-timeout": 1.0,
    }
    for extra in ({}, {"init-restarts": 0}):
        out = tmp_path / f"o{len(extra)}"
        result = run(
            {**config, **extra, "output-dir": str(out)},
            num_nodes=10,
            reply_hook=every_other_step({1001, 1002, 1003}, lambda reply: None),
        )
        assert result["nodes"]["excluded"] == {}, result["nodes"]["excluded"]
        late = step_failures(result)
        assert late and {(f["node"], f["kind"]) for f in late} <= {(n, "timeout") for n in (1001, 1002, 1003)}
        assert cost_of_run(X, out) <= 1.05 * central_cost(X, 4)


@pytest.mark.parametrize("seed", [0, 1])
def test_three_hostile_agents_whose_lies_are_dropped_do_not_stop_the_run(tmp_path, seed):
    """Three agents of ten send a gradient of NaN in every other step: each such reply is
    dropped (an absence), the agents' last valid statistics stay, nobody is excluded and
    the run ends near central. Once the run stopped ('no sound step is left') or ran its
    100 outer iterations without settling."""

    def nan(reply):
        if not reply.has_error():
            record = reply.content.array_records["arrays"]
            record["gradient"] = Array(np.full(record["gradient"].numpy().shape, np.nan))
        return reply

    data, X = three_hold_a_cluster(tmp_path, seed)
    config = {
        "algorithm": "da-ufl",
        "k": 4,
        "dataset": "npy-dir",
        "data-dir": str(data),
        "seed": seed,
        "reference": False,
        "init-restarts": 0,
        "output-dir": str(tmp_path / "o"),
    }
    result = run(config, num_nodes=10, reply_hook=every_other_step({1001, 1002, 1003}, nan))
    dropped = step_failures(result)
    assert dropped and {f["node"] for f in dropped} == {1001, 1002, 1003}
    assert all("gradient" in f["reason"] for f in dropped) and result["nodes"]["excluded"] == {}
    assert result["da_ufl"]["converged"] and result["da_ufl"]["outer_iterations"] < 100
    assert cost_of_run(X, tmp_path / "o") <= 1.05 * central_cost(X, 4)


@pytest.mark.parametrize("trip", [3, 5])
def test_every_agent_away_in_a_round_trip_stops_the_run_by_phase_or_not_at_all(tmp_path, trip):
    """Every agent away in one round trip of the steps: once a raw IndexError (the sum of
    no step replies). Now the run completes near central, or stops with a FederationError
    whose one line names the phase (in-process, a round trip that sends nothing does not
    advance the availability model's clock: everyone stays away)."""
    from fedcluster.inprocess import Availability

    data, X = spread_clusters(tmp_path, 0)
    config = {
        "algorithm": "da-ufl",
        "k": 5,
        "dataset": "npy-dir",
        "data-dir": str(data),
        "seed": 0,
        "reference": False,
        "output-dir": str(tmp_path / "o"),
    }
    try:
        run(config, num_nodes=10, availability=Availability(away={node: {trip} for node in range(1000, 1010)}))
    except FederationError as exc:
        assert str(exc).startswith("phase '") and "\n" not in str(exc), exc
    else:
        assert cost_of_run(X, tmp_path / "o") <= 1.05 * central_cost(X, 5)


# ---------------------------------------------------------------- liars with bin or SOM weights
def corner_mean(liars, points_of):
    """A reply hook: ``liars`` answer every step with each cluster's weighted mean at the
    corner of their own box farthest from its anchor center (inside the box they declared),
    their weights true."""

    def hook(node, message, reply):
        if node in liars and not reply.has_error() and message.metadata.message_type == "train.daufl_step":
            own = points_of(node)
            anchor = message.content.array_records["arrays"]["anchor"].numpy()
            record = reply.content.array_records["arrays"]
            weight = record["weight"].numpy()
            corner = np.where(np.abs(own.max(0) - anchor) > np.abs(own.min(0) - anchor), own.max(0), own.min(0))
            record["gradient"] = Array((anchor - corner) * weight[:, None])
        return reply

    return hook


def dirichlet_mixture(tmp_path, offset):
    """Five Gaussians in 3-D, 3000 points over ten devices by a Dirichlet split (the
    generator's), every point ``offset`` from the origin."""
    from fedcluster.node_data import generated_partition

    config = with_defaults({"k": 5, "dim": 3, "num-points": 3000, "seed": 0, "partition": "dirichlet"})
    parts = [generated_partition(dict(config), i, 10)[0] + offset for i in range(10)]
    return write_npy_dir(tmp_path / "data", parts), parts


@pytest.mark.parametrize("liars", [(1004,), (1001, 1004, 1007)], ids=["one", "three"])
@pytest.mark.parametrize("offset", [0.0, 1e9], ids=["near", "far"])
def test_agents_claiming_their_box_corners_with_bin_weights_are_dropped(tmp_path, liars, offset):
    """With bin weights no moments bound a step reply: agents that put every cluster's
    weighted mean at the corner of their box farthest from it moved the result to 1.8x
    central (one liar) or stopped the run with the centers outside the federation's box
    (three). The server knows each agent's bin weights and counts: a cluster weight W stands
    for at least W / (its heaviest bin's weight) points, whose weighted mean must lie where
    its labels allow (the Voronoi test of uniform weights)."""
    data, parts = dirichlet_mixture(tmp_path, offset)
    X = np.concatenate(parts) - offset
    config = {
        "algorithm": "da-ufl",
        "k": 5,
        "weighting": "bin",
        "dataset": "npy-dir",
        "data-dir": str(data),
        "seed": 0,
        "reference": False,
        "output-dir": str(tmp_path / "o"),
    }
    result = run(config, num_nodes=10, reply_hook=corner_mean(set(liars), lambda node: parts[node - 1000]))
    dropped = step_failures(result)
    assert dropped and {f["node"] for f in dropped} == set(liars)
    centers = np.load(tmp_path / "o" / "centers.npy") - offset
    from fedcluster.lloyd import kmeans_cost

    assert kmeans_cost(X, centers) <= 1.05 * central_cost(X, 5)


def test_an_agent_whose_sums_follow_the_centers_it_is_sent_leaves_the_run(tmp_path):
    """Within one outer iteration an agent's labels and weights are fixed, so are its
    weighted sums: agent 1004 shifts its implied means a little, a different way at every
    step (inside its box, where its labels allow), which no single reply shows. Its second
    reply of an outer iteration contradicts its first: it is excluded."""
    data, X = spread_clusters(tmp_path, 0)
    steps = {}

    def drift(node, message, reply):
        if node == 1004 and not reply.has_error() and message.metadata.message_type == "train.daufl_step":
            steps[node] = steps.get(node, 0) + 1
            record = reply.content.array_records["arrays"]
            weight = record["weight"].numpy()
            shift = 0.2 * (-1.0) ** steps[node]
            record["gradient"] = Array(record["gradient"].numpy() - shift * weight[:, None])
        return reply

    config = {
        "algorithm": "da-ufl",
        "k": 5,
        "weighting": "bin",
        "dataset": "npy-dir",
        "data-dir": str(data),
        "seed": 0,
        "reference": False,
        "output-dir": str(tmp_path / "o"),
    }
    result = run(config, num_nodes=10, reply_hook=drift)
    excluded = {int(node): reason for node, reason in result["nodes"]["excluded"].items()}
    assert list(excluded) == [1004] and "within one outer iteration" in excluded[1004]
    assert cost_of_run(X, tmp_path / "o") <= 1.05 * central_cost(X, 5)
