"""FedDP-KMeans' run-config section (docs/ALGORITHMS.md §3): its keys, their ranges, and the
rules that check them together (which start and which private steps a run makes)."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from fedcluster.checks import Interval, StrOptions
from fedcluster.keys import (
    MANY,
    SECAGG_NEIGHBOURS,
    SECAGG_THRESHOLD,
    SECURE_AGGREGATION,
    SEED_MAX,
    SERVER_DATA,
    WRITE_LABELS,
    ConfigError,
    Key,
    Section,
    number_list,
)
from fedcluster.privacy.clipping import CLIENT, DATA_POINT, LEVELS

INIT_METHODS = ("feddp", "histogram", "server-kmeans++", "server-lloyds", "sphere-packing")
DATA_FREE_STARTS = ("histogram", "sphere-packing")  # need no server data
INIT_STEPS = ("step1", "step2", "step3_gaussian", "step3_laplace")
LLOYD_STEPS = ("lloyd_gaussian", "lloyd_laplace")


# ==================================================================== run config
def step_names(config: Mapping[str, Any]) -> tuple[str, ...]:
    """The private steps a run uses, in the order ``step-epsilons`` lists them (``init =
    auto``: :func:`start_method`)."""
    has_server_data = bool(config["server-data"]) or config["dataset"] == "feddp-mixture"  # as the strategy finds it
    start = start_method(config["init"], has_server_data, config["privacy-level"], config["lloyd-rounds"])
    steps = INIT_STEPS if start == "feddp" else ("step2",) if start == "histogram" else ()
    return steps + (LLOYD_STEPS if config["lloyd-rounds"] > 0 else ())


CLIP_CENTERS = ("auto", "server-mean", "origin")


def clip_center_point(text: str) -> np.ndarray | None:
    """``clip-center`` as a public point (None for one of :data:`CLIP_CENTERS`); a
    ConfigError naming the key for anything else."""
    if text in CLIP_CENTERS:
        return None
    try:
        point = np.array([float(item) for item in text.split(",")], dtype=np.float64)
    except ValueError:
        raise ConfigError(
            f"run-config clip-center must be one of {', '.join(CLIP_CENTERS)} or a point 'x1,...,xd' "
            f"of comma-separated numbers, got {text!r}"
        ) from None
    if not np.all(np.isfinite(point)) or np.max(np.abs(point)) > 1e150:
        raise ConfigError(
            f"run-config clip-center must be a point of finite coordinates at most 1e150 in size, got {text!r}"
        )
    return point


# Ranges of the privacy keys. A target epsilon is calibrated within EPSILON (above, epsilon =
# inf runs without noise; below, no noise multiplier reaches it), a δ within DELTA and a
# sampling rate within SAMPLING_RATE (the privacy loss distributions of smaller ones take
# minutes and gigabytes to account). A bound Δ (clip-norm, and
# the client-level bounds of first-power statistics) enters the statistics squared, and step
# 1's eigensolver squares those again: Δ⁴ times the noise and the point count stay within
# float64. (The data's dimension is held to each start's own limit: start_problem.)
EPSILON = Interval(float, 1e-3, 100, allow_inf=True)
DELTA = Interval(float, 1e-12, 1, closed="left")
SAMPLING_RATE = Interval(float, 1e-4, 1)
CLIP_MAX = 1e60


def _value_rules(c: Mapping[str, Any]) -> None:
    """Values that must agree with another key's: the clip center's size, the budgets' lists."""
    point = clip_center_point(c["clip-center"])
    if point is not None and c["dimension"] and point.size != c["dimension"]:
        raise ConfigError(
            f"run-config clip-center is a point of {point.size} coordinates but dimension={c['dimension']}"
        )
    if c["step-epsilons"] and max(number_list(c["step-epsilons"], "step-epsilons")) > EPSILON.high:
        raise ConfigError(
            f"run-config step-epsilons must each be at most {EPSILON.high:g} (as epsilon), got {c['step-epsilons']!r}"
        )
    if c["client-sampling-rate"] < 1 and c["privacy-level"] != CLIENT:
        raise ConfigError("client-sampling-rate < 1 is only accounted at privacy-level = 'client'")
    if c["budget-split"] and len(number_list(c["budget-split"], "budget-split")) != 4:
        raise ConfigError(
            f"run-config budget-split must be four positive numbers 'w1,w2,w3g,w3l', got {c['budget-split']!r}"
        )


