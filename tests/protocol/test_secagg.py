"""Secure aggregation of the FedDP-Lloyd sums (fedcluster/secagg.py, server_app/secagg.py),
in-process runs: the secure run's centers are the plain run's, the server never receives a
device's plain statistics, and devices that drop before or after masking still give the
right sum while at least the threshold answer the unmasking."""

from __future__ import annotations

import math

import numpy as np
import pytest
from flwr.app import Error, Message

from conftest import lloyd_step
from fedcluster import secagg
from fedcluster.config import ConfigError, with_defaults
from fedcluster.device import run_task
from fedcluster.node_data import device_data, pooled_points
from inprocess import run

NODES = 10
BASE = {
    "algorithm": "feddp-kmeans", "dataset": "feddp-mixture", "dim": 10, "k": 3, "num-points": 3000, "seed": 3,
    "reference": False, "epsilon": math.inf, "init": "server-kmeans++", "clip-norm": 1e3, "max-device-points": 600,
}
SECAGG_TASKS = {"query.secagg_setup", "query.secagg_share_keys", "query.secure_feddp_lloyd", "query.secagg_unmask"}


def config(tmp_path, name, **overrides):
    return {**BASE, "output-dir": str(tmp_path / name), **overrides}


def centers(tmp_path, name):
    return np.load(tmp_path / name / "centers.npy")


def fail(node_to_fail, message_type):
    """A reply hook: ``node_to_fail``'s reply to ``message_type`` becomes an error reply."""
    def hook(node, message, reply):
        if node == node_to_fail and message.metadata.message_type == message_type:
            return Message(Error(code=2, reason="gone"), reply_to=message)
        return reply
    return hook


def test_secure_lloyd_at_epsilon_inf_gives_the_plain_centers_in_four_round_trips_per_round(tmp_path):
    plain = run(config(tmp_path, "plain", **{"lloyd-rounds": 3}), num_nodes=NODES)
    secure = run(config(tmp_path, "secure", **{"lloyd-rounds": 3, "secure-aggregation": True}), num_nodes=NODES)
    np.testing.assert_allclose(centers(tmp_path, "secure"), centers(tmp_path, "plain"), rtol=1e-6)
    phases = [p["phase"] for p in secure["phases"] if p["phase"].startswith("lloyd")]
    assert phases == ["lloyd-setup", "lloyd-share-keys", "lloyd", "lloyd-unmask"] * 3
    lloyd_trips = {p["round_trip"] for p in secure["phases"] if p["phase"].startswith("lloyd")}
    plain_trips = {p["round_trip"] for p in plain["phases"] if p["phase"].startswith("lloyd")}
    assert len(lloyd_trips) == 4 * len(plain_trips) == 12


def test_the_server_never_receives_a_devices_plain_statistics(tmp_path):
    """Every reply the server receives in a secure run (evaluate-cost off, a start that asks
    the devices nothing) is of the four secure-aggregation tasks, carries no point count,
    and no masked array equals, or is near, the device's plain sums or counts, in floats or
    in their fixed-point integers."""
    received, requests = [], []
    run_config = with_defaults(config(tmp_path, "secure", **{"lloyd-rounds": 2, "secure-aggregation": True,
                                                             "evaluate-cost": False}))

    def hook(node, message, reply):
        received.append((node, message.metadata.message_type, reply))
        if message.metadata.message_type == "query.secure_feddp_lloyd":
            requests.append((node, message))
        return reply

    run(dict(run_config), num_nodes=NODES, reply_hook=hook)
    assert {kind for _, kind, _ in received} == SECAGG_TASKS and len(requests) == 2 * NODES
    for _, _, reply in received:
        assert not reply.has_error()
        assert set(reply.content.metric_records["metrics"]) == {"partition"}  # no num-examples, no kept
    masked = {}
    for node, kind, reply in received:
        if kind == "query.secure_feddp_lloyd":
            masked.setdefault(node, []).append({k: v.numpy() for k, v in reply.content.array_records["arrays"].items()})
    in_band = total = 0
    for node in sorted(masked):
        data = device_data(run_config, {"partition-id": node - 1000, "num-partitions": NODES})
        mine = [m for n, m in requests if n == node]
        for message, arrays in zip(mine, masked[node]):
            request = {k: v.numpy() for k, v in message.content.array_records["arrays"].items()}
            plain, _ = run_task("feddp_lloyd", data, {k: v for k, v in request.items() if not k.startswith("secagg-")},
                                {k: v for k, v in message.content.config_records["config"].items() if not k.startswith("secagg-")})
            ranges = dict(zip(("sums", "counts"), request["secagg-ranges"]))
            for name in ("sums", "counts"):
                value = arrays[name]
                assert value.dtype == np.uint64 and value.shape == plain[name].shape
                assert not np.allclose(value.astype(np.float64), plain[name], rtol=1e-3)
                fixed = secagg.quantize(plain[name], ranges[name]).astype(np.uint64) & np.uint64(secagg.MODULUS - 1)
                assert not np.any(value == fixed), (node, name)  # no coordinate sent as its fixed-point value
                # masked values are uniform in [0, 2^62): almost none in the band of a plain fixed-point value
                small = np.minimum(value, np.uint64(secagg.MODULUS) - value) <= secagg.HALF_LEVELS
                in_band, total = in_band + int(small.sum()), total + value.size
    assert total == 2 * NODES * (3 * 10 + 3) and in_band <= total // 100


@pytest.mark.parametrize("stage", ["after-masking", "before-masking"])
def test_a_device_that_drops_still_gives_the_right_sum_of_the_others(tmp_path, stage):
    """Node 1000 fails its unmask reply (after masking: its vector is in the sum, the others'
    shares remove its seed's mask) or its masked reply (before masking: its pairwise masks
    in the nine others' vectors are removed with its reconstructed sk1): the round completes
    with nine answers, over all ten or over the nine others."""
    kind = "query.secagg_unmask" if stage == "after-masking" else "query.secure_feddp_lloyd"
    result = run(config(tmp_path, "secure", **{"lloyd-rounds": 1, "secure-aggregation": True}), num_nodes=NODES,
                 reply_hook=fail(1000, kind))
    phase = {p["phase"]: p for p in result["phases"]}
    failed = "lloyd-unmask" if stage == "after-masking" else "lloyd"
    assert [f["node"] for f in phase[failed]["failures"]] == [1000] and phase[failed]["replies"] == NODES - 1
    X = pooled_points(result["config"], NODES)[0]
    used = X if stage == "after-masking" else X[len(X) // NODES:]  # node 1000 holds the first tenth
    init = np.load(tmp_path / "secure" / "init_centers.npy")
    np.testing.assert_allclose(centers(tmp_path, "secure"), lloyd_step(used, init), rtol=1e-6)


def test_fewer_unmask_answers_than_the_threshold_stop_the_run(tmp_path):
    def hook(node, message, reply):
        if node < 1004 and message.metadata.message_type == "query.secagg_unmask":
            return Message(Error(code=2, reason="gone"), reply_to=message)
        return reply

    with pytest.raises(Exception, match="lloyd-unmask.*7 required"):
        run(config(tmp_path, "secure", **{"lloyd-rounds": 1, "secure-aggregation": True}), num_nodes=NODES, reply_hook=hook)


def test_secure_aggregation_is_refused_where_the_prototype_does_not_secure_every_sum():
    for overrides in ({"max-device-points": 0}, {"init": "feddp"}, {"privacy-level": "client"}):
        with pytest.raises(ConfigError, match="secure-aggregation"):
            with_defaults({**BASE, "secure-aggregation": True, **overrides})
