"""FedSpectral's and FedSpectral+'s run-config sections (docs/ALGORITHMS.md §5)."""

from __future__ import annotations

from typing import Any, Mapping

from fedcluster.checks import Interval, StrOptions
from fedcluster.keys import MANY, SECAGG_NEIGHBOURS, SECAGG_THRESHOLD, SECURE_AGGREGATION, ConfigError, Key, Section


def _rules(c: Mapping[str, Any]) -> None:
    if c["num-nodes"] < 1:
        raise ConfigError(
            f"algorithm {c['algorithm']!r} needs run-config num-nodes: the global number of "
            "graph nodes (node ids are 0 .. num-nodes-1), e.g. num-nodes=1005 for email-Eu-core"
        )
    if c["k"] > c["num-nodes"]:
        raise ConfigError(f"k={c['k']} is larger than num-nodes={c['num-nodes']}")


def _plus_rules(c: Mapping[str, Any]) -> None:
    if c["num-rounds"] < 1:
        raise ConfigError(f"{c['algorithm']} needs num-rounds >= 1, got {c['num-rounds']}")
    n, k, extra = c["num-nodes"], c["k"], c["oversample"]
    block = k if c["mode"] == "paper" else min(n, k + (max(k, 10) if extra < 0 else extra))  # the strategy's block_size
    if n * block > BLOCK_VALUES_MAX:
        raise ConfigError(
            f"run-config num-nodes × (k + oversample) = {n} × {block} must be at most {BLOCK_VALUES_MAX}: "
            f"the server holds that many numbers per block (8 bytes each), and so does every message"
        )


# The largest graphs a run takes: FedSpectral+ holds num-nodes × block dense numbers (every
# message carries one block); FedSpectral a dense num-nodes × num-nodes co-association.
NUM_NODES_MAX = 1_000_000
BLOCK_VALUES_MAX = 2**25
COASSOCIATION_NODES_MAX = 10_000
NUM_NODES_DOC = "global number of graph nodes (ids 0 .. n-1)"
RUN_CONFIG = Section(
    "fedspectral",
    (  # docs/ALGORITHMS.md section 5: the one-shot co-association baseline
        Key(
            "num-nodes",
            0,
            NUM_NODES_DOC + " (a dense n × n co-association)",
            allowed=Interval(int, 0, COASSOCIATION_NODES_MAX),
        ),
        Key(
            "coassociation",
            "both-present",
            "FedSpectral co-association rule",
            allowed=StrOptions(("both-present", "all-clients")),
        ),
    ),
    rules=(_rules,),
    algorithms=("fedspectral",),
)
PLUS_RUN_CONFIG = Section(
    "fedspectral-plus",
    (  # docs/ALGORITHMS.md section 5: federated power iteration
        Key(
            "num-nodes",
            0,
            NUM_NODES_DOC + "; num-nodes × (k + oversample) at most 2^25",
            allowed=Interval(int, 0, NUM_NODES_MAX),
        ),
        Key("mode", "exact", "exact (summed global products) or paper", allowed=StrOptions(("exact", "paper"))),
        Key("iters", 1, "paper mode: local power steps per round", allowed=Interval(int, 1, MANY)),
        Key("oversample", -1, "exact mode: extra block columns (-1 = max(k, 10))", allowed=Interval(int, -1, MANY)),
        Key(
            "acceleration",
            "krylov",
            "exact mode: block Krylov + Rayleigh-Ritz, or none",
            allowed=StrOptions(("krylov", "none")),
        ),
        Key("max-basis", 0, "krylov: columns kept before a thick restart (0 = auto)", allowed=Interval(int, 0, MANY)),
        Key(
            "residual-tol",
            0.0,
            "exact mode: stop when every top-k Ritz residual is at most this (0 = never)",
            allowed=Interval(float, 0),
        ),
        Key("edge-copies", 1, "r, clients holding every edge", allowed=Interval(int, 1, MANY)),
        SECURE_AGGREGATION,
        SECAGG_THRESHOLD,
        SECAGG_NEIGHBOURS,
    ),
    rules=(_rules, _plus_rules),
    algorithms=("fedspectral-plus",),
)
