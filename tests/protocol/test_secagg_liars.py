"""Devices that lie to secure aggregation (fedcluster/secagg/device.py, fedcluster/secagg/checks.py,
fedcluster/server/secure_sum.py, fedcluster/server/secure_sum_checks.py): what a device reveals (its own seed, a
share) is checked against what it committed to at setup, and a refusal of another device's
shares is settled by that device's proof. The liar is named and excluded; the sum is
completed without it, or set up again without it; an honest device never pays for a lie
about it (issue 42, case 3)."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, Error, Message

from conftest import lloyd_step
from fedcluster.secagg import device as secagg
from fedcluster.node_data import pooled_points
from fedcluster.inprocess import run
from test_secagg import NODES, centers, config, in_order_ring


def own_rows(X, nodes, count=NODES):
    """The rows of ``X`` the given nodes hold (node 1000 + i holds the i-th of ``count`` parts)."""
    return np.concatenate(
        [np.arange(len(X))[i * len(X) // count : (i + 1) * len(X) // count] for i in range(count) if 1000 + i in nodes]
    )


def lloyd_over(tmp_path, result, nodes, rounds=1):
    X = pooled_points(result["config"], NODES)[0]
    expected = np.load(tmp_path / "secure" / "init_centers.npy")
    for r in range(rounds):
        expected = lloyd_step(X[own_rows(X, nodes[r] if isinstance(nodes, list) else nodes)], expected)
    return expected


def setup_positions(seen):
    """A reply hook's helper: each session's position of every node (from ``secagg_setup``)."""

    def note(node, message):
        if message.metadata.message_type == "query.secagg_setup":
            cfg = message.content.config_records["config"]
            seen.setdefault(int(cfg["session"]), {})[node] = int(cfg["position"])

    return note


def test_two_colluders_accusing_the_same_honest_device_in_every_session_are_the_ones_taken_out(tmp_path):
    """Nodes 1001 and 1002 flag node 1005's shares as refused in every masked reply (or, in
    a session without 1005, the next honest device's). Before, a device refused by two
    others sat out: one honest device per new session, until fewer than the threshold were
    left and the run stopped. Now the accused proves its shares (the key of each): they
    decrypt, so the accusers lie, and they are excluded; the accused stays in every sum."""
    colluders, positions, summed = (1001, 1002), {}, {}
    note = setup_positions(positions)

    def hook(node, message, reply):
        note(node, message)
        kind = message.metadata.message_type
        if kind == "query.secure_feddp_lloyd" and not reply.has_error():
            session = int(message.content.config_records["config"]["secagg-session"])
            summed.setdefault(session, set()).add(node)
            if node in colluders:
                here = positions[session]
                victim = next(v for v in range(1005, 1000 + NODES) if v in here)
                arrays = reply.content.array_records["arrays"]
                flags = arrays["secagg-refused"].numpy().copy()
                flags[here[victim] - 1] = 1
                arrays["secagg-refused"] = Array(flags)
        return reply

    result = run(
        config(tmp_path, "secure", **{"lloyd-rounds": 2, "secure-aggregation": True}), num_nodes=NODES, reply_hook=hook
    )
    record = result["privacy"]["secure_aggregation"]
    assert record["excluded_liars"] == [1001, 1002] and record["left_out_over_refused_shares"] == []
    assert {"1001", "1002"} <= set(result["nodes"]["excluded"]) and "1005" not in result["nodes"]["excluded"]
    assert "refused" in result["nodes"]["excluded"]["1001"]
    assert record["sessions"] == 2 and record["sums"] == 2 and not record["out_of_range"]
    assert all(1005 in nodes for nodes in summed.values())
    honest = set(range(1000, 1000 + NODES)) - set(colluders)
    np.testing.assert_allclose(
        centers(tmp_path, "secure"), lloyd_over(tmp_path, result, honest, 2), rtol=1e-6, atol=1e-8
    )


def wrong_seed(liar, kinds=("query.secagg_unmask",)):
    """A hook: ``liar``'s own seed in every unmask reply is another 32 bytes."""

    def hook(node, message, reply):
        if node == liar and message.metadata.message_type in kinds and not reply.has_error():
            arrays = reply.content.array_records["arrays"]
            arrays["seed"] = Array(np.frombuffer(bytes(range(32)), np.uint8).copy())
        return reply

    return hook