def _step_rules(c: Mapping[str, Any]) -> None:
    """The steps a run takes, and what each needs."""
    steps = step_names(c)
    if c["step-epsilons"] and len(number_list(c["step-epsilons"], "step-epsilons")) != len(steps):
        raise ConfigError(
            f"run-config step-epsilons must give {len(steps)} positive values, one per step of this run "
            f"in the order {', '.join(steps) or '(none: this run has no private step)'}; got {c['step-epsilons']!r}"
        )
    if c["lloyd-update"] == "relative" and c["privacy-level"] != DATA_POINT:
        raise ConfigError(
            "lloyd-update = 'relative' is a data-point level update (its sums are clipped point by point)"
        )
    if c["init"] == "sphere-packing" and c["lloyd-rounds"] == 0:
        raise ConfigError(
            "init='sphere-packing' with lloyd-rounds = 0 returns centers that never saw the devices' "
            "data: set lloyd-rounds >= 1"
        )
    if c["init"] == "histogram" and c["lloyd-rounds"] == 0:
        raise ConfigError(
            "init='histogram' with lloyd-rounds = 0 returns candidate points, not cluster means: set lloyd-rounds >= 1"
        )
    if "step3_gaussian" in steps and c["lloyd-rounds"] > 0 and c["lloyd-fraction"] <= 0:
        raise ConfigError("lloyd-rounds > 0 needs lloyd-fraction > 0 (the Lloyd rounds' share of epsilon)")


def _secure_rules(c: Mapping[str, Any]) -> None:
    """What secure aggregation secures, and what it must not send in the clear."""
    if not c["secure-aggregation"]:
        return
    served = bool(c["server-data"]) or c["dataset"] == "feddp-mixture"
    if start_method(c["init"], served, c["privacy-level"], c["lloyd-rounds"]) == "feddp":
        raise ConfigError(
            "secure-aggregation = true secures the histogram start and the Lloyd sums, not FedDP-Init's "
            "steps: choose init = 'histogram', 'sphere-packing', 'server-kmeans++' or 'server-lloyds'"
        )
    if c["secagg-noise"] == "devices" and (c["step-epsilons"] or c["privacy-level"] == "client"):
        raise ConfigError(
            "secagg-noise = 'devices' calibrates one target epsilon at data-point level (at client level a "
            "device that leaves takes its noise share with it, which its accounting does not cover): drop "
            "step-epsilons, or set privacy-level = 'data-point' or secagg-noise = 'server'"
        )
    if c["evaluate-cost"]:
        raise ConfigError(
            "secure-aggregation = true with evaluate-cost = true would send each device's exact cost in "
            "the clear: set evaluate-cost = false"
        )


