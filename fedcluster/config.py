"""The run configuration, declared once: every key with its type, default, meaning and
range, grouped by the algorithm that reads it; cross-key rules; one validation.

:func:`with_defaults` is called once, before the run waits for any node, and returns
typed values (a strategy never casts). ``pyproject.toml`` declares the same keys under
``[tool.flwr.app.config]`` so that ``flwr run`` and the in-process runner see identical
defaults (a test checks the two agree); the README's key table is :func:`markdown_table`.
"""

from __future__ import annotations

import difflib
import math
import tomllib
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from . import checks
from .checks import Interval, StrOptions
from .privacy.clipping import DATA_POINT, LEVELS


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

ALGORITHMS = ("fedkmeans", "kfed", "feddp-kmeans", "fedspectral", "fedspectral-plus", "da-ufl")
DATASETS = ("gaussian-mixture", "triebe", "digits", "npy-dir", "edge-dir", "feddp-mixture", "da-ufl-paper")
PARTITIONS = ("iid", "dirichlet", "one-source", "components")
KFED_WEIGHTINGS = ("count", "uniform", "capped-count")
AGGREGATIONS = ("mean", "trimmed-mean", "median")  # fedcluster/robust.py
FEDKMEANS_INITS = ("auto", "local-summaries", "kfed", "random-box", "server-kmeans++")
FEDDP_INITS = ("auto", "feddp", "server-kmeans++", "server-lloyds", "sphere-packing")
# Presets: values for keys left at their default (a key given another value than both its
# default and the preset's is a conflict). "deployment" switches off the measurement rounds
# that are not part of any algorithm: in a deployment every round trip costs seconds, and
# FedDP's exact cost report is not private.
PRESETS: dict[str, dict[str, Any]] = {
    "none": {},
    "deployment": {"eval-every": 0, "kfed-evaluate": False, "evaluate-cost": False},
}
PRESET_NAMES = tuple(PRESETS)

