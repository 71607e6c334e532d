"""FedKMeans' tasks: the local summary of the default start, and a training round."""

from __future__ import annotations

from fedcluster.checks import Interval
from fedcluster.task import LOCAL_CENTERS, SEED, ArrayField, Limit, Param, Task


TASKS = (
    Task(
        "local_summary",
        "query",
        "a local k-means (centers, counts); clusters under min-count points suppressed",
        config=(
            Param("k", int, allowed=Interval(int, 1), doc="local clusters"),
            Param("min-count", int, 2, allowed=Interval(int, 1), doc="smallest cluster that may leave the device"),
            Param("n-init", int, 1, allowed=Interval(int, 1), doc="local k-means restarts"),
            SEED,
        ),
        reply=LOCAL_CENTERS,
        used_by=("fedkmeans",),
        counts="at-most",
        limits=(Limit("c", "k", lambda config, sizes: config.get("k")),),
    ),
    Task(
        "fedkmeans_train",
        "train",
        "ClientKMeans from each of the m sets of global centers trained side by side (n-init); the cost of each set "
        "received",
        request=(ArrayField("centers", ("m", "k", "d"), "the global centers of every set"),),
        config=(
            Param("local-epochs", int, 1, allowed=Interval(int, 1), doc="E"),
            Param("batch-size", int, 0, allowed=Interval(int, 0), doc="B (0: full batch)"),
            Param("client-lr", float, 1.0, allowed=Interval(float, 0, 1, closed="right"), doc="β"),
            SEED,
        ),
        reply=(
            ArrayField("centers", ("m", "k", "d"), role="mean", of="centers"),
            ArrayField("counts", ("m", "k"), nonnegative=True, role="count"),
            ArrayField(
                "scatter",
                ("m", "k", "d"),
                "per cluster and coordinate, the sum of squared deviations of the "
                "points it assigned (last epoch) from their mean",
                nonnegative=True,
                role="scatter",
            ),
            ArrayField("cost", ("m",), nonnegative=True, role="cost", of="centers"),
        ),
        used_by=("fedkmeans",),
        counts="all",
    ),
)
