"""FedDP-KMeans (Scott et al. 2025; docs/ALGORITHMS.md §3): everything that never touches a
Flower message. NumPy only at import time (a device needs nothing else).

- Device kernels (``feddp_outer``, ``feddp_histogram``, ``feddp_projected_stats``,
  ``feddp_lloyd``): each applies the privacy level's clipping ON THE DEVICE, before
  anything leaves it (data-point: points clipped to Δ = ``clip-norm`` once; client: each
  statistic clipped as a whole, L2 ``clip`` / L1 ``clip-l1``).
- Server-side math, called by ``fedcluster/algorithms/feddp_kmeans/strategy.py``: the privacy plan (steps,
  rule-of-thumb weights, sensitivities, calibration), the reply bound checks, the noisy
  aggregates, the top eigenvectors, and the SpherePacking baseline. The privacy plan
  loads :mod:`fedcluster.privacy`'s server modules (SciPy, dp_accounting) on first use.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Mapping, Sequence

import numpy as np

import fedcluster.privacy as privacy
from fedcluster.kernel import DeviceData
from fedcluster.linalg import top_eigenpairs
from fedcluster.lloyd import (
    LloydStatistics,
    assign,
    farthest_first,
    kmeans,
    rows_per_chunk,
    squared_distances,
)
from fedcluster.privacy.clipping import CLIENT, DATA_POINT, clip_l1, clip_rows_l2
from fedcluster.shared_kernels import matching_dimension

from .config import DATA_FREE_STARTS, INIT_STEPS, LLOYD_STEPS, clip_center_point
from .config import start_method, step_names  # noqa: F401 (what the strategy reads through this module)

# ==================================================================== device kernels
# Tasks (message types ``query.<task>``; the protocol table is fedcluster/protocol.py):
#   feddp_outer            step 1: XᵀX as its packed upper triangle (d(d+1)/2 values);
#                          at client level scaled to Frobenius norm ``clip`` (``normalize``)
#                          or clipped to it
#   feddp_histogram        step 2: per projected server point (rows of ``server``), how
#                          many projected device points XV have it as their nearest
#   feddp_projected_stats  step 3: assignment to the nearest projected center ν, margin
#                          filter (keep x iff ||xV − ν_r|| ≤ margin·||xV − ν_s|| for all
#                          s ≠ r); sums and counts of the ORIGINAL points (data-point) or
#                          per-cluster means and a 0/1 non-empty vector (client)
#   feddp_candidates       the histogram start: per candidate (server points, and points
#                          drawn independently of any data), how many of the device's
#                          points have it as their nearest
#   feddp_lloyd            FedDP-Lloyds: full-space sums and counts (relative: of the
#                          points' displacements from their centers, clipped to ``radius``)


def _bound(config: dict[str, Any], key: str) -> float:
    """A clipping bound the protocol declares optional but this level needs (the protocol
    already checked that it is a number > 0 when present)."""
    if config.get(key) is None:
        raise ValueError(f"the message config has no clipping bound {key!r}")
    return config[key]


def private_points(data: DeviceData, arrays: dict[str, np.ndarray], config: dict[str, Any]) -> np.ndarray:
    """The points a FedDP kernel may use, taken around the request's public ``origin``
    (``x − origin``; the origin itself when absent): clipped to norm Δ = ``clip-norm`` at
    data-point level (computed once per (origin, Δ) and cached on the device), as they
    are at client level.

    At data-point level with ``max-points`` = m > 0, a device holding more than m points
    uses the same m of them in every step: :func:`capped_rows`, a rule under which adding
    or removing one point changes the subset by at most one point (the sensitivities are
    then those of replacing a point, ``clipping_bounds(capped=True)``)."""
    X = np.asarray(data.require_points(), dtype=np.float64)
    if X.shape[0] == 0:
        raise ValueError(f"the device holds no points ({data.source})")
    origin = arrays.get("origin")
    if origin is not None:
        matching_dimension(X, origin, "origin")  # a clear error for another dimension
    if config["level"] == CLIENT:
        return X if origin is None else X - origin
    delta = _bound(config, "clip-norm")
    cap = int(config.get("max-points") or 0)
    key = ("feddp-clipped", delta, cap, X.shape, None if origin is None else origin.tobytes())
    cached = data.extra.get(key)
    if cached is None:
        if 0 < cap < X.shape[0]:
            X = X[capped_rows(X, cap)]  # the same subset whatever the origin
        cached = clip_rows_l2(X if origin is None else X - origin, delta)
        data.extra[key] = cached
    return cached


def held(data: DeviceData) -> int:
    """The device's number of points (its declaration, ``num-examples``), whatever a cap
    lets the FedDP steps use."""
    return int(data.require_points().shape[0])


def usable_points(num_examples: int, level: str, cap: int) -> int:
    """How many points a data-point level reply's statistics may stand for: the declared
    n, at most ``max-device-points`` when that is set (an honest capped device uses exactly
    min(n, cap))."""
    return min(int(num_examples), int(cap)) if level == DATA_POINT and cap > 0 else int(num_examples)


_MIX = (np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB))


def point_priority(X: np.ndarray) -> np.ndarray:
    """A pseudo-random 64-bit priority of every row, a function of the row's values alone
    (splitmix64 over the bits of its coordinates): equal rows get equal priorities."""
    bits = np.ascontiguousarray(X, dtype=np.float64).view(np.uint64)
    priority = np.full(bits.shape[0], _MIX[0])
    for column in bits.T:
        z = priority ^ column
        z = (z ^ (z >> np.uint64(30))) * _MIX[1]
        z = (z ^ (z >> np.uint64(27))) * _MIX[2]
        priority = (z ^ (z >> np.uint64(31))) + _MIX[0]
    return priority


def capped_rows(X: np.ndarray, cap: int) -> np.ndarray:
    """Indices (ascending) of the ``cap`` rows of X that rank first by (priority, values):
    a total order on point values, so the subset depends on the device's points as a
    multiset and adding one point either leaves it alone or swaps one point in for one out.
    A subset drawn from a seed of (n, cap) would change wholesale when n changes by one."""
    if X.shape[0] <= cap:
        return np.arange(X.shape[0])
    priority = point_priority(X)
    last = np.partition(priority, cap - 1)[cap - 1]
    first, tied = np.flatnonzero(priority < last), np.flatnonzero(priority == last)
    if tied.size > cap - first.size:  # equal priorities: equal rows, or (rarely) a collision broken by the values
        bits = np.ascontiguousarray(X[tied], dtype=np.float64).view(np.uint64)
        tied = tied[np.lexsort(bits.T[::-1])][: cap - first.size]
    return np.sort(np.concatenate([first, tied]))


def _projection(arrays: dict[str, np.ndarray], d: int) -> np.ndarray:
    """The projection V (d x r); the protocol checked its rank, finiteness and that its r
    matches the other arrays' — here only that d is this device's dimension."""
    V = arrays["projection"]
    if V.shape[0] != d:
        raise ValueError(f"the device's data has dimension {d} but the projection has {V.shape[0]} rows")
    return V


def outer_product(X: np.ndarray) -> np.ndarray:
    """XᵀX (only its upper triangle is ever sent)."""
    return X.T @ X


@lru_cache(maxsize=8)
def _triangle(d: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Row and column indices of the upper triangle of a d x d matrix, and the packed
    positions of its diagonal."""
    rows, cols = np.triu_indices(d)
    return rows, cols, np.flatnonzero(rows == cols)