SECTIONS: dict[str, tuple[Key, ...]] = {
    "common": (
        Key("algorithm", "fedkmeans", "which algorithm runs", allowed=StrOptions(ALGORITHMS)),
        Key("k", 5, "number of clusters", allowed=Interval(int, 1, MANY)),
        Key("num-rounds", 20, "training rounds", allowed=Interval(int, 0, MANY)),
        Key("seed", 0, "seed of the server's random choices and of generated data", allowed=Interval(int, 0, SEED_MAX)),
        Key("preset", "none", "deployment: the measurement phases that are not part of the algorithm are off "
            "(eval-every = 0, kfed-evaluate = false, evaluate-cost = false)", allowed=StrOptions(PRESET_NAMES)),
    ),
    "data": (
        Key("dataset", "gaussian-mixture", "where the devices' data come from", allowed=StrOptions(DATASETS)),
        Key("data-dir", "", "folder of per-device files (npy-dir, edge-dir)"),
        Key("num-points", 3000, "generated points in total", allowed=Interval(int, 1, 10**9)),
        Key("dim", 4, "generated dimension", allowed=Interval(int, 1, MANY)),
        Key("components", 0, "generated mixture components (0 = k)", allowed=Interval(int, 0, MANY)),
        Key("separation", 8.0, "distance scale between generated means", allowed=Interval(float, 0)),
        Key("partition", "dirichlet", "how generated points are split over devices", allowed=StrOptions(PARTITIONS)),
        Key("dirichlet-alpha", 0.3, "Dirichlet concentration (small = skewed)", allowed=Interval(float, 0, closed="right")),
        Key("classes-per-client", 2, "components per device (partition=components)", allowed=Interval(int, 1, MANY)),
        Key("server-data", "", "a .npy of server-side points (FedDP-KMeans, init=server-kmeans++)"),
        Key("standardize", False, "every feature to mean 0 and variance 1 first (scikit-learn's StandardScaler, "
            "federated: one round of per-device sums), centers written in the original units (FedKMeans, k-FED, DA-UFL)"),
        Key("snr-db", 30.0, "da-ufl-paper: every agent's SNR in dB (observation probability 1 − exp(−0.025·SNR/d))", allowed=Interval(float, -50, 100)),
        Key("class-std", 1.0, "da-ufl-paper: standard deviation of every class per coordinate", allowed=Interval(float, 0, 1000, closed="right")),
    ),
    # docs/ALGORITHMS.md section 1; `init` is shared by every center-based algorithm.
    "fedkmeans": (
        Key("fraction", 1.0, "C, fraction of nodes sampled per round", allowed=Interval(float, 0, 1, closed="right")),
        Key("local-epochs", 1, "E, local epochs", allowed=Interval(int, 1, MANY)),
        Key("batch-size", 0, "B, local mini-batch size (0 = full batch)", allowed=Interval(int, 0, 10**9)),
        Key("client-lr", 1.0, "β, client learning rate", allowed=Interval(float, 0, 1, closed="right")),
        Key("server-lr", 1.0, "α, server learning rate", allowed=Interval(float, 0, 2, closed="right")),
        Key("momentum", 0.0, "μ, server momentum", allowed=Interval(float, 0, 1, closed="left")),
        Key("reassign-threshold", 0.01, "ρ, a cluster below this share of the largest cluster's count is starved", allowed=Interval(float, 0, 1)),
        Key("reassign-patience", 20, "R, starved rounds before a cluster is re-seeded", allowed=Interval(int, 1, MANY)),
        Key("init", "auto", "initialization method", allowed=StrOptions(tuple(dict.fromkeys(FEDKMEANS_INITS + FEDDP_INITS)))),
        Key("n-init", 0, "center sets trained side by side in the same round trips (scikit-learn's n_init, "
            "federated): the cheapest scored start and n-init − 1 unrefined k-means++ draws on the devices' summaries; "
            "a set that can no longer win stops, after half of the rounds only the cheapest trains on. 0: 16 sets while "
            "k·d ≤ 4096, fewer for larger centers (at most 65536 floats of centers per message)", allowed=Interval(int, 0, 64)),
        Key("init-candidates", 10, "candidate center sets scored in one federated round (FedKMeans; DA-UFL: at most this many distinct optima of init-restarts)", allowed=Interval(int, 1, 10_000)),
        Key("init-server-starts", 100, "k-means++ + Lloyd starts the server runs on each device summary; the "
            "init-candidates of lowest cost on the summary are scored on the devices (server time only)", allowed=Interval(int, 1, 100_000)),
        Key("init-min-count", 2, "smallest local cluster a device may summarize", allowed=Interval(int, 1, 10**9)),
        Key("init-coarse", True, "devices also summarize at ceil(sqrt(k)) local clusters; init-candidates more "
            "candidates are drawn on that coarse summary and scored in the same round"),
        Key("eval-every", 0, "partial participation: the unsampled devices also score the centers every this many "
            "rounds (0 = never: a round contacts only its sampled devices, the center sets are ranked by the bound "
            "the server's memory gives, and the centers of lowest bound are scored by every device once, with the "
            "final evaluation)", allowed=Interval(int, 0, MANY)),
        Key("tol", 0.0, "stop when the centers move at most this much (0 = run num-rounds)", allowed=Interval(float, 0)),
        Key("server-memory", True, "aggregate every node's latest statistics (unsampled ones as last reported; every node sends its statistics of the start in round 1); false: this round's replies only (the paper)"),
        Key("aggregation", "mean", "combining the devices' centers (FedKMeans) or agents' implied means (DA-UFL): "
            "mean (the papers), trimmed-mean, median", allowed=StrOptions(AGGREGATIONS)),
        Key("trim-fraction", 0.1, "trimmed-mean: share of a cluster's devices dropped at each end", allowed=Interval(float, 0, 0.5)),
        Key("k-range", "", "choose k: 'a:b' scores every k in a..b in one federated round and reports the elbow "
            "and the Calinski-Harabasz choice instead of training (k is then unused)"),
    ),
    # docs/ALGORITHMS.md section 4
    "kfed": (
        Key("k-prime", 0, "local clusters per device; 0: each device chooses from its own data, up to k (fewer only "
            "when its clusters are separated beyond doubt); the paper's rule is ceil(sqrt(k))", allowed=Interval(int, 0, MANY)),
        Key("kfed-weighting", "count", "weighting of device centers in the merge; capped-count: no device weighs "
            "more than the median device (robust to inflated counts)", allowed=StrOptions(KFED_WEIGHTINGS)),
        Key("kfed-min-devices", 1, "a global cluster must gather centers of at least this many devices, else its "
            "centers are left out of the merge (1 = the paper; 2: one device cannot claim a cluster of its own)",
            allowed=Interval(int, 1, MANY)),
        Key("kfed-to-convergence", True, "server Lloyd to convergence (false = one round, the paper)"),
        Key("kfed-server-starts", 100, "merge starts scored on the server; they stop once ten further starts reproduced the best grouping (1 = the paper)", allowed=Interval(int, 1, 10_000)),
        Key("kfed-device-restarts", 10, "local k'-means restarts on each device (1 = the paper)", allowed=Interval(int, 1, 10_000)),
        Key("kfed-evaluate", True, "one extra round measuring the federated cost of the result"),
    ),
    # docs/ALGORITHMS.md section 3
    "feddp-kmeans": (
        Key("privacy-level", DATA_POINT, "unit of privacy", allowed=StrOptions(LEVELS)),
        Key("epsilon", 1.0, "target total ε (inf = no noise)", allowed=Interval(float, 0, closed="right", allow_inf=True)),
        Key("delta", 1e-6, "δ", allowed=Interval(float, 0, 1, closed="neither")),
        Key("step-epsilons", "", "per-step ε 'e1,e2,...' instead of a target total; their PLD total must not exceed epsilon"),
        Key("budget-split", "", "relative ε shares 'w1,w2,w3g,w3l' (default: the paper's rule of thumb)"),
        Key("lloyd-rounds", 0, "T, FedDP-Lloyds rounds", allowed=Interval(int, 0, MANY)),
        Key("lloyd-fraction", 0.25, "share of ε for FedDP-Lloyds", allowed=Interval(float, 0, 1, closed="left")),
        Key("clip-norm", 0.0, "Δ, point norm bound (0 = the server data's radius)", allowed=Interval(float, 0)),
        Key("dimension", 0, "the data's dimension, public and agreed in advance (0 = the server data's); without "
            "server data the run starts from init='sphere-packing' in the ball of radius clip-norm", allowed=Interval(int, 0, 10**6)),
        Key("max-device-points", 0, "data-point level: points one device may contribute (0 = no cap); a device "
            "with more uses the same subset of them in every step, a reply declaring more is dropped; a cap doubles the noise "
            "(neighbours then differ by a swapped point)", allowed=Interval(int, 0, 10**9)),
        Key("client-max-points", 50, "m, points per client assumed by derived client-level bounds", allowed=Interval(int, 1, 10**9)),
        Key("clip-outer", 0.0, "client level: bound of XᵀX (0 = each client's XᵀX scaled to Frobenius norm 1)", allowed=Interval(float, 0)),
        Key("clip-histogram", 0.0, "client level: bound of the histogram (0 = derived)", allowed=Interval(float, 0)),
        Key("clip-means", 0.0, "client level: bound of the step-3 means (0 = √k times the server data's root-mean-square norm, at most √k·Δ)", allowed=Interval(float, 0)),
        Key("clip-nonempty", 0.0, "client level: bound of the non-empty vector (0 = derived)", allowed=Interval(float, 0)),
        Key("clip-sums", 0.0, "client level: bound of the Lloyd sums (0 = derived)", allowed=Interval(float, 0)),
        Key("clip-counts", 0.0, "client level: bound of the Lloyd counts (0 = derived)", allowed=Interval(float, 0)),
        Key("client-sampling-rate", 1.0, "q, Poisson sampling of clients per step", allowed=Interval(float, 0, 1, closed="right")),
        Key("margin", 1.0, "step-3 margin filter (1 = off)", allowed=Interval(float, 0, closed="right")),
        Key("min-server-weight", 5.0, "server points lighter than this are dropped in step 2", allowed=Interval(float, 0)),
        Key("server-n-init", 10, "k-means restarts on the server's weighted points", allowed=Interval(int, 1, 10_000)),
        Key("noise-seed", -1, "seed of the noise (-1 = OS entropy)", allowed=Interval(int, -1, SEED_MAX)),
        Key("evaluate-cost", True, "report the exact (non-private) federated cost of the result"),
    ),
    # docs/ALGORITHMS.md section 5
    "fedspectral": (
        Key("num-nodes", 0, "global number of graph nodes (ids 0 .. n-1)", allowed=Interval(int, 0, 10**9)),
        Key("mode", "exact", "FedSpectral+: exact (summed global products) or paper", allowed=StrOptions(("exact", "paper"))),
        Key("iters", 1, "paper mode: local power steps per round", allowed=Interval(int, 1, MANY)),
        Key("oversample", -1, "exact mode: extra block columns (-1 = max(k, 10))", allowed=Interval(int, -1, MANY)),
        Key("acceleration", "krylov", "exact mode: block Krylov + Rayleigh-Ritz, or none", allowed=StrOptions(("krylov", "none"))),
        Key("max-basis", 0, "krylov: columns kept before a thick restart (0 = auto)", allowed=Interval(int, 0, MANY)),
        Key("residual-tol", 0.0, "exact mode: stop when every top-k Ritz residual is at most this (0 = never)", allowed=Interval(float, 0)),
        Key("edge-copies", 1, "r, clients holding every edge", allowed=Interval(int, 1, MANY)),
        Key("coassociation", "both-present", "FedSpectral co-association rule", allowed=StrOptions(("both-present", "all-clients"))),
    ),
    # docs/ALGORITHMS.md §2
    "da-ufl": (
        Key("weighting", "uniform", "UFLUni (w_j = 1/J; the SOM codebooks still start the centers), UFLSOM (SOM-codebook "
            "bins) or UFLBin (grid bins): the bin weights count an observation several agents share once, and re-weight "
            "real points when agents hold different ones (docs: DA-UFL)", allowed=StrOptions(("uniform", "som", "bin"))),
        Key("xi-max", 0.05, "ξ_max, label perturbation ξ ~ U(0, ξ_max) per point and cluster (0 = off)", allowed=Interval(float, 0, 10)),
        Key("eta", 1.0, "η of the dual-averaging step (1 = one inner step is a weighted Lloyd step)", allowed=Interval(float, 0, 1, closed="right")),
        Key("eps-glo", 1e-6, "ε_glo: inner loop stops when no center moves more than this × the bounding-box diagonal", allowed=Interval(float, 0, 1)),
        Key("bins", 10, "UFLBin: grid cells per dimension (b^d cells)", allowed=Interval(int, 1, 10_000)),
        Key("max-bins", 100_000, "UFLBin: refuse a grid of more cells than this (b^d grows with d)", allowed=Interval(int, 1, 10**8)),
        Key("som-grid", 0, "UFLSOM: SOM of som-grid × som-grid units per device (0: about 4k units, at least 4 × 4; "
            "a device with fewer points uses fewer units)", allowed=Interval(int, 0, 100)),
        Key("som-epochs", 30, "UFLSOM: batch SOM passes over each device's points", allowed=Interval(int, 1, 10_000)),
        Key("init-restarts", 50, "k-means++ starts on the bin representatives, each refined by weighted Lloyd there (server only); 0 = the paper's single draw", allowed=Interval(int, 0, 10_000)),
        Key("outer-iterations", 100, "t1 limit: outer (labelling) iterations", allowed=Interval(int, 1, MANY)),
        Key("inner-iterations", 50, "t2 limit: dual-averaging steps per outer iteration", allowed=Interval(int, 1, MANY)),
    ),
    "federation": (
        Key("min-nodes", 0, "nodes to wait for (0 = until the count is stable)", allowed=Interval(int, 0, 10**9)),
        Key("node-wait-s", 120.0, "longest wait for nodes, seconds", allowed=Interval(float, 0, 10**7)),
        Key("node-settle-s", 3.0, "seconds the node count must be stable (min-nodes = 0)", allowed=Interval(float, 0, 10**5)),
        Key("round-timeout", 600.0, "longest wait for the replies of one phase, seconds", allowed=Interval(float, 0, 10**7, closed="right")),
        Key("min-replies", 1, "fewest valid replies a phase needs", allowed=Interval(int, 1, 10**9)),
        Key("min-reply-fraction", 0.5, "fewest valid replies a phase needs, as a share of those sent", allowed=Interval(float, 0, 1)),
        Key("max-missed-phases", 3, "a node that sent no reply in this many consecutive phases leaves the run", allowed=Interval(int, 1, 10**6)),
        Key("output-dir", "", "results folder (default outputs/<time>-<algorithm>)"),
        Key("overwrite", False, "replace a result already in output-dir (default: write to a fresh run-N sub-folder)"),
        Key("reference", True, "also compute the pooled central k-means reference (generated data)"),
        Key("write-labels", False, "after the run every device saves its points' labels in fedcluster-labels/ "
            "beside its data file (never sent; center-based algorithms)"),
    ),
}