RUN_CONFIG = Section(
    "feddp-kmeans",
    (  # docs/ALGORITHMS.md section 3
        Key("privacy-level", DATA_POINT, "unit of privacy", allowed=StrOptions(LEVELS)),
        Key("epsilon", 1.0, "target total ε (inf = no noise)", allowed=EPSILON),
        Key("delta", 1e-6, "δ", allowed=DELTA),
        Key(
            "step-epsilons",
            "",
            "per-step ε 'e1,e2,...' instead of a target total; their PLD total must not exceed epsilon",
        ),
        Key(
            "budget-split",
            "",
            "relative shares of the budget (of ε; of ρ for the devices' noise) 'w1,w2,w3g,w3l' (default: "
            "the paper's rule of thumb; the devices' noise splits the Lloyd rounds' share between sums and counts as "
            "2√d : 1)",
        ),
        Key(
            "init",
            "auto",
            "initialization method (auto = histogram without server data, and with it at data-point "
            "level when lloyd-rounds >= 1, its candidates then server points; feddp otherwise)",
            allowed=StrOptions(("auto",) + INIT_METHODS),
        ),
        SERVER_DATA,
        Key("lloyd-rounds", 0, "T, FedDP-Lloyds rounds", allowed=Interval(int, 0, MANY)),
        Key("lloyd-fraction", 0.25, "share of ε for FedDP-Lloyds", allowed=Interval(float, 0, 1, closed="left")),
        Key(
            "lloyd-update",
            "auto",
            "FedDP-Lloyds: absolute (sums of the points, sensitivity Δ: the paper) or relative "
            "(sums of each point's displacement from its center clipped to lloyd-radius, sensitivity lloyd-radius; a "
            "center moves at most that far per round); auto = relative at data-point level after init histogram or "
            "sphere-packing, else absolute",
            allowed=StrOptions(("auto", "absolute", "relative")),
        ),
        Key(
            "lloyd-radius",
            0.0,
            "relative updates: the radius r (0 = 0.5·Δ/k^(1/d), at most Δ)",
            allowed=Interval(float, 0, CLIP_MAX),
        ),
        Key(
            "public-points",
            0,
            "the number of points lloyd-rounds was chosen from, treated as public (the estimator's "
            "rounds rule sets it); listed in privacy.not_covered; 0 = none",
            allowed=Interval(int, 0, MANY),
        ),
        Key(
            "clip-norm",
            0.0,
            "Δ, point norm bound around clip-center (0 = the server data's radius around it)",
            allowed=Interval(float, 0, CLIP_MAX),
        ),
        Key(
            "clip-center",
            "auto",
            "the public point devices take their points around and clip them within clip-norm of: "
            "server-mean (the server data's mean), origin (the paper), auto = server-mean with server data, origin "
            "without, "
            "or a point 'x1,...,xd' (public: without server data, data far from the origin need one near them; auto "
            "then warns)",
        ),
        Key(
            "dimension",
            0,
            "the data's dimension, public and agreed in advance (0 = the server data's); without "
            "server data the run starts from init='histogram' (or 'sphere-packing') in the cube inscribed in the ball "
            "of radius "
            "clip-norm",
            allowed=Interval(int, 0, 10**6),
        ),
        Key(
            "max-device-points",
            0,
            "data-point level: points one device may contribute (0 = no cap); a device "
            "with more uses the same subset of them in every step, a reply declaring more is dropped; a cap doubles "
            "the noise "
            "(neighbours then differ by a swapped point)",
            allowed=Interval(int, 0, 10**9),
        ),
        Key(
            "client-max-points",
            50,
            "m, points per client assumed by derived client-level bounds",
            allowed=Interval(int, 1, 10**9),
        ),
        Key(
            "clip-outer",
            0.0,
            "client level: bound of XᵀX (0 = each client's XᵀX scaled to Frobenius norm 1)",
            allowed=Interval(float, 0, CLIP_MAX**2),
        ),
        Key(
            "clip-histogram",
            0.0,
            "client level: bound of the histogram (0 = derived)",
            allowed=Interval(float, 0, CLIP_MAX),
        ),
        Key(
            "clip-means",
            0.0,
            "client level: bound of the step-3 means (0 = √k times the server data's root-mean-square norm, at most "
            "√k·Δ)",
            allowed=Interval(float, 0, CLIP_MAX),
        ),
        Key(
            "clip-nonempty",
            0.0,
            "client level: bound of the non-empty vector (0 = derived)",
            allowed=Interval(float, 0, CLIP_MAX),
        ),
        Key(
            "clip-sums",
            0.0,
            "client level: bound of the Lloyd sums (0 = derived)",
            allowed=Interval(float, 0, CLIP_MAX),
        ),
        Key(
            "clip-counts",
            0.0,
            "client level: bound of the Lloyd counts (0 = derived)",
            allowed=Interval(float, 0, CLIP_MAX),
        ),
        Key("client-sampling-rate", 1.0, "q, Poisson sampling of clients per step", allowed=SAMPLING_RATE),
        Key("margin", 1.0, "step-3 margin filter (1 = off)", allowed=Interval(float, 0, closed="right")),
        Key(
            "min-server-weight",
            5.0,
            "server points lighter than this are dropped in step 2",
            allowed=Interval(float, 0),
        ),
        Key("server-n-init", 10, "k-means restarts on the server's weighted points", allowed=Interval(int, 1, 10_000)),
        SECURE_AGGREGATION,
        Key(
            "secagg-noise",
            "devices",
            "with secure-aggregation: who adds the DP noise. devices: each adds its share of "
            "Skellam noise before masking (the server never holds a sum without noise; RDP accounting); server: the "
            "server adds it to the exact sum (central DP)",
            allowed=StrOptions(("devices", "server")),
        ),
        SECAGG_THRESHOLD,
        SECAGG_NEIGHBOURS,
        Key("noise-seed", -1, "seed of the noise (-1 = OS entropy)", allowed=Interval(int, -1, SEED_MAX)),
        Key("evaluate-cost", True, "report the exact (non-private) federated cost of the result"),
        WRITE_LABELS,
    ),
    rules=(_value_rules, _step_rules, _secure_rules),
    algorithms=("feddp-kmeans",),
)


def start_method(init: str, has_server_data: bool, level: str = DATA_POINT, lloyd_rounds: int = 0) -> str:
    """The start a run makes: ``init``, where ``auto`` is the private histogram start
    (:func:`histogram_start`; with server data its candidates are server points) without
    server data, or at data-point level when Lloyd rounds follow (the histogram gives
    candidate points, the rounds turn them into means); FedDP-Init otherwise (its step 3
    gives means)."""
    if init != "auto":
        return init
    histogram = not has_server_data or (level == DATA_POINT and lloyd_rounds >= 1)
    return "histogram" if histogram else "feddp"
