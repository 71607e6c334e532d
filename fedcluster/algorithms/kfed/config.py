"""k-FED's run-config section (docs/ALGORITHMS.md §4)."""

from __future__ import annotations

from fedcluster.checks import Interval, StrOptions
from fedcluster.keys import MANY, STANDARDIZE, WRITE_LABELS, Key, Section

WEIGHTINGS = ("count", "uniform", "capped-count")

RUN_CONFIG = Section(
    "kfed",
    (  # docs/ALGORITHMS.md section 4
        Key(
            "k-prime",
            0,
            "local clusters per device; 0: each device chooses from its own data, up to k (fewer only "
            "when its clusters are separated beyond doubt); the paper's rule is ceil(sqrt(k))",
            allowed=Interval(int, 0, MANY),
        ),
        Key(
            "kfed-weighting",
            "count",
            "weighting of device centers in the merge; capped-count: no device weighs "
            "more than the median device (robust to inflated counts)",
            allowed=StrOptions(WEIGHTINGS),
        ),
        Key(
            "kfed-min-devices",
            1,
            "a global cluster must gather centers of at least this many devices, else its "
            "centers are left out of the merge (1 = the paper; 2: one device cannot claim a cluster of its own)",
            allowed=Interval(int, 1, MANY),
        ),
        Key("kfed-to-convergence", True, "server Lloyd to convergence (false = one round, the paper)"),
        Key(
            "kfed-server-starts",
            100,
            "merge starts scored on the server; they stop once ten further starts reproduced the best grouping (1 = "
            "the paper)",
            allowed=Interval(int, 1, 10_000),
        ),
        Key(
            "kfed-device-restarts",
            10,
            "local k'-means restarts on each device (1 = the paper)",
            allowed=Interval(int, 1, 10_000),
        ),
        Key("kfed-evaluate", True, "one extra round measuring the federated cost of the result"),
        STANDARDIZE,
        WRITE_LABELS,
    ),
    algorithms=("kfed",),
)
