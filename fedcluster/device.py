"""What a device runs: :func:`run_task`, the one entry point (the ClientApp's and any other
caller's): parse the request through its task, run the task's kernel, check the reply
against the declaration.

A task's kernel is found where the task is declared (:func:`kernel`): the shared tasks'
in :mod:`fedcluster.shared_kernels`, an algorithm's in its package's ``device`` module
(:mod:`fedcluster.registry`), secure aggregation's in :mod:`fedcluster.secagg.device`. Only
those modules are imported: a device running FedKMeans loads FedKMeans' kernels and the
shared ones, nothing of the other algorithms or of any server. NumPy only: a phone-class
device needs neither SciPy nor scikit-learn (tests/unit/test_device_without_scipy.py).
"""

from __future__ import annotations

import importlib
from typing import Any, Mapping

import numpy as np

import fedcluster.protocol as protocol

import fedcluster.registry as registry

import fedcluster.shared_tasks as shared_tasks
from .kernel import KERNELS, DeviceData, TaskFunction, TaskResult

SHARED_KERNELS = "fedcluster.shared_kernels"
SECURE_KERNELS = "fedcluster.secagg.device"


def kernel_module(name: str) -> str:
    """The module that registers task ``name``'s kernel."""
    if name in {task.name for task in shared_tasks.TASKS}:
        return SHARED_KERNELS
    if name in protocol.SECURE_STAGES:
        return SECURE_KERNELS
    owner = registry.task_owners().get(name)
    if owner is None:
        raise KeyError(f"task {name!r} has no kernel on this device")
    return f"{owner}.device"


def kernel(name: str) -> TaskFunction:
    """The kernel of task ``name``, its module imported on first use (a masked task's wraps
    its plain task's kernel, imported first)."""
    if name in protocol.SECURE_STAGES and name.startswith(protocol.secure_name("")):
        # the plain kernel the masked one wraps, loaded first (the masked ones are registered
        # when the secure sum's module loads, before any plain kernel may have been)
        kernel(name[len(protocol.secure_name("")) :])
    if name not in KERNELS:
        importlib.import_module(kernel_module(name))
    if name not in KERNELS:
        raise KeyError(f"task {name!r} has no kernel on this device")
    return KERNELS[name]


def kernels() -> dict[str, TaskFunction]:
    """Every kernel, by task name (imports every kernel module: for tests and docs)."""
    for name in protocol.TASKS:
        kernel(name)
    return KERNELS


def _whole(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value >= 0


def run_task(name: str, data: DeviceData, arrays: Mapping[str, Any], config: Mapping[str, Any]) -> TaskResult:
    """Parse the request through the protocol, run the kernel, check its own reply.

    Raises ``ValueError``/``KeyError`` naming the problem (the ClientApp turns it into an
    error reply)."""
    spec = protocol.task(name)
    run = kernel(name)
    from .scaling import scaled

    data, arrays = scaled(data, arrays)  # a standardized run's requests say how (fedcluster.scaling)
    config = {
        key: protocol.device_seed(value, data.identity) if key in protocol.SEEDS and _whole(value) else value
        for key, value in config.items()
    }
    out_arrays, metrics = run(data, arrays, config)
    metrics = {**metrics, protocol.PARTITION: data.partition if data.partition is not None else -1}
    out_arrays = {key: np.asarray(value) for key, value in out_arrays.items()}
    reason = protocol.check_arrays(spec.reply, out_arrays, {}, spec.parse_config(config))
    if reason:  # a kernel that breaks the protocol is a bug on this device, not the server's problem
        raise RuntimeError(f"task {name!r} produced a reply that breaks the protocol: {reason}")
    return out_arrays, metrics