def pack_symmetric(matrix: np.ndarray) -> np.ndarray:
    """The upper triangle (with the diagonal) of a symmetric d x d matrix, row by row."""
    rows, cols, _ = _triangle(matrix.shape[0])
    return np.ascontiguousarray(matrix[rows, cols])


def unpack_symmetric(packed: np.ndarray, d: int) -> np.ndarray:
    """Inverse of :func:`pack_symmetric`."""
    rows, cols, _ = _triangle(d)
    matrix = np.zeros((d, d))
    matrix[rows, cols] = packed
    matrix[cols, rows] = packed
    return matrix


def packed_diagonal(packed: np.ndarray, d: int) -> np.ndarray:
    """The diagonal of a packed symmetric matrix."""
    return packed[_triangle(d)[2]]


def packed_frobenius(packed: np.ndarray, d: int) -> float:
    """Frobenius norm of the symmetric matrix a packed triangle stands for."""
    diagonal = packed_diagonal(packed, d)
    return float(np.sqrt(max(2.0 * float(packed @ packed) - float(diagonal @ diagonal), 0.0)))


def packed_size(d: int) -> int:
    return d * (d + 1) // 2


def nearest_histogram(projected: np.ndarray, server_projected: np.ndarray) -> np.ndarray:
    """Counts, per row of ``server_projected``, of the rows of ``projected`` nearest to it
    (ties: the lowest index)."""
    labels, _ = assign(projected, server_projected)
    return np.bincount(labels, minlength=server_projected.shape[0]).astype(np.float64)


def margin_assignment(projected: np.ndarray, centers: np.ndarray, margin: float) -> tuple[np.ndarray, np.ndarray]:
    """Nearest center of every projected point, and which points pass the margin filter
    ``||p − ν_r|| ≤ margin · ||p − ν_s||`` for all s ≠ r (``margin >= 1``: all pass)."""
    if margin >= 1.0 or centers.shape[0] < 2:
        labels, _ = assign(projected, centers)
        return labels, np.ones(labels.shape[0], dtype=bool)
    n = projected.shape[0]
    labels = np.empty(n, dtype=np.int64)
    keep = np.empty(n, dtype=bool)
    step = rows_per_chunk(n, centers.shape[0])
    for start in range(0, n, step):
        d2 = squared_distances(projected[start : start + step], centers)
        rows = np.arange(d2.shape[0])
        lab = np.argmin(d2, axis=1)
        nearest = d2[rows, lab]
        d2[rows, lab] = np.inf
        labels[start : start + step] = lab
        keep[start : start + step] = nearest <= (margin * margin) * d2.min(axis=1)
    return labels, keep


# FedDP-Init step 1 holds the d × d second moment on every device and the server
# eigendecomposes it: 8·d² bytes each (512 MiB at this d). Checked before any work.
MAX_OUTER_DIMENSION = 8192


def outer_dimension_problem(d: int) -> str | None:
    """Why step 1 cannot run at dimension ``d``, or None."""
    if d <= MAX_OUTER_DIMENSION:
        return None
    return (
        f"dimension d={d} is above {MAX_OUTER_DIMENSION}: FedDP-Init step 1's d × d second moment would take "
        f"{8 * d * d / 2**30:.1f} GiB on every device and on the server"
    )


# The histogram start sends its 10·k candidates (k·d·80 bytes) to every device; SpherePacking
# draws SPHERE_ATTEMPTS points of dimension d at a time, for every center and search step.
MAX_CANDIDATE_BYTES = 64 * 10**6
MAX_SPHERE_DIMENSION = 2**15


def start_problem(start: str, k: int, d: int, has_server_data: bool) -> str | None:
    """Why the start ``start`` cannot run for k clusters in dimension d (a resource limit,
    named), or None. Checked before any work."""
    outer = outer_dimension_problem(d) if start == "feddp" else None
    if outer:
        return (
            f"{outer}; reduce the dimension first (e.g. a projection agreed in advance) or "
            "start from init='histogram', 'sphere-packing' or 'server-kmeans++', which need no second moment"
        )
    size = HISTOGRAM_CANDIDATES_PER_CLUSTER * k * d * 8
    if start == "histogram" and size > MAX_CANDIDATE_BYTES:
        return (
            f"init='histogram' would send {size / 1e6:.0f} MB of candidates (10·k × d) to every device (limit "
            f"{MAX_CANDIDATE_BYTES / 1e6:.0f} MB): lower k or the dimension, or start from init='server-kmeans++'"
        )
    packing = start == "sphere-packing" or (start == "histogram" and not has_server_data)
    if packing and d > MAX_SPHERE_DIMENSION:
        return (
            f"dimension d={d} is above {MAX_SPHERE_DIMENSION} for SpherePacking (init='{start}' draws "
            f"{SPHERE_ATTEMPTS} points of dimension d per center and search step): reduce the dimension first"
        )
    return None


