"""Flower's SecAgg+ primitives (Shamir shares, authenticated encryption, ECDH key pairs), in
ONE place: the only module of the library that imports flwr, and only when a secure sum
runs (their module moved between flwr releases)."""

from __future__ import annotations

from functools import lru_cache
from typing import Any


@lru_cache(maxsize=None)
def flower_crypto() -> dict[str, Any]:
    """Flower's primitives by name."""
    from flwr.common.secure_aggregation.crypto import shamir, symmetric_encryption
    from flwr.common.secure_aggregation import secaggplus_utils

    try:
        from flwr.supercore.primitives import asymmetric
    except ImportError:  # flwr 1.41
        asymmetric = symmetric_encryption
    return {
        "combine_shares": shamir.combine_shares,
        "create_shares": shamir.create_shares,
        "decrypt": symmetric_encryption.decrypt,
        "encrypt": symmetric_encryption.encrypt,
        "generate_shared_key": symmetric_encryption.generate_shared_key,
        "share_keys_plaintext_concat": secaggplus_utils.share_keys_plaintext_concat,
        "share_keys_plaintext_separate": secaggplus_utils.share_keys_plaintext_separate,
        **{
            name: getattr(asymmetric, name)
            for name in (
                "bytes_to_private_key",
                "bytes_to_public_key",
                "generate_key_pairs",
                "private_key_to_bytes",
                "public_key_to_bytes",
            )
        },
    }
