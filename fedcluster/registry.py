"""The one registry: every algorithm, by the name run-config ``algorithm`` gives it, read
from the declarations of the packages :data:`fedcluster.algorithms.PACKAGES` lists. Each
part of an algorithm is loaded only when asked for (a device validating its run config reads
every algorithm's ``config`` module, and only the ``device`` module of the tasks it runs),
and no module this one loads imports it back."""

from __future__ import annotations

import importlib
from functools import lru_cache
from typing import Any

from .algorithm import Algorithm
from .algorithms import PACKAGES


@lru_cache(maxsize=None)
def algorithms() -> dict[str, Algorithm]:
    """Every declared algorithm by name, in the order of :data:`PACKAGES`."""
    found: dict[str, Algorithm] = {}
    for package in PACKAGES:
        for algorithm in importlib.import_module(f"fedcluster.algorithms.{package}").ALGORITHMS:
            if algorithm.name in found:
                raise RuntimeError(f"algorithm {algorithm.name!r} is declared twice")
            found[algorithm.name] = algorithm
    return found


def names() -> tuple[str, ...]:
    return tuple(algorithms())


def algorithm(name: str) -> Algorithm:
    """The declaration of ``name``; ``KeyError`` names the known ones."""
    try:
        return algorithms()[name]
    except KeyError:
        raise KeyError(f"unknown algorithm {name!r}; available: {', '.join(algorithms())}") from None


def packages() -> tuple[str, ...]:
    """The algorithm packages' module paths, each once (a package may hold two algorithms)."""
    return tuple(dict.fromkeys(a.package for a in algorithms().values()))


@lru_cache(maxsize=None)
def sections() -> tuple[Any, ...]:
    """Every algorithm's run-config section, in declaration order."""
    return tuple(getattr(importlib.import_module(f"{a.package}.config"), a.section) for a in algorithms().values())


@lru_cache(maxsize=None)
def task_owners() -> dict[str, str]:
    """Every algorithm-specific task's name -> the package that declares it (its
    ``protocol.TASKS``); the device kernels of a task are in that package's ``device``."""
    owners: dict[str, str] = {}
    for package in packages():
        for task in importlib.import_module(f"{package}.protocol").TASKS:
            if task.name in owners:
                raise RuntimeError(f"task {task.name!r} is declared by {owners[task.name]} and {package}")
            owners[task.name] = package
    return owners
