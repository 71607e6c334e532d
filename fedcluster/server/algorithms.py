"""Algorithm name (run-config ``algorithm``) -> strategy class."""

from __future__ import annotations

from typing import Any

from fedcluster.config import with_defaults

from .base import FederatedStrategy, FederationError
from .da_ufl import DAUFL
from .feddp_kmeans import FedDPKMeans
from .fedkmeans import FedKMeans
from .fedspectral import FedSpectral, FedSpectralPlus
from .kfed import KFed

STRATEGIES: dict[str, type[FederatedStrategy]] = {
    "fedkmeans": FedKMeans,
    "kfed": KFed,
    "feddp-kmeans": FedDPKMeans,
    "fedspectral": FedSpectral,
    "fedspectral-plus": FedSpectralPlus,
    "da-ufl": DAUFL,
}


def validated_config(run_config: dict[str, Any]) -> dict[str, Any]:
    """The full run config, typed and validated; the algorithm must have a strategy here."""
    return with_defaults(run_config, algorithms=tuple(STRATEGIES))


def strategy_for(name: str) -> type[FederatedStrategy]:
    if name not in STRATEGIES:
        raise FederationError(
            f"algorithm {name!r} is not available in this version; available: {', '.join(STRATEGIES)}"
        )
    return STRATEGIES[name]
