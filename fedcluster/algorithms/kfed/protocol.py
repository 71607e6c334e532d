"""k-FED's task: the device's local k'-means."""

from __future__ import annotations

from fedcluster.checks import Interval, StrOptions
from fedcluster.task import LOCAL_CENTERS, SEED, ArrayField, Limit, Param, Task

NODE_K_PRIME_MAX = 10_000  # the most local clusters a node's own k-prime may ask for

TASKS = (
    Task(
        "kfed_local",
        "query",
        "k-FED step 1: the device's local k'-means (Awasthi-Sheffet)",
        config=(
            Param(
                "k-prime",
                int,
                allowed=Interval(int, 0),
                doc="local clusters k' (0: the device chooses, up to k; a node's own --node-config k-prime wins)",
            ),
            Param(
                "k",
                int,
                1,
                allowed=Interval(int, 1),
                doc="global clusters: the most local clusters a device chooses (k-prime = 0)",
            ),
            Param("n-init", int, 10, allowed=Interval(int, 1), doc="device restarts (1: the paper)"),
            Param("max-iter", int, 100, allowed=Interval(int, 1), doc="Lloyd steps"),
            Param(
                "seeding", str, "best", allowed=StrOptions(("best", "core", "voronoi")), doc="start of the Lloyd steps"
            ),
            SEED,
        ),
        reply=(
            LOCAL_CENTERS[0],
            ArrayField(
                "counts", ("c",), "points in each", nonnegative=True, integer=True, role="count", dtype="integer"
            ),
            ArrayField("cost", (1,), "the local k'-means cost (its points to their local centers)", nonnegative=True),
        ),
        used_by=("kfed",),
        counts="all",
        limits=(
            Limit(
                "c",
                f"the larger of k-prime, k and {NODE_K_PRIME_MAX} (a node's own k-prime)",
                lambda config, sizes: max(int(config.get("k-prime", 0)), int(config.get("k", 1)), NODE_K_PRIME_MAX),
            ),
        ),
    ),
)
