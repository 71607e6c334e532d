"""Secure aggregation of the FedDP-Lloyd sums (fedcluster/secagg/device.py, fedcluster/server/secure_sum.py),
in-process runs: the secure run's centers are the plain run's, the server never receives a
device's plain statistics, and devices that drop before or after masking still give the
right sum while at least the threshold answer the unmasking."""

from __future__ import annotations

import math

import numpy as np
import pytest
from flwr.app import Error, Message

from conftest import lloyd_step
from fedcluster.secagg import device as secagg
from fedcluster.config import ConfigError, with_defaults
from fedcluster.device import run_task
from fedcluster.node_data import device_data, pooled_points
from fedcluster.inprocess import run

NODES = 10
BASE = {
    "algorithm": "feddp-kmeans",
    "dataset": "feddp-mixture",
    "dim": 10,
    "k": 3,
    "num-points": 3000,
    "seed": 3,
    "reference": False,
    "epsilon": math.inf,
    "init": "server-kmeans++",
    "clip-norm": 1e3,
    "max-device-points": 600,
    "evaluate-cost": False,
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
            plain, _ = run_task(
                "feddp_lloyd",
                data,
                {k: v for k, v in request.items() if not k.startswith("secagg-")},
                {k: v for k, v in message.content.config_records["config"].items() if not k.startswith("secagg-")},
            )
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
    result = run(
        config(tmp_path, "secure", **{"lloyd-rounds": 1, "secure-aggregation": True}),
        num_nodes=NODES,
        reply_hook=fail(1000, kind),
    )
    phase = {p["phase"]: p for p in result["phases"]}
    failed = "lloyd-unmask" if stage == "after-masking" else "lloyd"
    assert [f["node"] for f in phase[failed]["failures"]] == [1000] and phase[failed]["replies"] == NODES - 1
    X = pooled_points(result["config"], NODES)[0]
    used = X if stage == "after-masking" else X[len(X) // NODES :]  # node 1000 holds the first tenth
    init = np.load(tmp_path / "secure" / "init_centers.npy")
    np.testing.assert_allclose(centers(tmp_path, "secure"), lloyd_step(used, init), rtol=1e-6)


def test_a_device_that_drops_before_masking_or_misses_an_unmasking_takes_part_in_the_next_sum(tmp_path):
    """Three rounds of one session. Node 1000 fails its first masked reply: that round is
    over the nine others (its mask key of that round is rebuilt, which unmasks nothing of
    another round: every round has its own), and it takes part in the next two. Node 1001
    fails only its first unmasking: its vector was in the sum, and it takes part in the next
    rounds."""
    seen = []

    def hook(node, message, reply):
        kind = message.metadata.message_type
        seen.append((node, kind))
        first = seen.count((node, kind)) == 1
        if first and (
            (node, kind) == (1000, "query.secure_feddp_lloyd") or (node, kind) == (1001, "query.secagg_unmask")
        ):
            return Message(Error(code=2, reason="gone"), reply_to=message)
        return reply

    result = run(
        config(tmp_path, "secure", **{"lloyd-rounds": 3, "secure-aggregation": True}), num_nodes=NODES, reply_hook=hook
    )
    assert seen.count((1000, "query.secure_feddp_lloyd")) == 3 and seen.count((1001, "query.secure_feddp_lloyd")) == 3
    assert result["privacy"]["secure_aggregation"]["sessions"] == 1
    X = pooled_points(result["config"], NODES)[0]
    expected = lloyd_step(
        X[len(X) // NODES :], np.load(tmp_path / "secure" / "init_centers.npy")
    )  # node 1000: the first tenth
    for _ in range(2):
        expected = lloyd_step(X, expected)
    np.testing.assert_allclose(centers(tmp_path, "secure"), expected, rtol=1e-6)


def test_no_mask_key_of_one_sum_unmasks_another(tmp_path, monkeypatch):
    """Node 1000 is in round 1 (the server then holds its round-1 seed) and drops before
    masking in round 2, so its round-2 mask key is rebuilt from the others' shares. With one
    mask key for the whole session, that key and the seed unmasked its round-1 reply. Here
    the server's attempt with everything it holds fails, while the same decoding with the
    round-1 key (the device's own secret, read here from its store) gives its statistics."""
    import fedcluster.client.app as device

    kept, keys = {}, {}

    def hook(node, message, reply):
        kind = message.metadata.message_type
        if kind == "query.secagg_setup":
            keys[node] = reply.content.array_records["arrays"]["pk1"].numpy()  # (sums, 215): public
        if node == 1000 and kind == "query.secure_feddp_lloyd":
            if "masked" in kept:
                return Message(Error(code=2, reason="gone"), reply_to=message)
            kept["request"], kept["masked"] = (
                message,
                {k: v.numpy() for k, v in reply.content.array_records["arrays"].items() if not k.startswith("secagg-")},
            )  # the masked arrays
        if node == 1000 and kind == "query.secagg_unmask" and "seed" not in kept:
            kept["seed"] = secagg.row_bytes(reply.content.array_records["arrays"]["seed"].numpy(), strip=False)
        return reply

    from fedcluster.secagg import checks as secagg_checks

    rebuilt = []
    original = secagg_checks.rebuilt
    monkeypatch.setattr(secagg_checks, "rebuilt", lambda *a: rebuilt.append(original(*a)) or rebuilt[-1])
    result = run(
        config(tmp_path, "secure", **{"lloyd-rounds": 2, "secure-aggregation": True}), num_nodes=NODES, reply_hook=hook
    )
    assert result["privacy"]["secure_aggregation"]["sessions"] == 1
    [server_key] = [found.secret for found in rebuilt]  # node 1000's round-2 key, nothing else
    store = next(d.extra[secagg.STATE] for d in device._DATA_CACHE.values() if d.extra.get("node-id") == 1000)
    true_key = secagg.private_scalar(store["sk1"][0])

    request = kept["request"]
    data = device_data(result["config"], {"partition-id": 0, "num-partitions": NODES})
    arrays = {k: v.numpy() for k, v in request.content.array_records["arrays"].items()}
    plain, _ = run_task(
        "feddp_lloyd",
        data,
        {k: v for k, v in arrays.items() if not k.startswith("secagg-")},
        {k: v for k, v in request.content.config_records["config"].items() if not k.startswith("secagg-")},
    )

    def decoded(scalar: bytes) -> np.ndarray:
        size = sum(v.size for v in kept["masked"].values())
        words = np.concatenate([v.ravel() for v in kept["masked"].values()]).astype(np.uint64)
        stream = secagg.stream_name(1, 1)
        words = words - secagg.mask(kept["seed"], "self", stream, size)
        for node, public in keys.items():
            if node != 1000:  # what node 1000 added for each peer, undone (it is position 1: it subtracted)
                words = words + secagg.mask(
                    secagg.shared_key(secagg.private_pem(scalar), bytes(public[0].tobytes())), "pair", stream, size
                )
        counts = secagg.dequantize(
            words[-3:] & np.uint64(secagg.MODULUS - 1), arrays["secagg-ranges"][1], arrays["secagg-levels"][1]
        )
        return counts

    np.testing.assert_allclose(decoded(true_key), plain["counts"], atol=1e-3)  # the decoding itself is right
    assert not np.allclose(decoded(server_key), plain["counts"], atol=1.0)  # what the server holds unmasks nothing


def test_fewer_unmask_answers_than_the_threshold_stop_the_run(tmp_path):
    def hook(node, message, reply):
        if node < 1004 and message.metadata.message_type == "query.secagg_unmask":
            return Message(Error(code=2, reason="gone"), reply_to=message)
        return reply

    with pytest.raises(Exception, match="lloyd.*fewer than 7 shares to unmask"):
        run(
            config(tmp_path, "secure", **{"lloyd-rounds": 1, "secure-aggregation": True}),
            num_nodes=NODES,
            reply_hook=hook,
        )


def test_secure_aggregation_is_refused_where_a_device_would_still_send_its_statistics_in_the_clear():
    # auto with server data and no Lloyd rounds: FedDP-Init
    for overrides in ({"init": "feddp"}, {"init": "auto"}, {"evaluate-cost": True}):
        with pytest.raises(ConfigError, match="secure-aggregation"):
            with_defaults({**BASE, "secure-aggregation": True, **overrides})
    with_defaults(
        {**BASE, "secure-aggregation": True, "init": "auto", "dataset": "gaussian-mixture"}
    )  # histogram: secured


def test_with_server_data_the_auto_start_is_secured_too(tmp_path):
    """auto with server data and Lloyd rounds: the histogram of server-point candidates, whose
    counts are a secure sum like the rounds'; at ε = ∞ the centers are the plain run's."""
    overrides = {"init": "auto", "lloyd-rounds": 2, "secagg-noise": "server"}
    plain = run(config(tmp_path, "plain", **overrides), num_nodes=NODES)
    secure = run(config(tmp_path, "secure", **overrides, **{"secure-aggregation": True}), num_nodes=NODES)
    assert (
        plain["init"]["method"] == secure["init"]["method"] == "histogram" and secure["init"]["server_candidates"] == 30
    )
    np.testing.assert_allclose(centers(tmp_path, "secure"), centers(tmp_path, "plain"), rtol=1e-6)
    assert secure["privacy"]["secure_aggregation"]["sums"] == 3  # the histogram and two rounds


def test_a_devices_session_outlives_its_process(tmp_path):
    """A deployment starts one ClientApp process per message, and a simulation may run a
    node's messages in different workers: the session's keys, seed and shares must come
    back from Flower's ``context.state``, not from process memory. Here every message finds
    an empty data cache (as a fresh process would) and the run still gives the plain centers."""
    import fedcluster.client.app as device

    def fresh_process(node, message, reply):
        device._DATA_CACHE.clear()
        return reply

    run(config(tmp_path, "plain", **{"lloyd-rounds": 2}), num_nodes=NODES)
    run(
        config(tmp_path, "secure", **{"lloyd-rounds": 2, "secure-aggregation": True}),
        num_nodes=NODES,
        reply_hook=fresh_process,
    )
    np.testing.assert_allclose(centers(tmp_path, "secure"), centers(tmp_path, "plain"), rtol=1e-6)


NO_SERVER_DATA = {
    "algorithm": "feddp-kmeans",
    "dataset": "gaussian-mixture",
    "dim": 4,
    "dimension": 4,
    "k": 4,
    "num-points": 4000,
    "seed": 2,
    "reference": False,
    "epsilon": 1.0,
    "lloyd-rounds": 3,
    "clip-norm": 30.0,
    "noise-seed": 7,
    "evaluate-cost": False,
}


def test_without_server_data_the_secure_run_with_the_servers_noise_is_the_plain_run(tmp_path):
    """The default start without server data (the histogram) and the relative Lloyd rounds,
    no cap on a device's points, the server adding the noise: secured, the same noise draws
    give the plain run's centers (the sensitivities grow only by the rounding to the
    fixed-point grid), within the same ε."""
    plain = run({**NO_SERVER_DATA, "output-dir": str(tmp_path / "plain")}, num_nodes=NODES)
    secure = run(
        {
            **NO_SERVER_DATA,
            "output-dir": str(tmp_path / "secure"),
            "secure-aggregation": True,
            "secagg-noise": "server",
        },
        num_nodes=NODES,
    )
    assert secure["init"]["method"] == "histogram" and secure["privacy"]["lloyd_update"] == "relative"
    np.testing.assert_allclose(centers(tmp_path, "secure"), centers(tmp_path, "plain"), rtol=1e-5, atol=1e-6)
    assert plain["privacy"]["secure_aggregation"] is None
    record = secure["privacy"]["secure_aggregation"]
    assert record["sums"] == 1 + 3 and record["sessions"] == 1 and record["out_of_range"] == []
    assert secure["privacy"]["epsilon"] <= 1.0
    for step in ("step2", "lloyd_gaussian", "lloyd_laplace"):  # the rounding slack is accounted, and tiny
        assert (
            plain["privacy"]["bounds"][step]
            < secure["privacy"]["bounds"][step]
            < plain["privacy"]["bounds"][step] * (1 + 1e-4)
        )
    phases = [p["phase"] for p in secure["phases"]]
    assert phases[:4] == [
        "init-histogram-setup",
        "init-histogram-share-keys",
        "init-histogram",
        "init-histogram-unmask",
    ]


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
                for name in [name for name in arrays if not name.startswith("secagg-")]:  # the masked arrays
                    shape = arrays[name].numpy().shape
                    arrays[name] = Array(rng.integers(0, secagg.MODULUS, size=shape, dtype=np.uint64))
        return reply

    result = run(
        config(tmp_path, "secure", **{"lloyd-rounds": 2, "secure-aggregation": True}),
        num_nodes=NODES,
        reply_hook=garbage,
    )
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
    import fedcluster.client.app as device
    from fedcluster.inprocess.grid import set_task_identity

    set_task_identity(run_id=7, node_id=1)

    run_config = {k: v for k, v in with_defaults({**BASE, "secure-aggregation": True}).items() if v is not None}
    context = Context(
        run_id=7,
        node_id=1000,
        node_config={"partition-id": 0, "num-partitions": NODES},
        state=RecordDict(),
        run_config=run_config,
    )
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
    """secagg-noise = devices (the default): every sum the server unmasks holds Skellam noise
    of the planned variance, the sum of t shares of v/t each per device: its spread around
    the devices' exact sums, over every coordinate of the histogram and the Lloyd rounds, is
    that of ten shares within 10 % (one share of v/n each would be 16 % short). The reported
    releases are those of the run (compositions, sensitivities from the reported bounds and
    grid), and ε recomputed from them with an independent implementation of the Skellam RDP
    bound equals the reported one and is at most the target."""
    from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

    decoded, requests = [], []
    original = secagg.unmasked_sum
    monkeypatch.setattr(secagg, "unmasked_sum", lambda *a, **k: decoded.append(original(*a, **k)) or decoded[-1])

    def hook(node, message, reply):
        if message.metadata.message_type.startswith("query.secure_"):
            requests.append((node, message))
        return reply

    rounds, k, d = 6, 8, 16  # 896 coordinates: the spread's standard error is 2.4 %
    run_config = with_defaults(
        {
            **NO_SERVER_DATA,
            "dim": d,
            "dimension": d,
            "k": k,
            "lloyd-rounds": rounds,
            "clip-norm": 40.0,
            "output-dir": str(tmp_path / "secure"),
            "secure-aggregation": True,
        }
    )
    result = run(dict(run_config), num_nodes=NODES, reply_hook=hook)
    privacy = result["privacy"]
    assert privacy["noise_added_by"] == "the devices" and privacy["min_noisy_devices"] == 7  # t of 10
    assert privacy["secure_aggregation"]["out_of_range"] == []
    sizes = {"step2": 10 * k, "lloyd_gaussian": k * d, "lloyd_laplace": k}
    for step in privacy["steps"]:
        bound, size = privacy["bounds"][step["name"]] / step["grid"], sizes[step["name"]]
        l1 = bound * math.sqrt(size) + size if step["name"] == "lloyd_gaussian" else bound + size
        assert step["l2"] == pytest.approx(bound + math.sqrt(size), rel=1e-12) and step["l1"] == pytest.approx(
            l1, rel=1e-12
        )
        assert step["compositions"] == (1 if step["name"] == "step2" else rounds)
    orders = list(range(2, 257))
    rdp = [
        sum(
            s["compositions"]
            * (
                a * s["l2"] ** 2 / (2 * s["variance"])
                + min(
                    ((2 * a - 1) * s["l2"] ** 2 + 6 * s["l1"]) / (4 * s["variance"] ** 2),
                    3 * s["l1"] / (2 * s["variance"]),
                )
            )
            for s in privacy["steps"]
        )
        for a in orders
    ]
    recomputed = compute_epsilon(orders, rdp, run_config["delta"])[0]
    assert privacy["epsilon"] == pytest.approx(recomputed, rel=1e-3) and recomputed <= 1.0 + 1e-6
    rho = {s["name"]: s["l2"] ** 2 / s["variance"] for s in privacy["steps"]}  # each release's ρ, up to one factor
    assert rho["lloyd_gaussian"] / rho["lloyd_laplace"] == pytest.approx(2 * math.sqrt(d), rel=1e-9)  # sums : counts

    std = {s["name"]: s["noise_std"] * math.sqrt(NODES / 7) for s in privacy["steps"]}
    names = {"histogram": "step2", "sums": "lloyd_gaussian", "counts": "lloyd_laplace"}
    scaled = []
    for index, total in enumerate(decoded):  # one per sum: the histogram, then each Lloyd round
        exact = {}
        for node, message in requests[index * NODES : (index + 1) * NODES]:
            data = device_data(run_config, {"partition-id": node - 1000, "num-partitions": NODES})
            task = message.metadata.message_type.removeprefix("query.secure_")
            request = {
                k: v.numpy() for k, v in message.content.array_records["arrays"].items() if not k.startswith("secagg-")
            }
            config = {k: v for k, v in message.content.config_records["config"].items() if not k.startswith("secagg-")}
            plain, _ = run_task(task, data, request, config)
            for name in total:
                exact[name] = exact.get(name, 0) + plain[name]
        for name, value in total.items():
            scaled.append(((value - exact[name]) / std[names[name]]).ravel())
    scaled = np.concatenate(scaled)
    assert scaled.size == 10 * k + rounds * (k * d + k)
    assert 0.9 < scaled.std() < 1.1, scaled.std()


def test_a_budget_split_given_sets_the_devices_noise_shares_of_the_lloyd_rounds(tmp_path):
    """With budget-split the Lloyd sums and counts take their ρ shares from it (w3g : w3l),
    not the 2√d : 1 default the test above checks."""
    run_config = with_defaults(
        {
            **NO_SERVER_DATA,
            "dim": 4,
            "dimension": 4,
            "k": 3,
            "lloyd-rounds": 2,
            "clip-norm": 4.0,
            "budget-split": "0.2,0.2,0.6,0.1",
            "output-dir": str(tmp_path),
            "secure-aggregation": True,
        }
    )
    steps = {s["name"]: s for s in run(run_config, num_nodes=NODES)["privacy"]["steps"]}
    rho = {name: s["l2"] ** 2 / s["variance"] for name, s in steps.items()}
    assert rho["lloyd_gaussian"] / rho["lloyd_laplace"] == pytest.approx(6.0, rel=1e-9)


def test_the_devices_noise_runs_with_a_small_cap_on_a_devices_points(tmp_path):
    """With max-device-points = 400 the finest grid (2^40 steps per range of 400 points)
    put the devices' Poisson draws beyond NumPy's reach and the run died; the grid is now
    coarsened to at most 2^25 steps per noise standard deviation."""
    result = run(
        {
            **NO_SERVER_DATA,
            "secure-aggregation": True,
            "max-device-points": 400,
            "output-dir": str(tmp_path / "capped"),
        },
        num_nodes=NODES,
    )
    assert 0 < result["privacy"]["epsilon"] <= 1.0
    assert all(
        step["grid"] > 400 * 30.0 / secagg.HALF_LEVELS for step in result["privacy"]["steps"] if step["name"] != "step2"
    )
    assert np.all(np.isfinite(centers(tmp_path, "capped")))


@pytest.mark.parametrize("lie", ["repeated shares", "garbage key", "copied key"])
def test_one_device_breaking_the_key_exchange_sits_the_session_out_and_the_run_goes_on(tmp_path, lie):
    """A device that addresses its shares twice, sends a public key that does not parse, or
    copies another device's keys is left out of the session (with the copied device: the
    server cannot tell which is the copy); the others' sums go on."""
    from flwr.app import Array

    def hook(node, message, reply):
        kind = message.metadata.message_type
        if node != 1003 or reply.has_error():
            return reply
        arrays = reply.content.array_records["arrays"]
        if lie == "repeated shares" and kind == "query.secagg_share_keys":
            d, c = arrays["destinations"].numpy(), arrays["ciphertexts"].numpy()
            arrays["destinations"], arrays["ciphertexts"] = Array(np.concatenate([d, d])), Array(np.concatenate([c, c]))
        if lie == "garbage key" and kind == "query.secagg_setup":
            arrays["pk2"] = Array(np.full(arrays["pk2"].numpy().shape, 65, dtype=np.uint8))
        if lie == "copied key" and kind == "query.secagg_setup":
            arrays["pk1"], arrays["pk2"] = Array(copied["pk1"]), Array(copied["pk2"])
        return reply

    copied = {}

    def copy_first(node, message, reply):
        if node == 1002 and message.metadata.message_type == "query.secagg_setup" and not copied:
            copied.update({k: v.numpy() for k, v in reply.content.array_records["arrays"].items()})
        return hook(node, message, reply)

    result = run(
        config(tmp_path, "secure", **{"lloyd-rounds": 2, "secure-aggregation": True}),
        num_nodes=NODES,
        reply_hook=copy_first,
    )
    left_out = {1002, 1003} if lie == "copied key" else {1003}
    lloyd = [p for p in result["phases"] if p["phase"] == "lloyd"]
    assert [p["replies"] for p in lloyd] == [NODES - len(left_out)] * 2
    X = pooled_points(result["config"], NODES)[0]
    rows = np.concatenate(
        [
            np.arange(len(X))[i * len(X) // NODES : (i + 1) * len(X) // NODES]
            for i in range(NODES)
            if 1000 + i not in left_out
        ]
    )
    expected = np.load(tmp_path / "secure" / "init_centers.npy")
    for _ in range(2):
        expected = lloyd_step(X[rows], expected)
    np.testing.assert_allclose(centers(tmp_path, "secure"), expected, rtol=1e-6)


@pytest.mark.parametrize("lie", ["garbled shares", "one garbled share", "refuses everyone", "a lost refusal"])
def test_refused_shares_leave_devices_out_of_a_new_session_and_the_run_goes_on(tmp_path, lie):
    """Shares that do not decrypt are refused, not fatal, and the refused device is asked to
    prove its shares. Node 1003 garbles all its shares (it cannot prove them: it sits the
    session out), garbles one share in every session (likewise; its victim stays: before,
    a lone refusal took out both sides), or refuses everyone (their shares open with the
    keys they reveal: it lied, and is excluded from the run); or its victim's first masked
    reply is lost, and the refusal comes with the next. The abandoned sum is never unmasked;
    a new session sets it up again and the run's centers are Lloyd's over the others."""
    from flwr.app import Array

    def hook(node, message, reply):
        kind = message.metadata.message_type
        if reply.has_error():
            return reply
        arrays = reply.content.array_records["arrays"]
        if kind == "query.secagg_unmask":
            unmasked.add(int(message.content.config_records["config"]["session"]))
        if node == 1003 and kind == "query.secagg_share_keys" and lie != "refuses everyone":
            c = arrays["ciphertexts"].numpy().copy()
            rows = range(len(c)) if lie == "garbled shares" else [0]
            c[list(rows), :20] = 66
            arrays["ciphertexts"] = Array(c)
            victims.append(int(arrays["destinations"].numpy()[0]))
        if node == 1003 and kind == "query.secure_feddp_lloyd" and lie == "refuses everyone" and not claimed:
            flags = np.zeros(NODES, dtype=np.int64)
            flags[[int(p) - 1 for p in message.content.array_records["arrays"]["secagg-sources"].numpy()]] = 1
            arrays["secagg-refused"] = Array(flags)
            claimed.append(True)
        if lie == "a lost refusal" and kind == "query.secure_feddp_lloyd" and node == 999 + victims[0] and not lost:
            lost.append(arrays["secagg-refused"].numpy()[3])  # node 1003 is position 4
            return Message(Error(code=2, reason="lost"), reply_to=message)
        return reply

    claimed, victims, lost, unmasked = [], [], [], set()
    rounds = 3 if lie == "a lost refusal" else 2
    result = run(
        config(tmp_path, "secure", **{"lloyd-rounds": rounds, "secure-aggregation": True}),
        num_nodes=NODES,
        reply_hook=hook,
    )
    secure = result["privacy"]["secure_aggregation"]
    left_out = {1003}
    assert secure["left_out_over_refused_shares"] == ([] if lie == "refuses everyone" else [1003])
    assert secure["excluded_liars"] == ([1003] if lie == "refuses everyone" else [])
    assert secure["sessions"] == 2 and secure["sums"] == rounds and not secure["out_of_range"]
    assert unmasked == ({1, 2} if lie == "a lost refusal" else {2})  # the abandoned sum: no unmasking
    if lie == "a lost refusal":
        assert lost == [1]  # the victim's first reply held the refusal, and it never arrived
    lloyd = [p for p in result["phases"] if p["phase"] == "lloyd"]
    assert [p["replies"] for p in lloyd][-2:] == [NODES - len(left_out)] * 2
    X = pooled_points(result["config"], NODES)[0]
    own = [np.arange(len(X))[i * len(X) // NODES : (i + 1) * len(X) // NODES] for i in range(NODES)]
    expected = np.load(tmp_path / "secure" / "init_centers.npy")
    if lie == "a lost refusal":  # round 1 over all but the victim (its reply lost), then the others
        expected = lloyd_step(
            X[np.concatenate([rows for i, rows in enumerate(own) if 1000 + i != 999 + victims[0]])], expected
        )
    rows = np.concatenate([rows for i, rows in enumerate(own) if 1000 + i not in left_out])
    for _ in range(2):
        expected = lloyd_step(X[rows], expected)
    np.testing.assert_allclose(centers(tmp_path, "secure"), expected, rtol=1e-6, atol=1e-8)  # atol: the grid


def test_refusals_are_grouped_by_the_accused_and_checked_against_the_forwarded_shares():
    from fedcluster.secagg.checks import accused

    assert accused({1: [3], 2: [3], 4: [3, 5]}) == {3: [1, 2, 4], 5: [4]}
    assert secagg.refused_positions(np.array([0, 1, 0, 1])) == [2, 4]
    assert secagg.refusals_problem(np.array([0, 2, 0]), {1, 2, 3}, 1)  # a flag of 2
    assert secagg.refusals_problem(np.array([1, 0]), {1, 2}, 1)  # itself
    assert secagg.refusals_problem(np.array([0, 0, 1]), {1, 2}, 1)  # no share of 3 was forwarded to it
    assert secagg.refusals_problem(np.array([0, 1, 0]), {1, 2}, 1) is None


# ---------------------------------------------------------------- SecAgg+'s sparse graph (secagg-neighbours)
def test_neighbourhoods_are_a_symmetric_ring_of_the_asked_degree_or_everyone():
    rng = np.random.default_rng(0)
    for n, m, degree in ((10, 4, 4), (10, 3, 4), (30, 6, 6), (5, 4, 4), (5, 0, 4), (7, 6, 6), (7, 9, 6)):
        graph = secagg.neighbourhoods(n, m, rng)
        assert sorted(graph) == list(range(1, n + 1))
        assert all(len(near) == degree and p not in near for p, near in graph.items()), (n, m)
        assert all(p in graph[q] for p, near in graph.items() for q in near)  # symmetric
        assert secagg.connected(range(1, n + 1), graph)
    ring = secagg.neighbourhoods(30, 2, rng)
    walk, previous = [1], None
    for _ in range(29):  # each has two neighbours: one cycle through all thirty
        step = next(iter(ring[walk[-1]] - {previous}))
        previous = walk[-1]
        walk.append(step)
    assert sorted(walk) == list(range(1, 31)) and 1 in ring[walk[-1]]
    assert secagg.neighbourhoods(30, 2, np.random.default_rng(1)) != ring  # the server's random order


def test_connected_finds_a_masking_graph_split_in_two():
    ring = {p: {(p % 8) + 1, ((p - 2) % 8) + 1} for p in range(1, 9)}  # 1-2-...-8-1
    assert secagg.connected([1, 2, 3, 4, 5, 6, 7, 8], ring) and secagg.connected([2, 3, 4, 5, 6, 7, 8], ring)
    assert not secagg.connected([2, 3, 4, 6, 7, 8], ring)  # 1 and 5 gone: 2-3-4 and 6-7-8
    assert secagg.connected([3], ring) and secagg.connected([], ring)


def in_order_ring(participants, neighbours, rng):
    """The masking graph with the positions in order on the ring (the test knows it)."""
    half = -(-neighbours // 2)
    return {
        p: {((p - 1 + o) % participants) + 1 for o in range(-half, half + 1)} - {p} for p in range(1, participants + 1)
    }


@pytest.mark.parametrize("drop", ["none", "before-masking", "after-masking"])
def test_a_sparse_graph_gives_the_plain_sums_with_each_device_sharing_only_with_its_neighbours(tmp_path, drop):
    """secagg-neighbours = 4 among ten devices: each device is sent the keys of its four
    neighbours only and shares with them only; the centers are the plain run's, and a device
    that drops before masking (its masks rebuilt from its neighbours' shares) or after it (its
    seed sent by itself is not needed: its neighbours' shares of it) still gives the right
    sums."""
    positions, failing = [], {"before-masking": "query.secure_feddp_lloyd", "after-masking": "query.secagg_unmask"}

    def hook(node, message, reply):
        kind = message.metadata.message_type
        if kind == "query.secagg_share_keys":
            positions.append(len(message.content.array_records["arrays"]["positions"].numpy()))
            assert len(reply.content.array_records["arrays"]["destinations"].numpy()) == 4
        if drop != "none" and node == 1000 and kind == failing[drop]:
            return Message(Error(code=2, reason="gone"), reply_to=message)
        return reply

    result = run(
        config(tmp_path, "secure", **{"lloyd-rounds": 2, "secure-aggregation": True, "secagg-neighbours": 4}),
        num_nodes=NODES,
        reply_hook=hook,
    )
    assert positions == [5] * NODES and result["privacy"]["secure_aggregation"]["neighbours"] == 4
    X = pooled_points(result["config"], NODES)[0]
    used = X[len(X) // NODES :] if drop == "before-masking" else X  # node 1000 holds the first tenth
    expected = np.load(tmp_path / "secure" / "init_centers.npy")
    for _ in range(2):
        expected = lloyd_step(used, expected)
    np.testing.assert_allclose(centers(tmp_path, "secure"), expected, rtol=1e-6, atol=1e-8)  # atol: the grid


def test_a_sum_whose_devices_no_longer_form_one_masking_graph_is_set_up_again_never_unmasked(tmp_path, monkeypatch):
    """A ring with one neighbour on each side (positions in order): devices 1 and 6 drop
    before masking, so 2-5 and 7-10 are two components, and unmasking would give the server
    each part's sum. That sum is never unmasked: a new session among the eight sets it up
    again, and the centers are the eight's."""
    monkeypatch.setattr(secagg, "neighbourhoods", in_order_ring)
    asked = []

    def hook(node, message, reply):
        kind = message.metadata.message_type
        asked.append(kind)
        if node in (1000, 1005) and kind == "query.secure_feddp_lloyd":
            return Message(Error(code=2, reason="gone"), reply_to=message)
        return reply

    result = run(
        config(
            tmp_path,
            "secure",
            **{"lloyd-rounds": 1, "secure-aggregation": True, "secagg-neighbours": 2, "secagg-threshold": 0.5},
        ),
        num_nodes=NODES,
        reply_hook=hook,
    )
    first_masked = asked.index("query.secure_feddp_lloyd")
    assert asked[first_masked:].index("query.secagg_setup") < asked[first_masked:].index("query.secagg_unmask")
    assert result["privacy"]["secure_aggregation"]["sessions"] == 2
    X = pooled_points(result["config"], NODES)[0]
    tenth = len(X) // NODES
    rows = np.r_[tenth : 5 * tenth, 6 * tenth : len(X)]
    expected = lloyd_step(X[rows], np.load(tmp_path / "secure" / "init_centers.npy"))
    np.testing.assert_allclose(centers(tmp_path, "secure"), expected, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("case", ["two adjacent drop", "absent, then dropped"])
def test_a_sparse_neighbourhood_too_thin_to_unmask_is_set_up_again_among_the_others(tmp_path, monkeypatch, case):
    """Four neighbours each (positions in order), threshold 4 of 5. Two adjacent devices
    dropping leave their neighbours with three: before the change the unmasking failed and
    the run stopped. Now the sum is set up again among the eight in a new session. Likewise
    a device absent from the second round (offline) and its neighbour dropping in it."""
    monkeypatch.setattr(secagg, "neighbourhoods", in_order_ring)
    seen = []

    def hook(node, message, reply):
        kind = message.metadata.message_type
        seen.append((node, kind))
        if kind == "query.secure_feddp_lloyd" and (
            node in (1003, 1004) if case == "two adjacent drop" else (node == 1004 and seen.count((node, kind)) == 2)
        ):
            return Message(Error(code=2, reason="gone"), reply_to=message)
        return reply

    from fedcluster.inprocess.availability import Availability

    class Away(Availability):  # node 1003 offline from round 1's unmasking to round 2's masked request
        def online(self, node, trip):
            return (
                case == "two adjacent drop"
                or node != 1003
                or seen.count((1000, "query.secure_feddp_lloyd")) != 1
                or seen[-1][1] != "query.secagg_unmask"
            )

    result = run(
        config(tmp_path, "secure", **{"lloyd-rounds": 2, "secure-aggregation": True, "secagg-neighbours": 4}),
        num_nodes=NODES,
        reply_hook=hook,
        availability=Away(),
    )
    assert result["privacy"]["secure_aggregation"]["sessions"] >= 2
    X = pooled_points(result["config"], NODES)[0]
    tenth = len(X) // NODES
    expected = np.load(tmp_path / "secure" / "init_centers.npy")
    if case == "two adjacent drop":
        for _ in range(2):
            expected = lloyd_step(np.r_[X[: 3 * tenth], X[5 * tenth :]], expected)
    else:
        expected = lloyd_step(X, expected)
        expected = lloyd_step(np.r_[X[: 3 * tenth], X[5 * tenth :]], expected)
    np.testing.assert_allclose(centers(tmp_path, "secure"), expected, rtol=1e-6, atol=1e-8)


def test_on_a_sparse_graph_a_refusal_of_a_device_that_is_no_neighbour_is_an_invalid_reply(tmp_path, monkeypatch):
    """Positions in order on a ring with two neighbours each side: device 1003 (position 4)
    flags position 9, from which no share could reach it. Its masked reply is invalid (it
    counts as dropped before masking, its masks rebuilt from its neighbours' shares), no
    one is left out over refusals, and the sum is the nine others'."""
    monkeypatch.setattr(secagg, "neighbourhoods", in_order_ring)

    def hook(node, message, reply):
        if node == 1003 and message.metadata.message_type == "query.secure_feddp_lloyd":
            from flwr.app import Array

            arrays = reply.content.array_records["arrays"]
            flags = arrays["secagg-refused"].numpy().copy()
            flags[8] = 1
            arrays["secagg-refused"] = Array(flags)
        return reply

    result = run(
        config(tmp_path, "secure", **{"lloyd-rounds": 1, "secure-aggregation": True, "secagg-neighbours": 4}),
        num_nodes=NODES,
        reply_hook=hook,
    )
    lloyd = next(p for p in result["phases"] if p["phase"] == "lloyd")
    assert [f["node"] for f in lloyd["failures"]] == [1003] and "refusal flags" in lloyd["failures"][0]["reason"]
    assert result["privacy"]["secure_aggregation"]["left_out_over_refused_shares"] == []
    X = pooled_points(result["config"], NODES)[0]
    rows = np.r_[0 : 3 * len(X) // NODES, 4 * len(X) // NODES : len(X)]  # node 1003 holds the fourth tenth
    expected = lloyd_step(X[rows], np.load(tmp_path / "secure" / "init_centers.npy"))
    np.testing.assert_allclose(centers(tmp_path, "secure"), expected, rtol=1e-6, atol=1e-8)


def test_the_sparse_graph_is_drawn_among_the_devices_whose_keys_came(tmp_path, monkeypatch):
    """Devices 1000 and 1001 never answer the key setup. Drawn before it, the ring of four
    neighbours would leave their neighbours with three others, below the threshold of four
    of five; drawn among the eight whose keys came, every device has four neighbours, and
    the sums are the eight's."""
    monkeypatch.setattr(secagg, "neighbourhoods", in_order_ring)

    def hook(node, message, reply):
        if node in (1000, 1001) and message.metadata.message_type == "query.secagg_setup":
            return Message(Error(code=2, reason="gone"), reply_to=message)
        return reply

    result = run(
        config(tmp_path, "secure", **{"lloyd-rounds": 1, "secure-aggregation": True, "secagg-neighbours": 4}),
        num_nodes=NODES,
        reply_hook=hook,
    )
    share_keys = next(p for p in result["phases"] if p["phase"].endswith("share-keys"))
    assert share_keys["replies"] == NODES - 2 and not share_keys["failures"]
    X = pooled_points(result["config"], NODES)[0]
    expected = lloyd_step(X[2 * len(X) // NODES :], np.load(tmp_path / "secure" / "init_centers.npy"))
    np.testing.assert_allclose(centers(tmp_path, "secure"), expected, rtol=1e-6, atol=1e-8)


def test_many_devices_on_the_full_graph_are_told_of_the_sparse_one(tmp_path, monkeypatch, caplog):
    import fedcluster.server.secure_setup as server_side

    monkeypatch.setattr(server_side, "FULL_GRAPH_NOTE", NODES - 1)
    run(config(tmp_path, "full", **{"lloyd-rounds": 1, "secure-aggregation": True}), num_nodes=NODES)
    assert "secagg-neighbours = m cuts both" in caplog.text
    caplog.clear()
    run(
        config(tmp_path, "sparse", **{"lloyd-rounds": 1, "secure-aggregation": True, "secagg-neighbours": 4}),
        num_nodes=NODES,
    )
    assert "secagg-neighbours = m cuts both" not in caplog.text


def test_a_device_offline_for_one_sum_takes_part_in_the_later_ones(tmp_path):
    """Node 1003 never receives the first Lloyd round's masked request (offline for that
    round trip, so it never sees the shares that travel with it either): that round is over
    the nine others, and it takes part in the next two (its shares come with its first
    masked request, whichever sum)."""
    from fedcluster.inprocess.availability import Availability

    probe = run(config(tmp_path, "probe", **{"lloyd-rounds": 3, "secure-aggregation": True}), num_nodes=NODES)
    first = min(p["round_trip"] for p in probe["phases"] if p["phase"] == "lloyd")

    class OfflineOnce(Availability):
        def online(self, node, trip):
            return not (node == 1003 and trip == first - 1)  # the grid counts round trips from 0

    result = run(
        config(tmp_path, "secure", **{"lloyd-rounds": 3, "secure-aggregation": True}),
        num_nodes=NODES,
        availability=OfflineOnce(),
    )
    masked = [p for p in result["phases"] if p["phase"] == "lloyd"]
    assert [p["replies"] for p in masked] == [NODES - 1, NODES, NODES] and not any(p["failures"] for p in masked)
    X = pooled_points(result["config"], NODES)[0]
    tenth = len(X) // NODES
    expected = lloyd_step(np.r_[X[: 3 * tenth], X[4 * tenth :]], np.load(tmp_path / "secure" / "init_centers.npy"))
    for _ in range(2):
        expected = lloyd_step(X, expected)
    np.testing.assert_allclose(centers(tmp_path, "secure"), expected, rtol=1e-6, atol=1e-8)


def test_a_secure_sum_asks_as_many_replies_as_min_reply_fraction(tmp_path):
    """With min-reply-fraction = 1 a plain round stops when one device fails; so does a
    secure one, rather than summing without it."""
    for secure in (False, True):
        with pytest.raises(Exception, match="10 required"):
            run(
                config(
                    tmp_path,
                    f"strict-{secure}",
                    **{"lloyd-rounds": 1, "secure-aggregation": secure, "min-reply-fraction": 1.0},
                ),
                num_nodes=NODES,
                reply_hook=fail(1002, "query.secure_feddp_lloyd" if secure else "query.feddp_lloyd"),
            )


def test_a_sum_whose_unmasking_began_is_never_set_up_again(tmp_path, monkeypatch):
    """Four neighbours each (positions in order): device 1005 drops after masking and its
    neighbour 1004 fails the call for shares of 1005's seed, so three of the four needed
    shares come. Set up again among the others, the sum would let the server, with 1004's
    withheld share, unmask this one later and subtract: 1005's statistics. The run stops."""
    monkeypatch.setattr(secagg, "neighbourhoods", in_order_ring)
    asked = []

    def hook(node, message, reply):
        kind = message.metadata.message_type
        asked.append(kind)
        recover = kind == "query.secagg_unmask" and len(message.content.array_records["arrays"]["recover"].numpy())
        if (node == 1005 and kind == "query.secagg_unmask") or (node == 1004 and recover):
            return Message(Error(code=2, reason="gone"), reply_to=message)
        return reply

    with pytest.raises(Exception, match="lloyd.*fewer than 4 shares to unmask positions \\[6\\]"):
        run(
            config(tmp_path, "secure", **{"lloyd-rounds": 1, "secure-aggregation": True, "secagg-neighbours": 4}),
            num_nodes=NODES,
            reply_hook=hook,
        )
    assert asked.count("query.secagg_setup") == NODES  # one session: never set up again


def test_a_session_set_up_again_keeps_the_first_sessions_threshold(tmp_path, monkeypatch):
    """Twelve devices, six neighbours each, threshold 8. Three adjacent devices drop before
    masking: the sum is set up again among the nine, whose own threshold would be 6. Two
    more drop in the new session: seven are fewer than the first session's eight, and the
    run stops rather than sum over seven."""
    monkeypatch.setattr(secagg, "neighbourhoods", in_order_ring)
    summed = {}

    def hook(node, message, reply):
        if message.metadata.message_type == "query.secure_feddp_lloyd":
            session = message.content.config_records["config"]["secagg-session"]
            if (session == 1 and node in (1003, 1004, 1005)) or (session == 2 and node in (1000, 1007)):
                return Message(Error(code=2, reason="gone"), reply_to=message)
            summed.setdefault(session, []).append(node)
        return reply

    with pytest.raises(Exception, match="only 7 valid replies of 9 sent, 8 required"):
        run(
            config(
                tmp_path,
                "secure",
                **{"lloyd-rounds": 1, "secure-aggregation": True, "secagg-neighbours": 6, "num-points": 3600},
            ),
            num_nodes=12,
            reply_hook=hook,
        )
    assert {s: len(v) for s, v in summed.items()} == {1: 9, 2: 7}


def test_a_session_whose_asked_devices_leave_a_thin_neighbourhood_is_reopened_before_the_sum(tmp_path, monkeypatch):
    """Four neighbours each (positions in order). Devices 1003 and 1004 are not asked for
    the second round's sum (as a strategy leaves out devices that are out of the run):
    their neighbours would keep three of five, below the threshold of four. The server
    opens a new session among the eight before that sum, so no device fails and no sum is
    set up again."""
    import fedcluster.server.secure_sum as server_side

    monkeypatch.setattr(secagg, "neighbourhoods", in_order_ring)
    attempt, calls = server_side.SecureSum.attempt, []

    def leaving(self, task, nodes, *args):
        calls.append(task)
        return attempt(self, task, [n for n in nodes if len(calls) < 2 or n not in (1003, 1004)], *args)

    monkeypatch.setattr(server_side.SecureSum, "attempt", leaving)
    result = run(
        config(tmp_path, "secure", **{"lloyd-rounds": 2, "secure-aggregation": True, "secagg-neighbours": 4}),
        num_nodes=NODES,
    )
    phases = [p for p in result["phases"] if p["phase"].startswith("lloyd")]
    assert not any(p["failures"] for p in phases) and not any("again" in p["phase"] for p in phases)
    assert [p["phase"] for p in phases].count("lloyd-setup") == 2 and calls == ["feddp_lloyd"] * 2
    X = pooled_points(result["config"], NODES)[0]
    tenth = len(X) // NODES
    expected = lloyd_step(X, np.load(tmp_path / "secure" / "init_centers.npy"))
    expected = lloyd_step(np.r_[X[: 3 * tenth], X[5 * tenth :]], expected)
    np.testing.assert_allclose(centers(tmp_path, "secure"), expected, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("seed", [1, 2])
def test_devices_away_at_random_are_dropouts_the_secure_sums_tolerate(tmp_path, seed):
    """The availability model, offline = 0.2 (each device away in a fifth of the round
    trips, at random): the plain run completes. The secure one stopped: the session's
    threshold counted the devices away when it was set up ('only 4 valid replies of 4 sent,
    5 required' at the key sharing), and a device away at the unmasking left too few
    shares. Now a session is set up among the devices connected, one whose key sharing
    devices away cut below its threshold is set up again, a device away when a sum is
    asked is left out of it as a device out of the run is, and the unmasking asks the
    devices away again."""
    from fedcluster.inprocess import Availability

    churn = {
        "algorithm": "feddp-kmeans",
        "k": 5,
        "dim": 3,
        "num-points": 3000,
        "seed": seed,
        "partition": "dirichlet",
        "reference": False,
        "epsilon": math.inf,
        "lloyd-rounds": 3,
        "dimension": 3,
        "clip-norm": 30.0,
        "init": "histogram",
        "evaluate-cost": False,
    }
    for secure in (False, True):
        result = run(
            {**churn, "secure-aggregation": secure, "output-dir": str(tmp_path / f"o{secure}")},
            num_nodes=NODES,
            availability=Availability(offline=0.2, seed=seed),
        )
        assert result["nodes"]["excluded"] == {} and sum(p["away"] for p in result["phases"]) > 0
        assert np.all(np.isfinite(centers(tmp_path, f"o{secure}")))
    assert result["privacy"]["secure_aggregation"]["sums"] == 4