KEYS: dict[str, Key] = {key.name: key for section in SECTIONS.values() for key in section}
DEFAULTS: dict[str, Any] = {name: key.default for name, key in KEYS.items()}


class RunConfig(Mapping[str, Any]):
    """The full, validated run config, frozen (:func:`with_defaults` makes it): read a key as
    ``config["num-rounds"]`` or, typed by its declaration, ``config.num_rounds`` (a key's
    hyphens are underscores); :meth:`replace` gives a new one, checked again."""

    __slots__ = ("_values",)

    def __init__(self, values: Mapping[str, Any]) -> None:
        object.__setattr__(self, "_values", dict(values))

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def __iter__(self):
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __getattr__(self, name: str) -> Any:
        try:
            return self._values[name.replace("_", "-")]
        except KeyError:
            raise AttributeError(f"the run config has no key {name.replace('_', '-')!r}") from None

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("the run config is frozen: make a changed one with replace(...)")

    def __reduce__(self):
        return RunConfig, (self._values,)

    def __repr__(self) -> str:
        return f"RunConfig({self._values!r})"

    def replace(self, **changes: Any) -> "RunConfig":
        """A copy with ``changes`` (``min_nodes=3`` for ``min-nodes``), validated again."""
        return with_defaults({**self._values, **{name.replace("_", "-"): value for name, value in changes.items()}})


