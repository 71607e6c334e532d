"""FedDP-KMeans' tasks: FedDP-Init's three steps, the histogram start and the noisy Lloyd
rounds; every statistic clipped on the device at the privacy level the request names."""

from __future__ import annotations

from fedcluster.checks import Interval, StrOptions
from fedcluster.privacy.clipping import DATA_POINT, LEVELS
from fedcluster.task import CENTERS, DIM, NUM_EXAMPLES, ArrayField, Limit, Param, Task

ORIGIN = ArrayField(
    "origin",
    ("d",),
    "the public point the device's points are taken around (clipped within "
    "clip-norm of it; every statistic is of x - origin); absent: the origin",
    optional=True,
)
LEVEL = Param("level", str, DATA_POINT, allowed=StrOptions(LEVELS), doc="privacy level")
CLIP_NORM = Param(
    "clip-norm",
    float,
    None,
    allowed=Interval(float, 0, closed="right"),
    doc="data-point level: clip every point to this norm",
)
CLIP = Param(
    "clip",
    float,
    None,
    allowed=Interval(float, 0, closed="right"),
    doc="client level: L2 bound of the Gaussian-noised statistic",
)
NORMALIZE = Param(
    "normalize",
    bool,
    False,
    doc="client level: scale the statistic to L2 norm exactly `clip` (a zero one stays zero) instead of clipping it",
)
MAX_POINTS = Param(
    "max-points",
    int,
    0,
    allowed=Interval(int, 0),
    doc="data-point level: use at most this many points (the same subset in every step, by a per-point rule; 0 = all)",
)
CLIP_L1 = Param(
    "clip-l1",
    float,
    None,
    allowed=Interval(float, 0, closed="right"),
    doc="client level: L1 bound of the Laplace-noised statistic",
)

TASKS = (
    Task(
        "feddp_outer",
        "query",
        "FedDP-Init step 1: XᵀX as its packed upper triangle",
        request=(ORIGIN,),
        config=(LEVEL, CLIP_NORM, MAX_POINTS, CLIP, NORMALIZE),
        reply=(ArrayField("outer", ("p",)),),
        metrics=(NUM_EXAMPLES, DIM),
        used_by=("feddp-kmeans",),
        limits=(
            Limit(
                "p", "d(d+1)/2", lambda config, sizes: sizes["d"] * (sizes["d"] + 1) // 2 if sizes.get("d") else None
            ),
        ),
    ),
    Task(
        "feddp_histogram",
        "query",
        "FedDP-Init step 2: histogram of the nearest projected server point",
        request=(ArrayField("projection", ("d", "r")), ArrayField("server", ("s", "r")), ORIGIN),
        config=(LEVEL, CLIP_NORM, MAX_POINTS, CLIP_L1),
        reply=(ArrayField("histogram", ("s",), nonnegative=True, role="count"),),
        used_by=("feddp-kmeans",),
        counts="at-most",
    ),
    Task(
        "feddp_candidates",
        "query",
        "FedDP histogram start: histogram of the nearest candidate (server points, or drawn independently of any data)",
        request=(ArrayField("candidates", ("s", "d")), ORIGIN),
        config=(LEVEL, CLIP_NORM, MAX_POINTS, CLIP_L1),
        reply=(ArrayField("histogram", ("s",), nonnegative=True, role="count"),),
        summable=True,
        used_by=("feddp-kmeans",),
        counts="at-most",
    ),
    Task(
        "feddp_projected_stats",
        "query",
        "FedDP-Init step 3: statistics of the projected assignment",
        request=(ArrayField("projection", ("d", "r")), ArrayField("centers", ("k", "r")), ORIGIN),
        config=(
            LEVEL,
            CLIP_NORM,
            MAX_POINTS,
            CLIP,
            CLIP_L1,
            Param("margin", float, 1.0, allowed=Interval(float, 0, closed="right"), doc="margin filter (1: off)"),
        ),
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
        "feddp_lloyd",
        "query",
        "FedDP-Lloyds: per-cluster sums and counts, clipped on the device",
        request=(CENTERS, ORIGIN),
        config=(
            LEVEL,
            CLIP_NORM,
            MAX_POINTS,
            CLIP,
            CLIP_L1,
            Param(
                "radius",
                float,
                None,
                allowed=Interval(float, 0, closed="right"),
                doc=(
                    "data-point level, relative update: sums of each point's displacement from its center, clipped "
                    "to this norm"
                ),
            ),
        ),
        reply=(ArrayField("sums", ("k", "d")), ArrayField("counts", ("k",), nonnegative=True, role="count")),
        summable=True,
        used_by=("feddp-kmeans",),
        counts="at-most",
    ),
)