def test_a_device_revealing_a_wrong_own_seed_is_named_and_the_sums_complete_without_it(tmp_path):
    """Node 1004 sends a wrong value of its own mask seed in every unmasking. Before, every
    secure update was skipped (the sum decoded outside the ranges) and the run 'completed'
    with the start's centers. Now the seed fails the commitment 1004 made at setup: it is
    named and excluded, and the sum is completed without it (it is treated as dropped
    before masking: its vector comes off, its mask key is rebuilt from the others' shares),
    so every round is Lloyd's over the nine others."""
    result = run(
        config(tmp_path, "secure", **{"lloyd-rounds": 2, "secure-aggregation": True}),
        num_nodes=NODES,
        reply_hook=wrong_seed(1004),
    )
    record = result["privacy"]["secure_aggregation"]
    assert not record["out_of_range"] and all(r["center_shift"] > 0 for r in result["rounds"])
    honest = set(range(1000, 1000 + NODES)) - {1004}
    np.testing.assert_allclose(
        centers(tmp_path, "secure"), lloyd_over(tmp_path, result, honest, 2), rtol=1e-6, atol=1e-8
    )
    assert (
        record["excluded_liars"] == [1004]
        and not record["incomplete"]
        and "seed" in result["nodes"]["excluded"]["1004"]
    )


def test_a_wrong_own_seed_whose_removal_would_split_the_graph_is_rebuilt_from_the_shares(tmp_path, monkeypatch):
    """A ring with one neighbour each side (positions in order), threshold one half: node
    1000 drops before masking, so the sum's graph is the path 2..10; node 1004 (position 5)
    lies about its seed. Without it the path would split in two, so its seed is rebuilt
    from its neighbours' shares instead (checked against its commitment): the sum holds its
    vector, and it is named and excluded all the same."""
    monkeypatch.setattr(secagg, "neighbourhoods", in_order_ring)
    lie = wrong_seed(1004)

    def hook(node, message, reply):
        if node == 1000 and message.metadata.message_type == "query.secure_feddp_lloyd":
            return Message(Error(code=2, reason="gone"), reply_to=message)
        return lie(node, message, reply)

    result = run(
        config(
            tmp_path,
            "secure",
            **{"lloyd-rounds": 1, "secure-aggregation": True, "secagg-neighbours": 2, "secagg-threshold": 0.5},
        ),
        num_nodes=NODES,
        reply_hook=hook,
    )
    record = result["privacy"]["secure_aggregation"]
    assert not record["out_of_range"] and record["sessions"] == 1
    np.testing.assert_allclose(
        centers(tmp_path, "secure"), lloyd_over(tmp_path, result, set(range(1001, 1000 + NODES))), rtol=1e-6, atol=1e-8
    )
    assert record["excluded_liars"] == [1004]


