"""Could a cluster's count, mean and per-coordinate scatter come from points inside
its center's Voronoi cell and the device's declared box? (server side, SciPy)

A full-batch FedKMeans training reply states, for every cluster j of the centers it
received, its count n, mean μ and per-coordinate scatter about μ, hence per-coordinate
variances v. Nearest-center points of cluster j lie in K_j = {x in [low, high] : x nearer
c_j than every other center}, a polytope with vertex set V. Each point is a convex
combination of vertices and (t − μ_d)² is convex in t, so some probability vector p on V has

    Σ_v p_v v = μ    and    Σ_v p_v (v_d − μ_d)² ≥ v_d  for every coordinate d.

:func:`cell_moments_violation` looks for such a p (a linear program over the vertices, after
certificates that pass most parts without one; per reply at most ``SOLVED`` clusters go to the
solver, the farthest from passing and others drawn at random, so the check is partial).
When none exists, no points inside the cell have these statistics: the reply is not a
nearest-center assignment, whatever the device's data. It catches what the mean-in-the-cell
test (:func:`fedcluster.bounds.voronoi_violation`) cannot: a device claiming points of other
clusters for one cluster whose mean stays in its cell, more scattered than the cell can hold.
Honest replies pass by the argument above, which holds in exact arithmetic; for rounding,
the cell and box are widened (``SLACK``, relative to the distances; ``KERNEL`` × (‖x − r‖ +
‖c − r‖)(‖x − r‖ + ‖c − r‖ + ‖r‖) about the centers' reference r, because a device's
nearest-center test errs in absolute terms, at the size of its coordinates), the variances
tested are the smallest rounding could have produced (``ROUNDING``, and each coordinate's
own rounding far from the origin), and a mean that rounds outside the box gets no verdict.
Everything is a difference of nearby points: the same check wherever the data lie.

The vertices are enumerated, which is cheap only in low dimension: above ``MAX_DIM``, or
when a solver cannot decide, the check says nothing (never a rejection).
"""

from __future__ import annotations

import numpy as np

from .bounds import coordinate_rounding
from .lloyd import sum_of_squares

MAX_DIM = 6  # vertex enumeration beyond this costs too much: no check (no rejection either)
SLACK = 1e-7  # cells and box widened by this, relative: rounding, points on a bisector
TOLERANCE = 1e-6  # a variance may exceed the largest achievable by this share of the box width²
ROUNDING = (
    1e-9  # variances are tested lowered by this share of themselves and of (μ − c)²: scatter about c, less n(μ − c)²
)
KERNEL = 1e-12  # walls widened by this × the size of a device's distance terms: they round in absolute terms
SOLVED = 2  # per reply, at most this many clusters the certificates cannot pass go to the solver
BLOCK_FLOATS = 1 << 16  # the axis certificate's parts go in blocks of about this many floats per array
BRUTE_FORCE = 4000  # vertices by solving every choice of d walls when there are at most this many


def cell_moments_violation(
    means: np.ndarray,
    counts: np.ndarray,
    scatter: np.ndarray,
    centers: np.ndarray,
    low: np.ndarray | None,
    high: np.ndarray | None,
    rng: np.random.Generator | None = None,
) -> tuple[int, str] | None:
    """For center sets side by side (``centers`` (m, k, d); ``means``, ``scatter`` (m, k, d) and
    ``counts`` (m, k) of a reply to them): a set with a cluster whose (count, mean,
    per-coordinate scatter about the mean) cannot come from points inside its center's Voronoi cell
    and the box ``[low, high]``, and why. None when every one checked can, and when the
    dimension is above ``MAX_DIM``, no box was declared or a solver cannot tell. Of the
    clusters no certificate passes, the solver takes the farthest from passing and
    ``SOLVED − 1`` drawn by ``rng`` (the server's own entropy by default: a device cannot
    know which of its clusters are checked, so decoys do not shield a lie)."""
    m, k, d = centers.shape
    if low is None or high is None or d > MAX_DIM or k < 2:
        return None
    sets, parts = np.nonzero(counts > 1)
    if parts.size == 0:
        return None
    mean, n = means[sets, parts], counts[sets, parts][:, None]
    var = scatter[sets, parts] / n
    # the smallest variance rounding could have produced: the device's scatter about the
    # center less n(μ − c)², and each coordinate's rounding at its size
    apart = (mean - centers[sets, parts]) ** 2
    delta = coordinate_rounding(centers, low, high)
    var = np.maximum(var - ROUNDING * (var + apart) - 2.0 * delta * (np.sqrt(var) + np.sqrt(apart)) - delta**2, 0.0)
    passed, need = _axis_certificate(mean, var, centers, sets, parts, low, high)
    undecided = np.flatnonzero(~passed)
    ranked = undecided[np.argsort(-need[undecided], kind="stable")]
    if ranked.size > SOLVED:
        rng = rng if rng is not None else np.random.default_rng()
        ranked = np.concatenate([ranked[:1], rng.choice(ranked[1:], size=SOLVED - 1, replace=False)])
    for p in ranked:
        s, j = int(sets[p]), int(parts[p])
        gap = _cached_gap(mean[p], var[p], centers[s], j, low, high)
        if gap is not None and gap < -TOLERANCE:
            return s, (
                f"the {counts[s, j]:g} points it assigned to center {j} scatter more than any points inside "
                f"that center's Voronoi cell and its declared box can: not a nearest-center assignment"
            )
    return None


