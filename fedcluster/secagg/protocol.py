"""Secure aggregation's tasks: the stages of a session and of each sum, and the masked
variant of every summable task (:func:`secure_variant`). Positions 1..n (never Flower node
ids) name the participants; byte strings (PEM keys, Fernet tokens, Shamir shares) travel as
uint8 rows, right-padded with zero bytes."""

from __future__ import annotations

from fedcluster.checks import Interval
from fedcluster.task import ArrayField, Limit, Param, Task

PUBLIC_KEY_BYTES = 215  # a P-384 public key as PEM SubjectPublicKeyInfo (flwr's public_key_to_bytes)
SEED_BYTES = 32  # a self-mask seed b_s
HASH_BYTES = 32  # a SHA-256 commitment
SCALAR_BYTES = 48  # a P-384 private scalar
POINT_BYTES = 49  # a P-384 public key as a compressed point (a share token's ephemeral key)
TOKEN_OVERHEAD = 256  # a Fernet token of a device's shares is at most this longer than its joined public keys (y)
SHARE_BYTES_MAX = 1024  # one Shamir share of a seed or a mask key, as sent
SESSION = Param("session", int, allowed=Interval(int, 0), doc="the session's number in the run")


def secure_name(name: str) -> str:
    """The masked variant of the summable task ``name``."""
    return f"secure_{name}"


def secure_variant(spec: Task) -> Task:
    """``spec`` with the forwarded shares and the public ranges in its request, and as reply
    its arrays masked: integers in [0, 2^62), the same names and shapes, and no metric."""
    return Task(
        secure_name(spec.name),
        spec.kind,
        f"secure aggregation, masked: {spec.doc}",
        request=spec.request
        + (
            ArrayField(
                "secagg-sources", ("e",), "positions whose encrypted shares follow", integer=True, nonnegative=True
            ),
            ArrayField("secagg-ciphertexts", ("e", "*"), "their Fernet tokens for this device", nonnegative=True),
            ArrayField(
                "secagg-ephemeral",
                ("e", POINT_BYTES),
                "each token's ephemeral public key",
                integer=True,
                nonnegative=True,
            ),
            ArrayField(
                "secagg-digests",
                ("e", HASH_BYTES),
                "each sender's commitments to the shares in its token, hashed",
                integer=True,
                nonnegative=True,
            ),
            ArrayField(
                "secagg-ranges",
                ("a",),
                "public clipping range of each summed reply array, in declared order",
                nonnegative=True,
            ),
            ArrayField(
                "secagg-levels", ("a",), "grid steps per range of each summed array (at most 2^40)", nonnegative=True
            ),
            ArrayField(
                "secagg-noise",
                ("a",),
                "variance of the Skellam noise this device adds to each summed array, per coordinate, in grid steps",
                nonnegative=True,
            ),
            ArrayField(
                "secagg-absent",
                ("g",),
                "positions of the session not in this sum (not masked with)",
                integer=True,
                nonnegative=True,
            ),
        ),
        config=spec.config
        + (
            Param("secagg-session", int, allowed=Interval(int, 0), doc="the session"),
            Param("secagg-sum", int, allowed=Interval(int, 1), doc="the sum's number in the session"),
        ),
        reply=tuple(
            ArrayField(
                f.name,
                f.shape,
                "masked mod 2^62",
                nonnegative=True,
                integer=True,
                optional=f.optional,
                when=f.when,
                dtype="integer",
            )
            for f in spec.reply
        )
        + (
            ArrayField(
                "secagg-refused",
                ("i",),
                "1 at position − 1 for every participant whose forwarded share this "
                "device refused (it did not mask with them; first sum of a session), else 0",
                integer=True,
                nonnegative=True,
                dtype="integer",
            ),
        ),
        metrics=(),
        used_by=spec.used_by,
    )


