"""The device side: every kernel a device can be asked to run, by task name, and the one
entry point a device runs them through.

A kernel is registered with ``@device_task("<name>")`` for a task the protocol declares
(:mod:`fedcluster.protocol`); it takes ``(data, arrays, config)`` already parsed by the
task's declaration (float64 arrays of the declared ranks, typed config with defaults) and
returns ``(arrays, metrics)``. :func:`run_task` is what the ClientApp (and any other
caller) uses: parse, run, check the reply against the declaration. The algorithms' modules
register their kernels when they are imported; :func:`kernels` imports them all. NumPy only:
a phone-class device needs neither SciPy nor scikit-learn
(tests/unit/test_device_without_scipy.py checks it).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np

from . import protocol


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


def kernels() -> dict[str, TaskFunction]:
    """Every registered kernel by task name (importing the algorithms' modules registers them)."""
    from . import da_ufl, feddp_kmeans, fedkmeans, fedspectral, kfed, point_tasks, secagg  # noqa: F401

    return KERNELS


def device_task(name: str) -> Callable[[TaskFunction], TaskFunction]:
    """Register ``fn`` as the device kernel of the declared task ``name``.

    The registered (and returned) function parses its inputs through the task's
    declaration before ``fn`` sees them, however it is called: ``fn`` may rely on typed,
    defaulted, range-checked config values and float64 arrays of the declared ranks."""
    spec = protocol.task(name)  # KeyError for a task the protocol does not declare

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


def _whole(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value >= 0


def run_task(name: str, data: DeviceData, arrays: Mapping[str, Any], config: Mapping[str, Any]) -> TaskResult:
    """Parse the request through the protocol, run the kernel, check its own reply.

    Raises ``ValueError``/``KeyError`` naming the problem (the ClientApp turns it into an
    error reply)."""
    spec = protocol.task(name)
    if name not in kernels():
        raise KeyError(f"task {name!r} has no kernel on this device")
    from .scaling import scaled

    data, arrays = scaled(data, arrays)  # a standardized run's requests say how (fedcluster.scaling)
    config = {key: protocol.device_seed(value, data.identity) if key in protocol.SEEDS and _whole(value) else value
              for key, value in config.items()}
    out_arrays, metrics = KERNELS[name](data, arrays, config)
    metrics = {**metrics, protocol.PARTITION: data.partition if data.partition is not None else -1}
    out_arrays = {key: np.asarray(value) for key, value in out_arrays.items()}
    reason = protocol.check_arrays(spec.reply, out_arrays, {}, spec.parse_config(config))
    if reason:  # a kernel that breaks the protocol is a bug on this device, not the server's problem
        raise RuntimeError(f"task {name!r} produced a reply that breaks the protocol: {reason}")
    return out_arrays, metrics


@device_task("identify")
def identify(data: DeviceData, arrays: Mapping[str, np.ndarray], config: Mapping[str, Any]) -> TaskResult:
    """Nothing of the data: :func:`run_task` adds the partition every reply states."""
    return {}, {}