_GAPS: dict[bytes, float | None] = {}  # a set that stopped moving brings the same statistics every round


def _cached_gap(mean, var, centers, j, low, high) -> float | None:
    key = b"".join(
        np.ascontiguousarray(x, dtype=np.float64).tobytes() for x in (mean, var, centers, low, high)
    ) + j.to_bytes(4, "little")
    if key not in _GAPS:
        if len(_GAPS) >= 10_000:
            _GAPS.clear()
        _GAPS[key] = largest_variance_gap(mean, var, centers, j, low, high)
    return _GAPS[key]


def _rounding(centers: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """How far a device's nearest-center test may err, in the walls' units, for a center set
    (k, d) or one per part (P, k, d): it compares terms about the centers' mean r
    (:func:`fedcluster.lloyd.reference`) of the size (‖x − r‖ + ‖c − r‖)(‖x − r‖ + ‖c − r‖ + ‖r‖),
    and rounds in absolute terms, about (d + 2)·eps times that, whatever the distances between
    them."""
    middle = centers.mean(axis=-2, keepdims=True)  # r (the origin's rounding is no better)
    reach = np.sqrt((np.maximum(np.abs(low - middle), np.abs(high - middle)) ** 2).sum(-1)).max(-1)
    spread = np.sqrt(((centers - middle) ** 2).sum(-1).max(-1))
    size = np.sqrt((middle[..., 0, :] ** 2).sum(-1))
    return KERNEL * (reach + spread) * (reach + spread + size)


def _walls(
    centers: np.ndarray, j: int, mean: np.ndarray, low: np.ndarray, high: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Cell j's walls around ``mean``: ``a·(x − mean) <= b`` for each other center, widened."""
    others = np.delete(centers, j, axis=0)
    a = 2.0 * (others - centers[j])
    b = ((others - mean) ** 2).sum(1) - ((centers[j] - mean) ** 2).sum()
    size = max(float(((centers - mean) ** 2).sum(1).max()), 1e-300)
    return a, b + SLACK * size + float(_rounding(centers, low, high))


def _axis_certificate(
    means: np.ndarray,
    var: np.ndarray,
    centers: np.ndarray,
    sets: np.ndarray,
    parts: np.ndarray,
    low: np.ndarray,
    high: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Which parts (``means``, ``var`` (P, d); part p is cluster ``parts[p]`` of the center set
    ``centers[sets[p]]``, ``centers`` (m, k, d)) pass without a solver, all at once, and how
    far each is from it (``need``, passing at most 1): along each axis d the segment
    from the mean to the cell's boundary, −s⁻_d .. +s⁺_d, lies in the cell; two points at its
    ends weighted to keep the mean have variance s⁺_d s⁻_d, so mass v_d / (s⁺_d s⁻_d) on axis d
    (the rest at the mean) meets every variance when Σ_d v_d / (s⁺_d s⁻_d) <= 1. The arrays
    are (p, d, k) for blocks of p parts (about ``BLOCK_FLOATS`` floats: temporaries that stay in
    the cache and in memory already mapped), coordinate by coordinate, so that every
    reduction runs over contiguous centers."""
    across = np.ascontiguousarray(centers.transpose(0, 2, 1))  # (m, d, k)
    rounding = _rounding(centers, low, high)
    step = max(1, BLOCK_FLOATS // max(centers.shape[1] * centers.shape[2], 1))
    passed, need = np.empty(parts.size, dtype=bool), np.empty(parts.size)
    for first in range(0, parts.size, step):
        block = slice(first, first + step)
        passed[block], need[block] = _axis_block(
            means[block], var[block], across[sets[block]], rounding[sets[block]], parts[block], low, high
        )
    return passed, need


def _axis_block(means, var, across, rounding, parts, low, high) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_axis_certificate` of a block of parts, each with its set's centers ``across``
    (p, d, k) and their :func:`_rounding`."""
    rows = np.arange(parts.size)
    distance = sum_of_squares(across[:, q, :] - means[:, q, None] for q in range(across.shape[1]))  # (P, k)
    widen = SLACK * np.maximum(distance.max(1), 1e-300) + rounding
    b = distance - distance[rows, parts][:, None] + widen[:, None]
    b[rows, parts] = np.inf
    half = across - across[rows, :, parts][:, :, None]  # a / 2; the own center's column is 0
    width = high - low
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        ratio = (0.5 * b)[:, None, :] / half  # b / a: the same quotient, to the bit
        up = np.where(half > 0, ratio, np.inf).min(2)
        down = -np.where(half < 0, ratio, -np.inf).max(2)
        up = np.minimum(up, high - means + SLACK * width)
        down = np.minimum(down, means - low + SLACK * width)
        need = np.where(var > 0, var / (up * down), 0.0).sum(1)
    passed = np.all(b > 0, axis=1) & (up > 0).all(1) & (down > 0).all(1) & (need <= 1.0 - 1e-9)
    return passed, np.nan_to_num(need, nan=np.inf)


def largest_variance_gap(
    mean: np.ndarray, var: np.ndarray, centers: np.ndarray, j: int, low: np.ndarray, high: np.ndarray
) -> float | None:
    """Over the point distributions on cell j ∩ box with mean ``mean``, the largest of
    min_d (variance_d − var_d) / width_d² (vertex mixtures: they dominate, by Jensen).
    Negative: no points in the cell have these variances. None: no verdict. A value ≥ 0 from a
    certificate is a pass, not the maximum."""
    width = high - low
    free = width > np.maximum(1e-12, coordinate_rounding(low, high))  # wider than its coordinates' rounding
    if not free.any():
        return None
    # y = (x − mean) / width on the free coordinates; a flat box side fixes its coordinate
    w = np.where(free, width, 1.0)
    a, b = _walls(centers, j, mean, low, high)
    b = b + (np.abs(a[:, ~free]) * np.maximum(np.abs(low - mean), np.abs(high - mean))[~free]).sum(1)  # flat sides
    target = (var / w**2)[free]
    lo, hi = ((low - mean) / w)[free], ((high - mean) / w)[free]
    if np.any(lo > SLACK) or np.any(hi < -SLACK):
        return None  # the mean (rounded) outside the box: not this check's call, as outside the cell
    dim = int(free.sum())
    A = np.vstack([(a * w)[:, free], np.eye(dim), -np.eye(dim)])
    b = np.concatenate([b, hi + SLACK, -lo + SLACK])
    norm = np.linalg.norm(A, axis=1)
    flat = norm <= 1e-12 * max(norm.max(), 1e-300)  # a wall constant on the free coordinates
    if np.any(b[flat] < 0):
        return None
    A, b = A[~flat] / norm[~flat, None], b[~flat] / norm[~flat]
    walls = np.arange(len(A)) < len(A) - 2 * dim
    reach = np.maximum(A * (lo - SLACK), A * (hi + SLACK)).sum(axis=1)
    keep = ~walls | (reach > b)  # a Voronoi wall the whole box satisfies cuts nothing
    A, b, walls = A[keep], b[keep], walls[keep]
    if not walls.any():  # the cell is the box: two-point laws at its sides are the largest variances
        return float(np.min(-(lo - SLACK) * (hi + SLACK) - target))
    if _box_certificate(A, b, hi, target) or _spread_certificate(A, b, walls, target, dim):
        return 0.0
    gap = _mixture_gap(_vertices(A, b, dim), target)
    if gap is not None and gap < -TOLERANCE:  # a rejection stands only on Qhull's vertices too
        gap = _mixture_gap(_vertices(A, b, dim, qhull=True), target)
    return gap


def _mixture_gap(vertices: np.ndarray | None, target: np.ndarray) -> float | None:
    """max t over mixtures p of ``vertices``: Σ p = 1, Σ p v = 0 (the mean), Σ p v_d² − t >=
    target_d; None without vertices or when infeasible (the mean outside: not this check's call)."""
    from scipy.optimize import linprog

    if vertices is None:
        return None
    m, dim = vertices.shape
    equal = np.vstack([np.r_[np.ones(m), 0.0][None], np.hstack([vertices.T, np.zeros((dim, 1))])])
    rhs = np.zeros(dim + 1)
    rhs[0] = 1.0
    below = np.hstack([-(vertices**2).T, np.ones((dim, 1))])
    found = linprog(
        np.r_[np.zeros(m), -1.0],
        A_ub=below,
        b_ub=-target,
        A_eq=equal,
        b_eq=rhs,
        bounds=[(0, None)] * m + [(None, 1.0)],
        method="highs",
    )
    return float(-found.fun) if found.status == 0 else None


def _box_certificate(A: np.ndarray, b: np.ndarray, hi: np.ndarray, target: np.ndarray) -> bool:
    """A pass without a solver: independent two-point laws, coordinate d at −l_d or +u_d with
    l_d·u_d = target_d (mean 0, that variance; u_d no further than the box side hi_d), fit
    when the whole box [−l, u] lies in the cell and the device's box (rows of ``A``): every
    row's largest value on it, Σ_d max(a_d u_d, −a_d l_d), at most its bound."""
    up = np.minimum(np.sqrt(target), np.maximum(hi, 0.0))
    if np.any((up <= 0) & (target > 0)):
        return False
    down = np.divide(target, up, out=np.zeros_like(target), where=up > 0)
    return bool(np.all(np.maximum(A * up, -A * down).sum(axis=1) <= b))


def _spread_certificate(A: np.ndarray, b: np.ndarray, walls: np.ndarray, target: np.ndarray, dim: int) -> bool:
    """A pass without vertices: two-point laws along the axes and along the axes projected
    onto each wall (a part cut by a wall spreads along it), each direction v reaching ±t±
    to the cell's boundary (variance t⁺t⁻ v_d² in coordinate d); weights p_v with Σ p_v <= 1
    (the rest at the mean) that meet every variance, found greedily."""
    if np.any(b <= 0):
        return False
    a = A[walls]
    projected = np.eye(dim)[None] - a[:, :, None] * a[:, None, :]  # each wall's projection (rows: the axes')
    length = np.linalg.norm(projected, axis=2)
    D = np.vstack([np.eye(dim), projected[length > 1e-9] / length[length > 1e-9][:, None]])
    along = D @ A.T
    with np.errstate(divide="ignore"):
        t_up = np.where(along > 1e-15, b[None] / np.where(along > 1e-15, along, 1.0), np.inf).min(axis=1)
        t_down = np.where(along < -1e-15, b[None] / np.where(along < -1e-15, -along, 1.0), np.inf).min(axis=1)
    with np.errstate(invalid="ignore"):  # an unbounded direction (inf · 0) is dropped just below
        spread = (t_up * t_down)[:, None] * D**2
    spread = spread[np.all(np.isfinite(spread), axis=1)]
    if not len(spread):
        return False
    left, mass = target.copy(), 0.0
    for d in np.argsort(-target):  # greedy: each coordinate by the direction that spreads it most
        if left[d] > 0:
            v = int(np.argmax(spread[:, d]))
            if spread[v, d] <= 0:
                return False
            p = left[d] / spread[v, d]
            mass, left = mass + p, left - p * spread[v]
    return mass <= 1 - 1e-9


def _vertices(A: np.ndarray, b: np.ndarray, dim: int, qhull: bool = False) -> np.ndarray | None:
    """The vertices of the bounded polytope {y : A y <= b}, or None: every ``dim`` rows solved
    at once when they are few (unless ``qhull``), else Qhull (from an interior point)."""
    from itertools import combinations
    from math import comb

    from scipy.optimize import linprog
    from scipy.spatial import HalfspaceIntersection

    if 1 < dim and not qhull and comb(len(A), dim) <= BRUTE_FORCE:
        rows = np.array(list(combinations(range(len(A)), dim)))
        systems = A[rows]
        ok = np.abs(np.linalg.det(systems)) > 1e-12
        points = np.linalg.solve(systems[ok], b[rows[ok]][..., None])[..., 0]
        inside = np.all(points @ A.T <= b + 1e-9 * (1.0 + np.abs(b)), axis=1)
        return points[inside] if inside.any() else None
    if dim == 1:
        ends = [linprog([sign], A_ub=A, b_ub=b, bounds=[(None, None)], method="highs") for sign in (1.0, -1.0)]
        return None if any(e.status != 0 for e in ends) else np.array([[ends[0].fun], [-ends[1].fun]])
    if np.all(b > 1e-9):  # the mean (the origin) is strictly inside: Qhull's interior point
        inside = np.zeros(dim)
    else:  # else the Chebyshev center
        norm = np.linalg.norm(A, axis=1)
        inner = linprog(
            np.r_[np.zeros(dim), -1.0],
            A_ub=np.hstack([A, norm[:, None]]),
            b_ub=b,
            bounds=[(None, None)] * dim + [(0, None)],
            method="highs",
        )
        if inner.status != 0 or inner.x[-1] <= 0:
            return None
        inside = inner.x[:dim]
    try:
        return HalfspaceIntersection(np.hstack([A, -b[:, None]]), inside).intersections
    except Exception:  # Qhull precision trouble: no verdict
        return None
