"""Secure aggregation (SecAgg, Bonawitz et al. 2017, full graph: every participant a
neighbour of every other), a prototype built on Flower's primitives, not on its SecAgg+
workflow (which needs the legacy strategy API). The device stages are kernels of the declared
tasks ``secagg_setup``, ``secagg_share_keys``, ``secure_<task>`` and ``secagg_unmask``, and
``secagg_prove`` after a refusal (:mod:`fedcluster.protocol`); the server's side is pure
functions here (:func:`masked_total`, :func:`unmasked_sum`), orchestrated by
``fedcluster/server/secure_sum.py``. The commitments that let the server check what a device reveals,
and the share encryption under ephemeral keys, are :mod:`fedcluster.secagg.checks`.

Fixed point and modulus (bounds agreed before the round, never learnt from the data):

- every summed array has a public range ``c`` (the request's ``secagg-ranges``); a device
  clips each coordinate to [−c, c] and rounds it to the integer q = rint(x · 2^40 / c), so
  |q| ≤ 2^40 = ``HALF_LEVELS`` and the step is γ = c / 2^40 (rounding error ≤ γ/2 per device
  and coordinate; deterministic rounding: the central noise the server adds afterwards
  assumes the exact sum, so the sensitivity grows by at most γ·√dim, not accounted);
- values and masks live mod R = 2^62 (uint64 arithmetic with ``& (R − 1)``: R divides 2^64);
  the signed sum of n devices is read back exactly while n · 2^40 < 2^61, i.e. n < 2^21
  (:data:`MAX_PARTICIPANTS`; the server refuses more).

Masks: PRG(seed) is ChaCha20 (the ``cryptography`` package, a dependency of flwr) keyed by
SHA-256 of a label, the session and the seed, instead of flwr's ``pseudo_rand_gen``, whose
32-byte seed is XOR-folded to 32 bits for NumPy's MT19937. Key agreement (ECDH P-384 + HKDF),
encryption of the shares (Fernet, under an ephemeral key per token) and Shamir (GF(2^128))
are Flower's. Device state lives in
``data.extra[STATE]``, one session at a time; the ClientApp saves it in Flower's
``context.state`` after every stage and restores it before the next (:func:`export_state`,
:func:`import_state`), because a deployment starts one process per message and a simulation
may run a node's messages in different workers.

flwr and ``cryptography`` are imported on first use: the rest of fedcluster never needs them.
"""

from __future__ import annotations

import hashlib
import math
import os
from typing import Any, Iterable, Mapping, MutableMapping

import numpy as np

import fedcluster.protocol as protocol
from fedcluster.kernel import KERNELS, DeviceData, device_task
from fedcluster.privacy.skellam import noise

import fedcluster.secagg.checks as checks
from .crypto import flower_crypto as _flwr
from fedcluster.secagg.protocol import HASH_BYTES, POINT_BYTES, SCALAR_BYTES, SEED_BYTES

MODULUS_BITS = 62
MODULUS = 2**MODULUS_BITS
HALF_LEVELS = 2**40
MAX_PARTICIPANTS = 2**21 - 1  # n · HALF_LEVELS < R / 2: the signed sum is read back exactly
STATE = "secagg-state"  # data.extra key of the device's session store
RANGE_POINTS = 2**20  # without a cap on a device's points, its sums' public range: this many points
_LISTS = (
    "positions",
    "peers",
    "masked-with",
    "unmask-dropped",
    "unmask-recovered",
    "refused",
    "revealed",
)  # list[int] entries; "sk1", "pk1", "peer-pk*", "seeds": list[bytes]
_MAPS = ("b-shares", "sk-shares", "pair-keys", "ephemeral")  # dict[int, bytes] entries


# ==================================================================== helpers (both sides)
def shared_key(private_pem: bytes, public_pem: bytes) -> bytes:
    """ECDH + HKDF (flwr's ``generate_shared_key``) between a PEM private and public key."""
    f = _flwr()
    return f["generate_shared_key"](f["bytes_to_private_key"](private_pem), f["bytes_to_public_key"](public_pem))


def private_scalar(private_pem: bytes) -> bytes:
    """A P-384 private key (PEM) as its 48-byte scalar: what is Shamir-shared (a PEM is
    six times longer, and Flower's Shamir works 16 bytes at a time)."""
    key = _flwr()["bytes_to_private_key"](private_pem)
    return key.private_numbers().private_value.to_bytes(48, "big")


