"""Algorithm name (run-config ``algorithm``) -> strategy class."""

from __future__ import annotations

from .base import FederatedStrategy, FederationError
from .fedkmeans import FedKMeans

STRATEGIES: dict[str, type[FederatedStrategy]] = {
    "fedkmeans": FedKMeans,
}


def strategy_for(name: str) -> type[FederatedStrategy]:
    if name not in STRATEGIES:
        raise FederationError(
            f"algorithm {name!r} is not available in this version; available: {', '.join(STRATEGIES)}"
        )
    return STRATEGIES[name]
