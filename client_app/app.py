"""The ClientApp: load this device's data once, run the kernel each message names, reply.

Message type ``query.<task>`` or ``train.<task>``; content ``{"arrays": ArrayRecord,
"config": ConfigRecord}``. The reply is ``{"arrays": ArrayRecord, "metrics":
MetricRecord}`` with at least ``num-examples``. A kernel that fails (bad data, a
dimension mismatch, ...) produces an error reply whose reason says what went wrong; the
server logs it and drops that node's contribution.

Needs only NumPy and flwr: no SciPy, no scikit-learn (except the ``digits`` demo dataset).
"""

from __future__ import annotations

import traceback

from flwr.app import Array, ArrayRecord, Context, Error, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedcluster import protocol
from fedcluster.datasets import device_data
from fedcluster.device import DeviceData, run_task
from fedcluster.wire import array_fields, array_numpy

# Flower's error code for "the ClientApp raised an exception" (flwr.common.constant.ErrorCode).
CLIENT_APP_RAISED_EXCEPTION = 2

app = ClientApp()

_DATA_CACHE: dict[tuple, DeviceData] = {}
_CACHE_RUN: dict[str, int] = {}


def _cache_key(context: Context) -> tuple:
    node = context.node_config
    return (
        context.run_id,
        tuple(sorted(context.run_config.items())),
        str(node.get("data-path", "")),
        node.get("partition-id"),
        node.get("num-partitions"),
    )


def load_data(context: Context) -> DeviceData:
    """This device's data, loaded once per run and process (simulation reuses processes
    across nodes, hence the partition in the key)."""
    key = _cache_key(context)
    if _CACHE_RUN.get("run") != context.run_id:
        _DATA_CACHE.clear()  # keep only the current run's devices
        _CACHE_RUN["run"] = context.run_id
    if key not in _DATA_CACHE:
        from fedcluster.config import with_defaults

        data = device_data(with_defaults(dict(context.run_config)), dict(context.node_config))
        data.extra["node-config"] = dict(context.node_config)  # per-device settings (e.g. k-prime)
        _DATA_CACHE[key] = data
    return _DATA_CACHE[key]


def handle(message: Message, context: Context) -> Message:
    task = message.metadata.message_type.split(".", 1)[-1]
    where = ""
    try:
        data = load_data(context)
        where = f" on {data.describe()}"
        content = message.content
        records, configs = content.array_records, content.config_records
        arrays = {k: array_numpy(v) for k, v in records[protocol.ARRAYS].items()} if protocol.ARRAYS in records else {}
        config = dict(configs[protocol.CONFIG]) if protocol.CONFIG in configs else {}
        out_arrays, metrics = run_task(task, data, arrays, config)
        reply = RecordDict(
            {
                protocol.ARRAYS: ArrayRecord({k: Array(**array_fields(v)) for k, v in out_arrays.items()}),
                protocol.METRICS: MetricRecord(dict(metrics)),
            }
        )
        return Message(reply, reply_to=message)
    except Exception as exc:  # every failure becomes an error reply that says what happened
        reason = f"task {task!r} failed{where}: {type(exc).__name__}: {exc}"
        if not isinstance(exc, (ValueError, KeyError, OSError)):
            reason += "\n" + traceback.format_exc(limit=4)
        return Message(Error(code=CLIENT_APP_RAISED_EXCEPTION, reason=reason), reply_to=message)


for _task in protocol.TASKS.values():
    getattr(app, _task.kind)(_task.name)(handle)
