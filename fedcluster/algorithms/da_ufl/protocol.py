"""DA-UFL's tasks: the SOM codebook, the points per bin, and a dual-averaging step."""

from __future__ import annotations

from fedcluster.checks import Interval, StrOptions
from fedcluster.task import CENTERS, SEED, ArrayField, Limit, Param, Task

BINNING = Param(
    "binning", str, "codebook", allowed=StrOptions(("grid", "codebook")), doc="grid cells or nearest codebook vector"
)

TASKS = (
    Task(
        "som_codebook",
        "query",
        "DA-UFL phase 1 (UFLSOM): a Kohonen SOM codebook of the device's points",
        config=(
            Param(
                "grid",
                int,
                4,
                allowed=Interval(int, 1, 100),
                doc="grid × grid units at most (a device with fewer points uses fewer)",
            ),
            Param("epochs", int, 30, allowed=Interval(int, 1, 10_000), doc="batch SOM passes over the points"),
            SEED,
        ),
        reply=(
            ArrayField(
                "codebook", ("u", "d"), "the SOM units (u ≤ grid², a square): weighted means of its points", role="mean"
            ),
        ),
        used_by=("da-ufl",),
        limits=(Limit("u", "grid²", lambda config, sizes: int(config.get("grid", 4)) ** 2),),
    ),
    Task(
        "bin_counts",
        "query",
        "DA-UFL phase 2: points per bin (grid cell or nearest codebook vector)",
        request=(
            ArrayField("low", ("d",), when=("binning", "grid")),
            ArrayField("high", ("d",), when=("binning", "grid")),
            ArrayField("codebook", ("q", "d"), when=("binning", "codebook")),
        ),
        config=(
            BINNING,
            Param("bins", int, 10, allowed=Interval(int, 1), doc="grid cells per dimension"),
        ),
        reply=(ArrayField("counts", ("q",), nonnegative=True, integer=True, role="count"),),
        counts="at-most",
        used_by=("da-ufl",),
    ),
    Task(
        "daufl_step",
        "train",
        "DA-UFL inner step: perturbed labels, weighted gradients g_k and counts W_k",
        request=(
            CENTERS,
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
            SEED,
        ),
        reply=(
            ArrayField("gradient", ("k", "d")),
            ArrayField("weight", ("k",), nonnegative=True),
            ArrayField("changed", (1,), nonnegative=True, integer=True),
        ),
        used_by=("da-ufl",),
    ),
)
