"""The wire protocol: every task a server can ask of a device, in one table.

How a task is declared, and what a declaration checks, is :mod:`fedcluster.task`; the tasks
are declared where their kernels are: the shared ones in :mod:`fedcluster.shared_tasks`, each
algorithm's in its package's ``protocol`` (:mod:`fedcluster.registry`), secure aggregation's
in :mod:`fedcluster.secagg.protocol`, with the masked variant of every summable task. A
device parses every request through its task (:meth:`Task.parse_request`); the server checks
every reply against it (:meth:`Task.check_reply`, :meth:`Task.check_layout`); the reference's
table is :func:`markdown_table` (a test checks they agree). NumPy only: a device imports this.
"""

from __future__ import annotations

import importlib
from dataclasses import replace

import fedcluster.registry as registry

import fedcluster.shared_tasks as shared_tasks
from .secagg import protocol as secure
from .task import (  # noqa: F401 (the names every caller of the protocol uses)
    ARRAYS,
    BUNDLE,
    CONFIG,
    DIM,
    ERROR,
    FREE_MAX,
    METRICS,
    NUM_EXAMPLES,
    PARTITION,
    SEEDS,
    ArrayField,
    Limit,
    Param,
    Task,
    check_arrays,
    device_seed,
    part,
    partition_of,
    partition_problem,
    undeclared_array,
)

secure_name = secure.secure_name


def _assemble() -> dict[str, Task]:
    """Every task by name: the shared ones, each algorithm's, secure aggregation's stages and
    the masked variant of each summable task; ``used_by`` from the algorithms' declarations."""
    tasks = {task.name: task for task in shared_tasks.TASKS}
    users: dict[str, list[str]] = {}
    for algorithm in registry.algorithms().values():
        for name in algorithm.uses:
            users.setdefault(name, []).append(algorithm.name)
    for package in registry.packages():
        for task in importlib.import_module(f"{package}.protocol").TASKS:
            tasks[task.name] = task
    for name, task in list(tasks.items()):
        tasks[name] = replace(task, used_by=tuple(dict.fromkeys(task.used_by + tuple(users.get(name, ())))))
    securing = tuple(a.name for a in registry.algorithms().values() if a.secure)
    for task in secure.TASKS:
        tasks[task.name] = replace(task, used_by=securing)
    for task in [t for t in tasks.values() if t.summable]:
        tasks[secure_name(task.name)] = secure.secure_variant(task)
    return tasks


TASKS: dict[str, Task] = _assemble()
SECURE_TASKS = tuple(name for name, task in TASKS.items() if task.summable)  # their server step needs only the sum
# the tasks whose device state (keys, seed, shares) must outlive the message
SECURE_STAGES = frozenset(secure.STAGES | {secure_name(n) for n in SECURE_TASKS})


def task(name: str) -> Task:
    """The declared task ``name``; ``KeyError`` names the known ones."""
    try:
        return TASKS[name]
    except KeyError:
        raise KeyError(f"unknown task {name!r}; the protocol declares {', '.join(TASKS)}") from None


def markdown_table() -> str:
    """The README's task table, generated from :data:`TASKS`."""
    lines = [
        "| message type | what the device computes | request arrays | request config | reply arrays | used by |",
        "|---|---|---|---|---|---|",
    ]
    for spec in TASKS.values():
        lines.append(
            "| `{}` | {} | {} | {} | {} | {} |".format(
                spec.message_type,
                spec.doc,
                ", ".join(a.describe() for a in spec.request) or "—",
                ", ".join(p.describe() for p in spec.config) or "—",
                ", ".join(a.describe() for a in spec.reply)
                + ("; metrics " + ", ".join(f"`{m}`" for m in spec.metrics) if spec.metrics else "")
                + "".join(f"; {limit.symbol} ≤ {limit.doc}" for limit in spec.limits),
                ", ".join(spec.used_by),
            )
        )
    return "\n".join(lines)


if __name__ == "__main__":  # python -m fedcluster.protocol [docs/reference.md]: print or rewrite the table
    import sys

    if len(sys.argv) > 1:
        from .config import write_generated_block

        write_generated_block(sys.argv[1], "protocol", markdown_table())
    else:
        print(markdown_table())