def test_a_device_returning_a_wrong_share_of_a_dropped_devices_key_is_named_and_the_sum_completes(tmp_path):
    """Node 1000 drops before masking, so its mask key is rebuilt from the nine others'
    shares; node 1003 returns a wrong share. Before, the key came out wrong and the run
    stopped or skipped the update. Now each share is checked against the hash its dealer
    committed to: 1003's is left out and 1003 is named; the other eight rebuild the key."""

    def hook(node, message, reply):
        kind = message.metadata.message_type
        if node == 1000 and kind == "query.secure_feddp_lloyd":
            return Message(Error(code=2, reason="gone"), reply_to=message)
        if node == 1003 and kind == "query.secagg_unmask" and not reply.has_error():
            arrays = reply.content.array_records["arrays"]
            shares = arrays["sk-shares"].numpy().copy()
            shares[:, 4:] ^= 0x5A  # the index kept, every chunk changed
            arrays["sk-shares"] = Array(shares)
        return reply

    result = run(
        config(tmp_path, "secure", **{"lloyd-rounds": 1, "secure-aggregation": True}), num_nodes=NODES, reply_hook=hook
    )
    record = result["privacy"]["secure_aggregation"]
    assert record["excluded_liars"] == [1003] and not record["out_of_range"]
    assert "share" in result["nodes"]["excluded"]["1003"]
    np.testing.assert_allclose(
        centers(tmp_path, "secure"), lloyd_over(tmp_path, result, set(range(1001, 1000 + NODES))), rtol=1e-6, atol=1e-8
    )


def crafted_shares(monkeypatch, liar):
    """``liar`` deals shares of another mask key than its own (each share matches the hash
    it commits to, so no holder can tell): only a rebuilt key shows it."""
    import os

    from fedcluster.kernel import KERNELS

    original = KERNELS["secagg_share_keys"]

    def kernel(data, arrays, config):
        if data.extra.get("node-id") != liar:
            return original(data, arrays, config)
        with monkeypatch.context() as patched:
            patched.setattr(secagg, "private_scalar", lambda pem: os.urandom(48))
            return original(data, arrays, config)

    monkeypatch.setitem(KERNELS, "secagg_share_keys", kernel)


def test_a_liar_whose_shares_rebuild_nothing_is_named_and_the_skipped_update_is_said(tmp_path, monkeypatch, caplog):
    """Node 1004 deals shares of a wrong mask key (matching its commitments) and sends a
    wrong seed: taken out of the first round's sum, its mask key is rebuilt from the others'
    shares and is not the key of its public key. That sum stays masked (never set up again:
    1004 alone could unmask it later). 1004 is named and excluded; the skipped update is
    in the log and in result.json; the second round is Lloyd's over the nine others."""
    crafted_shares(monkeypatch, 1004)
    result = run(
        config(tmp_path, "secure", **{"lloyd-rounds": 2, "secure-aggregation": True}),
        num_nodes=NODES,
        reply_hook=wrong_seed(1004),
    )
    assert [r["center_shift"] == 0 for r in result["rounds"]] == [True, False]
    X = pooled_points(result["config"], NODES)[0]
    expected = lloyd_step(
        X[own_rows(X, set(range(1000, 1000 + NODES)) - {1004})], np.load(tmp_path / "secure" / "init_centers.npy")
    )
    np.testing.assert_allclose(centers(tmp_path, "secure"), expected, rtol=1e-6, atol=1e-8)
    record = result["privacy"]["secure_aggregation"]
    assert record["incomplete"] == ["lloyd"] and record["excluded_liars"] == [1004] and record["sessions"] == 1
    assert "do not rebuild" in result["nodes"]["excluded"]["1004"] and "this update is skipped" in caplog.text


