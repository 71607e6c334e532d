"""Secure aggregation of FedSpectral+'s products (``secure-aggregation = true``), in-process
runs: the secure run gives the plain run's embedding and labels in both modes, the server
never receives one client's product, a client that drops after masking is still in the
sums, one that drops before is out of the run as in a plain run, and a sum no honest
clients could give stops the run by name. Each client's product is clipped to a public
range fixed before the round (``fedcluster.algorithms.fedspectral.model.product_range``), tested here
against honest products."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, Error, Message

from fedcluster.secagg import device as secagg
from fedcluster.config import with_defaults
from fedcluster.kernel import DeviceData
from fedcluster.device import run_task
from fedcluster.algorithms.fedspectral.model import product_range
from fedcluster.node_data import device_data
from fedcluster.inprocess import run
from test_fedspectral import planted, write_split
from test_secagg import fail, in_order_ring

CLIENTS = 5
SECURE_TASKS = {"query.secagg_setup", "query.secagg_share_keys", "train.secure_power_step", "query.secagg_unmask"}


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    edges, n = planted([60, 50, 40], 0.3, 20, 1)
    return write_split(tmp_path_factory.mktemp("graph"), edges, CLIENTS, 1), n


def config(tmp_path, graph, name, **overrides):
    data_dir, n = graph
    return {
        "algorithm": "fedspectral-plus",
        "dataset": "edge-dir",
        "data-dir": str(data_dir),
        "k": 3,
        "num-nodes": n,
        "num-rounds": 5,
        "node-settle-s": 0.2,
        "output-dir": str(tmp_path / name),
        **overrides,
    }


def outputs(tmp_path, name):
    return np.load(tmp_path / name / "labels.npy"), np.load(tmp_path / name / "embedding.npy")


@pytest.mark.parametrize("mode", ["exact", "paper"])
def test_the_secure_run_gives_the_plain_runs_embedding_in_two_round_trips_per_round(tmp_path, graph, mode):
    plain = run(config(tmp_path, graph, "plain", mode=mode), num_nodes=CLIENTS)
    secure = run(config(tmp_path, graph, "secure", mode=mode, **{"secure-aggregation": True}), num_nodes=CLIENTS)
    plain_labels, plain_embedding = outputs(tmp_path, "plain")
    labels, embedding = outputs(tmp_path, "secure")
    np.testing.assert_array_equal(labels, plain_labels)
    np.testing.assert_allclose(embedding, plain_embedding, rtol=1e-6, atol=1e-9 * np.abs(plain_embedding).max())
    trips = {p["round_trip"] for p in secure["phases"]}
    assert len(trips) == 2 + 2 * len(plain["rounds"]) and len(secure["rounds"]) == len(plain["rounds"])
    if mode == "exact":  # the summed degrees, snapped to whole edges: the plain run's to the last bit
        assert secure["final"]["graph"] == plain["final"]["graph"]
    record = secure["final"]["secure_aggregation"]
    assert record["sessions"] == 1 and record["sums"] == len(plain["rounds"]) and "no noise" in record["threat_model"]


def test_the_server_never_receives_a_clients_product(tmp_path, graph):
    """Every reply is of the four secure-aggregation tasks, carries no edge count, and no
    masked product equals, or is near, the client's own product of the block it was sent,
    in floats or in its fixed-point integers."""
    received, requests = [], {}
    run_config = with_defaults(config(tmp_path, graph, "secure", **{"secure-aggregation": True, "num-rounds": 3}))

    def hook(node, message, reply):
        received.append((node, message.metadata.message_type, reply))
        if message.metadata.message_type == "train.secure_power_step":
            requests.setdefault(node, []).append(message)
        return reply

    run(dict(run_config), num_nodes=CLIENTS, reply_hook=hook)
    assert {kind for _, kind, _ in received} == SECURE_TASKS
    checked = in_band = total = 0
    for node, kind, reply in received:
        assert not reply.has_error()
        assert "num-examples" not in reply.content.metric_records.get("metrics", {})
        if kind != "train.secure_power_step":
            continue
        message = requests[node][[id(r) for n, k, r in received if n == node and k == kind].index(id(reply))]
        request = {k: v.numpy() for k, v in message.content.array_records["arrays"].items()}
        data = device_data(run_config, {"partition-id": node - 1000, "num-partitions": CLIENTS})
        plain, _ = run_task(
            "power_step",
            data,
            {k: v for k, v in request.items() if not k.startswith("secagg-")},
            {k: v for k, v in message.content.config_records["config"].items() if not k.startswith("secagg-")},
        )
        masked = reply.content.array_records["arrays"]["Q"].numpy()
        assert masked.dtype == np.uint64 and masked.shape == plain["Q"].shape
        assert not np.allclose(masked.astype(np.float64), plain["Q"], rtol=1e-3)
        fixed = secagg.quantize(plain["Q"], request["secagg-ranges"][0]).astype(np.uint64) & np.uint64(
            secagg.MODULUS - 1
        )
        assert not np.any((masked == fixed) & (fixed != 0)), node  # no nonzero coordinate sent as its fixed-point value
        small = np.minimum(masked, np.uint64(secagg.MODULUS) - masked) <= secagg.HALF_LEVELS
        in_band, total, checked = in_band + int(small.sum()), total + masked.size, checked + 1
    assert checked == 3 * CLIENTS and in_band <= total // 100


def test_a_client_that_drops_after_masking_is_still_in_every_sum(tmp_path, graph):
    """Client 1002 fails every unmasking: its product is in each sum all the same (the
    others' shares remove its own mask), so the run is the plain run over all five."""
    run(config(tmp_path, graph, "plain"), num_nodes=CLIENTS)
    result = run(
        config(tmp_path, graph, "secure", **{"secure-aggregation": True}),
        num_nodes=CLIENTS,
        reply_hook=fail(1002, "query.secagg_unmask"),
    )
    unmask = [p for p in result["phases"] if p["phase"].endswith("-unmask")]
    assert unmask and all([f["node"] for f in p["failures"]] == [1002] for p in unmask)
    np.testing.assert_array_equal(outputs(tmp_path, "secure")[0], outputs(tmp_path, "plain")[0])
    np.testing.assert_allclose(outputs(tmp_path, "secure")[1], outputs(tmp_path, "plain")[1], rtol=1e-6, atol=1e-12)


def test_a_client_that_drops_before_masking_is_out_of_the_run_as_in_a_plain_run(tmp_path, graph):
    plain = run(config(tmp_path, graph, "plain"), num_nodes=CLIENTS, reply_hook=fail(1002, "train.power_step"))
    secure = run(
        config(tmp_path, graph, "secure", **{"secure-aggregation": True}),
        num_nodes=CLIENTS,
        reply_hook=fail(1002, "train.secure_power_step"),
    )
    assert list(secure["nodes"]["excluded"]) == list(plain["nodes"]["excluded"]) == ["1002"]
    np.testing.assert_array_equal(outputs(tmp_path, "secure")[0], outputs(tmp_path, "plain")[0])
    np.testing.assert_allclose(outputs(tmp_path, "secure")[1], outputs(tmp_path, "plain")[1], rtol=1e-6, atol=1e-12)


def test_a_sum_no_honest_clients_could_give_stops_the_run_by_name(tmp_path, graph):
    def garbage(node, message, reply):
        if node == 1003 and message.metadata.message_type == "train.secure_power_step":
            arrays = reply.content.array_records["arrays"]
            shape = arrays["Q"].numpy().shape
            arrays["Q"] = Array(np.random.default_rng(0).integers(0, secagg.MODULUS, size=shape, dtype=np.uint64))
        return reply

    with pytest.raises(Exception, match="degrees-and-first-product.*outside their public ranges"):
        run(config(tmp_path, graph, "secure", **{"secure-aggregation": True}), num_nodes=CLIENTS, reply_hook=garbage)


@pytest.mark.parametrize("seed", range(4))
def test_honest_products_lie_within_the_public_range(seed):
    """The first product ``w A_j [1, G]`` and later ones ``w D^-1/2 A_j D^-1/2 X`` (global
    degrees D, X with orthonormal columns) and paper-mode local power steps: every
    coordinate within ``product_range``, and the bound not loose by more than the graph
    allows (a star's centre reaches the first product's bound's degree part)."""
    rng = np.random.default_rng(seed)
    n, weight = 40, 0.5
    edges = np.unique(np.sort(rng.integers(0, n, size=(200, 2)), axis=1), axis=0)
    edges = edges[edges[:, 0] != edges[:, 1]]
    star = np.stack([np.zeros(n - 1, dtype=np.int64), np.arange(1, n)], axis=1)
    degrees = np.bincount(np.concatenate([edges.ravel(), star.ravel()]), minlength=n).astype(float)
    for local in (edges[: len(edges) // 2], star):
        data = DeviceData(edges=local)
        first = np.hstack([np.ones((n, 1)), rng.standard_normal((n, 4))])
        step = {"num-nodes": n, "iters": 1, "normalization": "global", "edge-weight": weight}
        got = run_task("power_step", data, {"Q": first, "degrees": np.ones(n)}, step)[0]["Q"]
        assert np.abs(got).max() <= product_range(first, weight, True) * (1 + 1e-12)
        X = np.linalg.qr(rng.standard_normal((n, 4)))[0]
        later = run_task("power_step", data, {"Q": X, "degrees": degrees}, step)[0]["Q"]
        assert np.abs(later).max() <= product_range(X, weight, False) * (1 + 1e-12)
        local_steps = run_task("power_step", data, {"Q": X}, {**step, "iters": 2, "normalization": "local"})[0]["Q"]
        assert np.abs(local_steps).max() <= product_range(X, 1.0, False) * (1 + 1e-12)
    star_first = run_task(
        "power_step",
        DeviceData(edges=star),
        {"Q": np.ones((n, 1)), "degrees": np.ones(n)},
        {"num-nodes": n, "iters": 1, "normalization": "global", "edge-weight": weight},
    )[0]["Q"]
    assert np.abs(star_first).max() == pytest.approx(product_range(np.ones((n, 1)), weight, True))  # reached


def test_on_a_sparse_graph_clients_leaving_in_turn_leave_the_plain_runs_result(tmp_path, monkeypatch):
    """Ten clients, four neighbours each (positions in order on the ring): client 1003 drops
    before masking in round 1 and client 1005 in round 2, so position 5 keeps too few of its
    neighbourhood to unmask. The session is set up again; the run ends as the plain run
    with the same two clients leaving does."""
    monkeypatch.setattr(secagg, "neighbourhoods", in_order_ring)
    edges, n = planted([60, 50, 40], 0.3, 20, 1)
    data = write_split(tmp_path / "ten", edges, 10, 1)

    def leaving(seen):
        def hook(node, message, reply):
            if message.metadata.message_type in ("train.power_step", "train.secure_power_step"):
                seen[node] = seen.get(node, 0) + 1
                if (node, seen[node]) in ((1003, 1), (1005, 2)):
                    return Message(Error(code=2, reason="gone"), reply_to=message)
            return reply

        return hook

    plain = run(config(tmp_path, (data, n), "plain"), num_nodes=10, reply_hook=leaving({}))
    secure = run(
        config(tmp_path, (data, n), "secure", **{"secure-aggregation": True, "secagg-neighbours": 4}),
        num_nodes=10,
        reply_hook=leaving({}),
    )
    assert list(secure["nodes"]["excluded"]) == list(plain["nodes"]["excluded"]) == ["1003", "1005"]
    assert secure["final"]["secure_aggregation"]["sessions"] >= 2
    np.testing.assert_array_equal(outputs(tmp_path, "secure")[0], outputs(tmp_path, "plain")[0])
    np.testing.assert_allclose(outputs(tmp_path, "secure")[1], outputs(tmp_path, "plain")[1], rtol=1e-6, atol=1e-9)


def test_a_client_revealing_a_wrong_own_seed_is_named_and_the_run_completes(tmp_path, graph):
    """Client 1002 sends a wrong value of its own mask seed in every unmasking. Before, the
    first sum decoded outside the ranges and the run stopped saying the sender could not be
    named. Now the seed fails 1002's commitment: it is named and excluded, the sum completes
    without its product, and the run is the plain run without 1002 from the start."""
    from test_secagg_liars import wrong_seed

    plain = run(config(tmp_path, graph, "plain"), num_nodes=CLIENTS, reply_hook=fail(1002, "train.power_step"))
    secure = run(
        config(tmp_path, graph, "secure", **{"secure-aggregation": True}),
        num_nodes=CLIENTS,
        reply_hook=wrong_seed(1002),
    )
    assert list(secure["nodes"]["excluded"]) == list(plain["nodes"]["excluded"]) == ["1002"]
    assert "seed" in secure["nodes"]["excluded"]["1002"] and secure["final"]["secure_aggregation"][
        "excluded_liars"
    ] == [1002]
    np.testing.assert_array_equal(outputs(tmp_path, "secure")[0], outputs(tmp_path, "plain")[0])
    np.testing.assert_allclose(outputs(tmp_path, "secure")[1], outputs(tmp_path, "plain")[1], rtol=1e-6, atol=1e-12)


def test_a_sum_a_liars_shares_keep_masked_stops_the_run_naming_it(tmp_path, graph, monkeypatch):
    """A product cannot be skipped: when client 1002's shares rebuild another mask key than
    its own (and its seed is wrong), the run stops and the error names 1002."""
    from test_secagg_liars import crafted_shares, wrong_seed

    crafted_shares(monkeypatch, 1002)
    with pytest.raises(Exception, match=r"degrees-and-first-product.*\[1002\] lied"):
        run(
            config(tmp_path, graph, "secure", **{"secure-aggregation": True}),
            num_nodes=CLIENTS,
            reply_hook=wrong_seed(1002),
        )
