"""FedSpectral's and FedSpectral+'s tasks: spectral clustering of the local graph, and a
product of the local adjacency with the server's block."""

from __future__ import annotations

from fedcluster.checks import Interval, StrOptions
from fedcluster.task import NUM_EXAMPLES, SEED, ArrayField, Param, Task

NUM_NODES = Param("num-nodes", int, allowed=Interval(int, 1), doc="global number of graph nodes")

TASKS = (
    Task(
        "power_step",
        "train",
        "FedSpectral+: local power steps (paper) or one global product (exact)",
        request=(ArrayField("Q", ("n", "b")), ArrayField("degrees", ("n",), nonnegative=True, optional=True)),
        config=(
            NUM_NODES,
            Param("iters", int, 1, allowed=Interval(int, 1), doc="local power steps (paper mode)"),
            Param(
                "normalization",
                str,
                "local",
                allowed=StrOptions(("local", "global")),
                doc="local: paper; global: exact",
            ),
            Param(
                "edge-weight",
                float,
                1.0,
                allowed=Interval(float, 0, closed="right"),
                doc="1/r for edges held by r clients",
            ),
        ),
        reply=(ArrayField("Q", ("n", "b")),),
        summable=True,
        used_by=("fedspectral-plus",),
    ),
    Task(
        "local_spectral_labels",
        "query",
        "FedSpectral: spectral clustering of the local graph",
        config=(
            NUM_NODES,
            Param("k", int, allowed=Interval(int, 1), doc="clusters"),
            Param("block", int, 0, allowed=Interval(int, 0), doc="block columns (0: auto)"),
            Param("max-iters", int, 1000, allowed=Interval(int, 1), doc="block products at most"),
            Param("tol", float, 1e-6, allowed=Interval(float, 0), doc="Ritz residual to stop at"),
            SEED,
        ),
        reply=(ArrayField("labels", ("n",), integer=True, dtype="integer"),),
        metrics=(NUM_EXAMPLES, "num-local-nodes"),
        used_by=("fedspectral",),
    ),
)
