"""The wire protocol: every task a server can ask of a device, declared once.

A phase of an algorithm is one broadcast of a :class:`Task`: the server sends each node a
Flower Message of type ``<kind>.<name>`` with the records ``arrays`` (the request's
arrays) and ``config`` (its scalar parameters); the device runs the kernel registered for
``name`` (:mod:`fedcluster.device`) and replies with the records ``arrays`` and
``metrics`` (at least ``num-examples``). This module is the whole protocol:

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

from . import checks
from .checks import Interval, StrOptions
from .privacy.clipping import DATA_POINT, LEVELS

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
NODE_K_PRIME_MAX = 10_000  # k-FED: the most local clusters a node's own k-prime may ask for


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
        return f"array {field.name!r} has dtype {dtype}, the protocol declares {field.dtype} (kind {'/'.join(kinds)}, {size} an item)"
    return None


def _declared(fields: tuple[ArrayField, ...], config: Mapping[str, Any]) -> dict[str, ArrayField]:
    return {f.name: f for f in fields if f.when is None or config.get(f.when[0]) == f.when[1]}


def undeclared_array(fields: tuple[ArrayField, ...], names, config: Mapping[str, Any] | None = None) -> str | None:
    """The reason ``names`` hold an array ``fields`` do not declare for this ``config``, or None."""
    declared = _declared(fields, config or {})
    for name in names:
        if name not in declared:
            return f"holds undeclared array {str(name)[:80]!r} (the reply declares {', '.join(map(repr, declared)) or 'none'})"
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
                return f"array {name!r} has shape {tuple(shape)}: {symbol}={actual} is above the most the protocol allows, {at_most}{rule}"
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
    used_by: tuple[str, ...] = field(default=())
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
        return {**bound, **{key: value for key, value in sizes.items() if value is not None},
                **{key: None for key, value in sizes.items() if value is None and key not in bound}}

    def check_layout(self, layouts: Mapping[str, tuple[np.dtype, tuple[int, ...]]], sizes: Mapping[str, int | None],
                     config: Mapping[str, Any] | None = None) -> str | None:
        """The reason a reply's arrays of these ``(dtype, shape)`` are refused before any is
        decoded (:func:`check_layout` with this task's reply and limits), or None."""
        return check_layout(self.reply, layouts, sizes, config, self.limits)


_CENTERS = ArrayField("centers", ("k", "d"), "the current global centers")
_ORIGIN = ArrayField("origin", ("d",), "FedDP: the public point the device's points are taken around (clipped within "
                     "clip-norm of it; every statistic is of x - origin); absent: the origin", optional=True)
_LOCAL_CENTERS = (
    ArrayField("centers", ("c", "d"), "a device's local centers", role="mean"),
    ArrayField("counts", ("c",), "points in each", nonnegative=True, role="count"),
)
_SEED = Param("seed", int, 0, doc="the node's own seed for its random choices")
_LEVEL = Param("level", str, DATA_POINT, allowed=StrOptions(LEVELS), doc="privacy level")
_CLIP_NORM = Param("clip-norm", float, None, allowed=Interval(float, 0, closed="right"), doc="data-point level: clip every point to this norm")
_CLIP = Param("clip", float, None, allowed=Interval(float, 0, closed="right"), doc="client level: L2 bound of the Gaussian-noised statistic")
_NORMALIZE = Param("normalize", bool, False, doc="client level: scale the statistic to L2 norm exactly `clip` (a zero one stays zero) instead of clipping it")
_MAX_POINTS = Param("max-points", int, 0, allowed=Interval(int, 0), doc="data-point level: use at most this many points (the same subset in every step, by a per-point rule; 0 = all)")
_CLIP_L1 = Param("clip-l1", float, None, allowed=Interval(float, 0, closed="right"), doc="client level: L1 bound of the Laplace-noised statistic")
_BINNING = Param("binning", str, "codebook", allowed=StrOptions(("grid", "codebook")), doc="grid cells or nearest codebook vector")
_NUM_NODES = Param("num-nodes", int, allowed=Interval(int, 1), doc="global number of graph nodes")

TASKS: dict[str, Task] = {
    task.name: task
    for task in (
        Task(
            "data_summary", "query", "size, dimension and bounding box of the device's points (with `moments`: their sums and scatter about their mean)",
            config=(Param("moments", bool, False, doc="also the per-feature sums and scatter (they bind its later statistics; standardize)"),),
            reply=(ArrayField("min", ("d",), role="box-min"), ArrayField("max", ("d",), role="box-max"),
                   ArrayField("sum", ("d",), when=("moments", True), role="moment-sum"),
                   ArrayField("scatter", ("d",), "per feature, the sum of squared deviations of its points from their mean",
                              nonnegative=True, when=("moments", True), role="moment-scatter")),
            metrics=(NUM_EXAMPLES, DIM),
            used_by=("fedkmeans", "feddp-kmeans", "da-ufl"),
        ),
        Task(
            "identify", "query",
            "nothing of its data: only the partition every reply states (a resumed run matches the nodes connected now "
            "to its own by it)",
            metrics=(),
            used_by=("fedkmeans", "kfed", "feddp-kmeans", "da-ufl", "fedspectral", "fedspectral-plus"),
        ),
        Task(
            "lloyd_stats", "query", "per-cluster sums, counts and cost of the given centers",
            request=(_CENTERS,),
            reply=(
                ArrayField("sums", ("k", "d"), role="sum"),
                ArrayField("counts", ("k",), nonnegative=True, role="count"),
                ArrayField("cost", (1,), nonnegative=True, role="cost", of="centers"),
            ),
            used_by=("fedkmeans", "kfed", "feddp-kmeans", "da-ufl"),
            counts="all",
        ),
        Task(
            "write_labels", "query",
            "label its own points with the centers and save them beside its data file; only whether it wrote is sent",
            request=(_CENTERS,),
            reply=(ArrayField("written", (1,), nonnegative=True),),
            used_by=("fedkmeans", "kfed", "feddp-kmeans", "da-ufl"),
        ),
        Task(
            "score_candidates", "query", "k-means cost of each of m candidate center sets",
            request=(ArrayField("candidates", ("m", "k", "d")),),
            reply=(ArrayField("costs", ("m",), nonnegative=True, role="cost", of="candidates"),),
            used_by=("fedkmeans", "kfed", "da-ufl"),
        ),
        Task(
            "local_summary", "query", "a local k-means (centers, counts); clusters under min-count points suppressed",
            config=(
                Param("k", int, allowed=Interval(int, 1), doc="local clusters"),
                Param("min-count", int, 2, allowed=Interval(int, 1), doc="smallest cluster that may leave the device"),
                Param("n-init", int, 1, allowed=Interval(int, 1), doc="local k-means restarts"),
                _SEED,
            ),
            reply=_LOCAL_CENTERS,
            used_by=("fedkmeans",),
            counts="at-most",
            limits=(Limit("c", "k", lambda config, sizes: config.get("k")),),
        ),
        Task(
            "fedkmeans_train", "train",
            "ClientKMeans from each of the m sets of global centers trained side by side (n-init); the cost of each set received",
            request=(ArrayField("centers", ("m", "k", "d"), "the global centers of every set"),),
            config=(
                Param("local-epochs", int, 1, allowed=Interval(int, 1), doc="E"),
                Param("batch-size", int, 0, allowed=Interval(int, 0), doc="B (0: full batch)"),
                Param("client-lr", float, 1.0, allowed=Interval(float, 0, 1, closed="right"), doc="β"),
                _SEED,
            ),
            reply=(
                ArrayField("centers", ("m", "k", "d"), role="mean", of="centers"),
                ArrayField("counts", ("m", "k"), nonnegative=True, role="count"),
                ArrayField("scatter", ("m", "k", "d"), "per cluster and coordinate, the sum of squared deviations of the "
                           "points it assigned (last epoch) from their mean", nonnegative=True, role="scatter"),
                ArrayField("cost", ("m",), nonnegative=True, role="cost", of="centers"),
            ),
            used_by=("fedkmeans",),
            counts="all",
        ),
        Task(
            "kfed_local", "query", "k-FED step 1: the device's local k'-means (Awasthi-Sheffet)",
            config=(
                Param("k-prime", int, allowed=Interval(int, 0), doc="local clusters k' (0: the device chooses, up to k; a node's own --node-config k-prime wins)"),
                Param("k", int, 1, allowed=Interval(int, 1), doc="global clusters: the most local clusters a device chooses (k-prime = 0)"),
                Param("n-init", int, 10, allowed=Interval(int, 1), doc="device restarts (1: the paper)"),
                Param("max-iter", int, 100, allowed=Interval(int, 1), doc="Lloyd steps"),
                Param("seeding", str, "best", allowed=StrOptions(("best", "core", "voronoi")), doc="start of the Lloyd steps"),
                _SEED,
            ),
            reply=(_LOCAL_CENTERS[0], ArrayField("counts", ("c",), "points in each", nonnegative=True, integer=True, role="count", dtype="integer"),
                   ArrayField("cost", (1,), "the local k'-means cost (its points to their local centers)", nonnegative=True)),
            used_by=("kfed", "fedkmeans"),
            counts="all",
            limits=(Limit("c", f"the larger of k-prime, k and {NODE_K_PRIME_MAX} (a node's own k-prime)", lambda config, sizes: max(
                int(config.get("k-prime", 0)), int(config.get("k", 1)), NODE_K_PRIME_MAX)),),
        ),
        Task(
            "feddp_outer", "query", "FedDP-Init step 1: XᵀX as its packed upper triangle",
            request=(_ORIGIN,),
            config=(_LEVEL, _CLIP_NORM, _MAX_POINTS, _CLIP, _NORMALIZE),
            reply=(ArrayField("outer", ("p",)),),
            metrics=(NUM_EXAMPLES, DIM),
            used_by=("feddp-kmeans",),
            limits=(Limit("p", "d(d+1)/2", lambda config, sizes: sizes["d"] * (sizes["d"] + 1) // 2 if sizes.get("d") else None),),
        ),
        Task(
            "feddp_histogram", "query", "FedDP-Init step 2: histogram of the nearest projected server point",
            request=(ArrayField("projection", ("d", "r")), ArrayField("server", ("s", "r")), _ORIGIN),
            config=(_LEVEL, _CLIP_NORM, _MAX_POINTS, _CLIP_L1),
            reply=(ArrayField("histogram", ("s",), nonnegative=True, role="count"),),
            used_by=("feddp-kmeans",),
            counts="at-most",
        ),
        Task(
            "feddp_candidates", "query", "FedDP histogram start: histogram of the nearest candidate (server points, or drawn independently of any data)",
            request=(ArrayField("candidates", ("s", "d")), _ORIGIN),
            config=(_LEVEL, _CLIP_NORM, _MAX_POINTS, _CLIP_L1),
            reply=(ArrayField("histogram", ("s",), nonnegative=True, role="count"),),
            used_by=("feddp-kmeans",),
            counts="at-most",
        ),
        Task(
            "feddp_projected_stats", "query", "FedDP-Init step 3: statistics of the projected assignment",
            request=(ArrayField("projection", ("d", "r")), ArrayField("centers", ("k", "r")), _ORIGIN),
            config=(_LEVEL, _CLIP_NORM, _MAX_POINTS, _CLIP, _CLIP_L1, Param("margin", float, 1.0, allowed=Interval(float, 0, closed="right"), doc="margin filter (1: off)")),
            reply=(
                ArrayField("sums", ("k", "d"), when=("level", "data-point")),
                ArrayField("counts", ("k",), nonnegative=True, when=("level", "data-point"), role="count"),
                ArrayField("means", ("k", "d"), when=("level", "client")),
                ArrayField("nonempty", ("k",), nonnegative=True, when=("level", "client")),
            ),
            used_by=("feddp-kmeans",),
            counts="at-most",
        ),
        Task(
            "feddp_lloyd", "query", "FedDP-Lloyds: per-cluster sums and counts, clipped on the device",
            request=(_CENTERS, _ORIGIN),
            config=(_LEVEL, _CLIP_NORM, _MAX_POINTS, _CLIP, _CLIP_L1,
                    Param("radius", float, None, allowed=Interval(float, 0, closed="right"),
                          doc="data-point level, relative update: sums of each point's displacement from its center, clipped to this norm")),
            reply=(ArrayField("sums", ("k", "d")), ArrayField("counts", ("k",), nonnegative=True, role="count")),
            used_by=("feddp-kmeans",),
            counts="at-most",
        ),
        Task(
            "power_step", "train", "FedSpectral+: local power steps (paper) or one global product (exact)",
            request=(ArrayField("Q", ("n", "b")), ArrayField("degrees", ("n",), nonnegative=True, optional=True)),
            config=(
                _NUM_NODES,
                Param("iters", int, 1, allowed=Interval(int, 1), doc="local power steps (paper mode)"),
                Param("normalization", str, "local", allowed=StrOptions(("local", "global")), doc="local: paper; global: exact"),
                Param("edge-weight", float, 1.0, allowed=Interval(float, 0, closed="right"), doc="1/r for edges held by r clients"),
            ),
            reply=(ArrayField("Q", ("n", "b")),),
            used_by=("fedspectral-plus",),
        ),
        Task(
            "local_spectral_labels", "query", "FedSpectral: spectral clustering of the local graph",
            config=(
                _NUM_NODES,
                Param("k", int, allowed=Interval(int, 1), doc="clusters"),
                Param("block", int, 0, allowed=Interval(int, 0), doc="block columns (0: auto)"),
                Param("max-iters", int, 1000, allowed=Interval(int, 1), doc="subspace iterations"),
                Param("tol", float, 1e-6, allowed=Interval(float, 0), doc="Ritz residual to stop at"),
                _SEED,
            ),
            reply=(ArrayField("labels", ("n",), integer=True, dtype="integer"),),
            metrics=(NUM_EXAMPLES, "num-local-nodes"),
            used_by=("fedspectral",),
        ),
        Task(
            "som_codebook", "query", "DA-UFL phase 1 (UFLSOM): a Kohonen SOM codebook of the device's points",
            config=(
                Param("grid", int, 4, allowed=Interval(int, 1, 100), doc="grid × grid units at most (a device with fewer points uses fewer)"),
                Param("epochs", int, 30, allowed=Interval(int, 1, 10_000), doc="batch SOM passes over the points"),
                _SEED,
            ),
            reply=(ArrayField("codebook", ("u", "d"), "the SOM units (u ≤ grid², a square): weighted means of its points", role="mean"),),
            used_by=("da-ufl",),
            limits=(Limit("u", "grid²", lambda config, sizes: int(config.get("grid", 4)) ** 2),),
        ),
        Task(
            "bin_counts", "query", "DA-UFL phase 2: points per bin (grid cell or nearest codebook vector)",
            request=(
                ArrayField("low", ("d",), when=("binning", "grid")),
                ArrayField("high", ("d",), when=("binning", "grid")),
                ArrayField("codebook", ("q", "d"), when=("binning", "codebook")),
            ),
            config=(
                _BINNING,
                Param("bins", int, 10, allowed=Interval(int, 1), doc="grid cells per dimension"),
            ),
            reply=(ArrayField("counts", ("q",), nonnegative=True, integer=True, role="count"),),
            counts="at-most",
            used_by=("da-ufl",),
        ),
        Task(
            "daufl_step", "train", "DA-UFL inner step: perturbed labels, weighted gradients g_k and counts W_k",
            request=(
                _CENTERS,
                ArrayField("anchor", ("k", "d"), "m^(0) of this outer iteration: the labels are taken against it"),
                ArrayField("weights", ("q",), "this agent's weight of every bin", nonnegative=True),
                ArrayField("low", ("d",), when=("binning", "grid")),
                ArrayField("high", ("d",), when=("binning", "grid")),
                ArrayField("codebook", ("q", "d"), when=("binning", "codebook")),
                ArrayField("previous", ("k", "d"), "the previous iteration's anchor (count changed labels)", optional=True),
            ),
            config=(
                Param("binning", str, "codebook", allowed=StrOptions(("grid", "codebook", "uniform")), doc="what a bin is"),
                Param("bins", int, 10, allowed=Interval(int, 1), doc="grid cells per dimension"),
                Param("outer", int, allowed=Interval(int, 1), doc="t1, the outer iteration"),
                Param("xi-max", float, 0.0, allowed=Interval(float, 0), doc="ξ_max of the perturbation"),
                Param("previous-outer", int, 1, allowed=Interval(int, 1), doc="t1 of the previous iteration"),
                Param("previous-seed", int, 0, doc="seed of the previous iteration's ξ"),
                _SEED,
            ),
            reply=(
                ArrayField("gradient", ("k", "d")),
                ArrayField("weight", ("k",), nonnegative=True),
                ArrayField("changed", (1,), nonnegative=True, integer=True),
            ),
            used_by=("da-ufl",),
        ),
    )
}


# ------------------------------------------------------------------ secure aggregation
# (fedcluster/secagg.py): the four stages of one secure sum, each a task of its own. Positions
# 1..n (never Flower node ids) name the participants; byte strings (PEM keys, Fernet tokens,
# Shamir shares) travel as uint8 rows, right-padded with zero bytes.
PUBLIC_KEY_BYTES = 215  # a P-384 public key as PEM SubjectPublicKeyInfo (flwr's public_key_to_bytes)
SEED_BYTES = 32  # a self-mask seed b_s
HASH_BYTES = 32  # a SHA-256 commitment
SCALAR_BYTES = 48  # a P-384 private scalar
POINT_BYTES = 49  # a P-384 public key as a compressed point (a share token's ephemeral key)
TOKEN_OVERHEAD = 256  # a Fernet token of a device's shares is at most this longer than its joined public keys (y)
SHARE_BYTES_MAX = 1024  # one Shamir share of a seed or a mask key, as sent
_SESSION = Param("session", int, allowed=Interval(int, 0), doc="the session's number in the run")
SECURE_TASKS = ("feddp_candidates", "feddp_lloyd", "power_step")  # tasks whose server step needs only the sum of their replies


def secure_name(name: str) -> str:
    """The masked variant of the summable task ``name``."""
    return f"secure_{name}"


def _secure_variant(spec: Task) -> Task:
    """``spec`` with the forwarded shares and the public ranges in its request, and as reply
    its arrays masked: integers in [0, 2^62), the same names and shapes, and no metric."""
    return Task(
        secure_name(spec.name), spec.kind, f"secure aggregation, masked: {spec.doc}",
        request=spec.request + (
            ArrayField("secagg-sources", ("e",), "positions whose encrypted shares follow", integer=True, nonnegative=True),
            ArrayField("secagg-ciphertexts", ("e", "*"), "their Fernet tokens for this device", nonnegative=True),
            ArrayField("secagg-ephemeral", ("e", POINT_BYTES), "each token's ephemeral public key", integer=True, nonnegative=True),
            ArrayField("secagg-digests", ("e", HASH_BYTES), "each sender's commitments to the shares in its token, hashed", integer=True, nonnegative=True),
            ArrayField("secagg-ranges", ("a",), "public clipping range of each summed reply array, in declared order", nonnegative=True),
            ArrayField("secagg-levels", ("a",), "grid steps per range of each summed array (at most 2^40)", nonnegative=True),
            ArrayField("secagg-noise", ("a",), "variance of the Skellam noise this device adds to each summed array, per coordinate, in grid steps", nonnegative=True),
            ArrayField("secagg-absent", ("g",), "positions of the session not in this sum (not masked with)", integer=True, nonnegative=True),
        ),
        config=spec.config + (Param("secagg-session", int, allowed=Interval(int, 0), doc="the session"),
                              Param("secagg-sum", int, allowed=Interval(int, 1), doc="the sum's number in the session")),
        reply=tuple(ArrayField(f.name, f.shape, "masked mod 2^62", nonnegative=True, integer=True, dtype="integer") for f in spec.reply) + (
            ArrayField("secagg-refused", ("i",), "1 at position − 1 for every participant whose forwarded share this "
                       "device refused (it did not mask with them; first sum of a session), else 0", integer=True,
                       nonnegative=True, dtype="integer"),),
        metrics=(),
        used_by=spec.used_by,
    )


TASKS.update({
    task.name: task
    for task in (
        Task(
            "secagg_setup", "query", "secure aggregation stage 0 (once per session): a mask key pair per sum and an encryption key pair",
            config=(_SESSION, Param("position", int, allowed=Interval(int, 1), doc="this device's position 1..n"),
                    Param("participants", int, allowed=Interval(int, 2), doc="n"),
                    Param("threshold", int, allowed=Interval(int, 2), doc="Shamir threshold t"),
                    Param("sums", int, allowed=Interval(int, 1), doc="secure sums the session serves (one mask seed each)")),
            reply=(ArrayField("pk1", ("h", PUBLIC_KEY_BYTES), "PEM public keys for the pairwise masks, one per sum", nonnegative=True, integer=True, dtype="byte"),
                   ArrayField("pk2", (PUBLIC_KEY_BYTES,), "PEM public key for the shares' encryption", nonnegative=True, integer=True, dtype="byte")),
            metrics=(), used_by=("feddp-kmeans", "fedspectral-plus"),
        ),
        Task(
            "secagg_share_keys", "query", "secure aggregation stage 1 (once per session): Shamir shares of a mask seed and of the mask key of every sum, encrypted per participant under an ephemeral key; commitments to the seeds and shares",
            request=(ArrayField("positions", ("c",), integer=True, nonnegative=True),
                     ArrayField("pk1", ("c", "y"), nonnegative=True), ArrayField("pk2", ("c", "*"), nonnegative=True)),
            config=(_SESSION,),
            reply=(ArrayField("destinations", ("e",), integer=True, nonnegative=True, dtype="integer"),
                   ArrayField("ciphertexts", ("e", "*"), nonnegative=True, dtype="byte"),
                   ArrayField("ephemeral", ("e", POINT_BYTES), "each token's ephemeral public key", integer=True, nonnegative=True, dtype="byte"),
                   ArrayField("commitments", ("e", "h", 2 * HASH_BYTES), "per destination and sum, the hashes of its seed share and mask-key share", integer=True, nonnegative=True, dtype="byte"),
                   ArrayField("seed-commitments", ("h", HASH_BYTES), "the hash of each sum's mask seed", integer=True, nonnegative=True, dtype="byte")),
            limits=(Limit("e", "c", lambda config, sizes: sizes.get("c")),
                    Limit("*", f"y + {TOKEN_OVERHEAD}", lambda config, sizes: sizes["y"] + TOKEN_OVERHEAD if sizes.get("y") else None)),
            metrics=(), used_by=("feddp-kmeans", "fedspectral-plus"),
        ),
        Task(
            "secagg_unmask", "query", "secure aggregation stage 3 (per sum): its own seed, shares of the seeds of survivors that did not answer and of the dropped participants' mask keys",
            request=(ArrayField("dropped", ("v",), "positions it masked with that sent no masked reply (the others are in the sum)", integer=True, nonnegative=True),
                     ArrayField("recover", ("w",), "positions in the sum whose seed's shares are asked (they did not answer)", integer=True, nonnegative=True)),
            config=(_SESSION, Param("sum", int, allowed=Interval(int, 1), doc="the sum's number in the session")),
            reply=(ArrayField("seed", (SEED_BYTES,), "this device's own mask seed of the sum", integer=True, nonnegative=True, dtype="byte"),
                   ArrayField("b-positions", ("w",), integer=True, nonnegative=True, dtype="integer"),
                   ArrayField("b-shares", ("w", "*"), nonnegative=True, dtype="byte"),
                   ArrayField("sk-positions", ("v",), integer=True, nonnegative=True, dtype="integer"),
                   ArrayField("sk-shares", ("v", "*"), nonnegative=True, dtype="byte")),
            limits=(Limit("*", f"{SHARE_BYTES_MAX}", lambda config, sizes: SHARE_BYTES_MAX),),
            metrics=(), used_by=("feddp-kmeans", "fedspectral-plus"),
        ),
        Task(
            "secagg_prove", "query", "secure aggregation, after refused shares: the ephemeral keys of its share tokens to the devices that refused them (the server opens those tokens)",
            request=(ArrayField("positions", ("v",), "positions that refused its share", integer=True, nonnegative=True),),
            config=(_SESSION,),
            reply=(ArrayField("scalars", ("v", SCALAR_BYTES), "each token's ephemeral private key", integer=True, nonnegative=True, dtype="byte"),),
            metrics=(), used_by=("feddp-kmeans", "fedspectral-plus"),
        ),
    )
})
TASKS.update({secure_name(name): _secure_variant(TASKS[name]) for name in SECURE_TASKS})
# the tasks whose device state (keys, seed, shares) must outlive the message
SECURE_STAGES = frozenset({"secagg_setup", "secagg_share_keys", "secagg_unmask", "secagg_prove"}
                          | {secure_name(n) for n in SECURE_TASKS})


def part(record: str, index: int) -> str:
    """The name of record ``record`` (``arrays``, ``config``, ``metrics``, ``error``) of part
    ``index`` of a bundle."""
    return f"{record}.{index}"


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
                ", ".join(a.describe() for a in spec.reply) + ("; metrics " + ", ".join(f"`{m}`" for m in spec.metrics) if spec.metrics else "")
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