def test_a_wrong_share_that_leaves_a_key_short_of_the_threshold_skips_that_update_naming_the_liar(
    tmp_path, monkeypatch, caplog
):
    """Four neighbours each (positions in order), Shamir threshold four: node 1004 drops
    before masking in round 1, so its mask key needs all four of its neighbours' shares,
    and neighbour 1005 returns a wrong one. Before, the run stopped. Now 1005 is named and
    excluded, and that update is skipped and said (the sum is not set up again: 1005 could
    hand its true share over later); round 2 is Lloyd's over the nine others."""
    monkeypatch.setattr(secagg, "neighbourhoods", in_order_ring)
    seen = []

    def hook(node, message, reply):
        kind = message.metadata.message_type
        seen.append((node, kind))
        if node == 1004 and kind == "query.secure_feddp_lloyd" and seen.count((node, kind)) == 1:
            return Message(Error(code=2, reason="gone"), reply_to=message)
        if node == 1005 and kind == "query.secagg_unmask" and not reply.has_error():
            arrays = reply.content.array_records["arrays"]
            shares = arrays["sk-shares"].numpy().copy()
            shares[:, 4:] ^= 0x5A
            arrays["sk-shares"] = Array(shares)
        return reply

    result = run(
        config(tmp_path, "secure", **{"lloyd-rounds": 2, "secure-aggregation": True, "secagg-neighbours": 4}),
        num_nodes=NODES,
        reply_hook=hook,
    )
    assert [r["center_shift"] == 0 for r in result["rounds"]] == [True, False]
    X = pooled_points(result["config"], NODES)[0]
    expected = lloyd_step(
        X[own_rows(X, set(range(1000, 1000 + NODES)) - {1005})], np.load(tmp_path / "secure" / "init_centers.npy")
    )
    np.testing.assert_allclose(centers(tmp_path, "secure"), expected, rtol=1e-6, atol=1e-8)
    record = result["privacy"]["secure_aggregation"]
    assert record["incomplete"] == ["lloyd"] and record["excluded_liars"] == [1005]
    assert "[1005] lied" in caplog.text and "this update is skipped" in caplog.text


# ---------------------------------------------------------------- the checks themselves
def test_a_refusal_is_settled_by_opening_the_token_with_the_key_its_sender_reveals():
    """A token a holder can open opens for the server with the sender's ephemeral key (the
    refusal is false); a damaged token, a token of shares other than committed, a key that
    is not the token's, or no proof at all leaves the fault with the sender."""
    from fedcluster.secagg import checks as checks
    from fedcluster.secagg.crypto import flower_crypto as _flwr

    f = _flwr()
    holder_sk, holder_pk = f["generate_key_pairs"]()
    holder_pem, holder_sk_pem = f["public_key_to_bytes"](holder_pk), f["private_key_to_bytes"](holder_sk)
    session, dealer, holder, sums = 3, 2, 5, 2
    b = [bytes([i]) * checks.share_width(32) for i in range(sums)]
    sk = [bytes([9 + i]) * checks.share_width(48) for i in range(sums)]
    digest = checks.share_digest(checks.share_hashes(b, sk, session, dealer, holder), session, dealer, holder)
    scalar, point = checks.ephemeral_pair()
    token = f["encrypt"](
        checks.sender_key(scalar, holder_pem),
        f["share_keys_plaintext_concat"](dealer, holder, b"".join(b), b"".join(sk)),
    )
    # the holder opens it, and so does the server with the revealed key
    assert checks.opened_share(
        token, checks.holder_key(holder_sk_pem, point), session, dealer, holder, digest, sums
    ) == (b, sk)
    fault = lambda tok=token, pt=point, sc=scalar, dg=digest: checks.share_fault(
        tok, pt, sc, holder_pem, session, dealer, holder, dg, sums
    )
    assert fault() is None  # the refusal was false
    assert "decrypt" in fault(tok=token[:-8] + b"AAAAAAAA")
    assert "commitment" in fault(dg=bytes(32))
    assert "not the one" in fault(sc=checks.ephemeral_pair()[0])
    assert "proved nothing" in fault(sc=None)
    assert "not the one" in fault(sc=bytes(48))  # no valid scalar at all
    other = f["encrypt"](
        checks.sender_key(scalar, holder_pem), f["share_keys_plaintext_concat"](dealer, 6, b"".join(b), b"".join(sk))
    )
    assert "someone else" in fault(tok=other)


