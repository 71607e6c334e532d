"""What a secure-aggregation device reveals, checked against what it committed to (pure
functions of both sides; the device stages are in :mod:`fedcluster.secagg`, the server's
use in ``fedcluster/server/secure_sum_checks.py``; the reasoning in docs/security.md).

Commitments, made once per session with the shares (``secagg_share_keys``) and kept by
the server:

- each sum's own mask seed b_s: SHA-256 of a label (session, position, sum) and b_s. The
  seed is 32 uniform bytes, so the hash hides it; a seed revealed at the unmasking (or
  rebuilt from shares) that does not hash to it is not the committed one. A mask key
  needs no hash: its public key pk1_s is its commitment;
- each Shamir share, per holder and sum: SHA-256 of a label (session, dealer, holder, sum,
  kind) and the share. The holder checks its shares against the digest of these hashes
  that the server forwards with them, and refuses them otherwise; so a share a holder
  returns at the unmasking that does not hash to its commitment is the holder's lie.

Shares are encrypted for each holder under a fresh ephemeral key pair (ECIES: ECDH of the
ephemeral private key and the holder's ``pk2``, Flower's HKDF, Fernet), the ephemeral
public key sent beside the token. The ephemeral private key encrypts that one token only,
so its dealer can reveal it to prove the token right to the server — which then opens the
token exactly as the holder does (:func:`opened_share`) — without revealing anything else.

``cryptography`` and flwr are imported on first use: the rest of fedcluster never needs them.
"""

from __future__ import annotations

import hashlib
from typing import Callable, Iterable, Mapping, NamedTuple

from fedcluster.secagg.crypto import flower_crypto
from fedcluster.secagg.protocol import HASH_BYTES, SCALAR_BYTES, SEED_BYTES


def share_width(secret_bytes: int) -> int:
    """The length of one of Flower's Shamir shares of a secret of ``secret_bytes``: a
    4-byte index and 16 bytes per block of the PKCS#7-padded secret."""
    return 4 + 16 * (secret_bytes // 16 + 1)


# ==================================================================== commitments
def seed_commitment(seed: bytes, session: int, position: int, index: int) -> bytes:
    """The hash a device commits to for its mask seed of sum ``index``."""
    return hashlib.sha256(f"fedcluster-secagg/seed/{session}/{position}/{index}/".encode() + bytes(seed)).digest()


def share_hash(share: bytes, session: int, dealer: int, holder: int, index: int, kind: str) -> bytes:
    """The hash ``dealer`` commits to for its ``kind`` ("b" or "sk") share of sum ``index``
    held by ``holder``."""
    label = f"fedcluster-secagg/share/{session}/{dealer}/{holder}/{index}/{kind}/".encode()
    return hashlib.sha256(label + bytes(share)).digest()


def share_hashes(b_shares: list[bytes], sk_shares: list[bytes], session: int, dealer: int, holder: int) -> bytes:
    """Per sum 1..h the hash of the b share, then of the sk share (h × 64 bytes)."""
    return b"".join(
        share_hash(b, session, dealer, holder, i, "b") + share_hash(sk, session, dealer, holder, i, "sk")
        for i, (b, sk) in enumerate(zip(b_shares, sk_shares), start=1)
    )


def share_digest(hashes: bytes, session: int, dealer: int, holder: int) -> bytes:
    """One hash of a holder's share hashes from ``dealer``: what the server forwards to it."""
    return hashlib.sha256(f"fedcluster-secagg/digest/{session}/{dealer}/{holder}/".encode() + bytes(hashes)).digest()


def hash_of(hashes: bytes, index: int, kind: str) -> bytes:
    """The committed hash of the ``kind`` share of sum ``index`` in a row of :func:`share_hashes`."""
    start = (index - 1) * 2 * HASH_BYTES + (HASH_BYTES if kind == "sk" else 0)
    return bytes(hashes[start : start + HASH_BYTES])


# ==================================================================== ephemeral keys (ECIES)
def _ec():
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives import serialization

    return ec, serialization


def ephemeral_pair() -> tuple[bytes, bytes]:
    """A fresh ephemeral key pair: (private scalar, public compressed point)."""
    ec, _ = _ec()
    key = ec.generate_private_key(ec.SECP384R1())
    return key.private_numbers().private_value.to_bytes(SCALAR_BYTES, "big"), _point(key.public_key())


def _point(public) -> bytes:
    _, serialization = _ec()
    return public.public_bytes(serialization.Encoding.X962, serialization.PublicFormat.CompressedPoint)


def _private(scalar: bytes):
    ec, _ = _ec()
    return ec.derive_private_key(int.from_bytes(bytes(scalar), "big"), ec.SECP384R1())


def ephemeral_point(scalar: bytes) -> bytes | None:
    """The public point of a private scalar, or None when it is no valid scalar."""
    try:
        return _point(_private(scalar).public_key())
    except (ValueError, TypeError):
        return None


def sender_key(scalar: bytes, holder_pem: bytes) -> bytes:
    """The Fernet key of a share token: ECDH of the ephemeral scalar and the holder's
    ``pk2`` (PEM), Flower's HKDF (the dealer encrypts with it; the server, given the scalar,
    opens the token with it)."""
    f = flower_crypto()
    return f["generate_shared_key"](_private(scalar), f["bytes_to_public_key"](bytes(holder_pem)))


def holder_key(private_pem: bytes, point: bytes) -> bytes:
    """The same key on the holder's side: ECDH of its ``sk2`` (PEM) and the ephemeral point."""
    ec, _ = _ec()
    f = flower_crypto()
    public = ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP384R1(), bytes(point))
    return f["generate_shared_key"](f["bytes_to_private_key"](bytes(private_pem)), public)