def with_defaults(run_config: Mapping[str, Any] | None, algorithms: Sequence[str] | None = None) -> RunConfig:
    """The full, validated run config: DEFAULTS overridden by ``run_config``.

    Every value has its key's type (ints are ints, floats floats), lies in its range, and
    the keys agree with each other. ``algorithms``: the names that have a strategy (the
    server passes its registry; a name without a strategy is refused here, before any
    node is waited for)."""
    merged = dict(DEFAULTS)
    for name, value in (run_config or {}).items():
        if name not in KEYS:
            close = difflib.get_close_matches(name, KEYS, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"unknown run-config key {name!r}{hint}")
        merged[name] = KEYS[name].coerce(value)
    KEYS["preset"].check(merged["preset"])
    for name, value in PRESETS[merged["preset"]].items():
        if merged[name] not in (DEFAULTS[name], value):
            raise ConfigError(
                f"run-config {name} = {merged[name]!r} conflicts with preset {merged['preset']!r}, which sets "
                f"{name} = {value!r}: drop one of the two"
            )
        merged[name] = value
    for name, key in KEYS.items():
        key.check(merged[name])
    if algorithms is not None and merged["algorithm"] not in algorithms:
        raise ConfigError(
            f"run-config algorithm {merged['algorithm']!r} has no strategy in this version; "
            f"available: {', '.join(algorithms)}"
        )
    for rule in RULES:
        rule(merged)
    return RunConfig(merged)