def _histogram_reply(data: DeviceData, points: np.ndarray, targets: np.ndarray, config: dict):
    """Step 2's reply: how many of ``points`` have each row of ``targets`` as their nearest,
    clipped whole to ``clip-l1`` at client level."""
    histogram = nearest_histogram(points, targets)
    if config["level"] == CLIENT:
        histogram = clip_l1(histogram, _bound(config, "clip-l1"))
    return {"histogram": histogram}, {"num-examples": held(data)}


# ==================================================================== server-side math
# init = histogram: candidates per cluster, and the share of ε its one
# noisy histogram spends (the rest goes to the Lloyd rounds)
HISTOGRAM_CANDIDATES_PER_CLUSTER = 10
HISTOGRAM_SHARE = 0.1

# Every private step, its mechanism, and the fixed index of its own random stream (so a
# noise-seed reproduces the same noise whichever steps a run uses). Index 6: sampling.
STEPS = {
    "step1": ("symmetric_gaussian", 0),
    "step2": ("laplace", 1),
    "step3_gaussian": ("gaussian", 2),
    "step3_laplace": ("laplace", 3),
    "lloyd_gaussian": ("gaussian", 4),
    "lloyd_laplace": ("laplace", 5),
}
SAMPLING_STREAM = 6

# App. H.1 rule of thumb, fractions of ε_init = ε1 + ε2 + ε3G + ε3L.
RULE_OF_THUMB = {DATA_POINT: (0.20, 0.20, 0.45, 0.15), CLIENT: (0.35, 0.10, 0.45, 0.10)}

# Client-level bound keys of the run config, per step (0 = derive from Δ, k, m).
CLIENT_BOUND_KEYS = {
    "step1": "clip-outer",
    "step2": "clip-histogram",
    "step3_gaussian": "clip-means",
    "step3_laplace": "clip-nonempty",
    "lloyd_gaussian": "clip-sums",
    "lloyd_laplace": "clip-counts",
}

# Client-level step 1 with no chosen ``clip-outer``: every device sends XᵀX scaled to this
# Frobenius norm. Step 1 releases only the top eigenvectors of Σ XᵢᵀXᵢ, which a positive
# weight per device leaves spanning the same mixture subspace, while the noise is that of
# sensitivity 1 whatever the data's scale: no bound is tuned on private data, and every
# device contributes at the full bound (lower cost than the worst case m·Δ² at the same ε
# in the paper's App. G.1 client-level setting: bench/feddp_pareto.py measures it).
NORMALIZED_OUTER = 1.0


def normalized_outer(level: str, chosen_outer: float) -> bool:
    """Whether devices scale XᵀX to the step-1 bound (client level, ``clip-outer`` = 0)."""
    return level == CLIENT and not float(chosen_outer) > 0


# Replies are checked against their bound with this relative slack (float rounding).
REPLY_SLACK = 1e-9

SPHERE_ATTEMPTS = 1000
SPHERE_SEARCH_STEPS = 40


def clipping_bounds(
    level: str,
    clip_norm: float,
    k: int,
    client_max_points: float = 0.0,
    chosen: Mapping[str, float] | None = None,
    typical_norm: float | None = None,
    capped: bool = False,
) -> dict[str, float]:
    """Sensitivity of every step, i.e. the clipping bound the device enforces.

    Data-point level (Δ = ``clip_norm``; neighbours add or remove one point): step 1 Δ²
    (Frobenius norm of xxᵀ), step 2 1, step 3 and Lloyd sums Δ, counts 1. With a cap on the
    points a device uses (``capped``), adding a point to a device at the cap swaps one
    point y of its subset for x: step 1 √2·Δ² (‖xxᵀ − yyᵀ‖_F² = ‖x‖⁴ + ‖y‖⁴ − 2(x·y)²),
    step 2 2, sums 2Δ (‖x − y‖ in one cluster), counts 2 (one leaves a cluster, one joins). Client level:
    ``chosen[step]`` when > 0, else for
    step 1 ``NORMALIZED_OUTER`` (each device scales its XᵀX to that Frobenius norm: step 1
    releases only eigenvectors, see ``normalized_outer``), for the step-3 means √k·ρ with
    ρ = min(Δ, ``typical_norm``) -- the Frobenius norm of k per-cluster means, each of
    norm ≤ the root mean square of its points' norms, when those are ≤ ρ (the server data's
    root-mean-square norm ``server_typical_norm``, public, rather than its largest norm) --
    and for the others the worst case of a client with m = ``client_max_points`` points of
    norm ≤ Δ: m, k, m·Δ, m.
    """
    delta = float(clip_norm)
    if level == DATA_POINT and capped:
        return {
            "step1": math.sqrt(2) * delta**2,
            "step2": 2.0,
            "step3_gaussian": 2 * delta,
            "step3_laplace": 2.0,
            "lloyd_gaussian": 2 * delta,
            "lloyd_laplace": 2.0,
        }
    if level == DATA_POINT:
        return {
            "step1": delta**2,
            "step2": 1.0,
            "step3_gaussian": delta,
            "step3_laplace": 1.0,
            "lloyd_gaussian": delta,
            "lloyd_laplace": 1.0,
        }
    m = float(client_max_points)
    rho = delta if typical_norm is None else min(delta, float(typical_norm))
    worst = {
        "step1": NORMALIZED_OUTER,
        "step2": m,
        "step3_gaussian": math.sqrt(k) * rho,
        "step3_laplace": float(k),
        "lloyd_gaussian": m * delta,
        "lloyd_laplace": m,
    }
    chosen = chosen or {}
    return {name: float(chosen.get(name, 0.0)) or value for name, value in worst.items()}


