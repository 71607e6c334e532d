"""The ClientApp: load this device's data once, run the kernel each message names, reply.

Message type ``query.<task>`` or ``train.<task>``; content ``{"arrays": ArrayRecord,
"config": ConfigRecord}``. The reply is ``{"arrays": ArrayRecord, "metrics":
MetricRecord}`` with at least ``num-examples``. A ``query.bundle`` message carries several
tasks (:mod:`fedcluster.protocol`); each part is run and answered on its own. A kernel that fails (bad data, a
dimension mismatch, ...) produces an error reply whose reason says what went wrong; the
server logs it and drops that node's contribution.

Needs only NumPy and flwr: no SciPy, no scikit-learn (except the ``digits`` demo dataset).
"""

from __future__ import annotations

import traceback

from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Error, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

import fedcluster.protocol as protocol
from fedcluster.secagg import device as secagg
from fedcluster.node_data import device_data
from fedcluster.kernel import DeviceData
from fedcluster.device import run_task
from fedcluster.wire import array_fields, array_numpy, record_of

# Flower's error code for "the ClientApp raised an exception" (flwr.common.constant.ErrorCode).
CLIENT_APP_RAISED_EXCEPTION = 2

app = ClientApp()

_DATA_CACHE: dict[tuple, DeviceData] = {}
_CACHE_RUN: dict[str, int] = {}


def _cache_key(context: Context) -> tuple:
    node = context.node_config
    return (
        context.run_id,
        tuple(context.run_config.items()),  # one run's config comes in one order (no sort per message)
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


def _failure(task: str, where: str, exc: Exception) -> str:
    reason = f"task {task!r} failed{where}: {type(exc).__name__}: {exc}"
    if not isinstance(exc, (ValueError, KeyError, OSError)):
        reason += "\n" + traceback.format_exc(limit=4)
    return reason


def _run(
    task: str, data: DeviceData, records: ArrayRecord | None, config: ConfigRecord | None
) -> tuple[ArrayRecord, MetricRecord]:
    """One task on this device's data: request records in, reply records out."""
    arrays = {k: array_numpy(v) for k, v in records.items()} if records is not None else {}
    out_arrays, metrics = run_task(task, data, arrays, dict(config) if config is not None else {})
    record = ArrayRecord()  # item by item: ArrayRecord(dict) copies every Array once more
    for key, value in out_arrays.items():
        record[key] = Array(**array_fields(value))
    return record, MetricRecord(dict(metrics))


def handle(message: Message, context: Context) -> Message:
    task = message.metadata.message_type.split(".", 1)[-1]
    where = ""
    try:
        data = load_data(context)
        data.extra["node-id"] = int(context.node_id)  # seeds a device without a partition-id
        where = f" on {data.describe()}"
        content = message.content
        if task == protocol.BUNDLE:
            return Message(run_bundle(content, data, where), reply_to=message)
        if task in protocol.SECURE_STAGES:  # a session's keys and shares outlive this process: context.state
            saved = context.state.config_records.get(secagg.STATE)
            data.extra[secagg.STATE] = secagg.import_state(dict(saved) if saved is not None else {})
            where = ""  # no point count or data path in a secure-aggregation reply
        arrays, metrics = _run(
            task,
            data,
            record_of(content, protocol.ARRAYS, ArrayRecord),
            record_of(content, protocol.CONFIG, ConfigRecord),
        )
        if task in protocol.SECURE_STAGES:
            context.state[secagg.STATE] = ConfigRecord(secagg.export_state(data.extra[secagg.STATE]))
        return Message(RecordDict({protocol.ARRAYS: arrays, protocol.METRICS: metrics}), reply_to=message)
    except Exception as exc:  # every failure becomes an error reply that says what happened
        return Message(Error(code=CLIENT_APP_RAISED_EXCEPTION, reason=_failure(task, where, exc)), reply_to=message)


def run_bundle(content: RecordDict, data: DeviceData, where: str = "") -> RecordDict:
    """The reply to a bundle (several tasks in one message, :mod:`fedcluster.protocol`):
    ``arrays.i``/``metrics.i`` per part, ``error.i`` for a part that failed; one failing
    part never costs the others."""
    tasks = content.config_records[protocol.BUNDLE]["tasks"]
    if not isinstance(tasks, list) or not all(isinstance(t, str) for t in tasks):
        raise ValueError(f"a bundle's {protocol.BUNDLE!r} record must list task names, got {tasks!r}")
    reply = RecordDict()
    for index, task in enumerate(tasks):
        try:
            arrays, metrics = _run(
                task,
                data,
                record_of(content, protocol.part(protocol.ARRAYS, index), ArrayRecord),
                record_of(content, protocol.part(protocol.CONFIG, index), ConfigRecord),
            )
            reply[protocol.part(protocol.ARRAYS, index)] = arrays
            reply[protocol.part(protocol.METRICS, index)] = metrics
        except Exception as exc:
            reply[protocol.part(protocol.ERROR, index)] = ConfigRecord({"reason": _failure(task, where, exc)})
    return reply


for _task in protocol.TASKS.values():
    getattr(app, _task.kind)(_task.name)(handle)
app.query(protocol.BUNDLE)(handle)