def validate(config: dict[str, Any]) -> None:
    """Check a full config (as :func:`with_defaults` returns it) again."""
    with_defaults(config)


def number_list(text: str, name: str) -> tuple[float, ...]:
    """A comma-separated list of positive finite numbers (``step-epsilons``, ``budget-split``)."""
    try:
        values = tuple(float(item) for item in text.split(","))
    except ValueError:
        raise ConfigError(f"run-config {name} must be comma-separated numbers, got {text!r}") from None
    if not all(math.isfinite(v) and v > 0 for v in values):
        raise ConfigError(f"run-config {name} must hold positive finite numbers, got {text!r}")
    return values


def feddp_step_names(config: Mapping[str, Any]) -> tuple[str, ...]:
    """The private steps a FedDP-KMeans run uses, in the order ``step-epsilons`` lists them
    (``init = auto`` starts from FedDP-Init with server data, from SpherePacking without:
    :func:`fedcluster.feddp_kmeans.start_method`)."""
    from .feddp_kmeans import start_method

    has_server_data = bool(config["server-data"]) or config["dataset"] == "feddp-mixture"  # as the strategy finds it
    steps = ("step1", "step2", "step3_gaussian", "step3_laplace") if start_method(config["init"], has_server_data) == "feddp" else ()
    if config["lloyd-rounds"] > 0:
        steps += ("lloyd_gaussian", "lloyd_laplace")
    return steps