def step_weights(
    init_method: str, lloyd_rounds: int, shares: Sequence[float], lloyd_fraction: float
) -> dict[str, float]:
    """Relative ε share of every step a run uses.

    ``shares`` = (w1, w2, w3g, w3l) (``RULE_OF_THUMB[level]`` or the user's
    ``budget-split``). FedDP-Init keeps (1 − ``lloyd_fraction``) of them, normalised; with
    ``lloyd_rounds`` > 0 FedDP-Lloyds gets ``lloyd_fraction``, split between sums and
    counts as w3g : w3l. The histogram start spends ``HISTOGRAM_SHARE`` on its histogram
    (step 2) and the rest on FedDP-Lloyds; the baselines spend everything on FedDP-Lloyds.
    """
    split = [float(w) for w in shares]
    gaussian, laplace = split[2], split[3]
    lloyd = {"lloyd_gaussian": gaussian / (gaussian + laplace), "lloyd_laplace": laplace / (gaussian + laplace)}
    if init_method == "histogram":
        return (
            {"step2": HISTOGRAM_SHARE, **{name: (1.0 - HISTOGRAM_SHARE) * w for name, w in lloyd.items()}}
            if lloyd_rounds > 0
            else {}
        )
    if init_method != "feddp":
        return lloyd if lloyd_rounds > 0 else {}
    fraction = float(lloyd_fraction) if lloyd_rounds > 0 else 0.0
    weights = {name: (1.0 - fraction) * w / sum(split) for name, w in zip(INIT_STEPS, split)}
    if lloyd_rounds > 0:
        weights.update({name: fraction * w for name, w in lloyd.items()})
    return weights


def device_noise_weights(weights: Mapping[str, float], d: int) -> dict[str, float]:
    """The shares of the devices' Skellam noise (``secagg-noise = devices``, RDP: a share is
    one of ρ, the noise variance ∝ Δ²/ρ on counts as on sums) when ``budget-split`` is not
    given: the Lloyd rounds' share split between sums and counts as 2√d : 1. A Lloyd step's
    error on a center is (η_s − m·η_c)/N, with m the center's move (relative rounds) or the
    center itself (absolute), η_s the sums' noise on d coordinates, η_c the count's: its
    E‖·‖² ∝ d·Δ_s²/ρ_s + ‖m‖²/ρ_c is least at ρ_s : ρ_c = √d·Δ_s : ‖m‖, and ‖m‖ is at most
    the sums' per-point bound Δ_s, Δ_s/2 taken as typical (FastLloyd's split of its
    Gaussian noise, √(4d) : 1). The central plan keeps the paper's shares (its counts are
    Laplace, ε-shares under PLD)."""
    if not all(name in weights for name in LLOYD_STEPS):
        return dict(weights)
    lloyd = weights["lloyd_gaussian"] + weights["lloyd_laplace"]
    ratio = 2.0 * math.sqrt(d)
    return {**weights, "lloyd_gaussian": lloyd * ratio / (ratio + 1.0), "lloyd_laplace": lloyd / (ratio + 1.0)}


def step_specs(
    weights: Mapping[str, float], bounds: Mapping[str, float], lloyd_rounds: int, sampling_rate: float | None
) -> list[privacy.StepSpec]:
    """The steps to calibrate, in the order of ``weights``: mechanism, weight, sensitivity,
    repetitions (Lloyd rounds) and Poisson client sampling."""
    return [
        privacy.StepSpec(
            name,
            STEPS[name][0],
            weight,
            sensitivity=bounds[name],
            compositions=lloyd_rounds if name in LLOYD_STEPS else 1,
            sampling_rate=sampling_rate,
        )
        for name, weight in weights.items()
    ]


class BudgetExceeded(ValueError):
    """Per-step ε values whose composition exceeds the run's ``epsilon``."""


def privacy_plan(
    specs: Sequence[privacy.StepSpec], epsilon: float, delta: float, step_epsilons: Sequence[float] | None = None
) -> tuple[dict[str, privacy.CalibratedStep], str]:
    """The noise of every step and the budget mode: calibrated so that the PLD total is
    ``epsilon`` at ``delta`` ("target-total"; ``inf`` = no noise), or each step on its own
    for its ε in ``step_epsilons`` ("per-step", one value per spec, in order). In per-step
    mode ``epsilon`` is a cap: a PLD total above it raises :class:`BudgetExceeded`
    (``epsilon = inf``: no cap)."""
    if not specs:
        return {}, "no private step"
    if step_epsilons:
        steps = [privacy.calibrate_step(spec, float(eps), delta) for spec, eps in zip(specs, step_epsilons)]
        if not math.isinf(epsilon):
            total = privacy.composed_epsilon([step.event() for step in steps], delta)
            if total > epsilon * (1.0 + 1e-9):
                raise BudgetExceeded(
                    f"step-epsilons {', '.join(f'{float(e):g}' for e in step_epsilons)} compose to a total "
                    f"ε of {total:.4g} at δ={delta:g} (PLD accounting), above epsilon={epsilon:g}: lower "
                    f"step-epsilons, or set epsilon to at least {total:.4g} to accept that budget"
                )
        return {step.name: step for step in steps}, "per-step"
    mode = "no noise (epsilon = inf)" if math.isinf(epsilon) else "target-total"
    calibration = privacy.calibrate_to_total(epsilon, delta, specs)
    return {step.name: step for step in calibration.steps}, mode


def server_typical_norm(points: np.ndarray) -> float:
    """The server data's root-mean-square point norm: ρ of the default client-level step-3
    bound (``clipping_bounds``)."""
    return float(np.sqrt(np.mean(np.einsum("ij,ij->i", points, points))))


def public_dimension(
    server: np.ndarray | None, dimension: int, clip_norm: float, init: str, lloyd_rounds: int
) -> tuple[int, str | None]:
    """The data's dimension, which every party may know (the server data's, or ``dimension``
    agreed in advance), and what stops the run when it cannot start: without server data
    only SpherePacking in the ball of radius ``clip_norm`` can, followed by Lloyd rounds."""
    if server is not None:
        d = int(server.shape[1])
        if dimension and dimension != d:
            return d, f"run-config dimension={dimension} but the server data has dimension {d}"
        return d, None
    missing = [
        text
        for text, bad in (
            (
                "init='histogram', 'sphere-packing' or 'auto' (the other starts run on the server data)",
                init not in DATA_FREE_STARTS,
            ),
            ("dimension (the data's, agreed in advance)", dimension <= 0),
            ("clip-norm (Δ: every point is clipped to it, and the start is drawn within it)", clip_norm <= 0),
            ("lloyd-rounds >= 1 (else the centers never see the devices' data)", lloyd_rounds < 1),
        )
        if bad
    ]
    if missing:
        return int(dimension), (
            "feddp-kmeans without server-side data (run-config server-data, or dataset="
            "'feddp-mixture', which generates it) needs " + "; ".join(missing)
        )
    return int(dimension), None