def private_pem(scalar: bytes) -> bytes:
    """The inverse of :func:`private_scalar` (``cryptography``'s ``derive_private_key``)."""
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.derive_private_key(int.from_bytes(scalar, "big"), ec.SECP384R1())
    return _flwr()["private_key_to_bytes"](key)


def mask(seed: bytes, label: str, stream: str, size: int) -> np.ndarray:
    """``size`` uint64 words uniform in [0, R): ChaCha20 keyed by SHA-256(label, stream, seed)
    (the stream names the session and the sum)."""
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

    key = hashlib.sha256(f"fedcluster-secagg/{label}/{stream}/".encode() + seed).digest()
    stream = Cipher(algorithms.ChaCha20(key, bytes(16)), mode=None).encryptor().update(bytes(8 * size))
    return np.frombuffer(stream, dtype="<u8").astype(np.uint64) & np.uint64(MODULUS - 1)


def quantize(value: np.ndarray, bound: float, levels: float = HALF_LEVELS) -> np.ndarray:
    """Centred fixed point: clip to [−bound, bound], q = rint(x · levels / bound) (int64);
    ``levels`` ≤ 2^40, coarser where the devices' noise is large (:func:`noise_levels`)."""
    scaled = np.clip(np.asarray(value, dtype=np.float64), -bound, bound) * (float(levels) / bound)
    return np.rint(scaled).astype(np.int64)