# ==================================================================== opening a share
def opened_share(
    token: bytes, key: bytes, session: int, source: int, holder: int, digest: bytes, sums: int
) -> tuple[list[bytes], list[bytes]]:
    """The b and sk shares (one per sum) in ``source``'s token for ``holder``, checked as a
    holder checks them: the token decrypts under ``key``, is addressed from ``source`` to
    ``holder``, holds ``sums`` shares of each kind of the right width, and their hashes'
    digest is the forwarded ``digest``. Raises ValueError naming what is wrong."""
    f = flower_crypto()
    try:
        plain = f["decrypt"](key, bytes(token))
    except Exception:  # noqa: BLE001 -- whatever the token holds: it does not decrypt
        raise ValueError("the share does not decrypt") from None
    src, dst, b_joined, sk_joined = f["share_keys_plaintext_separate"](plain)
    if (src, dst) != (source, holder):
        raise ValueError("the share is addressed to someone else")
    b_width, sk_width = share_width(SEED_BYTES), share_width(SCALAR_BYTES)
    if len(b_joined) != sums * b_width or len(sk_joined) != sums * sk_width:
        raise ValueError("the share has the wrong length")
    b = [b_joined[i * b_width : (i + 1) * b_width] for i in range(sums)]
    sk = [sk_joined[i * sk_width : (i + 1) * sk_width] for i in range(sums)]
    if share_digest(share_hashes(b, sk, session, source, holder), session, source, holder) != bytes(digest):
        raise ValueError("the share does not match its dealer's commitment")
    return b, sk


def share_fault(
    token: bytes,
    point: bytes,
    scalar: bytes | None,
    holder_pem: bytes,
    session: int,
    source: int,
    holder: int,
    digest: bytes,
    sums: int,
) -> str | None:
    """Settles a refusal: why ``source``'s token for ``holder`` (as the server forwarded it)
    cannot be opened given the ephemeral ``scalar`` its dealer revealed (None: no proof),
    or None when it opens as a holder opens it — then the holder's refusal is false."""
    if scalar is None:
        return "its sender proved nothing"
    if ephemeral_point(scalar) != bytes(point):
        return "the key its sender revealed is not the one the share was encrypted with"
    try:
        opened_share(token, sender_key(scalar, holder_pem), session, source, holder, digest, sums)
    except ValueError as exc:
        return str(exc)
    return None


# ==================================================================== rebuilding a secret
class Rebuilt(NamedTuple):
    """A secret rebuilt from the shares that match their commitments (None when it cannot
    be), the holders whose share did not match (liars), and whether the matching shares
    rebuilt something other than the committed secret (then the dealer dealt them so)."""

    secret: bytes | None
    bad_holders: list[int]
    dealer_lied: bool


def rebuilt(
    shares: Mapping[int, bytes],
    committed: Callable[[int], bytes],
    hashed: Callable[[int, bytes], bytes],
    threshold: int,
    matches: Callable[[bytes], bool],
) -> Rebuilt:
    """``shares``: holder -> the share it returned; ``committed(holder)``: the hash its
    dealer committed to, ``hashed(holder, share)``: the same hash of the returned share;
    ``matches(secret)``: whether a secret is the committed one. Every matching share is
    used: Lagrange interpolation through all of them gives the secret only if they lie on
    one polynomial of degree < threshold, so any inconsistency of the dealer's shows."""
    bad = sorted(h for h, share in shares.items() if hashed(h, share) != committed(h))
    good = [shares[h] for h in sorted(shares) if h not in bad]
    if len(good) < threshold:
        return Rebuilt(None, bad, False)
    try:
        secret = flower_crypto()["combine_shares"](good)
    except Exception:  # noqa: BLE001 -- shares the dealer committed to that combine to nothing
        return Rebuilt(None, bad, True)
    return Rebuilt(secret, bad, False) if matches(secret) else Rebuilt(None, bad, True)


def scalar_matches(scalar: bytes, public_pem: bytes) -> bool:
    """Whether a rebuilt mask-key scalar is the private key of ``public_pem`` (its commitment)."""
    try:
        return flower_crypto()["public_key_to_bytes"](_private(scalar).public_key()) == bytes(public_pem)
    except (ValueError, TypeError):
        return False


def accused(refusals: Mapping[int, Iterable[int]]) -> dict[int, list[int]]:
    """position refused -> the positions that refused its share (``refusals``: position ->
    the positions whose share it refused)."""
    out: dict[int, list[int]] = {}
    for accuser, refused in sorted(refusals.items()):
        for position in refused:
            out.setdefault(int(position), []).append(int(accuser))
    return dict(sorted(out.items()))