def test_a_secret_is_rebuilt_from_the_shares_that_match_their_commitments_only():
    import os

    from fedcluster.secagg import checks as checks
    from fedcluster.secagg.crypto import flower_crypto as _flwr

    seed, t = os.urandom(32), 3
    shares = dict(enumerate(_flwr()["create_shares"](seed, t, 6), start=1))
    committed = {h: checks.share_hash(s, 1, 9, h, 1, "b") for h, s in shares.items()}
    hashed = lambda h, s: checks.share_hash(s, 1, 9, h, 1, "b")
    matches = lambda s: checks.seed_commitment(s, 1, 9, 1) == checks.seed_commitment(seed, 1, 9, 1)
    assert checks.rebuilt(shares, committed.get, hashed, t, matches) == (seed, [], False)
    lying = {**shares, 2: shares[2][:4] + bytes(48), 5: shares[3]}  # a changed share, another holder's share
    assert checks.rebuilt(lying, committed.get, hashed, t, matches) == (seed, [2, 5], False)
    assert checks.rebuilt({h: lying[h] for h in (1, 2, 5)}, committed.get, hashed, t, matches) == (None, [2, 5], False)
    other = dict(enumerate(_flwr()["create_shares"](os.urandom(32), t, 6), start=1))  # a dealer committing to them
    crafted = {h: checks.share_hash(s, 1, 9, h, 1, "b") for h, s in other.items()}
    assert checks.rebuilt(other, crafted.get, hashed, t, matches) == (None, [], True)
    key_sk, key_pk = _flwr()["generate_key_pairs"]()
    scalar = secagg.private_scalar(_flwr()["private_key_to_bytes"](key_sk))
    assert checks.scalar_matches(scalar, _flwr()["public_key_to_bytes"](key_pk))
    assert not checks.scalar_matches(os.urandom(48), _flwr()["public_key_to_bytes"](key_pk))
    assert len(shares[1]) == checks.share_width(32) and len(
        _flwr()["create_shares"](scalar, t, 6)[0]
    ) == checks.share_width(48)


def test_a_device_proves_fewer_shares_than_the_threshold_and_never_gives_both_shares_of_one_participant():
    """The device side: ``secagg_prove`` reveals the key of a token it sent, but not of one
    it did not send, and never the threshold's worth in a session; a later unmask call may
    add a participant to the dropped (its vector taken out) but not one whose seed share it
    already sent, nor take one out of the dropped."""
    from fedcluster.kernel import DeviceData
    from fedcluster.device import run_task

    data = DeviceData(points=np.zeros((4, 2)))
    data.extra[secagg.STATE] = {
        "session": 1,
        "position": 1,
        "threshold": 3,
        "sums": 1,
        "stage": "unmasked",
        "sum": 1,
        "ephemeral": {2: b"a" * 48, 3: b"b" * 48, 4: b"c" * 48, 5: b"d" * 48},
        "revealed": [],
        "masked-with": [2, 3, 4, 5],
        "unmask-dropped": [2],
        "unmask-recovered": [3],
        "seeds": [bytes(32)],
        "b-shares": {p: bytes(52) for p in (2, 3, 4, 5)},
        "sk-shares": {p: bytes(68) for p in (2, 3, 4, 5)},
    }
    prove = lambda *positions: run_task("secagg_prove", data, {"positions": np.array(positions)}, {"session": 1})[0]
    assert bytes(prove(3)["scalars"][0]) == b"b" * 48
    with pytest.raises(ValueError, match="did not send"):
        prove(6)
    assert bytes(prove(4)["scalars"][0]) == b"c" * 48
    with pytest.raises(ValueError, match="threshold"):
        prove(5)  # a third key: the threshold's worth
    unmask = lambda dropped, recover=(): run_task(
        "secagg_unmask",
        data,
        {"dropped": np.array(dropped, dtype=np.int64), "recover": np.array(recover, dtype=np.int64)},
        {"session": 1, "sum": 1},
    )[0]
    for dropped in ([2, 3], [4]):  # its seed share already sent; 2 no longer dropped
        with pytest.raises(ValueError, match="another set of dropped"):
            unmask(dropped)
    assert list(unmask([2, 4])["sk-positions"]) == [2, 4]
    with pytest.raises(ValueError, match="not in the sum"):
        unmask([2, 4], [4])  # a seed share of one now dropped
