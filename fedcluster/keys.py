"""How a run-config key is declared: :class:`Key`, a :class:`Section` of them with its
cross-key rules, and the keys several algorithms read (declared once here, listed in each
reader's section). Each algorithm's package declares its own section with these
(``fedcluster/algorithms/<name>/config.py``); :mod:`fedcluster.config` assembles them
into the one validated run config."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import fedcluster.checks as checks
from .checks import Interval, StrOptions


class ConfigError(ValueError):
    """A run-config value is unknown, of the wrong type, out of range, or inconsistent with
    another key. The message names the key."""


@dataclass(frozen=True)
class Key:
    """One run-config key: its default (whose type is the key's type), what it means, and
    what values it allows (:class:`fedcluster.checks.Interval` / ``StrOptions``; ``None``:
    any value of the type)."""

    name: str
    default: Any
    doc: str
    allowed: Interval | StrOptions | None = None

    @property
    def kind(self) -> type:
        return type(self.default)

    def coerce(self, value: Any) -> Any:
        """``value`` as this key's type, or ConfigError naming the key."""
        return checks.typed(f"run-config {self.name}", value, self.kind, self.allowed, ConfigError)

    def check(self, value: Any) -> None:
        checks.within(f"run-config {self.name}", value, self.allowed, ConfigError, f"  ({self.doc})")


MANY = 1_000_000  # upper bound of counts that have no natural one (rounds, restarts, ...)
SEED_MAX = 2**32 - 1


Rule = Callable[[Mapping[str, Any]], None]


@dataclass(frozen=True)
class Section:
    """The run-config keys one algorithm reads (``algorithms``; empty: every algorithm) and
    the cross-key rules that check them together. Each algorithm's module declares its own
    (``fedcluster.algorithms.fedkmeans.model.RUN_CONFIG``, ...); a key several algorithms read is declared in
    each of their sections, with one default and type."""

    name: str
    keys: tuple[Key, ...]
    rules: tuple[Rule, ...] = ()
    algorithms: tuple[str, ...] = ()

    def read_by(self, algorithm: str) -> bool:
        return not self.algorithms or algorithm in self.algorithms


# Keys more than one algorithm reads: declared once here, listed in each reader's section.
STANDARDIZE = Key(
    "standardize",
    False,
    "every feature to mean 0 and variance 1 first (scikit-learn's StandardScaler, "
    "federated: one round of per-device sums), centers written in the original units (FedKMeans, k-FED, "
    "DA-UFL; not FedDP-KMeans, whose privacy guarantee would not cover the exact per-device sums)",
)
WRITE_LABELS = Key(
    "write-labels",
    False,
    "after the run every device saves its points' labels in fedcluster-labels/ "
    "beside its data file (never sent; center-based algorithms: a graph run stores one label per graph "
    "node in labels.npy)",
)
AGGREGATION = Key(
    "aggregation",
    "mean",
    "combining the devices' centers (FedKMeans) or agents' implied means (DA-UFL): "
    "mean (the papers), trimmed-mean, median",
    allowed=StrOptions(("mean", "trimmed-mean", "median")),
)
TRIM_FRACTION = Key(
    "trim-fraction",
    0.1,
    "trimmed-mean: share of a cluster's devices dropped at each end",
    allowed=Interval(float, 0, 0.5),
)
SERVER_DATA = Key(
    "server-data", "", "a .npy of server-side points (FedDP-KMeans; FedKMeans with init='server-kmeans++')"
)
INIT_CANDIDATES = Key(
    "init-candidates",
    10,
    "candidate center sets scored in one federated round (FedKMeans; DA-UFL: at "
    "most this many distinct optima of init-restarts)",
    allowed=Interval(int, 1, 10_000),
)
SECURE_AGGREGATION = Key(
    "secure-aggregation",
    False,
    "the summed statistics by secure aggregation (FedDP-KMeans: the "
    "histogram start's counts and the Lloyd rounds' sums and counts; FedSpectral+: the clients' "
    "products): the server gets masked integer vectors and learns only their sum over at least the "
    "threshold of devices (2 round trips per sum, 2 more once per session; docs/security.md)",
)
SECAGG_THRESHOLD = Key(
    "secagg-threshold",
    2 / 3,
    "secure aggregation: threshold as a fraction of the participants (at "
    "least 2 and more than half): the fewest devices a sum may hold; with secagg-neighbours, also "
    "the Shamir threshold as a fraction of each device's neighbourhood",
    allowed=Interval(float, 0, 1, closed="right"),
)
SECAGG_NEIGHBOURS = Key(
    "secagg-neighbours",
    0,
    "secure aggregation: how many other devices each device masks with and "
    "shares its keys with. 0: every other device (SecAgg, O(n) work per device and O(n^2) through the "
    "server); m: SecAgg+'s sparse graph as Flower builds it (the devices in a random order on a ring, "
    "each joined to the m/2 before and after it, m rounded up to even), O(m) per device: any threshold "
    "of one device's neighbourhood colluding with the server can unmask it (docs/security.md)",
    allowed=Interval(int, 0, MANY),
)


def number_list(text: str, name: str) -> tuple[float, ...]:
    """A comma-separated list of positive finite numbers (``step-epsilons``, ``budget-split``)."""
    try:
        values = tuple(float(item) for item in text.split(","))
    except ValueError:
        raise ConfigError(f"run-config {name} must be comma-separated numbers, got {text!r}") from None
    if not all(math.isfinite(v) and v > 0 for v in values):
        raise ConfigError(f"run-config {name} must hold positive finite numbers, got {text!r}")
    return values


def k_range(text: str) -> tuple[int, int]:
    """``'a:b'`` -> (a, b), 2 <= a < b (the k-range of a choose-k run)."""
    try:
        low, high = (int(part) for part in text.split(":"))
    except ValueError:
        raise ConfigError(f"run-config k-range must look like '2:20' (two integers a:b), got {text!r}") from None
    if not 2 <= low < high <= 1000:
        raise ConfigError(f"run-config k-range a:b needs 2 <= a < b <= 1000, got {text!r}")
    return low, high
