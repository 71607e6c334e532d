"""Registry of device tasks: the vocabulary of the message protocol.

A *task* is what a device computes for one phase of an algorithm. The server sends a
message of type ``query.<task>`` or ``train.<task>``; the ClientApp looks the task up here
and runs it on the device's own data. Task functions take
``(data: DeviceData, arrays: dict[str, np.ndarray], config: dict)`` and return
``(arrays: dict[str, np.ndarray], metrics: dict[str, int | float])``. They raise
``ValueError`` with a clear message on bad input; the ClientApp turns that into an error
reply. This module needs only NumPy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np


@dataclass
class DeviceData:
    """What one device holds: points (n x d) for k-means algorithms or an edge list
    (m x 2, global node ids) for graph algorithms. ``source`` says where it came from,
    for error messages."""

    points: np.ndarray | None = None
    edges: np.ndarray | None = None
    source: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def require_points(self) -> np.ndarray:
        if self.points is None:
            raise ValueError(f"this task needs point data, but the device holds {self.describe()}")
        return self.points

    def require_edges(self) -> np.ndarray:
        if self.edges is None:
            raise ValueError(f"this task needs an edge list, but the device holds {self.describe()}")
        return self.edges

    def describe(self) -> str:
        if self.points is not None:
            return f"{self.points.shape[0]} points of dimension {self.points.shape[1]} ({self.source})"
        if self.edges is not None:
            return f"{self.edges.shape[0]} edges ({self.source})"
        return f"no data ({self.source})"


TaskResult = tuple[dict[str, np.ndarray], dict[str, float]]
TaskFunction = Callable[[DeviceData, dict[str, np.ndarray], dict[str, Any]], TaskResult]

TASKS: dict[str, TaskFunction] = {}


def device_task(name: str) -> Callable[[TaskFunction], TaskFunction]:
    """Register ``fn`` as the device kernel for task ``name`` (a Python identifier)."""
    if not name.isidentifier():
        raise ValueError(f"task name must be a Python identifier, got {name!r}")

    def decorator(fn: TaskFunction) -> TaskFunction:
        if name in TASKS and TASKS[name] is not fn:
            raise ValueError(f"device task {name!r} registered twice")
        TASKS[name] = fn
        return fn

    return decorator
