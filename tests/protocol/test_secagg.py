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
    "reference": False, "epsilon": math.inf, "init": "server-kmeans++", "clip-norm": 1e3, "max-device-points": 600, "evaluate-cost": False,
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


def test_secure_lloyd_at_epsilon_inf_gives_the_plain_centers_in_two_round_trips_per_round(tmp_path):
    """One session of keys (two round trips) serves every round; each round is then a masked
    reply and an unmasking."""
    plain = run(config(tmp_path, "plain", **{"lloyd-rounds": 3}), num_nodes=NODES)
    secure = run(config(tmp_path, "secure", **{"lloyd-rounds": 3, "secure-aggregation": True}), num_nodes=NODES)
    np.testing.assert_allclose(centers(tmp_path, "secure"), centers(tmp_path, "plain"), rtol=1e-6)
    phases = [p["phase"] for p in secure["phases"] if p["phase"].startswith("lloyd")]
    assert phases == ["lloyd-setup", "lloyd-share-keys"] + ["lloyd", "lloyd-unmask"] * 3
    lloyd_trips = {p["round_trip"] for p in secure["phases"] if p["phase"].startswith("lloyd")}
    plain_trips = {p["round_trip"] for p in plain["phases"] if p["phase"].startswith("lloyd")}
    assert len(plain_trips) == 3 and len(lloyd_trips) == 2 + 2 * 3
    assert secure["privacy"]["secure_aggregation"]["sessions"] == 1


def test_the_server_never_receives_a_devices_plain_statistics(tmp_path):
    """Every reply the server receives in a secure run (evaluate-cost off, a start that asks
    the devices nothing) is of the four secure-aggregation tasks, carries no point count,
    and no masked array equals, or is near, the device's plain sums or counts, in floats or
    in their fixed-point integers."""
    received, requests = [], []
    run_config = with_defaults(config(tmp_path, "secure", **{"lloyd-rounds": 2, "secure-aggregation": True}))

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


