"""FedKMeans' run-config section (docs/ALGORITHMS.md §1)."""

from __future__ import annotations

from typing import Any, Mapping

from fedcluster.algorithms.kfed import config as kfed_config
from fedcluster.checks import Interval, StrOptions
from fedcluster.keys import (
    AGGREGATION,
    INIT_CANDIDATES,
    MANY,
    SERVER_DATA,
    STANDARDIZE,
    TRIM_FRACTION,
    WRITE_LABELS,
    ConfigError,
    Key,
    Section,
    k_range,
)

INITS = ("auto", "local-summaries", "kfed", "random-box", "server-kmeans++")


# init = 'kfed' starts from k-FED's one-shot merge, which reads k-FED's own keys.
KFED_START_KEYS = tuple(
    key
    for key in kfed_config.RUN_CONFIG.keys
    if key.name
    in (
        "k-prime",
        "kfed-weighting",
        "kfed-min-devices",
        "kfed-to-convergence",
        "kfed-server-starts",
        "kfed-device-restarts",
    )
)


def _rules(c: Mapping[str, Any]) -> None:
    if c["init"] == "server-kmeans++" and not c["server-data"]:
        raise ConfigError("init='server-kmeans++' needs run-config server-data (a .npy path)")
    if c["server-data"] and c["init"] != "server-kmeans++":
        raise ConfigError(
            f"run-config server-data is read by FedKMeans only with init='server-kmeans++', not init={c['init']!r}"
        )
    for key in KFED_START_KEYS:
        if c["init"] != "kfed" and c[key.name] != key.default:
            raise ConfigError(
                f"run-config {key.name} is read by FedKMeans only with init='kfed', not init={c['init']!r}"
            )
    if c["k-range"]:
        k_range(c["k-range"])


RUN_CONFIG = Section(
    "fedkmeans",
    (  # docs/ALGORITHMS.md section 1
        Key("fraction", 1.0, "C, fraction of nodes sampled per round", allowed=Interval(float, 0, 1, closed="right")),
        Key("local-epochs", 1, "E, local epochs", allowed=Interval(int, 1, MANY)),
        Key("batch-size", 0, "B, local mini-batch size (0 = full batch)", allowed=Interval(int, 0, 10**9)),
        Key(
            "client-lr",
            1.0,
            "β, client learning rate (the server recovers a device's means by dividing its centers' move "
            "by β: below 1e-6 float64 rounding, so amplified, would make honest replies look inconsistent)",
            allowed=Interval(float, 1e-6, 1),
        ),
        Key("server-lr", 1.0, "α, server learning rate", allowed=Interval(float, 0, 2, closed="right")),
        Key("momentum", 0.0, "μ, server momentum", allowed=Interval(float, 0, 1, closed="left")),
        Key(
            "reassign-threshold",
            0.01,
            "ρ, a cluster below this share of the largest cluster's count is starved",
            allowed=Interval(float, 0, 1),
        ),
        Key("reassign-patience", 20, "R, starved rounds before a cluster is re-seeded", allowed=Interval(int, 1, MANY)),
        Key("init", "auto", "initialization method", allowed=StrOptions(INITS)),
        Key(
            "n-init",
            0,
            "center sets trained side by side in the same round trips (scikit-learn's n_init, "
            "federated): the cheapest scored start and n-init − 1 unrefined k-means++ draws on the devices' summaries; "
            "a set that can no longer win stops, after half of the rounds only the cheapest trains on. 0: 16 sets "
            "while "
            "k·d ≤ 4096, fewer for larger centers (at most 65536 floats of centers per message)",
            allowed=Interval(int, 0, 64),
        ),
        INIT_CANDIDATES,
        Key(
            "init-server-starts",
            100,
            "k-means++ + Lloyd starts the server runs on each device summary; the "
            "init-candidates of lowest cost on the summary are scored on the devices (server time only)",
            allowed=Interval(int, 1, 100_000),
        ),
        Key("init-min-count", 2, "smallest local cluster a device may summarize", allowed=Interval(int, 1, 10**9)),
        Key(
            "init-coarse",
            True,
            "devices also summarize at ceil(sqrt(k)) local clusters; init-candidates more "
            "candidates are drawn on that coarse summary and scored in the same round",
        ),
        Key(
            "eval-every",
            0,
            "partial participation: the unsampled devices also score the centers every this many "
            "rounds (0 = never: a round contacts only its sampled devices, the center sets are ranked by the bound "
            "the server's memory gives, and the centers of lowest bound are scored by every device once, with the "
            "final evaluation)",
            allowed=Interval(int, 0, MANY),
        ),
        Key(
            "tol",
            0.0,
            "stop when the centers move at most this much (0: only at a fixed point, stop-when-fixed)",
            allowed=Interval(float, 0),
        ),
        Key(
            "stop-when-fixed",
            True,
            "stop once a full-batch round over every node leaves every center set standing where it was (the rounds "
            "left would repeat it); false: run num-rounds",
        ),
        Key(
            "server-memory",
            True,
            "aggregate every node's latest statistics (unsampled ones as last reported; every node sends its "
            "statistics of the start in round 1); false: this round's replies only (the paper)",
        ),
        AGGREGATION,
        TRIM_FRACTION,
        SERVER_DATA,
        *KFED_START_KEYS,
        Key(
            "k-range",
            "",
            "choose k: 'a:b' scores every k in a..b in one federated round and reports the elbow "
            "and the Calinski-Harabasz choice instead of training (k is then unused)",
        ),
        STANDARDIZE,
        WRITE_LABELS,
    ),
    rules=(_rules,),
    algorithms=("fedkmeans",),
)
