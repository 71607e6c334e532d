"""DA-UFL's run-config section (docs/ALGORITHMS.md §2)."""

from __future__ import annotations

from fedcluster.checks import Interval, StrOptions
from fedcluster.keys import AGGREGATION, INIT_CANDIDATES, MANY, STANDARDIZE, TRIM_FRACTION, WRITE_LABELS, Key, Section

MAX_BINS = 10**6  # grid cells: every agent's weights and counts, and the server's cell centers, are arrays of them

RUN_CONFIG = Section(
    "da-ufl",
    (  # docs/ALGORITHMS.md section 2
        Key(
            "weighting",
            "uniform",
            "UFLUni (w_j = 1/J; the SOM codebooks still start the centers), UFLSOM (SOM-codebook "
            "bins) or UFLBin (grid bins): the bin weights count an observation several agents share once, and "
            "re-weight "
            "real points when agents hold different ones (docs: DA-UFL)",
            allowed=StrOptions(("uniform", "som", "bin")),
        ),
        Key(
            "xi-max",
            0.05,
            "ξ_max, label perturbation ξ ~ U(0, ξ_max) per point and cluster (0 = off)",
            allowed=Interval(float, 0, 10),
        ),
        Key(
            "eta",
            1.0,
            "η of the dual-averaging step (1 = one inner step is a weighted Lloyd step)",
            allowed=Interval(float, 0, 1, closed="right"),
        ),
        Key(
            "eps-glo",
            1e-6,
            "ε_glo: inner loop stops when no center moves more than this × the bounding-box diagonal",
            allowed=Interval(float, 0, 1),
        ),
        Key("bins", 10, "UFLBin: grid cells per dimension (b^d cells)", allowed=Interval(int, 1, 10_000)),
        Key(
            "max-bins",
            100_000,
            "UFLBin: refuse a grid of more cells than this (b^d grows with d; the server holds a weight "
            "of every cell for every agent)",
            allowed=Interval(int, 1, MAX_BINS),
        ),
        Key(
            "som-grid",
            0,
            "UFLSOM: SOM of som-grid × som-grid units per device (0: about 4k units, at least 4 × 4; "
            "a device with fewer points uses fewer units)",
            allowed=Interval(int, 0, 100),
        ),
        Key("som-epochs", 30, "UFLSOM: batch SOM passes over each device's points", allowed=Interval(int, 1, 10_000)),
        Key(
            "init-restarts",
            50,
            "k-means++ starts on the bin representatives, each refined by weighted Lloyd there (server only); 0 = the "
            "paper's single draw",
            allowed=Interval(int, 0, 10_000),
        ),
        INIT_CANDIDATES,
        Key("outer-iterations", 100, "t1 limit: outer (labelling) iterations", allowed=Interval(int, 1, MANY)),
        Key(
            "inner-iterations", 50, "t2 limit: dual-averaging steps per outer iteration", allowed=Interval(int, 1, MANY)
        ),
        AGGREGATION,
        TRIM_FRACTION,
        STANDARDIZE,
        WRITE_LABELS,
    ),
    algorithms=("da-ufl",),
)