def dequantize(total: np.ndarray, bound: float, levels: float = HALF_LEVELS) -> np.ndarray:
    """A sum mod R back to floats: the signed representative, times the step bound / levels."""
    signed = total.astype(np.int64)
    signed = np.where(signed >= MODULUS // 2, signed - MODULUS, signed)
    return signed.astype(np.float64) * (bound / float(levels))


NOISE_LEVELS = 2**25  # grid steps per standard deviation of the devices' noise, at most


def noise_levels(bound: float, noise_std: float) -> float:
    """The grid of an array the devices add noise of ``noise_std`` (data units) to: 2^40
    levels per range, or fewer, so that the noise spans at most 2^25 steps per standard
    deviation (its variance in steps then stays far inside NumPy's Poisson sampler and the
    modulus, and the rounding stays 2^-25 of the noise)."""
    if noise_std <= 0:
        return float(HALF_LEVELS)
    return float(min(HALF_LEVELS, max(1.0, math.floor(NOISE_LEVELS * bound / noise_std))))


def stack_bytes(items: Iterable[bytes]) -> np.ndarray:
    """Byte strings as the rows of a uint8 array, right-padded with zero bytes (PEM keys and
    Fernet tokens are ASCII: they never end in a zero byte)."""
    items = list(items)
    width = max((len(item) for item in items), default=0)
    return np.array([list(item.ljust(width, b"\0")) for item in items], dtype=np.uint8).reshape(len(items), width)


def row_bytes(row: np.ndarray, strip: bool = True) -> bytes:
    raw = np.asarray(row).astype(np.uint8).tobytes()
    return raw.rstrip(b"\0") if strip else raw


def _flat_size(shapes: Mapping[str, tuple]) -> int:
    return int(sum(int(np.prod(shape)) for shape in shapes.values()))


def _split(words: np.ndarray, shapes: Mapping[str, tuple]) -> dict[str, np.ndarray]:
    out, start = {}, 0
    for name, shape in shapes.items():
        size = int(np.prod(shape))
        out[name] = words[start : start + size].reshape(shape)
        start += size
    return out


def rounding_slack(bound: float, size: int, norm: int) -> float:
    """How much further apart two devices' rounded arrays of ``size`` coordinates in range
    ``bound`` can be than the arrays themselves (``norm`` 1 or 2): :func:`quantize` moves a
    coordinate by at most half a step γ = bound / 2^40, so γ·size (L1) or γ·√size (L2).
    Added to a sensitivity, it keeps the noise calibrated to what is actually summed."""
    step = float(bound) / HALF_LEVELS
    return step * (size if norm == 1 else float(np.sqrt(size)))


def export_state(store: Mapping[str, Any]) -> dict[str, Any]:
    """A device's session store as flat values a Flower ConfigRecord holds (ints, strings,
    bytes and lists of one of them): each share map becomes a list of positions and a list
    of shares."""
    flat: dict[str, Any] = {}
    for key, value in store.items():
        if key in _MAPS:
            flat[f"{key}.positions"] = [int(p) for p in value]
            flat[f"{key}.values"] = [bytes(v) for v in value.values()]
        elif isinstance(value, list):
            flat[key] = [int(v) for v in value] if key in _LISTS else [bytes(v) for v in value]
        else:
            flat[key] = value
    return flat


def import_state(flat: Mapping[str, Any]) -> dict[str, Any]:
    """The inverse of :func:`export_state`."""
    store: dict[str, Any] = {}
    for key, value in flat.items():
        if key.endswith(".positions") and key[: -len(".positions")] in _MAPS:
            name = key[: -len(".positions")]
            store[name] = {int(p): bytes(v) for p, v in zip(value, flat[f"{name}.values"])}
        elif key.endswith(".values") and key[: -len(".values")] in _MAPS:
            continue
        elif isinstance(value, list):
            store[key] = [int(v) for v in value] if key in _LISTS else [bytes(v) for v in value]
        else:
            store[key] = value
    return store


def threshold(participants: int, fraction: float) -> int:
    """Shamir threshold t for ``participants``: ceil(fraction · n), at least 2 and more than
    n/2, at most n. (More than n/2: two disjoint groups of t devices cannot exist. That
    alone does not stop a server that lies in its unmask requests, since a device in the sum
    sends its own seed: the protocol assumes an honest-but-curious server.)"""
    return min(participants, max(2, participants // 2 + 1, int(np.ceil(fraction * participants - 1e-9))))


def degree(participants: int, neighbours: int) -> int:
    """How many others each of ``participants`` masks with: all of them (``neighbours`` = 0,
    or a ring that would reach everyone), else ``neighbours`` rounded up to even."""
    ring = 2 * -(-neighbours // 2)
    return participants - 1 if neighbours == 0 or ring >= participants - 1 else ring


def neighbourhoods(participants: int, neighbours: int, rng: np.random.Generator) -> dict[int, set[int]]:
    """Who masks with and shares keys with whom, positions 1..n: with ``neighbours`` = 0 or
    at least n − 1 everyone with everyone (SecAgg); else SecAgg+'s graph as Flower's
    SecAggPlusWorkflow builds it: the positions in a random order on a ring, each joined to
    the ⌈neighbours/2⌉ before and the ⌈neighbours/2⌉ after it (symmetric)."""
    everyone, joined = set(range(1, participants + 1)), degree(participants, neighbours)
    if joined == participants - 1:
        return {p: everyone - {p} for p in everyone}
    half = joined // 2
    ring = [int(p) + 1 for p in rng.permutation(participants)]
    return {
        ring[i]: {ring[(i + offset) % participants] for offset in range(-half, half + 1)} - {ring[i]}
        for i in range(participants)
    }


def short_neighbourhoods(
    alive: Iterable[int], dropped: Iterable[int], neighbours: Mapping[int, set[int]], threshold: int
) -> list[int]:
    """The positions whose masks could not come off a sum over ``alive``: a device in it
    with fewer than ``threshold`` of its neighbourhood (itself included) in it (it refuses
    to unmask, and its seed cannot be rebuilt), or one of ``dropped`` with fewer than
    ``threshold`` neighbours in it (its mask key cannot be rebuilt). None on the full graph
    while at least ``threshold`` are alive."""
    alive = set(alive)
    return sorted(
        [p for p in alive if len(neighbours[p] & alive) + 1 < threshold]
        + [p for p in dropped if len(neighbours[p] & alive) < threshold]
    )


def connected(positions: Iterable[int], neighbours: Mapping[int, set[int]]) -> bool:
    """Whether ``positions`` form one component of the masking graph restricted to them:
    otherwise unmasking would give the server the sum of each component on its own."""
    left = set(positions)
    if not left:
        return True
    frontier = [left.pop()]
    while frontier:
        reached = neighbours[frontier.pop()] & left
        left -= reached
        frontier.extend(reached)
    return not left


# ==================================================================== device stages
# One session serves several secure sums (``sums``): keys and shares are set up once, and
# each sum s has its own self-mask seed b_s and its own mask key pair (sk1_s, pk1_s), so a
# sum takes two round trips (masked reply, unmasking). Revealing what unmasks one sum (the
# seeds of the devices in it, the mask keys of those that dropped before masking) reveals
# nothing of another sum, and within a sum no device reveals both for one participant.
def _store(data: DeviceData) -> MutableMapping[str, Any]:
    return data.extra.setdefault(STATE, {})


def _session(data: DeviceData, session: int) -> MutableMapping[str, Any]:
    store = _store(data)
    if store.get("session") != session:
        raise ValueError(f"secure-aggregation session {session} is unknown on this device")
    return store


def split_keys(joined: bytes, count: int) -> list[bytes]:
    """``count`` equal parts, concatenated (one per sum: PEM keys, shares, pairwise keys),
    apart again."""
    if count < 1 or len(joined) % count:
        raise ValueError("secure aggregation: parts of unequal length")
    width = len(joined) // count
    return [joined[i * width : (i + 1) * width] for i in range(count)]


@device_task(protocol.task("secagg_setup"))
def secagg_setup(data: DeviceData, arrays: dict, config: dict):
    """Stage 0: fresh key pairs, one per sum for the pairwise masks (pk1) and one for the
    shares' encryption (pk2); any older session is forgotten."""
    f = _flwr()
    if not 2 <= config["threshold"] <= config["participants"] or not 1 <= config["position"] <= config["participants"]:
        raise ValueError("secure aggregation: threshold or position out of range")
    store = _store(data)
    store.clear()
    pairs = [f["generate_key_pairs"]() for _ in range(config["sums"] + 1)]
    sk1 = [f["private_key_to_bytes"](sk) for sk, _ in pairs[:-1]]
    pk1 = [f["public_key_to_bytes"](pk) for _, pk in pairs[:-1]]
    store.update(
        {
            "session": config["session"],
            "position": config["position"],
            "threshold": config["threshold"],
            "sums": config["sums"],
            "participants": config["participants"],
            "stage": "setup",
            "sum": 0,
            "sk1": sk1,
            "pk1": pk1,
            "sk2": f["private_key_to_bytes"](pairs[-1][0]),
            "pk2": f["public_key_to_bytes"](pairs[-1][1]),
        }
    )
    return {
        "pk1": np.frombuffer(b"".join(pk1), np.uint8).reshape(len(pk1), -1),
        "pk2": np.frombuffer(store["pk2"], np.uint8),
    }, {}


def _participants(store: MutableMapping[str, Any], arrays: dict) -> tuple[list[int], list[bytes], list[bytes]]:
    """The positions and public keys the server forwarded for stage 1, checked: none
    repeated, at least the threshold of them, this device among them with its own keys
    unchanged, one mask key per sum in each."""
    positions = [int(p) for p in arrays["positions"]]
    pk1 = [row_bytes(row, strip=False) for row in arrays["pk1"]]
    pk2 = [row_bytes(row) for row in arrays["pk2"]]
    if len(set(positions)) != len(positions) or len(set(pk1)) != len(pk1) or len(set(pk2)) != len(pk2):
        raise ValueError("secure aggregation: repeated positions or public keys")
    if len(positions) < store["threshold"] or store["position"] not in positions:
        raise ValueError("secure aggregation: fewer participants than the threshold, or this device is not among them")
    for keys in pk1:
        split_keys(keys, store["sums"])  # one key per sum, of equal lengths
    mine = positions.index(store["position"])
    if pk1[mine] != b"".join(store["pk1"]) or pk2[mine] != store["pk2"]:
        raise ValueError("secure aggregation: this device's own public keys came back changed")
    return positions, pk1, pk2


@device_task(protocol.task("secagg_share_keys"))
def secagg_share_keys(data: DeviceData, arrays: dict, config: dict):
    """Stage 1: Shamir shares of one fresh mask seed b_s and of the mask key sk1_s per sum,
    one per participant, each participant's encrypted under a fresh ephemeral key and its
    pk2 (:mod:`fedcluster.secagg.checks`); with them the commitments the server keeps: the
    hash of each seed, and per participant and sum the hashes of its two shares."""
    f = _flwr()
    store = _session(data, config["session"])
    if store["stage"] != "setup":
        raise ValueError("secure aggregation: keys shared twice")
    positions, pk1, pk2 = _participants(store, arrays)
    me, sums, t, session = store["position"], store["sums"], store["threshold"], store["session"]
    mine = positions.index(me)
    seeds = [os.urandom(SEED_BYTES) for _ in range(sums)]
    b_shares = [f["create_shares"](seed, t, len(positions)) for seed in seeds]
    sk_shares = [f["create_shares"](private_scalar(sk), t, len(positions)) for sk in store["sk1"]]
    destinations, ciphertexts, points, hashes, ephemeral = [], [], [], [], {}
    for index, position in enumerate(positions):
        if position == me:
            continue
        b_parts, sk_parts = [shares[index] for shares in b_shares], [shares[index] for shares in sk_shares]
        scalar, point = checks.ephemeral_pair()  # this token's key only: revealed if the token is disputed
        plaintext = f["share_keys_plaintext_concat"](me, position, b"".join(b_parts), b"".join(sk_parts))
        destinations.append(position)
        ciphertexts.append(f["encrypt"](checks.sender_key(scalar, pk2[index]), plaintext))
        points.append(point)
        hashes.append(
            np.frombuffer(checks.share_hashes(b_parts, sk_parts, session, me, position), np.uint8).reshape(sums, -1)
        )
        ephemeral[position] = scalar
    store.update(
        {
            "stage": "shared",
            "seeds": seeds,
            "positions": positions,
            "peer-pk1": pk1,
            "peer-pk2": pk2,
            "ephemeral": ephemeral,
            "revealed": [],
            "b-shares": {me: b"".join(shares[mine] for shares in b_shares)},
            "sk-shares": {me: b"".join(shares[mine] for shares in sk_shares)},
            "peers": [],
            "pair-keys": {},
        }
    )
    committed = [checks.seed_commitment(seed, session, me, i) for i, seed in enumerate(seeds, start=1)]
    return {
        "destinations": np.array(destinations, dtype=np.int64),
        "ciphertexts": stack_bytes(ciphertexts),
        "ephemeral": np.array([list(p) for p in points], dtype=np.uint8).reshape(len(points), POINT_BYTES),
        "commitments": np.stack(hashes) if hashes else np.zeros((0, sums, 2 * HASH_BYTES), np.uint8),
        "seed-commitments": np.array([list(c) for c in committed], dtype=np.uint8),
    }, {}


def _receive_shares(store: MutableMapping[str, Any], arrays: dict) -> list[int]:
    """The first masked reply of a session: open the shares forwarded to this device
    (:func:`fedcluster.secagg.checks.opened_share`: they decrypt, are addressed to it, and
    match the digest of their dealer's commitments); the participants they came from are
    the ones it may mask with. A share that fails is refused: this device does not mask
    with its sender, and says so (the server then asks the sender to prove the share right,
    and leaves out whichever of the two lies). Returns the refused positions."""
    f = _flwr()
    me, positions, session, sums = store["position"], store["positions"], store["session"], store["sums"]
    sources = [int(s) for s in arrays["secagg-sources"]]
    if len(set(sources)) != len(sources) or not set(sources) <= set(positions) - {me}:
        raise ValueError("secure aggregation: shares from unknown or repeated participants")
    own = [f["bytes_to_private_key"](key) for key in store["sk1"]]
    refused = []
    for source, row, point, digest in zip(
        sources, arrays["secagg-ciphertexts"], arrays["secagg-ephemeral"], arrays["secagg-digests"]
    ):
        try:
            key = checks.holder_key(store["sk2"], row_bytes(point, strip=False))
            b_parts, sk_parts = checks.opened_share(
                row_bytes(row), key, session, source, me, row_bytes(digest, strip=False), sums
            )
            # the pairwise keys of every sum, once: ECDH(sk1_s, pk1_s of the peer), sums joined
            public = split_keys(store["peer-pk1"][positions.index(source)], sums)
            pair = b"".join(
                f["generate_shared_key"](mine, f["bytes_to_public_key"](theirs)) for mine, theirs in zip(own, public)
            )
        except Exception:  # noqa: BLE001 -- whatever a hostile sender put in its share: refuse it
            refused.append(source)
            continue
        store["b-shares"][source], store["sk-shares"][source], store["pair-keys"][source] = (
            b"".join(b_parts),
            b"".join(sk_parts),
            pair,
        )
    store["peers"], store["stage"] = [p for p in sources if p not in refused], "ready"
    return refused


def stream_name(session: int, index: int) -> str:
    """The mask streams of sum ``index`` of ``session``."""
    return f"{session}.{index}"


def masked_reply(name: str):
    """Stage 2 for the summable task ``name`` (sum ``secagg-sum`` of the session): run its
    kernel, quantize each summed array in its public range and grid (``secagg-levels``), add
    this device's share of the noise (``secagg-noise``, Skellam, its own entropy), then
    PRG(b_s) and ± PRG(ECDH(sk1_s, pk1_s of j)) for every participant j in this sum (its peers
    but the request's ``secagg-absent``), mod R. The reply holds those arrays only, as
    uint64 < R: no metric."""
    base = protocol.task(name)
    own = {p.name for p in base.config}

    def kernel(data: DeviceData, arrays: dict, config: dict):
        store = _session(data, config["secagg-session"])
        index = int(config["secagg-sum"])
        if store["stage"] == "shared":  # the shares come with this device's first masked request, whichever sum
            store["refused"] = _receive_shares(
                store, arrays
            )  # (forwarded again while the server lacks its reply: kept)
        if store["stage"] not in ("ready", "masked", "unmasked") or index <= store["sum"] or index > store["sums"]:
            raise ValueError(
                "secure aggregation: a masked reply out of order, or twice"
            )  # (a missed sum or unmask is fine)
        absent = {int(p) for p in arrays["secagg-absent"]}
        peers = [p for p in store["peers"] if p not in absent]
        refused = store.get("refused", [])  # repeated in every sum of the session, lest a lost reply hide them
        if len(peers) + 1 < store["threshold"] and not refused:  # with a refusal the server sets the sum up again
            raise ValueError("secure aggregation: fewer participants than the threshold")
        plain = {k: v for k, v in arrays.items() if not k.startswith("secagg-")}
        result, _ = KERNELS[name](data, plain, {k: v for k, v in config.items() if k in own and v is not None})
        summed = [field.name for field in base.reply if field.name in result]
        ranges, levels, variances = arrays["secagg-ranges"], arrays["secagg-levels"], arrays["secagg-noise"]
        if not len(ranges) == len(levels) == len(variances) == len(summed):
            raise ValueError(f"secure aggregation: ranges, levels and noise for {len(summed)} summed arrays expected")
        shapes = {key: np.shape(result[key]) for key in summed}
        flags = np.zeros(store["participants"], dtype=np.uint8)  # one byte a participant, in every masked reply
        flags[[p - 1 for p in refused]] = 1
        if refused:  # masks that do not cancel: this sum is never unmasked, so nothing of the data is sent
            store.update({"stage": "masked", "sum": index, "masked-with": peers})
            return {
                **{key: np.zeros(shape, dtype=np.uint64) for key, shape in shapes.items()},
                "secagg-refused": flags,
            }, {}
        size, stream, me, sums = (
            _flat_size(shapes),
            stream_name(store["session"], index),
            store["position"],
            store["sums"],
        )
        words = np.concatenate(
            [
                quantize(result[key], bound, level).ravel() + noise(variance, int(np.prod(shapes[key])))
                for key, bound, level, variance in zip(summed, ranges, levels, variances)
            ]
        )
        words = words.astype(np.uint64) + mask(store["seeds"][index - 1], "self", stream, size)
        for peer in peers:
            pair = mask(split_keys(store["pair-keys"][peer], sums)[index - 1], "pair", stream, size)
            words = words + pair if me > peer else words - pair  # uint64 wraps mod 2^64, a multiple of R
        store.update({"stage": "masked", "sum": index, "masked-with": peers})
        return {**_split(words & np.uint64(MODULUS - 1), shapes), "secagg-refused": flags}, {}

    return kernel


@device_task(protocol.task("secagg_unmask"))
def secagg_unmask(data: DeviceData, arrays: dict, config: dict):
    """Stage 3 of sum s: this device's own seed b_s (it is in the sum: the server would
    rebuild b_s from the shares anyway), shares of b_s for the participants in the sum that
    did not answer (``recover``, asked in a second call when needed), and of sk1_s for those
    it masked with that sent no vector (``dropped``; everyone else it masked with is in the
    sum). A later call for the same sum may add to ``dropped`` (a participant whose revealed
    seed failed its commitment: its vector is taken out of the sum) but never drops one
    from it, nor adds one whose b share it sent: never both shares of one sum for one
    participant, never below the threshold."""
    store = _session(data, config["session"])
    index = int(config["sum"])
    dropped, recover = [int(p) for p in arrays["dropped"]], [int(p) for p in arrays["recover"]]
    me, masked_with = store["position"], set(store.get("masked-with", []))
    recovered = set(store.get("unmask-recovered", []))
    if store["stage"] == "unmasked" and index == store["sum"]:  # a later call: the same sum, the dropped kept
        if not set(store["unmask-dropped"]) <= set(dropped) or set(dropped) & recovered:
            raise ValueError("secure aggregation: another set of dropped participants for the same sum")
    elif store["stage"] != "masked" or index != store["sum"]:
        raise ValueError("secure aggregation: unmask before this device's masked reply, or for another sum")
    else:
        recovered = set()
    if not set(dropped) <= masked_with or len(set(dropped)) != len(dropped):
        raise ValueError("secure aggregation: asked about a participant this device did not mask with")
    alive = masked_with - set(dropped) | {me}  # everyone it masked with that sent a vector, and itself
    if len(alive) < store["threshold"]:
        raise ValueError("secure aggregation: fewer survivors than the threshold")
    if not set(recover) <= alive - {me} or len(set(recover)) != len(recover):
        raise ValueError("secure aggregation: asked to recover a participant not in the sum")
    sums = store["sums"]
    reply = {
        "seed": np.frombuffer(store["seeds"][index - 1], np.uint8),
        "b-positions": np.array(recover, dtype=np.int64),
        "b-shares": stack_bytes(split_keys(store["b-shares"][p], sums)[index - 1] for p in recover),
        "sk-positions": np.array(dropped, dtype=np.int64),
        "sk-shares": stack_bytes(split_keys(store["sk-shares"][p], sums)[index - 1] for p in dropped),
    }
    store.update({"stage": "unmasked", "unmask-dropped": dropped, "unmask-recovered": sorted(recovered | set(recover))})
    return reply, {}


@device_task(protocol.task("secagg_prove"))
def secagg_prove(data: DeviceData, arrays: dict, config: dict):
    """After a refusal: the ephemeral private keys of this device's share tokens to the
    ``positions`` that refused them, so that the server opens those tokens as their holders
    do and sees who lies. Each key opens one token only; fewer than the threshold in all of
    a session (more would let a server that asked rebuild this device's secrets)."""
    store = _session(data, config["session"])
    positions = [int(p) for p in arrays["positions"]]
    ephemeral, revealed = store.get("ephemeral", {}), set(store.get("revealed", []))
    if len(set(positions)) != len(positions) or not set(positions) <= set(ephemeral):
        raise ValueError("secure aggregation: asked to prove shares this device did not send")
    if len(revealed | set(positions)) >= store["threshold"]:
        raise ValueError("secure aggregation: asked to prove as many shares as the threshold")
    store["revealed"] = sorted(revealed | set(positions))
    return {
        "scalars": np.array([list(ephemeral[p]) for p in positions], dtype=np.uint8).reshape(
            len(positions), SCALAR_BYTES
        )
    }, {}


for _name in protocol.SECURE_TASKS:
    device_task(protocol.task(protocol.secure_name(_name)))(masked_reply(_name))


# ==================================================================== server side
def keys_problem(reply) -> str | None:
    """Why a ``secagg_setup`` reply's public keys cannot be used (each must parse as a P-384
    public key), or None."""
    f = _flwr()
    try:
        for row in list(reply.arrays["pk1"]) + [reply.arrays["pk2"]]:
            f["bytes_to_public_key"](row_bytes(row, strip=False))
    except Exception:  # whatever the parser raises on bytes that are not a key
        return "a public key that does not parse"
    return None


def unique_keys(replies: list, keys_of) -> list:
    """The replies whose public keys no other reply repeats (a device that copies another's
    keys leaves both out of the session: the server cannot tell which is the copy)."""
    seen: dict[bytes, int] = {}
    for reply in replies:
        for key in keys_of(reply):
            seen[key] = seen.get(key, 0) + 1
    return [reply for reply in replies if all(seen[key] == 1 for key in keys_of(reply))]


def destinations_problem(destinations: np.ndarray, participants: list[int], sender: int) -> str | None:
    """Why a ``secagg_share_keys`` reply does not address exactly every other participant of
    its neighbourhood (``participants``, itself in it) once, or None."""
    if sorted(int(d) for d in destinations) != sorted(p for p in participants if p != sender):
        return "its shares do not address every other participant of its neighbourhood exactly once"
    return None


def forwarded(mail: list[tuple[int, np.ndarray, np.ndarray, bytes]]) -> dict[str, np.ndarray]:
    """The shares the server forwards to one device with its first masked request: the
    senders' positions, their tokens, ephemeral points and the digests of their share
    commitments for this device (none: zero rows)."""
    return {
        "secagg-sources": np.array([source for source, *_ in mail], dtype=np.int64),
        "secagg-ciphertexts": np.stack([row for _, row, _, _ in mail]) if mail else np.zeros((0, 1), np.uint8),
        "secagg-ephemeral": np.array([list(bytes(point)) for _, _, point, _ in mail], dtype=np.uint8).reshape(
            len(mail), POINT_BYTES
        ),
        "secagg-digests": np.array([list(digest) for *_, digest in mail], dtype=np.uint8).reshape(
            len(mail), HASH_BYTES
        ),
    }


def within_ranges(
    total: Mapping[str, np.ndarray],
    ranges: Mapping[str, float],
    devices: int,
    noise: Mapping[str, tuple[float, float]] | None = None,
    threshold: int = 1,
) -> bool:
    """Whether a decoded sum of ``devices`` devices' arrays can be theirs: every coordinate
    within ``devices`` × its public range (and finite), plus, where the devices add noise
    (``noise[name]`` = its variance in grid steps and the levels of the grid, over
    ``threshold`` devices' shares), 12 of the sum's noise standard deviations. Honest
    devices pass (but for a chance below 1e-30 a coordinate); a device that masked anything
    else (a vector beyond its range, or garbage mod R) almost surely does not."""
    noise = noise or {}

    def limit(name: str) -> float:
        variance, levels = noise.get(name, (0.0, HALF_LEVELS))
        grid = float(ranges[name]) / levels
        return devices * float(ranges[name]) + 12 * grid * math.sqrt(variance * devices / threshold)

    return all(
        bool(np.all(np.isfinite(value))) and float(np.max(np.abs(value), initial=0.0)) <= limit(name)
        for name, value in total.items()
    )


def refused_positions(flags: np.ndarray) -> list[int]:
    """The positions a masked reply's ``secagg-refused`` flags (1 at position − 1) name."""
    return [int(p) + 1 for p in np.flatnonzero(np.asarray(flags))]


def refusals_problem(flags: np.ndarray, positions: set[int], sender: int) -> str | None:
    """What is wrong with a device's refusal flags (0 or 1, set only for ``positions``, the
    others whose shares the server forwarded to it), or None."""
    if not np.isin(np.asarray(flags), (0, 1)).all() or not set(refused_positions(flags)) <= positions - {sender}:
        return "refusal flags other than 0/1, or set for itself or for positions outside the session"
    return None


def masked_total(replies: Iterable[Mapping[str, np.ndarray]], names: Iterable[str]) -> dict[str, np.ndarray]:
    """The sum mod R of the masked replies (uint64)."""
    total: dict[str, np.ndarray] = {}
    for arrays in replies:
        for name in names:
            value = np.asarray(arrays[name]).astype(np.uint64)
            total[name] = value if name not in total else total[name] + value
    return {name: value & np.uint64(MODULUS - 1) for name, value in total.items()}


def without(total: Mapping[str, np.ndarray], replies: Iterable[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """A masked total mod R with the masked replies ``replies`` taken out of it."""
    out = {name: np.asarray(value).astype(np.uint64) for name, value in total.items()}
    for arrays in replies:
        for name in out:
            out[name] = out[name] - np.asarray(arrays[name]).astype(np.uint64)  # uint64 wraps mod 2^64, a multiple of R
    return {name: value & np.uint64(MODULUS - 1) for name, value in out.items()}


def unmasked_sum(
    total: Mapping[str, np.ndarray],
    ranges: Mapping[str, float],
    stream: str,
    pk1: Mapping[int, bytes],
    seeds: Mapping[int, bytes],
    sk1: Mapping[int, bytes],
    levels: Mapping[str, float] | None = None,
    neighbours: Mapping[int, set[int]] | None = None,
) -> dict[str, np.ndarray]:
    """The float sum over the participants whose masked vectors arrived.

    ``seeds[p]``: p's seed b_s for every p in the sum (their self masks are removed);
    ``sk1[p]``: the scalar of this sum's mask key of every p the survivors masked with that
    sent no vector (the pairwise masks the survivors put in with p are removed). ``pk1``:
    the survivors' public mask keys of this sum. ``stream``: the session and the sum
    (:func:`stream_name`); ``levels``: each array's grid (default 2^40 per range);
    ``neighbours``: who masked with whom (default: everyone with everyone)."""
    shapes = {name: value.shape for name, value in total.items()}
    size = _flat_size(shapes)
    words = np.concatenate([value.ravel() for value in total.values()]).astype(np.uint64)
    for seed in seeds.values():
        words = words - mask(seed, "self", stream, size)
    for position, scalar in sk1.items():
        key = private_pem(scalar)
        for other, public in pk1.items():
            if neighbours is not None and other not in neighbours[position]:
                continue  # they never masked with each other
            pair = mask(shared_key(key, public), "pair", stream, size)
            words = words - pair if other > position else words + pair  # what `other` added, undone
    decoded = _split(words & np.uint64(MODULUS - 1), shapes)
    levels = levels or {}
    return {name: dequantize(value, ranges[name], levels.get(name, HALF_LEVELS)) for name, value in decoded.items()}