def clip_origin(center: str, server: np.ndarray | None) -> tuple[np.ndarray | None, str | None]:
    """The public point the devices' points are taken around (``clip-center``), None for
    the origin, and what stops the run: the server data's mean (``server-mean``, and
    ``auto`` with server data) costs no privacy (the server data is the server's own), and
    data far from the origin no longer pays its offset in the clipping radius, hence in
    the noise; a point given (public) does the same without server data."""
    point = clip_center_point(center)
    if point is not None:
        if server is not None and server.shape[1] != point.size:
            return (
                None,
                f"clip-center is a point of {point.size} coordinates, the server data has dimension {server.shape[1]}",
            )
        return point, None
    if center == "origin" or (center == "auto" and server is None):
        return None, None
    if server is None:
        return None, "clip-center='server-mean' needs server-side data (run-config server-data)"
    return server.mean(axis=0), None


def clip_center_warning(center: str, server: np.ndarray | None) -> str | None:
    """What a run must say when it clips around the origin only because nothing public
    placed the ball (``clip-center = auto`` without server data): data farther than Δ from
    it are clipped onto the sphere, and no step can tell (no device's box or mean reaches
    the server outside the private releases)."""
    if center != "auto" or server is not None:
        return None
    return (
        "clip-center = auto without server data clips every point to the ball of radius clip-norm around the "
        "origin: data farther from it are moved onto its sphere and the centers are wrong, which no private step "
        "can detect. Set clip-center to a public point near the data ('x1,...,xd'), or to 'origin' if they lie "
        "within clip-norm of it"
    )


def clip_center_name(center: str, origin: np.ndarray | None) -> str:
    """What ``result.json`` calls the clip center the run used (``init.clip_center``):
    origin, server-mean, or point (a public point given as ``clip-center``)."""
    if origin is None:
        return "origin"
    return "point" if clip_center_point(center) is not None else "server-mean"


def data_radius(points: np.ndarray) -> float:
    """The largest point norm: the default Δ (clip-norm) and the sphere-packing cube."""
    return float(np.max(np.linalg.norm(points, axis=1)))


def top_eigenvectors(matrix: np.ndarray, count: int) -> np.ndarray:
    """Step 1's projection V: eigenvectors of the ``count`` largest eigenvalues of the
    symmetric ``matrix`` (the noisy Σ XᵢᵀXᵢ), as columns, largest first."""
    return top_eigenpairs(matrix, count)[1]


