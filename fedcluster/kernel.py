"""What a device kernel is: the data a device holds (:class:`DeviceData`), and
``@device_task(task)``, which registers a function as the kernel of a declared task
(:data:`KERNELS`). A kernel takes ``(data, arrays, config)`` already parsed by the task's
declaration (float64 arrays of the declared ranks, typed config with defaults) and returns
``(arrays, metrics)``; :func:`fedcluster.device.run_task` runs it. NumPy only."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np

from fedcluster.task import Task


@dataclass
class DeviceData:
    """What one device holds: points (n x d) for k-means algorithms or an edge list
    (m x 2, global node ids) for graph algorithms. ``source`` says where it came from,
    for error messages; ``extra`` holds the device's own settings (``extra["node-config"]``,
    e.g. ``k-prime``) and derived data cached between messages of one process."""

    points: np.ndarray | None = None
    edges: np.ndarray | None = None
    source: str = ""
    extra: dict[Any, Any] = field(default_factory=dict)

    def require_points(self) -> np.ndarray:
        if self.points is None:
            raise ValueError(f"this task needs point data, but the device holds {self.describe()}")
        return self.points

    def require_edges(self) -> np.ndarray:
        if self.edges is None:
            raise ValueError(f"this task needs an edge list, but the device holds {self.describe()}")
        return self.edges

    @property
    def identity(self) -> int:
        """What this device's random choices are seeded from besides the run seed: its
        ``partition-id`` where its node config has one, else its node id (the ClientApp
        sets ``extra["node-id"]``), else 0."""
        partition = self.partition
        return partition if partition is not None else int(self.extra.get("node-id", 0))

    @property
    def partition(self) -> int | None:
        """The ``partition-id`` of the node config, when it is a whole number >= 0."""
        value = (self.extra.get("node-config") or {}).get("partition-id")
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
            return None
        return int(value)

    def describe(self) -> str:
        if self.points is not None:
            return f"{self.points.shape[0]} points of dimension {self.points.shape[1]} ({self.source})"
        if self.edges is not None:
            return f"{self.edges.shape[0]} edges ({self.source})"
        return f"no data ({self.source})"


TaskResult = tuple[dict[str, np.ndarray], dict[str, float]]
TaskFunction = Callable[[DeviceData, dict[str, np.ndarray], dict[str, Any]], TaskResult]

KERNELS: dict[str, TaskFunction] = {}


def device_task(spec: Task) -> Callable[[TaskFunction], TaskFunction]:
    """Register ``fn`` as the device kernel of the declared task ``spec`` (its package's
    ``protocol.TASKS``: :func:`fedcluster.task.named`).

    The registered (and returned) function parses its inputs through the task's
    declaration before ``fn`` sees them, however it is called: ``fn`` may rely on typed,
    defaulted, range-checked config values and float64 arrays of the declared ranks."""
    name = spec.name

    def decorator(fn: TaskFunction) -> TaskFunction:
        @functools.wraps(fn)
        def kernel(data: DeviceData, arrays: Mapping[str, Any], config: Mapping[str, Any]) -> TaskResult:
            parsed_arrays, parsed_config = spec.parse_request(arrays, config)
            return fn(data, parsed_arrays, parsed_config)

        if name in KERNELS and KERNELS[name].__wrapped__ is not fn:
            raise ValueError(f"device task {name!r} registered twice")
        KERNELS[name] = kernel
        return kernel

    return decorator
