"""How the wire protocol is declared: a :class:`Task` of request and reply arrays and config
parameters, and the checks a declaration gives. The tasks themselves are declared where
their kernels are (the shared ones in :mod:`fedcluster.shared_tasks`, each algorithm's in
its package's ``protocol``, secure aggregation's in :mod:`fedcluster.secagg.protocol`);
:mod:`fedcluster.protocol` assembles them into the one table.

A phase of an algorithm is one broadcast of a :class:`Task`: the server sends each node a
Flower Message of type ``<kind>.<name>`` with the records ``arrays`` (the request's
arrays) and ``config`` (its scalar parameters); the device runs the kernel registered for
``name`` (:mod:`fedcluster.device`) and replies with the records ``arrays`` and
``metrics`` (at least ``num-examples``). A declaration is the whole of a task:

- the device parses every request through :meth:`Task.parse_request` (arrays as float64
  of the declared rank and finite; config values typed, defaulted and range-checked), so
  a kernel sees only valid, typed inputs;
- the server builds its reply checks from :meth:`Task.check_reply` (declared arrays
  present, real numbers, the declared shapes with symbols such as ``k`` and ``d`` bound to
  the run's sizes, finite, non-negative where declared);
- the README's task table is :func:`markdown_table` (a test checks they agree).

Shapes are tuples of ints and symbols. A symbol the server binds (``k`` clusters, ``d``
the federation's dimension, ``m`` candidates, ``n`` graph nodes, ``b`` block columns,
``s`` server points, ``r`` projected dimension, ``p`` packed triangle size, ``u`` SOM units
per device, ``q`` bins, ``i`` participants of a secure-aggregation session, ``y`` bytes of
joined public keys) must match the bound value, as must a symbol the request's arrays bind
(a reply's ``k`` is its request's centers'); an unbound symbol (``c``, a count the device
chooses) must agree between the arrays of one reply and stay within its task's
:class:`Limit` (``c`` ≤ the request's ``k``; :data:`FREE_MAX` where none is declared).
``*`` is any size (within the task's limit for ``*``). Every reply array also
declares what its dtype may be (``real``, ``integer`` or ``byte``): a reply is refused by
these sizes from its arrays' metadata alone, before any of its data is decoded
(:meth:`Task.check_layout`).

Seeds and order: a request's ``seed`` (and ``previous-seed``) is the same for every node
of a phase; each device mixes it with its own identity (:func:`device_seed`: its
``partition-id`` where its node config has one, else its Flower node id), so a device's
random choices follow from the run seed and its partition on every engine. Every reply
also carries the metric ``partition`` (the ``partition-id``, or -1): the server orders
nodes by it for sampling and sums, since Flower's node ids are random per run.

Standardized runs (run-config ``standardize``): every request on point data also carries the
arrays ``scale-shift`` and ``scale-factor`` (d,), and the device runs the task on
``(x − shift) / factor`` of its points (:mod:`fedcluster.scaling`); replies are in those units.

Bundles: when one round trip asks a node for several tasks (the start-up queries a server
sends together), they travel as ONE message of type ``query.bundle``: part ``i`` is the
records ``arrays.i`` and ``config.i`` of task ``config-record "bundle"["tasks"][i]``; the
reply holds ``arrays.i`` and ``metrics.i`` per part, or ``error.i`` (``{"reason": ...}``)
for a part that failed. Each part is checked as its own reply. (Flower's simulation engine
scans every stored message for every node it serves, and a deployment starts one
ClientApp process per message: one message per node per round trip costs least.)

NumPy only: a device imports this.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np

import fedcluster.checks as checks
from .checks import Interval, StrOptions

# Record names and the metric every reply carries.
ARRAYS = "arrays"
CONFIG = "config"
METRICS = "metrics"
BUNDLE = "bundle"  # the task name of a bundle message and its config record (module docstring)
ERROR = "error"
NUM_EXAMPLES = "num-examples"
DIM = "dim"
PARTITION = "partition"  # every reply: the node's partition-id, or -1 (module docstring)
SEEDS = ("seed", "previous-seed")  # request config mixed with the device's identity


def device_seed(seed: int, identity: int) -> int:
    """A device's own seed: the phase's ``seed`` mixed with its identity (partition or
    node id; both non-negative)."""
    return int(np.random.default_rng([int(seed), int(identity)]).integers(2**31))


def partition_of(metrics: Mapping[str, Any]) -> int | None:
    """The ``partition`` a reply states, when it is a whole number in [0, 2**53); else None
    (a node that states none, or nonsense, is ordered by its node id)."""
    value = metrics.get(PARTITION)
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        return None
    if not np.isfinite(value) or value < 0 or value >= 2**53 or value != int(value):
        return None
    return int(value)


def partition_problem(metrics: Mapping[str, Any]) -> str | None:
    """Why a reply's ``partition`` metric is none an honest device sends (its node config's
    ``partition-id``, a whole number >= 0, or -1), or None (also when it states none)."""
    if PARTITION not in metrics:
        return None
    value = metrics[PARTITION]
    whole = isinstance(value, (int, np.integer)) and not isinstance(value, bool)
    if (whole and value >= -1) or partition_of(metrics) is not None:
        return None
    return f"metric {PARTITION!r} must be the node's partition-id (a whole number >= 0) or -1, got {str(value)[:40]}"


REQUIRED = object()  # a Param without a default


@dataclass(frozen=True)
class Param:
    """A scalar in a request's ``config`` record.

    ``kind`` is ``int``, ``float``, ``str`` or ``bool``; ``default`` is ``REQUIRED`` or a
    value (``None``: may be absent, the kernel decides); ``allowed`` what values it allows
    (:class:`fedcluster.checks.Interval` / ``StrOptions``, as a run-config key declares them).
    """

    name: str
    kind: type
    default: Any = REQUIRED
    allowed: Interval | StrOptions | None = None
    doc: str = ""

    def parse(self, config: Mapping[str, Any]) -> Any:
        if self.name not in config:
            if self.default is REQUIRED:
                raise ValueError(f"the request has no config {self.name!r} ({self.doc})")
            return self.default
        return checks.check(f"config {self.name!r}", config[self.name], self.kind, self.allowed)

    def describe(self) -> str:
        text = f"`{self.name}` {self.kind.__name__}"
        if isinstance(self.allowed, StrOptions):
            text += " " + "/".join(self.allowed.options)
        if self.default is REQUIRED:
            text += " (required)"
        elif self.default is not None:
            text += f" = {self.default}"
        return text


@dataclass(frozen=True)
class ArrayField:
    """An array in a request or a reply.

    ``shape`` holds ints, symbols (see the module docstring) and ``"*"``. ``integer``
    arrays hold whole numbers (labels); ``nonnegative`` ones no negative entry.
    ``when = (key, value)``: present only when the request's config has that value.
    ``role`` says what the array means for the bounds a device's declarations put on its
    replies (:mod:`fedcluster.bounds`): ``count``, ``sum``, ``scatter`` (per cluster and
    coordinate, the sum of squared deviations of its points from their mean), ``mean``,
    ``cost``, ``box-min``, ``box-max``, ``moment-sum``, ``moment-scatter`` (the same over all
    the device's points); ``of`` names the request array a ``cost`` is of, or whose centers a
    ``mean`` may start from. Second moments travel about a mean, never as sums of squared
    coordinates: those are the square of the data's offset from the origin plus rounding.
    ``dtype``: what a reply array's dtype may be (:data:`DTYPES`).
    """

    name: str
    shape: tuple[int | str, ...]
    doc: str = ""
    nonnegative: bool = False
    integer: bool = False
    optional: bool = False
    when: tuple[str, str] | None = None
    role: str = ""
    of: str = ""
    dtype: str = "real"

    def describe(self) -> str:
        dims = ", ".join(str(s) for s in self.shape)
        text = f"`{self.name}` ({dims}{',' if len(self.shape) == 1 else ''})"
        if self.dtype != "real":
            text += f" {self.dtype}"
        if self.when:
            text += f" if {self.when[0]}={self.when[1]}"
        elif self.optional:
            text += " optional"
        return text


def _bind(shape: tuple, got: tuple, sizes: dict[str, int]) -> str | None:
    """Check ``got`` against the symbolic ``shape``, binding free symbols in ``sizes``."""
    if len(got) != len(shape):
        return f"has {len(got)} dimensions, expected {len(shape)}"
    for expected, actual in zip(shape, got):
        if expected == "*":
            continue
        if isinstance(expected, int):
            if actual != expected:
                return f"has shape {got}, expected {shape}"
        elif expected in sizes and sizes[expected] is not None:
            if actual != sizes[expected]:
                return f"has shape {got}, expected {shape} with {expected}={sizes[expected]}"
        else:
            sizes[expected] = actual
    return None


def check_arrays(
    fields: tuple[ArrayField, ...],
    arrays: Mapping[str, np.ndarray],
    sizes: Mapping[str, int | None],
    config: Mapping[str, Any] | None = None,
) -> str | None:
    """The reason ``arrays`` do not match ``fields``, or None. Pure: usable on either side."""
    bound = dict(sizes)
    for spec in fields:
        if spec.when is not None and (config or {}).get(spec.when[0]) != spec.when[1]:
            continue
        if spec.name not in arrays:
            if spec.optional:
                continue
            return f"misses array {spec.name!r}"
        value = arrays[spec.name]
        if not isinstance(value, np.ndarray) or value.dtype.kind not in "biuf":
            kind = getattr(getattr(value, "dtype", None), "kind", type(value).__name__)
            return f"array {spec.name!r} is not of real numbers (dtype kind {kind!r})"
        reason = _bind(spec.shape, value.shape, bound)
        if reason:
            return f"array {spec.name!r} {reason}"
        if value.dtype.kind == "f" and not np.all(np.isfinite(value)):
            return f"array {spec.name!r} contains NaN or inf"
        if spec.nonnegative and value.size and np.min(value) < 0:
            return f"array {spec.name!r} has negative entries"
        if spec.integer and value.dtype.kind == "f" and not np.all(value == np.round(value)):
            return f"array {spec.name!r} must hold whole numbers"
    return None


# What a reply array's dtype may be (ArrayField.dtype): NumPy dtype kinds, and the smallest and the largest
# item in bytes. ``real`` is float64 alone, what every device sends and every server computation takes (a
# float32, an integer or a bool array there is no honest device's: refused by its metadata).
DTYPES: dict[str, tuple[str, int, int]] = {"real": ("f", 8, 8), "integer": ("iu", 1, 8), "byte": ("u", 1, 1)}
# The most a reply dimension the device chooses may be when its task declares no limit for it.
FREE_MAX = 1_000_000


@dataclass(frozen=True)
class Limit:
    """The most a reply symbol the device chooses (``c``, ``u``, ``e``, ... or ``*``) may be:
    ``at_most(config, sizes)`` of the request's config and the sizes bound so far (the
    server's and the request arrays'); ``doc`` says it in the task table."""

    symbol: str
    doc: str
    at_most: Callable[[Mapping[str, Any], Mapping[str, int | None]], int | None]


def _dtype_problem(field: ArrayField, dtype: np.dtype) -> str | None:
    kinds, smallest, largest = DTYPES[field.dtype]
    if dtype.kind not in kinds or not smallest <= dtype.itemsize <= largest or dtype.shape != ():
        size = f"{largest} byte{'s' if largest > 1 else ''}" if smallest == largest else f"at most {largest} bytes"
        return (
            f"array {field.name!r} has dtype {dtype}, the protocol declares {field.dtype} (kind {'/'.join(kinds)}, "
            f"{size} an item)"
        )
    return None


def _declared(fields: tuple[ArrayField, ...], config: Mapping[str, Any]) -> dict[str, ArrayField]:
    return {f.name: f for f in fields if f.when is None or config.get(f.when[0]) == f.when[1]}


def undeclared_array(fields: tuple[ArrayField, ...], names, config: Mapping[str, Any] | None = None) -> str | None:
    """The reason ``names`` hold an array ``fields`` do not declare for this ``config``, or None."""
    declared = _declared(fields, config or {})
    for name in names:
        if name not in declared:
            return (
                f"holds undeclared array {str(name)[:80]!r} (the reply declares "
                f"{', '.join(map(repr, declared)) or 'none'})"
            )
    return None


def check_layout(
    fields: tuple[ArrayField, ...],
    layouts: Mapping[str, tuple[np.dtype, tuple[int, ...]]],
    sizes: Mapping[str, int | None],
    config: Mapping[str, Any] | None = None,
    limits: tuple[Limit, ...] = (),
) -> str | None:
    """The reason arrays of these ``(dtype, shape)`` (as their metadata says, before any is
    decoded) do not match ``fields``, or None: only declared names, declared dtypes and
    shapes, symbols bound in ``sizes`` equal to them, the others within their limits."""
    config = config or {}
    declared = _declared(fields, config)
    reason = undeclared_array(fields, layouts, config)
    if reason:
        return reason
    bound = dict(sizes)
    for name, (dtype, shape) in layouts.items():
        field = declared[name]
        reason = _dtype_problem(field, dtype) or _bind(field.shape, shape, bound)
        if reason:
            return reason if reason.startswith("array") else f"array {name!r} {reason}"
    known = {key: value for key, value in sizes.items() if value is not None}
    most = {limit.symbol: limit for limit in limits}
    for name, (_, shape) in layouts.items():
        for symbol, actual in zip(declared[name].shape, shape):
            if isinstance(symbol, int) or symbol in known:
                continue
            limit = most.get(symbol)
            at_most = limit.at_most(config, known) if limit is not None else None
            at_most = FREE_MAX if at_most is None else min(int(at_most), FREE_MAX)
            if actual > at_most:
                rule = f" ({symbol} ≤ {limit.doc})" if limit is not None else ""
                return (
                    f"array {name!r} has shape {tuple(shape)}: {symbol}={actual} is above the most the protocol "
                    f"allows, {at_most}{rule}"
                )
    return None


@dataclass(frozen=True)
class Task:
    """One phase's exchange: what the server sends and what a valid reply holds."""

    name: str
    kind: str  # "query" or "train" (Flower's message-type prefixes)
    doc: str
    request: tuple[ArrayField, ...] = ()
    config: tuple[Param, ...] = ()
    reply: tuple[ArrayField, ...] = ()
    metrics: tuple[str, ...] = (NUM_EXAMPLES,)
    used_by: tuple[str, ...] = field(default=())  # the algorithms that ask for it (the assembled table fills it in)
    summable: bool = False  # the server's step needs only the sum of the replies: secure aggregation can carry it
    counts: str = ""  # the reply's "count" array adds up to the device's points: "all" or "at-most"
    limits: tuple[Limit, ...] = ()  # the most each reply symbol the device chooses may be

    @property
    def message_type(self) -> str:
        return f"{self.kind}.{self.name}"

    def parse_config(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """The request's config typed, defaulted and range-checked."""
        unknown = set(config) - {p.name for p in self.config}
        if unknown:
            raise ValueError(f"task {self.name!r} got unknown config {', '.join(sorted(unknown))}")
        return {p.name: p.parse(config) for p in self.config}

    def parse_request(
        self, arrays: Mapping[str, Any], config: Mapping[str, Any]
    ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """Typed, defaulted, checked inputs of a kernel; ``ValueError`` names what is wrong."""
        typed = self.parse_config(config)
        out: dict[str, np.ndarray] = {}
        for spec in self.request:
            if spec.name not in arrays:
                if spec.optional or (spec.when and typed.get(spec.when[0]) != spec.when[1]):
                    continue
                raise ValueError(f"task {self.name!r} needs array {spec.name!r} {spec.shape}")
            value = np.asarray(arrays[spec.name])
            if value.dtype.kind not in "biuf":
                raise ValueError(f"array {spec.name!r} must hold real numbers, got dtype {value.dtype}")
            out[spec.name] = value.astype(np.float64, copy=False)
        reason = check_arrays(self.request, out, {}, typed)
        if reason:
            raise ValueError(f"task {self.name!r}: {reason}")
        return out, typed

    def check_reply(
        self,
        arrays: Mapping[str, np.ndarray],
        metrics: Mapping[str, Any],
        sizes: Mapping[str, int | None],
        config: Mapping[str, Any] | None = None,
    ) -> str | None:
        """The reason a reply is invalid, or None (server side; ``sizes`` binds symbols)."""
        reason = partition_problem(metrics)
        if reason:
            return reason
        for key in self.metrics:
            if key not in metrics:
                return f"reply misses metric {key!r}"
            value = metrics[key]
            if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
                return f"metric {key!r} is not a number: {value!r}"
            if not np.isfinite(value) or value < 0:
                return f"metric {key!r} must be finite and >= 0, got {value!r}"
        return check_arrays(self.reply, arrays, sizes, config)

    def request_sizes(self, arrays: Mapping[str, Any], sizes: Mapping[str, int | None]) -> dict[str, int | None]:
        """``sizes`` with the symbols the request's ``arrays`` bind (a reply of this request
        has the same ``k`` as its centers, ...); those in ``sizes`` win."""
        bound: dict[str, int | None] = {}
        for spec in self.request:
            if spec.name in arrays:
                _bind(spec.shape, tuple(np.shape(arrays[spec.name])), bound)
        return {
            **bound,
            **{key: value for key, value in sizes.items() if value is not None},
            **{key: None for key, value in sizes.items() if value is None and key not in bound},
        }

    def check_layout(
        self,
        layouts: Mapping[str, tuple[np.dtype, tuple[int, ...]]],
        sizes: Mapping[str, int | None],
        config: Mapping[str, Any] | None = None,
    ) -> str | None:
        """The reason a reply's arrays of these ``(dtype, shape)`` are refused before any is
        decoded (:func:`check_layout` with this task's reply and limits), or None."""
        return check_layout(self.reply, layouts, sizes, config, self.limits)


# Parameters several tasks share.
CENTERS = ArrayField("centers", ("k", "d"), "the current global centers")
LOCAL_CENTERS = (
    ArrayField("centers", ("c", "d"), "a device's local centers", role="mean"),
    ArrayField("counts", ("c",), "points in each", nonnegative=True, role="count"),
)
SEED = Param("seed", int, 0, doc="the node's own seed for its random choices")


def part(record: str, index: int) -> str:
    """The name of record ``record`` (``arrays``, ``config``, ``metrics``, ``error``) of part
    ``index`` of a bundle."""
    return f"{record}.{index}"


def named(tasks: tuple[Task, ...], name: str) -> Task:
    """The task ``name`` of a declaration tuple (a package's ``TASKS``); KeyError if absent."""
    for spec in tasks:
        if spec.name == name:
            return spec
    raise KeyError(f"task {name!r} is not declared here")