# ---------------------------------------------------------------------- cross-key rules
def _data_rules(c: dict[str, Any]) -> None:
    if c["dataset"] in ("npy-dir", "edge-dir") and not c["data-dir"]:
        raise ConfigError(f"dataset {c['dataset']!r} needs run-config data-dir")


def _init_rules(c: dict[str, Any]) -> None:
    allowed = {"fedkmeans": FEDKMEANS_INITS, "feddp-kmeans": FEDDP_INITS}.get(c["algorithm"])
    if allowed and c["init"] not in allowed:
        raise ConfigError(f"run-config init for {c['algorithm']} must be one of {', '.join(allowed)}; got {c['init']!r}")
    if c["algorithm"] == "fedkmeans" and c["init"] == "server-kmeans++" and not c["server-data"]:
        raise ConfigError("init='server-kmeans++' needs run-config server-data (a .npy path)")


def _feddp_rules(c: dict[str, Any]) -> None:
    if c["client-sampling-rate"] < 1 and c["privacy-level"] != "client":
        raise ConfigError("client-sampling-rate < 1 is only accounted at privacy-level = 'client'")
    if c["budget-split"] and len(number_list(c["budget-split"], "budget-split")) != 4:
        raise ConfigError(f"run-config budget-split must be four positive numbers 'w1,w2,w3g,w3l', got {c['budget-split']!r}")
    if c["algorithm"] != "feddp-kmeans":
        return
    steps = feddp_step_names(c)
    if c["init"] == "sphere-packing" and c["lloyd-rounds"] == 0:
        raise ConfigError("init='sphere-packing' with lloyd-rounds = 0 returns centers that never saw the devices' "
                          "data: set lloyd-rounds >= 1")
    if "step3_gaussian" in steps and c["lloyd-rounds"] > 0 and c["lloyd-fraction"] <= 0:
        raise ConfigError("lloyd-rounds > 0 needs lloyd-fraction > 0 (the Lloyd rounds' share of epsilon)")
    if c["step-epsilons"]:
        values = number_list(c["step-epsilons"], "step-epsilons")
        if len(values) != len(steps):
            raise ConfigError(
                f"run-config step-epsilons must give {len(steps)} positive values, one per step of this run "
                f"in the order {', '.join(steps) or '(none: this run has no private step)'}; got {c['step-epsilons']!r}"
            )


def _spectral_rules(c: dict[str, Any]) -> None:
    if c["algorithm"] not in ("fedspectral", "fedspectral-plus"):
        return
    if c["num-nodes"] < 1:
        raise ConfigError(
            f"algorithm {c['algorithm']!r} needs run-config num-nodes: the global number of "
            "graph nodes (node ids are 0 .. num-nodes-1), e.g. num-nodes=1005 for email-Eu-core"
        )
    if c["k"] > c["num-nodes"]:
        raise ConfigError(f"k={c['k']} is larger than num-nodes={c['num-nodes']}")
    if c["num-rounds"] < 1:
        raise ConfigError(f"{c['algorithm']} needs num-rounds >= 1, got {c['num-rounds']}")


def k_range(text: str) -> tuple[int, int]:
    """``'a:b'`` -> (a, b), 2 <= a < b (the k-range of a choose-k run)."""
    try:
        low, high = (int(part) for part in text.split(":"))
    except ValueError:
        raise ConfigError(f"run-config k-range must look like '2:20' (two integers a:b), got {text!r}") from None
    if not 2 <= low < high <= 1000:
        raise ConfigError(f"run-config k-range a:b needs 2 <= a < b <= 1000, got {text!r}")
    return low, high


def _standardize_rules(c: dict[str, Any]) -> None:
    if not c["standardize"]:
        return
    if c["algorithm"] == "feddp-kmeans":
        raise ConfigError("standardize is not available with feddp-kmeans: the exact per-device sums it needs are not "
                          "covered by the privacy guarantee (scale the data before the run)")
    if c["algorithm"] in ("fedspectral", "fedspectral-plus"):
        raise ConfigError(f"standardize is for point data; {c['algorithm']} clusters a graph")


