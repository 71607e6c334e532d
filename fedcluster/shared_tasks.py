"""The tasks several algorithms share: the data summary, Lloyd statistics of given centers,
the cost of candidate center sets, labels written beside the data, and ``identify``. Their
kernels: :mod:`fedcluster.shared_kernels`."""

from __future__ import annotations

from .task import CENTERS, DIM, NUM_EXAMPLES, ArrayField, Param, Task


TASKS = (
    Task(
        "data_summary",
        "query",
        "size, dimension and bounding box of the device's points (with `moments`: their sums and scatter about their "
        "mean)",
        config=(
            Param(
                "moments",
                bool,
                False,
                doc="also the per-feature sums and scatter (they bind its later statistics; standardize)",
            ),
        ),
        reply=(
            ArrayField("min", ("d",), role="box-min"),
            ArrayField("max", ("d",), role="box-max"),
            ArrayField("sum", ("d",), when=("moments", True), role="moment-sum"),
            ArrayField(
                "scatter",
                ("d",),
                "per feature, the sum of squared deviations of its points from their mean",
                nonnegative=True,
                when=("moments", True),
                role="moment-scatter",
            ),
        ),
        metrics=(NUM_EXAMPLES, DIM),
    ),
    Task(
        "identify",
        "query",
        "nothing of its data: only the partition every reply states (a resumed run matches the nodes connected now "
        "to its own by it)",
        metrics=(),
    ),
    Task(
        "lloyd_stats",
        "query",
        "per-cluster sums, counts and cost of the given centers",
        request=(CENTERS,),
        reply=(
            ArrayField("sums", ("k", "d"), role="sum"),
            ArrayField("counts", ("k",), nonnegative=True, role="count"),
            ArrayField("cost", (1,), nonnegative=True, role="cost", of="centers"),
        ),
        counts="all",
    ),
    Task(
        "write_labels",
        "query",
        "label its own points with the centers and save them beside its data file; only whether it wrote is sent",
        request=(CENTERS,),
        reply=(ArrayField("written", (1,), nonnegative=True),),
    ),
    Task(
        "score_candidates",
        "query",
        "k-means cost of each of m candidate center sets",
        request=(ArrayField("candidates", ("m", "k", "d")),),
        reply=(ArrayField("costs", ("m",), nonnegative=True, role="cost", of="candidates"),),
    ),
)
