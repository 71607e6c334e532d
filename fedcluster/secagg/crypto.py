"""Flower's SecAgg+ primitives (Shamir shares, authenticated encryption, ECDH key pairs), in
ONE place: the only module of the library that imports flwr, and only when a secure sum
runs (their module moved between flwr releases)."""

from __future__ import annotations

from functools import lru_cache
from typing import Any


@lru_cache(maxsize=None)
def flower_crypto() -> dict[str, Any]:
    """Flower's primitives by name."""
    from flwr.common.secure_aggregation.crypto.shamir import combine_shares, create_shares
    from flwr.common.secure_aggregation.crypto.symmetric_encryption import decrypt, encrypt, generate_shared_key
    from flwr.common.secure_aggregation.secaggplus_utils import share_keys_plaintext_concat, share_keys_plaintext_separate

    try:
        from flwr.supercore.primitives.asymmetric import (
            bytes_to_private_key, bytes_to_public_key, generate_key_pairs, private_key_to_bytes, public_key_to_bytes)
    except ImportError:  # flwr 1.41
        from flwr.common.secure_aggregation.crypto.symmetric_encryption import (  # type: ignore[no-redef]
            bytes_to_private_key, bytes_to_public_key, generate_key_pairs, private_key_to_bytes, public_key_to_bytes)
    return dict(locals())