def _label_rules(c: dict[str, Any]) -> None:
    if c["write-labels"] and c["algorithm"] in ("fedspectral", "fedspectral-plus"):
        raise ConfigError("write-labels is for center-based algorithms: a graph run stores one label per graph node in labels.npy")


def _k_range_rules(c: dict[str, Any]) -> None:
    if not c["k-range"]:
        return
    if c["algorithm"] != "fedkmeans":
        raise ConfigError(f"run-config k-range is a FedKMeans study (algorithm='fedkmeans'), not {c['algorithm']!r}")
    k_range(c["k-range"])


RULES = (_data_rules, _init_rules, _feddp_rules, _spectral_rules, _k_range_rules, _label_rules, _standardize_rules)


def parse_run_config(text: str) -> dict[str, Any]:
    """Parse Flower's ``--run-config`` syntax: ``"k=5 dataset='npy-dir' tol=1e-6"``, or
    the path of a TOML file of such keys (as ``flwr run --run-config FILE.toml``).

    Each whitespace-separated ``key=value`` pair is read as one TOML assignment, so
    strings need quotes and numbers/booleans do not.
    """
    stripped = text.strip()
    if stripped.endswith(".toml") and "=" not in stripped:
        from pathlib import Path

        path = Path(stripped).expanduser()
        if not path.is_file():
            raise ConfigError(f"run-config file {path} does not exist")
        try:
            return tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"run-config file {path} is not valid TOML: {exc}") from exc
    out: dict[str, Any] = {}
    for item in _split_outside_quotes(text):
        if "=" not in item:
            raise ConfigError(f"run-config item {item!r} is not of the form key=value")
        key, value = item.split("=", 1)
        try:
            out[key.strip()] = tomllib.loads(f"v = {value}")["v"]
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(
                f"run-config value for {key!r} is not valid TOML ({value!r}): strings need quotes"
            ) from exc
    return out


def _split_outside_quotes(text: str) -> list[str]:
    """Split on whitespace that is not inside single or double quotes."""
    items, current, quote = [], [], None
    for char in text:
        if quote:
            current.append(char)
            if char == quote:
                quote = None
        elif char in "'\"":
            quote = char
            current.append(char)
        elif char.isspace():
            if current:
                items.append("".join(current))
                current = []
        else:
            current.append(char)
    if quote:
        raise ConfigError(f"run-config has an unterminated {quote} quote: {text!r}")
    if current:
        items.append("".join(current))
    return items


def markdown_table() -> str:
    """The README's run-config table, generated from :data:`SECTIONS`."""
    lines = ["| key | default | range | meaning |", "|---|---|---|---|"]
    for section, keys in SECTIONS.items():
        lines.append(f"| **{section}** | | | |")
        for key in keys:
            if isinstance(key.allowed, StrOptions):
                allowed = " / ".join(key.allowed.options)
            elif key.allowed is not None:
                allowed = str(key.allowed)
            else:
                allowed = key.kind.__name__
            default = str(key.default).lower() if isinstance(key.default, bool) else repr(key.default) if isinstance(key.default, str) else key.default
            lines.append(f"| `{key.name}` | {default} | {allowed} | {key.doc} |")
    return "\n".join(lines)


def write_generated_block(path: str, name: str, table: str) -> None:
    """Replace the block ``<!-- generated: python -m fedcluster.NAME -->`` ... ``<!-- end
    generated -->`` of the file at ``path`` (the README) with ``table``."""
    from pathlib import Path

    text = Path(path).read_text()
    start = f"<!-- generated: python -m fedcluster.{name} -->\n"
    head, found, rest = text.partition(start)
    if not found:
        raise SystemExit(f"{path} has no line {start.strip()!r}")
    _, end, tail = rest.partition("<!-- end generated -->")
    Path(path).write_text(head + start + table + "\n" + end + tail)


if __name__ == "__main__":  # python -m fedcluster.config [docs/reference.md]: print or rewrite the table
    import sys

    if len(sys.argv) > 1:
        write_generated_block(sys.argv[1], "config", markdown_table())
    else:
        print(markdown_table())
