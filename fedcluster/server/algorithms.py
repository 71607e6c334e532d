"""Algorithm name (run-config ``algorithm``) -> strategy class, from the one registry."""

from __future__ import annotations

import importlib
from typing import Any

import fedcluster.registry as registry
from fedcluster.config import with_defaults

from .base import FederatedStrategy, FederationError


def validated_config(run_config: dict[str, Any]) -> dict[str, Any]:
    """The full run config, typed and validated; the algorithm must be a registered one."""
    return with_defaults(run_config, algorithms=registry.names())


def strategy_for(name: str) -> type[FederatedStrategy]:
    if name not in registry.names():
        raise FederationError(
            f"algorithm {name!r} is not available in this version; available: {', '.join(registry.names())}"
        )
    algorithm = registry.algorithm(name)  # its strategy: the server side, loaded here only
    return getattr(importlib.import_module(f"{algorithm.package}.strategy"), algorithm.strategy)