TASKS = (
    Task(
        "secagg_setup",
        "query",
        "secure aggregation stage 0 (once per session): a mask key pair per sum and an encryption key pair",
        config=(
            SESSION,
            Param("position", int, allowed=Interval(int, 1), doc="this device's position 1..n"),
            Param("participants", int, allowed=Interval(int, 2), doc="n"),
            Param("threshold", int, allowed=Interval(int, 2), doc="Shamir threshold t"),
            Param("sums", int, allowed=Interval(int, 1), doc="secure sums the session serves (one mask seed each)"),
        ),
        reply=(
            ArrayField(
                "pk1",
                ("h", PUBLIC_KEY_BYTES),
                "PEM public keys for the pairwise masks, one per sum",
                nonnegative=True,
                integer=True,
                dtype="byte",
            ),
            ArrayField(
                "pk2",
                (PUBLIC_KEY_BYTES,),
                "PEM public key for the shares' encryption",
                nonnegative=True,
                integer=True,
                dtype="byte",
            ),
        ),
        metrics=(),
    ),
    Task(
        "secagg_share_keys",
        "query",
        "secure aggregation stage 1 (once per session): Shamir shares of a mask seed and of the mask key of every sum, "
        "encrypted per participant under an ephemeral key; commitments to the seeds and shares",
        request=(
            ArrayField("positions", ("c",), integer=True, nonnegative=True),
            ArrayField("pk1", ("c", "y"), nonnegative=True),
            ArrayField("pk2", ("c", "*"), nonnegative=True),
        ),
        config=(SESSION,),
        reply=(
            ArrayField("destinations", ("e",), integer=True, nonnegative=True, dtype="integer"),
            ArrayField("ciphertexts", ("e", "*"), nonnegative=True, dtype="byte"),
            ArrayField(
                "ephemeral",
                ("e", POINT_BYTES),
                "each token's ephemeral public key",
                integer=True,
                nonnegative=True,
                dtype="byte",
            ),
            ArrayField(
                "commitments",
                ("e", "h", 2 * HASH_BYTES),
                "per destination and sum, the hashes of its seed share and mask-key share",
                integer=True,
                nonnegative=True,
                dtype="byte",
            ),
            ArrayField(
                "seed-commitments",
                ("h", HASH_BYTES),
                "the hash of each sum's mask seed",
                integer=True,
                nonnegative=True,
                dtype="byte",
            ),
        ),
        limits=(
            Limit("e", "c", lambda config, sizes: sizes.get("c")),
            Limit(
                "*",
                f"y + {TOKEN_OVERHEAD}",
                lambda config, sizes: sizes["y"] + TOKEN_OVERHEAD if sizes.get("y") else None,
            ),
        ),
        metrics=(),
    ),
    Task(
        "secagg_unmask",
        "query",
        "secure aggregation stage 3 (per sum): its own seed, shares of the seeds of survivors that did not answer and "
        "of the dropped participants' mask keys",
        request=(
            ArrayField(
                "dropped",
                ("v",),
                "positions it masked with that sent no masked reply (the others are in the sum)",
                integer=True,
                nonnegative=True,
            ),
            ArrayField(
                "recover",
                ("w",),
                "positions in the sum whose seed's shares are asked (they did not answer)",
                integer=True,
                nonnegative=True,
            ),
        ),
        config=(SESSION, Param("sum", int, allowed=Interval(int, 1), doc="the sum's number in the session")),
        reply=(
            ArrayField(
                "seed",
                (SEED_BYTES,),
                "this device's own mask seed of the sum",
                integer=True,
                nonnegative=True,
                dtype="byte",
            ),
            ArrayField("b-positions", ("w",), integer=True, nonnegative=True, dtype="integer"),
            ArrayField("b-shares", ("w", "*"), nonnegative=True, dtype="byte"),
            ArrayField("sk-positions", ("v",), integer=True, nonnegative=True, dtype="integer"),
            ArrayField("sk-shares", ("v", "*"), nonnegative=True, dtype="byte"),
        ),
        limits=(Limit("*", f"{SHARE_BYTES_MAX}", lambda config, sizes: SHARE_BYTES_MAX),),
        metrics=(),
    ),
    Task(
        "secagg_prove",
        "query",
        "secure aggregation, after refused shares: the ephemeral keys of its share tokens to the devices that refused "
        "them (the server opens those tokens)",
        request=(ArrayField("positions", ("v",), "positions that refused its share", integer=True, nonnegative=True),),
        config=(SESSION,),
        reply=(
            ArrayField(
                "scalars",
                ("v", SCALAR_BYTES),
                "each token's ephemeral private key",
                integer=True,
                nonnegative=True,
                dtype="byte",
            ),
        ),
        metrics=(),
    ),
)
# the stages whose device state (keys, seed, shares) must outlive the message, besides the masked tasks
STAGES = frozenset(task.name for task in TASKS)