def test_a_device_that_drops_before_masking_stays_out_and_one_that_misses_an_unmasking_stays_in(tmp_path):
    """Three rounds of one session. Node 1000 fails its first masked reply: its sk1 is
    rebuilt, so it is never asked again (the others stop masking with it) and every round is
    over the nine others. Node 1001 fails only its first unmasking: its vector was in the
    sum, and it takes part in the next rounds."""
    seen = []

    def hook(node, message, reply):
        kind = message.metadata.message_type
        seen.append((node, kind))
        first = seen.count((node, kind)) == 1
        if first and ((node, kind) == (1000, "query.secure_feddp_lloyd") or (node, kind) == (1001, "query.secagg_unmask")):
            return Message(Error(code=2, reason="gone"), reply_to=message)
        return reply

    result = run(config(tmp_path, "secure", **{"lloyd-rounds": 3, "secure-aggregation": True}), num_nodes=NODES, reply_hook=hook)
    assert seen.count((1000, "query.secure_feddp_lloyd")) == 1 and seen.count((1001, "query.secure_feddp_lloyd")) == 3
    assert result["privacy"]["secure_aggregation"]["sessions"] == 1
    X = pooled_points(result["config"], NODES)[0]
    X = X[len(X) // NODES:]  # node 1000 holds the first tenth
    expected = np.load(tmp_path / "secure" / "init_centers.npy")
    for _ in range(3):
        expected = lloyd_step(X, expected)
    np.testing.assert_allclose(centers(tmp_path, "secure"), expected, rtol=1e-6)


def test_fewer_unmask_answers_than_the_threshold_stop_the_run(tmp_path):
    def hook(node, message, reply):
        if node < 1004 and message.metadata.message_type == "query.secagg_unmask":
            return Message(Error(code=2, reason="gone"), reply_to=message)
        return reply

    with pytest.raises(Exception, match="lloyd-unmask.*7 required"):
        run(config(tmp_path, "secure", **{"lloyd-rounds": 1, "secure-aggregation": True}), num_nodes=NODES, reply_hook=hook)


def test_secure_aggregation_is_refused_where_a_device_would_still_send_its_statistics_in_the_clear():
    for overrides in ({"init": "feddp"}, {"init": "auto"}, {"evaluate-cost": True}):  # auto: FedDP-Init with server data
        with pytest.raises(ConfigError, match="secure-aggregation"):
            with_defaults({**BASE, "secure-aggregation": True, **overrides})
    with_defaults({**BASE, "secure-aggregation": True, "init": "auto", "dataset": "gaussian-mixture"})  # histogram: secured


def test_a_devices_session_outlives_its_process(tmp_path):
    """A deployment starts one ClientApp process per message, and a simulation may run a
    node's messages in different workers: the session's keys, seed and shares must come
    back from Flower's ``context.state``, not from process memory. Here every message finds
    an empty data cache (as a fresh process would) and the run still gives the plain centers."""
    import client_app.app as device

    def fresh_process(node, message, reply):
        device._DATA_CACHE.clear()
        return reply

    run(config(tmp_path, "plain", **{"lloyd-rounds": 2}), num_nodes=NODES)
    run(config(tmp_path, "secure", **{"lloyd-rounds": 2, "secure-aggregation": True}), num_nodes=NODES,
        reply_hook=fresh_process)
    np.testing.assert_allclose(centers(tmp_path, "secure"), centers(tmp_path, "plain"), rtol=1e-6)


NO_SERVER_DATA = {
    "algorithm": "feddp-kmeans", "dataset": "gaussian-mixture", "dim": 4, "dimension": 4, "k": 4, "num-points": 4000, "seed": 2,
    "reference": False, "epsilon": 1.0, "lloyd-rounds": 3, "clip-norm": 30.0, "noise-seed": 7, "evaluate-cost": False,
}


def test_without_server_data_the_secure_run_with_the_servers_noise_is_the_plain_run(tmp_path):
    """The default start without server data (the histogram) and the relative Lloyd rounds,
    no cap on a device's points, the server adding the noise: secured, the same noise draws
    give the plain run's centers (the sensitivities grow only by the rounding to the
    fixed-point grid), within the same ε."""
    plain = run({**NO_SERVER_DATA, "output-dir": str(tmp_path / "plain")}, num_nodes=NODES)
    secure = run({**NO_SERVER_DATA, "output-dir": str(tmp_path / "secure"), "secure-aggregation": True,
                  "secagg-noise": "server"}, num_nodes=NODES)
    assert secure["init"]["method"] == "histogram" and secure["privacy"]["lloyd_update"] == "relative"
    np.testing.assert_allclose(centers(tmp_path, "secure"), centers(tmp_path, "plain"), rtol=1e-5, atol=1e-6)
    assert plain["privacy"]["secure_aggregation"] is None
    record = secure["privacy"]["secure_aggregation"]
    assert record["sums"] == 1 + 3 and record["sessions"] == 1 and record["out_of_range"] == []
    assert secure["privacy"]["epsilon"] <= 1.0
    for step in ("step2", "lloyd_gaussian", "lloyd_laplace"):  # the rounding slack is accounted, and tiny
        assert plain["privacy"]["bounds"][step] < secure["privacy"]["bounds"][step] < plain["privacy"]["bounds"][step] * (1 + 1e-4)
    phases = [p["phase"] for p in secure["phases"]]
    assert phases[:4] == ["init-histogram-setup", "init-histogram-share-keys", "init-histogram", "init-histogram-unmask"]


def test_a_sum_outside_the_devices_ranges_skips_that_update_and_says_so(tmp_path):
    """Node 1003 masks garbage in the first Lloyd round (a reply no check can read): the sum
    is outside what ten devices' ranges allow, that round's update is skipped and listed,
    the run completes, and the second round moves the centers as usual."""
    rounds = []

    def garbage(node, message, reply):
        if message.metadata.message_type == "query.secure_feddp_lloyd":
            rounds.append(node)
            if node == 1003 and rounds.count(1003) == 1:
                from flwr.app import Array

                arrays = reply.content.array_records["arrays"]
                rng = np.random.default_rng(0)
                for name in list(arrays):
                    shape = arrays[name].numpy().shape
                    arrays[name] = Array(rng.integers(0, secagg.MODULUS, size=shape, dtype=np.uint64))
        return reply

    result = run(config(tmp_path, "secure", **{"lloyd-rounds": 2, "secure-aggregation": True}), num_nodes=NODES,
                 reply_hook=garbage)
    assert result["privacy"]["secure_aggregation"]["out_of_range"] == ["lloyd"]
    shifts = [r["center_shift"] for r in result["rounds"]]
    assert shifts[0] == 0.0 and shifts[1] > 0
    X = pooled_points(result["config"], NODES)[0]
    init = np.load(tmp_path / "secure" / "init_centers.npy")
    np.testing.assert_allclose(centers(tmp_path, "secure"), lloyd_step(X, init), rtol=1e-6)


def test_a_secured_stages_failure_reason_names_no_point_count_or_data_path(tmp_path):
    """A plain task's failure says which data it failed on (point count, path); a secured
    stage's does not, since only sums of its statistics may reach the server."""
    from flwr.app import ConfigRecord, Context, Message, RecordDict
    import client_app.app as device
    from inprocess.grid import set_task_identity

    set_task_identity(run_id=7, node_id=1)

    run_config = {k: v for k, v in with_defaults({**BASE, "secure-aggregation": True}).items() if v is not None}
    context = Context(run_id=7, node_id=1000, node_config={"partition-id": 0, "num-partitions": NODES},
                      state=RecordDict(), run_config=run_config)
    described = device.load_data(context).describe()

    def reason(task, config):
        message = Message(RecordDict({"config": ConfigRecord(config)}), dst_node_id=1000, message_type=f"query.{task}")
        reply = device.handle(message, context)
        assert reply.has_error()
        return reply.error.reason

    assert described in reason("lloyd_stats", {})  # a plain task: where it failed (centers missing)
    secured = reason("secagg_unmask", {"session": 1})  # its arrays missing
    assert "secagg_unmask" in secured and described not in secured


def test_with_the_devices_noise_no_sum_the_server_decodes_lacks_it_and_epsilon_holds(tmp_path, monkeypatch):
    """secagg-noise = devices (the default): every sum the server unmasks already holds
    Skellam noise of the planned variance (its spread around the devices' exact sums, over
    every coordinate of the histogram and the Lloyd rounds, is that of the plan: ten
    devices' shares of v/7 each), and the reported ε, recomputed here from the reported
    releases with an independent implementation of the Skellam RDP bound, is at most the
    target."""
    from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

    decoded, requests = [], []
    original = secagg.unmasked_sum
    monkeypatch.setattr(secagg, "unmasked_sum", lambda *a, **k: decoded.append(original(*a, **k)) or decoded[-1])

    def hook(node, message, reply):
        if message.metadata.message_type.startswith("query.secure_"):
            requests.append((node, message))
        return reply

    run_config = with_defaults({**NO_SERVER_DATA, "output-dir": str(tmp_path / "secure"), "secure-aggregation": True})
    result = run(dict(run_config), num_nodes=NODES, reply_hook=hook)
    privacy = result["privacy"]
    assert privacy["noise_added_by"] == "the devices" and privacy["min_noisy_devices"] == 7  # t of 10
    assert privacy["secure_aggregation"]["out_of_range"] == []
    orders = list(range(2, 257))
    rdp = [sum(s["compositions"] * (a * s["l2"] ** 2 / (2 * s["variance"]) + min(
        ((2 * a - 1) * s["l2"] ** 2 + 6 * s["l1"]) / (4 * s["variance"] ** 2), 3 * s["l1"] / (2 * s["variance"])))
        for s in privacy["steps"]) for a in orders]
    assert privacy["epsilon"] <= compute_epsilon(orders, rdp, run_config["delta"])[0] * (1 + 1e-9) <= 1.0 + 1e-6

    std = {s["name"]: s["noise_std"] * math.sqrt(NODES / 7) for s in privacy["steps"]}
    names = {"histogram": "step2", "sums": "lloyd_gaussian", "counts": "lloyd_laplace"}
    scaled = []
    for index, total in enumerate(decoded):  # one per sum: the histogram, then each Lloyd round
        mine = requests[index * NODES:(index + 1) * NODES]
        exact = {}
        for node, message in mine:
            data = device_data(run_config, {"partition-id": node - 1000, "num-partitions": NODES})
            task = message.metadata.message_type.removeprefix("query.secure_")
            request = {k: v.numpy() for k, v in message.content.array_records["arrays"].items() if not k.startswith("secagg-")}
            config = {k: v for k, v in message.content.config_records["config"].items() if not k.startswith("secagg-")}
            plain, _ = run_task(task, data, request, config)
            for name in total:
                exact[name] = exact.get(name, 0) + plain[name]
        for name, value in total.items():
            scaled.append(((value - exact[name]) / std[names[name]]).ravel())
    scaled = np.concatenate(scaled)
    assert scaled.size == 40 + 3 * (16 + 4)
    assert 0.75 < scaled.std() < 1.3, scaled.std()