def server_weights(
    noisy_histogram: np.ndarray, min_weight: float, k: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
    """Step 2: weights = max(h̃, 0); keep the server points of weight ≥ ``min_weight`` (the
    ``k`` heaviest if fewer pass). Returns ``(weights, kept mask, weights of the kept ones
    -- all 1 if they sum to 0 --, whether the k-heaviest fallback was used)``."""
    weights = np.maximum(noisy_histogram, 0.0)
    kept = weights >= float(min_weight)
    fallback = bool(kept.sum() < k)
    if fallback:
        kept = np.zeros_like(kept)
        kept[np.argsort(-weights, kind="stable")[:k]] = True
    kept_weights = weights[kept] if weights[kept].sum() > 0 else np.ones(int(kept.sum()))
    return weights, kept, kept_weights, fallback


def step3_centers(noisy_sums: np.ndarray, noisy_counts: np.ndarray) -> np.ndarray:
    """Step 3: C = S̃ / max(Ñ, 1) (finite whatever the noise)."""
    return noisy_sums / np.maximum(noisy_counts, 1.0)[:, None]


def relative_lloyd_update(
    centers: np.ndarray, noisy_sums: np.ndarray, noisy_counts: np.ndarray, radius: float, clip_norm: float
) -> tuple[np.ndarray, np.ndarray]:
    """A relative FedDP-Lloyd step (``lloyd-update = relative``; the sums are of the points'
    displacements from their centers, each clipped to ``radius``): c ← c + S̃/Ñ where Ñ ≥ 1,
    the move itself clipped to ``radius`` (no honest move is longer) and the new center
    brought back into the ball of radius Δ = ``clip_norm`` that holds every clipped point
    (hence their means): both are post-processing. A cluster with a smaller noisy count
    keeps its center. Returns ``(new centers, alive mask)``."""
    alive = noisy_counts >= 1.0
    moves = clip_rows_l2(noisy_sums / np.maximum(noisy_counts, 1.0)[:, None], radius)
    moved = clip_rows_l2(centers + moves, clip_norm)
    return np.where(alive[:, None], moved, centers), alive


def lloyd_mode(update: str, level: str, start: str) -> str:
    """``lloyd-update``: ``auto`` is relative at data-point level after a start that gives
    points rather than means (``histogram``, ``sphere-packing``: the relative step's smaller
    sensitivity pays most there), absolute otherwise (the paper's FedDP-Lloyds, after
    FedDP-Init or a start on the server data); client level is always absolute."""
    if update == "auto":
        return "relative" if level == DATA_POINT and start in DATA_FREE_STARTS else "absolute"
    return update


# r = α·Δ / k^(1/d), FastLloyd's (Diaa et al. 2025) form with α = 1/2 rather than its 0.8: Δ
# bounds every point (a bound the user states, e.g. √d for data in [-1, 1]^d, or the server
# data's farthest point), so k balls of radius Δ/k^(1/d) tile a ball the data rarely fills;
# half that radius clips fewer honest displacements than it saves noise, on FastLloyd's seven
# datasets with and without server data and on twelve others (bench/fastlloyd.py,
# docs/results/fastlloyd.md).
RELATIVE_RADIUS_ALPHA = 0.5


def lloyd_radius(chosen: float, clip_norm: float, k: int, d: int) -> float:
    """The radius r of a relative update (``lloyd-radius``, 0 = α·Δ/k^(1/d) with α =
    ``RELATIVE_RADIUS_ALPHA``: k balls of radius Δ/k^(1/d) have together the volume of the
    ball of radius Δ, and α scales that per-cluster radius down), at most Δ."""
    radius = float(chosen) if chosen > 0 else RELATIVE_RADIUS_ALPHA * clip_norm / k ** (1.0 / d)
    return min(radius, float(clip_norm))


LLOYD_ROUNDS_RANGE = (2, 7)
LLOYD_ROUNDS_SIGNAL = 0.15


def secure_points(level: str, cap: int, client_max_points: float) -> float:
    """How many points' worth a device's secure-aggregation ranges hold (public, fixed before
    any round): at data-point level the cap ``max-device-points``, or
    :data:`fedcluster.secagg.RANGE_POINTS` without one; at client level ``client-max-points``,
    the bound of its clipped contribution. A device beyond it has its arrays clipped to the
    range, coordinate by coordinate: a projection onto a box, which moves two neighbouring
    inputs no further apart, so no sensitivity grows."""
    from fedcluster.secagg.device import RANGE_POINTS

    if level == DATA_POINT:
        return float(cap) if cap > 0 else float(RANGE_POINTS)
    return float(client_max_points)


def secure_ranges(points: float, per_point: float) -> dict[str, float]:
    """Public per-coordinate ranges of the Lloyd sums and counts (secure aggregation): a
    device's ``points`` (:func:`secure_points`), each moving a sum's coordinate by at most
    ``per_point`` (Δ, or the radius of a relative update)."""
    return {"sums": float(points) * per_point, "counts": float(points)}


SECURED_STEPS = {  # step: (its summed array, its size as a function of k and d, its bound's norm)
    "step2": ("histogram", lambda k, d: HISTOGRAM_CANDIDATES_PER_CLUSTER * k, 1),
    "lloyd_gaussian": ("sums", lambda k, d: k * d, 2),
    "lloyd_laplace": ("counts", lambda k, d: k, 1),
}


def device_noise_steps(
    weights: Mapping[str, float],
    bounds: Mapping[str, float],
    lloyd_rounds: int,
    points: float,
    per_point: float,
    k: int,
    d: int,
    levels: Mapping[str, float] | None = None,
) -> list[dict[str, Any]]:
    """The secured steps as :func:`fedcluster.privacy.skellam.calibrate` takes them, in
    fixed-point grid units (the grid step is the array's public range / its ``levels``,
    2^40 by default): a bound on the L1 norm (counts) also bounds the L2 norm, one on the L2
    norm bounds the L1 norm times √size, and rounding to the grid adds at most one unit per
    coordinate."""
    from fedcluster.secagg.device import HALF_LEVELS

    ranges = {"histogram": points, **secure_ranges(points, per_point)}
    levels = levels or {}
    steps = []
    for name, weight in weights.items():
        array, size_of, norm = SECURED_STEPS[name]
        size, grid = size_of(k, d), ranges[array] / levels.get(name, HALF_LEVELS)
        bound = bounds[name] / grid
        l1, l2 = (
            (bound + size, bound + math.sqrt(size))
            if norm == 1
            else (bound * math.sqrt(size) + size, bound + math.sqrt(size))
        )
        steps.append(
            {
                "name": name,
                "l1": l1,
                "l2": l2,
                "grid": grid,
                "weight": weight,
                "range": ranges[array],
                "compositions": lloyd_rounds if name in LLOYD_STEPS else 1,
            }
        )
    return steps


def device_noise_plan(
    weights: Mapping[str, float],
    bounds: Mapping[str, float],
    lloyd_rounds: int,
    points: float,
    per_point: float,
    k: int,
    d: int,
    epsilon: float,
    delta: float,
) -> dict[str, "DeviceNoiseStep"]:
    """The devices' Skellam noise of every secured step, for ``epsilon`` at ``delta``: a
    first calibration on the finest grid gives each step's noise, then each array's grid is
    coarsened to at most 2^25 steps per noise standard deviation
    (:func:`fedcluster.secagg.noise_levels`: a cap of a few points' range would otherwise ask
    a Poisson draw beyond NumPy's reach) and the noise is calibrated again on that grid."""
    from fedcluster.privacy import skellam
    from fedcluster.secagg.device import noise_levels

    first = skellam.calibrate(
        device_noise_steps(weights, bounds, lloyd_rounds, points, per_point, k, d), epsilon, delta
    )
    steps = device_noise_steps(weights, bounds, lloyd_rounds, points, per_point, k, d)
    levels = {r.name: noise_levels(s["range"], r.noise_std) for r, s in zip(first, steps)}
    steps = device_noise_steps(weights, bounds, lloyd_rounds, points, per_point, k, d, levels)
    releases = skellam.calibrate(steps, epsilon, delta)
    return {r.name: DeviceNoiseStep(r, weights[r.name], r.name != "lloyd_gaussian", levels[r.name]) for r in releases}


@dataclass(frozen=True)
class DeviceNoiseStep:
    """A step whose noise the devices add under secure aggregation (``secagg-noise =
    devices``): its Skellam release and share of ε. ``noise_scale`` is what the strategy
    reads of a calibrated step: the noise's standard deviation in the data's units, over
    √2 for counts (a Laplace scale of the same spread, for the histogram's significance
    threshold)."""

    release: Any
    epsilon_share: float
    counts: bool
    levels: float = 2.0**40

    @property
    def noise_scale(self) -> float:
        return self.release.noise_std / (math.sqrt(2) if self.counts else 1.0)

    def mechanism_instance(self, rng: np.random.Generator | None = None) -> "AddedByDevices":
        return AddedByDevices()


class AddedByDevices:
    """The server's "mechanism" of a step whose noise is in the secure sum already."""

    def add(self, value: np.ndarray) -> np.ndarray:
        return np.asarray(value, dtype=np.float64)


def secure_bounds(bounds: Mapping[str, float], points: float, per_point: float, k: int, d: int) -> dict[str, float]:
    """The sensitivities of the securely summed steps, plus what rounding to the fixed-point
    grid can add (:func:`fedcluster.secagg.rounding_slack`): the Lloyd sums (L2, k·d
    coordinates), the Lloyd counts and the histogram (L1, k and its candidates)."""
    from fedcluster.secagg.device import rounding_slack

    ranges = {"histogram": points, **secure_ranges(points, per_point)}
    out = dict(bounds)
    for name, (array, size_of, norm) in SECURED_STEPS.items():
        out[name] += rounding_slack(ranges[array], size_of(k, d), norm)
    return out


def lloyd_rounds_for(points: int, k: int, d: int, epsilon: float, delta: float) -> int:
    """Lloyd rounds at data-point level from the budget (the estimator's default after the
    histogram start, with or without server data): the most rounds (in
    ``LLOYD_ROUNDS_RANGE``) for which the noise on the mean of a typical cluster (``points``
    / k points), were the whole (ε, δ) spent on one Gaussian release of unit sensitivity
    and split over T rounds, stays below ``LLOYD_ROUNDS_SIGNAL`` times the per-point bound:
    T = ⌊(c·n / (k·z·√d))²⌋ with z the analytic Gaussian multiplier of (ε, δ). More rounds
    move further from the start; each costs √T more noise."""
    low, high = LLOYD_ROUNDS_RANGE
    if math.isinf(epsilon):
        return high
    z = privacy.analytic_gaussian_sigma(float(epsilon), float(delta))
    rounds = math.floor((LLOYD_ROUNDS_SIGNAL * points / (k * z * math.sqrt(d))) ** 2)
    return int(min(high, max(low, rounds)))


def lloyd_update(
    centers: np.ndarray, noisy_sums: np.ndarray, noisy_counts: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """FedDP-Lloyds: C ← S̃ / Ñ where Ñ ≥ 1; a cluster with a smaller noisy count keeps its
    center (Lloyd's own rule for an empty cluster, so no noise = Lloyd exactly).
    Returns ``(new centers, alive mask)``."""
    alive = noisy_counts >= 1.0
    masked = np.where(alive, noisy_counts, 0.0)
    return LloydStatistics(noisy_sums, masked, 0.0).centers(centers), alive


# ------------------------------------------------------------------ reply bound checks
# Each returns a reason to drop a reply whose statistic exceeds what the device's clipping
# allows (a device that did not clip, or a tampered reply), or None.
def over_l2(name: str, value: np.ndarray, bound: float) -> str | None:
    norm = float(np.linalg.norm(value.ravel()))
    if norm > bound * (1 + REPLY_SLACK):
        return f"array {name!r} exceeds the clipping bound: L2 norm {norm:.6g} > {bound:.6g}"
    return None


def over_l1(name: str, value: np.ndarray, bound: float) -> str | None:
    norm = float(np.abs(value).sum())
    if norm > bound * (1 + REPLY_SLACK):
        return f"array {name!r} exceeds the clipping bound: L1 norm {norm:.6g} > {bound:.6g}"
    return None


def outer_violation(
    packed: np.ndarray, d: int, num_examples: int, level: str, clip_norm: float, bound: float
) -> str | None:
    """Step 1: data-point level, a PSD-like diagonal with trace ≤ n·Δ²; client level,
    Frobenius norm ≤ ``bound``."""
    if level == DATA_POINT:
        diagonal = packed_diagonal(packed, d)
        trace = float(diagonal.sum())
        if np.any(diagonal < 0) or trace > num_examples * clip_norm**2 * (1 + REPLY_SLACK):
            return (
                f"array 'outer' exceeds the clipping bound: trace {trace:.6g} > "
                f"num-examples·Δ² = {num_examples}·{clip_norm:.6g}²"
            )
        return None
    norm = packed_frobenius(packed, d)
    if norm > bound * (1 + REPLY_SLACK):
        return f"array 'outer' exceeds the clipping bound: Frobenius norm {norm:.6g} > {bound:.6g}"
    return None


def histogram_violation(histogram: np.ndarray, num_examples: int, level: str, bound: float) -> str | None:
    """Step 2: data-point level, integer counts summing to n; client level, L1 ≤ ``bound``."""
    if level == DATA_POINT:
        if np.any(histogram != np.round(histogram)) or float(histogram.sum()) != num_examples:
            return (
                f"array 'histogram' is not a count of the node's {num_examples} points (clipping bound: one count per "
                "point)"
            )
        return None
    return over_l1("histogram", histogram, bound)


def sums_counts_violation(
    sums: np.ndarray, counts: np.ndarray, num_examples: int, clip_norm: float, exact_total: bool
) -> str | None:
    """Data-point level sums and counts: integer counts totalling ≤ n (= n when
    ``exact_total``), every row of sums of norm ≤ count·``clip_norm`` (Δ, or the radius r of a relative
    update: the per-point bound)."""
    total = float(counts.sum())
    if np.any(counts != np.round(counts)) or total > num_examples or (exact_total and total != num_examples):
        return (
            f"array 'counts' is not a count of the node's {num_examples} points (clipping bound: one count per point)"
        )
    norms = np.linalg.norm(sums, axis=1)
    if np.any(norms > counts * clip_norm * (1 + REPLY_SLACK) + 1e-12):
        j = int(np.argmax(norms - counts * clip_norm))
        return (
            f"array 'sums' exceeds the clipping bound: row {j} has norm {norms[j]:.6g} > "
            f"count × the per-point bound = {counts[j]:.0f}·{clip_norm:.6g}"
        )
    return None


def means_violation(means: np.ndarray, nonempty: np.ndarray, means_bound: float, nonempty_bound: float) -> str | None:
    """Step 3 at client level: entries of the non-empty vector ≤ 1, means L2 ≤ bound,
    non-empty vector L1 ≤ bound."""
    if np.any(nonempty > 1 + REPLY_SLACK):
        return "array 'nonempty' has an entry above 1"
    return over_l2("means", means, means_bound) or over_l1("nonempty", nonempty, nonempty_bound)


def lloyd_violation(
    sums: np.ndarray,
    counts: np.ndarray,
    num_examples: int,
    level: str,
    clip_norm: float,
    sums_bound: float,
    counts_bound: float,
) -> str | None:
    """FedDP-Lloyds: client level, sums L2 and counts L1 within their bounds; data-point
    level, :func:`sums_counts_violation` with an exact total."""
    if level == CLIENT:
        return over_l2("sums", sums, sums_bound) or over_l1("counts", counts, counts_bound)
    return sums_counts_violation(sums, counts, num_examples, clip_norm, exact_total=True)


# ------------------------------------------------------------------ SpherePacking baseline
def histogram_candidates(
    k: int, d: int, half_width: float, rng: np.random.Generator, server: np.ndarray | None = None
) -> np.ndarray:
    """init = histogram: ``HISTOGRAM_CANDIDATES_PER_CLUSTER``·k candidates: server points
    (a random subset of them, when there are more) and, for the rest, points drawn uniformly
    from the cube [−h, h]^d (h = ``half_width``), independently of any data; the devices
    count their points' nearest candidates (task ``feddp_candidates``) and the server
    clusters the candidates weighted by the noisy counts."""
    wanted = HISTOGRAM_CANDIDATES_PER_CLUSTER * k
    taken = np.empty((0, d)) if server is None else server[rng.permutation(server.shape[0])[:wanted]]
    return np.vstack([taken, rng.uniform(-half_width, half_width, size=(wanted - taken.shape[0], d))])


def histogram_start(
    candidates: np.ndarray,
    noisy_counts: np.ndarray,
    noise_scale: float,
    k: int,
    half_width: float,
    rng: np.random.Generator,
    n_init: int,
    server: np.ndarray | None = None,
) -> tuple[np.ndarray, dict[str, Any]]:
    """The start from the noisy histogram: weighted k-means of the candidates whose count
    stands out of the noise (:func:`significant_candidates`); with fewer than k of them,
    those candidates and, for the other centers, the server's own k-means centers farthest
    from them (:func:`farthest_fill`; with ``server`` data of at least k points), else
    SpherePacking in the cube, away from them (the rest of the histogram is noise). Returns
    the centers and what the init record says of them."""
    significant = significant_candidates(noisy_counts, noise_scale)
    record: dict[str, Any] = {
        "method": "histogram",
        "candidates": int(candidates.shape[0]),
        "candidates_kept": int(significant.sum()),
        "cube_half_width": half_width,
    }
    if significant.sum() >= k:
        centers, _ = kmeans(candidates[significant], k, rng, noisy_counts[significant], n_init=n_init)
        return centers, record
    supported = candidates[significant][np.argsort(-noisy_counts[significant], kind="stable")]
    if server is not None and len(np.unique(server, axis=0)) >= k:  # the server's own data fills in, at no privacy cost
        centers = farthest_fill(supported, kmeans(server, k, rng, n_init=n_init)[0], k)
        record.update(fallback="server-lloyds", filled=k - len(supported))
        return centers, record
    centers, record["radius_a"] = sphere_packing(k, candidates.shape[1], half_width, rng, fixed=supported)
    record.update(fallback="sphere-packing", filled=k - len(supported))
    return centers, record


def farthest_fill(fixed: np.ndarray, pool: np.ndarray, k: int) -> np.ndarray:
    """``fixed`` (m < k rows), then k − m rows of ``pool``, each the one farthest from the
    rows chosen so far (the first, with nothing fixed, the pool's first row)."""
    points = np.vstack([np.reshape(fixed, (-1, pool.shape[1])), pool])
    start = np.arange(len(fixed)) if len(fixed) else np.array([0])
    return points[farthest_first(points, start, k)]


def significant_candidates(noisy_counts: np.ndarray, noise_scale: float) -> np.ndarray:
    """The candidates whose noisy count exceeds b·ln(s) (b: the Laplace noise scale, s:
    the number of candidates): about the largest value the noise alone reaches among s
    candidates with no point, so what stands above it is, most likely, data. Post-processing
    of the noisy histogram (b is public); with no noise (b = 0), every non-empty candidate."""
    return noisy_counts > noise_scale * math.log(max(noisy_counts.size, 2))


def sphere_packing(
    k: int, d: int, radius: float, rng: np.random.Generator, fixed: np.ndarray | None = None
) -> tuple[np.ndarray, float]:
    """SpherePacking initialization (Su et al. 2017; docs/ALGORITHMS.md section 3, App. G.3).

    For a radius a, center j is drawn uniformly from the cube [−r, r]^d until it is at
    least a away from every corner of the cube (the nearest corner of c is sign(c)·r, at
    distance ||r − |c|||) and at least 2a away from every earlier center; 1000 attempts per
    center, else a is infeasible. The LARGEST feasible a is found by binary search (the
    authors' code stops at the first feasible one). ``fixed`` (m < k rows): the first m
    centers, given; the others are drawn as above, away from them too. Returns
    ``(centers, a)``.
    """
    given = 0 if fixed is None else len(fixed)

    def attempt(a: float) -> np.ndarray | None:
        centers = np.empty((k, d))
        centers[:given] = fixed if given else centers[:0]
        for j in range(given, k):
            candidates = rng.uniform(-radius, radius, size=(SPHERE_ATTEMPTS, d))
            ok = np.linalg.norm(radius - np.abs(candidates), axis=1) >= a
            if j > 0:
                gaps = np.sqrt(
                    np.maximum(
                        np.einsum("ij,ij->i", candidates, candidates)[:, None]
                        - 2 * candidates @ centers[:j].T
                        + np.einsum("ij,ij->i", centers[:j], centers[:j])[None],
                        0.0,
                    )
                )
                ok &= np.all(gaps >= 2 * a, axis=1)
            hits = np.flatnonzero(ok)
            if hits.size == 0:
                return None
            centers[j] = candidates[hits[0]]
        return centers

    low, high = 0.0, radius * math.sqrt(d)
    best = attempt(0.0)
    for _ in range(SPHERE_SEARCH_STEPS):
        middle = 0.5 * (low + high)
        found = attempt(middle)
        if found is None:
            high = middle
        else:
            low, best = middle, found
    return best, low
