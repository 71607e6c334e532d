"""k-FED: one-shot federated clustering (Dennis, Li & Smith, ICML 2021; docs/ALGORITHMS.md §4).

Device (:func:`local_kprime_means`, task ``kfed_local``): the Awasthi-Sheffet local
k'-means. At most k' distinct points are their own centers; otherwise project the points
about their mean onto the top k' right singular vectors (from the small Gram matrix,
:func:`fedcluster.linalg.top_eigenpairs`; about the mean, unlike the paper, so that the step
is the same wherever the data lie: far from the origin the top direction is the offset),
seed by k-means++ and run Lloyd in the projection, lift to the original space by the
1/3-distance core sets, and run Lloyd there until the assignment is stable. Only non-empty
clusters are sent, with their counts.

Server (:func:`kfed_merge`): start from one seeded device's centers, add the device center
farthest from the chosen set until there are k, then a count-weighted Lloyd over all device
centers (one round: the paper; to convergence: the authors' code).

A point takes the global cluster of its local center (:func:`induced_labels`); a new device
maps its local centers to the nearest global centers (:func:`kfed_assign_new_device`).

Our choices beyond the paper (``n_init=1, seeding="core"`` on the device and
``n_init=1, to_convergence=False`` on the server are the paper): device restarts scored by
the cost in the ORIGINAL space, Lloyd seeded from Voronoi-cell means as well as core sets
(core sets shrink to a few noisy points below the theory's separation), restarts that stop
once the best was reproduced, and several server starts scored by the count-weighted cost
on the device centers (the part of the global cost the merge controls). Why, and what each
one buys: docs/results/kfed_system.md (``bench/kfed_system.py``).

NumPy only (with :mod:`fedcluster.lloyd` and :mod:`fedcluster.linalg`): it runs on a device.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from .config import WEIGHTINGS  # noqa: F401
from fedcluster.linalg import orthonormalize, top_eigenpairs
from fedcluster.lloyd import (
    farthest_first,
    kmeans_plus_plus,
    label_means,
    lloyd_until_stable,
    nearest,
    squared_distances,
)


__all__ = [
    "local_kprime_means",
    "kfed_assign_new_device",
    "induced_labels",
    "farthest_point_init",
    "kfed_merge",
    "default_k_prime",
    "TooFewCenters",
]

# Default number of device-side restarts (full steps 2-4, best original-space cost wins).
DEVICE_N_INIT = 10
# Default number of server-side starts scored by count-weighted cost (all run: on real data
# the merge's best start is often found late, bench/real_data.py).
SERVER_N_INIT = 100
# Auto k' (k-prime = 0): a device sends fewer than k local centers only when its own
# clusters are this many times costlier to merge than any two pieces of one cluster
# (Ward merge costs, :func:`separated_clusters`).
SEPARATION_JUMP = 100.0
# Device restarts stop once this many further restarts reproduced the best (0 = run all).
DEVICE_EARLY_STOP = 2
# Server merge starts likewise: on separated data every start finds the best grouping and
# ten repeats end the search; where the best is rare (real data) all starts run.
MERGE_EARLY_STOP = 10


# --------------------------------------------------------------------------------------
# Device side
# --------------------------------------------------------------------------------------


def _as_rng(rng: np.random.Generator | int | None) -> np.random.Generator:
    return rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)


def _core_set_seeds(A: np.ndarray, d2: np.ndarray, nu: np.ndarray, V: np.ndarray, mean: np.ndarray) -> np.ndarray:
    """Step 3: θ_r = mean of the 1/3-distance core set S_r in the original space.

    Fallbacks: Voronoi cell of ν_r when S_r is empty; lifted ν_r (ν_r V^T + the points'
    ``mean`` the projection is about) when that cell is empty too.
    """
    k = nu.shape[0]  # d2: (n, k) squared distances to ν in the projected space
    closest = np.argmin(d2, axis=1)
    if k > 1:
        two = np.partition(d2, 1, axis=1)[:, :2]
        # ||x - ν_r|| <= ||x - ν_s|| / 3 for all s != r  <=>  9 d_r^2 <= (second smallest)
        in_core = 9.0 * two[:, 0] <= two[:, 1]
    else:
        in_core = np.ones(A.shape[0], dtype=bool)
    lifted = nu @ V.T + mean  # (k, d): ν_r lifted back to the original space
    theta, core_counts = label_means(A[in_core], closest[in_core], lifted)
    empty_core = core_counts == 0
    if np.any(empty_core):
        voronoi, _ = label_means(A, closest, lifted)
        theta[empty_core] = voronoi[empty_core]
    return theta


def _voronoi_seeds(A: np.ndarray, d2: np.ndarray, nu: np.ndarray, V: np.ndarray, mean: np.ndarray) -> np.ndarray:
    """Means in the original space of ν's Voronoi cells in the projected space (lifted ν_r
    for an empty cell): the Kumar-Kannan seeding."""
    theta, _ = label_means(A, np.argmin(d2, axis=1), nu @ V.T + mean)
    return theta


def local_kprime_means(
    A: np.ndarray,
    k_prime: int,
    rng: np.random.Generator | int | None,
    max_iter: int = 100,
    *,
    n_init: int = DEVICE_N_INIT,
    seeding: str = "best",
    early_stop: int = DEVICE_EARLY_STOP,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Awasthi-Sheffet local k'-means on one device (Algorithm 1 of the paper).

    Parameters
    ----------
    A : (n, d) the device's points.
    k_prime : number of local clusters k' (>= 1).
    rng : NumPy Generator (or a seed) for the k-means++ seedings.
    max_iter : maximum Lloyd steps in the original space (step 4) and in the projected space.
    n_init : number of full runs of steps 2-4 from independent k-means++ seedings; the run
        with the lowest k-means cost on ``A`` wins (``n_init=1`` is the paper's single run).
    seeding : start of step 4. ``"core"`` -- the paper's core-set means (step 3);
        ``"voronoi"`` -- the original-space means of ν's Voronoi cells; ``"best"`` (default)
        -- Lloyd from both, the lower original-space cost wins (see module docstring).
    early_stop : stop the restarts once this many further restarts reproduced the best
        result so far (the same projected partition, or an original-space cost within a
        relative 1e-9): the lowest cost then has a basin that several independent seedings
        fell into. With ``0`` all ``n_init`` restarts run (a repeated projected partition is still
        skipped, which changes nothing: steps 3-4 are deterministic given it).

    Returns
    -------
    centers : (k'', d) local centers, k'' <= k', only non-empty clusters.
    counts : (k'',) int64 number of points in each local cluster (all > 0).
    labels : (n,) index into ``centers`` of each point's local cluster.
    """
    A, k_prime = _checked_device_data(A, k_prime, seeding)
    n, d = A.shape
    if n == 0:
        return np.zeros((0, d)), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    rng = _as_rng(rng)

    # Step 1a: few distinct points -> they are the centers (duplicates merged).
    if n <= k_prime or _has_at_most_distinct(A, k_prime):
        centers, labels, counts = np.unique(A, axis=0, return_inverse=True, return_counts=True)
        return centers, counts.astype(np.int64), labels.reshape(-1).astype(np.int64)

    # Step 1b: project the points about their mean onto the top k' right singular vectors
    # (the paper does not centre: far from the origin its top direction is the offset).
    mean = A.mean(axis=0)
    centred = A - mean
    V = _top_right_singular_vectors(centred, k_prime)  # (d, r), r = min(k', n, d)
    A_hat = centred @ V

    best: tuple[np.ndarray, np.ndarray, float] | None = None
    seen: dict[bytes, float] = {}  # projected partition -> best cost of its steps 3-4
    hits = 0  # restarts that reproduced the current best (see ``early_stop``)
    for _ in range(max(1, int(n_init))):
        # Step 2: constant-factor approximation in the projected space: greedy k-means++
        # seeding + Lloyd until the assignment is stable.
        nu, nu_labels, _ = lloyd_until_stable(A_hat, kmeans_plus_plus(A_hat, k_prime, rng), max_iter)
        # Steps 3-4 are a deterministic function of the projected partition (up to a
        # relabelling), so a partition seen before gives the same result again: skip it.
        key = _canonical_partition(nu_labels)
        if key in seen:
            if seen[key] <= best[2] * (1.0 + 1e-9):
                hits += 1  # reproduced the best
                if early_stop and hits >= early_stop:
                    break
            continue
        restart_best = _steps_3_and_4(A, A_hat, nu, V, mean, seeding, max_iter)
        seen[key] = restart_best[2]
        # Only a match between DIFFERENT restarts counts as a reproduction.
        if best is None or restart_best[2] < best[2] * (1.0 - 1e-9):
            best, hits = restart_best, 0
        elif restart_best[2] <= best[2] * (1.0 + 1e-9):
            hits += 1
            if early_stop and hits >= early_stop:
                break
    centers, labels, _ = best
    return _nonempty(centers, labels)


def _checked_device_data(A: np.ndarray, k_prime: int, seeding: str) -> tuple[np.ndarray, int]:
    """``A`` as float64 points and ``k_prime`` as an int, or a ValueError naming the problem."""
    A = np.asarray(A, dtype=np.float64)
    if A.ndim != 2:
        raise ValueError(f"device data must be a 2-D array (n x d), got shape {A.shape}")
    if not np.all(np.isfinite(A)):
        raise ValueError("device data contains NaN or infinite values")
    k_prime = int(k_prime)
    if k_prime < 1:
        raise ValueError(f"k-prime must be >= 1, got {k_prime}")
    if seeding not in ("best", "core", "voronoi"):
        raise ValueError(f"seeding must be 'best', 'core' or 'voronoi', got {seeding!r}")
    return A, k_prime


def _steps_3_and_4(
    A: np.ndarray, A_hat: np.ndarray, nu: np.ndarray, V: np.ndarray, mean: np.ndarray, seeding: str, max_iter: int
) -> tuple[np.ndarray, np.ndarray, float]:
    """Steps 3-4 from the projected centers ``nu``: seeds in the original space (core sets
    and/or Voronoi-cell means), then Lloyd there until the assignment is stable; the
    cheapest. Two starts with the same first assignment follow the same Lloyd path: run once."""
    d2_hat = squared_distances(A_hat, nu)
    starts = []
    if seeding in ("best", "core"):
        starts.append(_core_set_seeds(A, d2_hat, nu, V, mean))
    if seeding in ("best", "voronoi"):
        starts.append(_voronoi_seeds(A, d2_hat, nu, V, mean))
    first_labels: list[np.ndarray] = []
    best: tuple[np.ndarray, np.ndarray, float] | None = None
    for theta in starts:
        lab0 = nearest(A, theta)
        if any(np.array_equal(lab0, f) for f in first_labels):
            continue
        first_labels.append(lab0)
        run = lloyd_until_stable(A, theta, max_iter, labels=lab0)
        if best is None or run[2] < best[2]:
            best = run
    return best


def _nonempty(centers: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The clusters that hold a point, their counts and the labels renumbered compactly."""
    counts = np.bincount(labels, minlength=centers.shape[0])
    keep = np.flatnonzero(counts > 0)
    remap = np.full(centers.shape[0], -1, dtype=np.int64)
    remap[keep] = np.arange(keep.size)
    return centers[keep], counts[keep].astype(np.int64), remap[labels]


def ward_agglomeration(
    centers: np.ndarray, counts: np.ndarray, groups: int = 1
) -> tuple[np.ndarray, np.ndarray | None]:
    """Ward's agglomeration of weighted centers, the cheapest pair merged each time (the
    k-means cost it adds: ``n_a n_b / (n_a + n_b) · ||μ_a − μ_b||²``). Returns ``merge``
    ((c − 1,) costs: ``merge[j - 1]`` is the cost added when the ``j + 1`` groups left are
    merged into ``j``) and the means of the ``groups`` groups left on the way (None when
    ``groups`` is not between 1 and c)."""
    C = np.asarray(centers, dtype=np.float64).copy()
    N = np.asarray(counts, dtype=np.float64).copy()
    c = C.shape[0]
    merge = np.zeros(max(c - 1, 0))
    alive = np.ones(c, dtype=bool)
    left = C.copy() if groups == c else None
    if c < 2:
        return merge, left
    cost = N[:, None] * N[None] / (N[:, None] + N[None]) * squared_distances(C, C)
    np.fill_diagonal(cost, np.inf)
    for remaining in range(c - 1, 0, -1):
        a, b = divmod(int(np.argmin(cost)), c)
        merge[remaining - 1] = cost[a, b]
        C[a] = (N[a] * C[a] + N[b] * C[b]) / (N[a] + N[b])
        N[a] += N[b]
        alive[b] = False
        cost[b, :] = cost[:, b] = np.inf
        row = N * N[a] / (N + N[a]) * np.sum((C - C[a]) ** 2, axis=1)
        row[~alive] = np.inf
        row[a] = np.inf
        cost[a, :] = cost[:, a] = row
        if remaining == groups:
            left = C[alive].copy()
    return merge, left


def ward_costs(centers: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The merge costs of :func:`ward_agglomeration`."""
    return ward_agglomeration(centers, counts)[0]


def separated_clusters(merge: np.ndarray, jump: float = SEPARATION_JUMP) -> int | None:
    """The finest number of groups c whose next merge (c → c − 1) costs at least ``jump``
    times any merge before it (:func:`ward_costs`): c clusters a device can SHOW it holds.
    None when no merge stands out that much (then it cannot tell)."""
    for groups in range(merge.shape[0], 1, -1):
        earlier = merge[groups - 1 :]  # the merges down to `groups` groups
        if merge[groups - 2] >= jump * max(float(earlier.max()), 1e-300):
            return groups
    return None


def auto_local_means(
    A: np.ndarray, k: int, rng: np.random.Generator | int | None, max_iter: int = 100, **kwargs: Any
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """k' chosen by the device (``k-prime = 0``): the local k-means at k' = k (the most
    clusters a device can hold, so the paper's condition k' ≥ the clusters it holds always
    holds), merged down to c groups only when its own data show c clusters separated
    beyond doubt (:func:`separated_clusters`), then Lloyd on its points from those groups'
    means. Estimating fewer clusters from less evidence under-counts real, overlapping
    clusters (the cause of k-FED's high costs on IID splits with k' = ⌈√k⌉;
    docs/ALGORITHMS.md §4 has the numbers)."""
    rng = _as_rng(rng)
    centers, counts, labels = local_kprime_means(A, k, rng, max_iter, **kwargs)
    groups = separated_clusters(ward_costs(centers, counts)) if centers.shape[0] > 2 else None
    if groups is None:
        return centers, counts, labels
    merged = ward_agglomeration(centers, counts, groups)[1]
    centers, labels, _ = lloyd_until_stable(A, merged, max_iter)
    return _nonempty(centers, labels)


def _top_right_singular_vectors(A: np.ndarray, r: int) -> np.ndarray:
    """Orthonormal (d, min(r, n, d)) basis of the top-``r`` right singular subspace of ``A``.

    Eigenvectors of the small Gram matrix instead of a full SVD: ``A^T A`` (d x d) when
    d <= n, else ``A A^T`` (n x n) with ``V = A^T U Σ^{-1}``. The projected distances, all
    that the device step uses, depend only on the subspace, so the result equals the SVD's
    up to rounding (signs and the order inside a repeated singular value do not matter).
    Directions with a singular value that is zero to rounding are dropped from the
    ``A A^T`` route (they carry no data); the SVD is the fallback if the eigensolver fails.
    """
    n, d = A.shape
    r = min(int(r), n, d)
    try:
        if d <= n:
            w, U = top_eigenpairs(A.T @ A, r)
            return U
        w, U = top_eigenpairs(A @ A.T, r)
        keep = w > max(w[0], 0.0) * max(n, d) * np.finfo(np.float64).eps
        if not np.all(keep):
            raise np.linalg.LinAlgError("rank-deficient Gram matrix")
        V = (A.T @ U) / np.sqrt(w)
        return orthonormalize(V)  # rounding in the Gram route
    except np.linalg.LinAlgError:
        _, _, Vt = np.linalg.svd(A, full_matrices=False)
        return Vt[:r].T


def _canonical_partition(labels: np.ndarray) -> bytes:
    """Labels renumbered by first appearance: equal keys <=> the same partition."""
    _, first = np.unique(labels, return_index=True)
    order = np.argsort(first, kind="stable")
    remap = np.empty(order.size, dtype=np.int64)
    remap[order] = np.arange(order.size)
    return remap[np.searchsorted(np.unique(labels), labels)].tobytes()


def _has_at_most_distinct(A: np.ndarray, m: int) -> bool:
    """True when ``A`` has at most ``m`` distinct rows.

    Cheap screen first: rows with distinct values along a random direction are distinct
    rows, so more than ``m`` distinct projections settles it in O(n d + n log n); only
    otherwise (degenerate data) are the rows compared exactly.
    """
    direction = np.random.default_rng(0).standard_normal(A.shape[1])
    if np.unique(A @ direction).size > m:
        return False
    return np.unique(A, axis=0).shape[0] <= m


def induced_labels(local_labels: np.ndarray, local_to_global: np.ndarray) -> np.ndarray:
    """k-FED induced clustering (Definition 3.3): point i gets the global cluster of its
    local center, ``local_to_global[local_labels[i]]``."""
    local_labels = np.asarray(local_labels, dtype=np.int64)
    local_to_global = np.asarray(local_to_global, dtype=np.int64)
    if local_labels.size and (local_labels.min() < 0 or local_labels.max() >= local_to_global.size):
        raise ValueError(
            f"local labels must lie in [0, {local_to_global.size}), "
            f"got range [{local_labels.min()}, {local_labels.max()}]"
        )
    return local_to_global[local_labels]


def kfed_assign_new_device(local_centers: np.ndarray, global_centers: np.ndarray) -> np.ndarray:
    """Map each local center of a (new or held-out) device to its nearest global center.

    O(k·k'') distances; no other device is involved (Theorem 3.2). Returns (k'',) int64.
    """
    local_centers = np.asarray(local_centers, dtype=np.float64)
    global_centers = np.asarray(global_centers, dtype=np.float64)
    if local_centers.ndim != 2 or global_centers.ndim != 2 or (local_centers.shape[1] != global_centers.shape[1]):
        raise ValueError(
            f"local centers of shape {local_centers.shape} and global centers of shape "
            f"{global_centers.shape} do not match"
        )
    if local_centers.shape[0] == 0:
        return np.zeros(0, dtype=np.int64)
    if global_centers.shape[0] == 0:
        raise ValueError("no global centers to assign to")
    return np.argmin(squared_distances(local_centers, global_centers), axis=1).astype(np.int64)


# --------------------------------------------------------------------------------------
# Server side
# --------------------------------------------------------------------------------------


def score_bounds(centers: np.ndarray, counts: np.ndarray, cost: float, candidates: np.ndarray) -> np.ndarray:
    """The most a device's points can cost under each candidate center set (m, k, d),
    given what it declared in ``kfed_local``: its centers c_j, the sizes n_j of the
    clusters its points form around them, and their total cost L. Every point may go to
    the candidate nearest its own center, at distance ≤ ‖x − c_j‖ + ‖c_j − c*‖, so by the
    triangle inequality over each cluster's points and Cauchy–Schwarz over the clusters,
    cost ≤ (√L + √(Σ_j n_j min_c ‖c_j − c‖²))², up to the rounding of the coordinates' own
    size (nothing near the origin; far from it a coordinate is known to a few units in its
    last place: :func:`fedcluster.bounds.deviation_rounding`). A ``score_candidates`` reply
    above it contradicts the device's own declaration."""
    return score_range(centers, counts, cost, candidates)[1]


def score_range(
    centers: np.ndarray, counts: np.ndarray, cost: float, candidates: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The least and the most a device's points can cost under each candidate center set,
    given its ``kfed_local`` declaration (:func:`score_bounds` is the most). The least: a
    point x of cluster j is at least ‖c_j − c(x)‖ − ‖x − c_j‖ from its nearest candidate
    c(x), so (reverse triangle inequality over all points) √cost ≥ √M − √L with
    M = Σ_j n_j min_c ‖c_j − c‖². A device that declares a local center where none of its
    points are (far from them) and scores the candidates on its real points costs less
    than that on every candidate without a center near its false one. Both bounds widen
    by the same rounding allowance."""
    from fedcluster.bounds import coordinate_rounding, deviation_rounding, expansion_rounding

    centers, counts = np.asarray(centers, dtype=np.float64), np.asarray(counts, dtype=np.float64)
    candidates = np.asarray(candidates, dtype=np.float64)
    moved = np.array([float(counts @ squared_distances(centers, c).min(axis=1)) for c in candidates])
    root_cost = math.sqrt(max(float(cost), 0.0))
    high = (root_cost + np.sqrt(moved)) ** 2
    low = np.maximum(np.sqrt(moved) - root_cost, 0.0) ** 2
    if not centers.size:
        return low, high
    # rounding: of the coordinates' own size, and of the squared distances taken here (Δ in
    # the moved mass moves either bound by at most 2√(MΔ) + 2√(LΔ) + Δ)
    delta = coordinate_rounding(centers, candidates)
    moved_rounding = np.array([expansion_rounding(counts, centers, c) for c in candidates])
    slack = (
        np.array([deviation_rounding(float(counts.sum()), b, delta) for b in high])
        + 2.0 * (root_cost + np.sqrt(moved)) * np.sqrt(moved_rounding)
        + moved_rounding
    )
    return np.maximum(low - slack, 0.0), high + slack


def score_violation(costs: np.ndarray, bounds: np.ndarray, floors: np.ndarray | None = None) -> str | None:
    """Why a device's candidate costs cannot be its own (above :func:`score_bounds`, or
    below ``floors``: :func:`score_range`), or None."""
    costs = np.asarray(costs, dtype=np.float64)
    over = np.flatnonzero(costs > bounds * (1 + 1e-9) + 1e-9)
    if over.size:
        return (
            f"its cost of candidate {int(over[0])} exceeds what its declared local centers, counts and cost "
            f"allow ({float(costs[over[0]]):.6g} > {float(bounds[over[0]]):.6g})"
        )
    if floors is not None:
        under = np.flatnonzero(costs < floors * (1 - 1e-9) - 1e-9)
        if under.size:
            return (
                f"its cost of candidate {int(under[0])} is below what its declared local centers, counts and "
                f"cost allow ({float(costs[under[0]]):.6g} < {float(floors[under[0]]):.6g}): its points are not "
                f"where its local centers say"
            )
    return None


def _stack_centers(device_centers: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Stack the devices' centers; returns ``(all_centers, device_index_of_each_row)``."""
    if len(device_centers) == 0:
        raise ValueError("no device centers to merge")
    mats = [np.asarray(c, dtype=np.float64) for c in device_centers]
    dims = {m.shape[1] for m in mats if m.ndim == 2 and m.shape[0] > 0}
    for z, m in enumerate(mats):
        if m.ndim != 2:
            raise ValueError(f"device {z}: centers must be 2-D (k'' x d), got shape {m.shape}")
        if not np.all(np.isfinite(m)):
            raise ValueError(f"device {z}: centers contain NaN or infinite values")
    if len(dims) > 1:
        raise ValueError(f"device centers have different dimensions: {sorted(dims)}")
    d = dims.pop() if dims else mats[0].shape[1]
    owner = np.concatenate([np.full(m.shape[0], z, dtype=np.int64) for z, m in enumerate(mats)])
    return np.vstack([m.reshape(-1, d) for m in mats]), owner


def _farthest_point_indices(all_centers: np.ndarray, owner: np.ndarray, k: int, start_device: int) -> np.ndarray:
    rows = np.flatnonzero(owner == start_device)
    if rows.size > k:  # first k by farthest-first traversal within the device
        sub = farthest_first(all_centers[rows], np.array([0]), k)
        rows = rows[sub]
    return farthest_first(all_centers, rows, k)


def farthest_point_init(
    device_centers: Sequence[np.ndarray], k: int, rng: np.random.Generator | int | None
) -> np.ndarray:
    """k-FED steps 2-6: M ← the centers of one (seeded-random) device, then repeatedly the
    device center farthest from M, until |M| = k. Returns (k, d).

    If the chosen device has more than ``k`` centers, the first ``k`` of a farthest-first
    traversal of them (from its first center) are taken. Raises ``ValueError`` when ``k``
    exceeds the total number of device centers.
    """
    all_centers, owner = _stack_centers(device_centers)
    k = int(k)
    _check_k(k, all_centers.shape[0])
    rng = _as_rng(rng)
    nonempty = np.flatnonzero(np.bincount(owner, minlength=len(device_centers)) > 0)
    start = int(nonempty[rng.integers(nonempty.size)])
    return all_centers[_farthest_point_indices(all_centers, owner, k, start)].copy()


class TooFewCenters(ValueError):
    """The devices sent fewer local centers in total than the ``k`` asked for."""


def default_k_prime(k: int, k_prime: int = 0) -> int:
    """The most local clusters a device sends: ``k_prime``, or k when it is 0 (each device
    then chooses, :func:`auto_local_means`). The paper's rule is k' = ⌈√k⌉
    (:func:`paper_k_prime`)."""
    return int(k_prime) or int(k)


def paper_k_prime(k: int) -> int:
    """The paper's k' = ⌈√k⌉ (it assumes a device holds at most that many clusters)."""
    return int(math.ceil(math.sqrt(int(k))))


def induced_over_nearest(
    device_centers: Sequence[np.ndarray],
    device_counts: Sequence[np.ndarray],
    device_costs: Sequence[float],
    assignment: Sequence[np.ndarray],
    global_centers: np.ndarray,
    nearest_cost: float,
) -> float:
    """The k-means cost of k-FED's induced clustering (every point takes its local center's
    global cluster) over the cost of the same global centers with every point at its
    nearest (the federated evaluation). The induced cost is exact from what the devices
    sent: Σ local cost + Σ count·||local center − its global center||². Near 1: local
    clusters sit inside global ones; well above 1: local clusters span several global
    clusters, i.e. k' was too small for how the devices' data are clustered."""
    spread = sum(
        float(np.sum(np.asarray(n) * np.sum((np.asarray(c) - global_centers[np.asarray(a)]) ** 2, axis=1)))
        for c, n, a in zip(device_centers, device_counts, assignment)
        if len(c)
    )
    return (float(sum(device_costs)) + spread) / nearest_cost if nearest_cost > 0 else 1.0


def _check_k(k: int, total: int) -> None:
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if k > total:
        raise TooFewCenters(
            f"k={k} is larger than the {total} local centers the devices sent: k-FED cannot "
            f"form more global clusters than it has device centers (raise k-prime, add devices "
            f"or lower k)"
        )


def cap_device_weights(device_counts: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Scale every device's counts so that its total is at most the median device total.

    The robust weighting of k-FED's merge: a device that claims a huge point count (its
    first reply fixes its own n, so nothing else bounds it) then weighs no more than a
    typical device, and honest devices at or below the median keep their counts exactly.
    """
    totals = np.array([float(np.sum(c)) for c in device_counts])
    positive = totals[totals > 0]
    if positive.size == 0:
        return [np.asarray(c, dtype=np.float64) for c in device_counts]
    cap = float(np.median(positive))
    return [np.asarray(c, dtype=np.float64) * (cap / t if t > cap else 1.0) for c, t in zip(device_counts, totals)]


def _checked_counts(device_counts: Sequence[np.ndarray], device_centers: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Each device's counts as float64, one finite non-negative count per center."""
    counts = []
    for z, (c, m) in enumerate(zip(device_counts, device_centers)):
        c = np.asarray(c, dtype=np.float64).reshape(-1)
        if c.shape[0] != np.asarray(m).shape[0]:
            raise ValueError(f"device {z}: {np.asarray(m).shape[0]} centers but {c.shape[0]} counts")
        if not np.all(np.isfinite(c)) or np.any(c < 0):
            raise ValueError(f"device {z}: counts must be finite and non-negative")
        counts.append(c)
    return counts


def kfed_merge(
    device_centers: Sequence[np.ndarray],
    device_counts: Sequence[np.ndarray],
    k: int,
    rng: np.random.Generator | int | None,
    weighting: str = "count",
    to_convergence: bool = True,
    max_iter: int = 100,
    *,
    n_init: int = SERVER_N_INIT,
    early_stop: int = MERGE_EARLY_STOP,
    min_devices: int = 1,
    return_kept: bool = False,
    candidates: int = 1,
):
    """k-FED server steps 2-7: merge the devices' local centers into ``k`` global clusters.

    Parameters
    ----------
    device_centers : one (k''_z, d) array per replying device (a device with no center may
        send a (0, d) array).
    device_counts : one (k''_z,) array of non-negative counts per device.
    k : number of global clusters; at most the total number of device centers.
    rng : NumPy Generator (or seed): which device starts the farthest-point traversal, and
        the extra starts when ``n_init > 1``.
    weighting : ``"count"`` -- group means and the start score weighted by counts;
        ``"uniform"`` -- every device center counts once; ``"capped-count"`` -- by counts,
        but no device weighs more than the median device (:func:`cap_device_weights`).
    to_convergence : ``False`` -- one Lloyd round from M (the paper's Algorithm 2, step 7);
        ``True`` -- Lloyd until the grouping is stable (the authors' code).
    max_iter : maximum Lloyd rounds when ``to_convergence``.
    n_init : number of starts. The first is always the paper's start (farthest-point
        traversal from the seeded device); the others are farthest-point starts from other
        devices and weighted k-means++ starts, alternately. Each is refined by Lloyd and
        the lowest weighted cost on the device centers wins. ``n_init=1`` is the paper.
    early_stop : stop the starts once this many further starts have reproduced the best
        cost so far (relative 1e-9; default ``MERGE_EARLY_STOP``); 0 runs all ``n_init``.
    min_devices : every global cluster must gather centers of at least this many distinct
        devices. The centers of a weaker cluster are left out and the merge is redone on the
        rest, until every cluster is supported (:func:`unsupported_centers`); a center left
        out takes the nearest global cluster in ``assignment``. 1 (the paper) leaves nothing
        out. 2 stops one device from claiming a global cluster of its own with a center far
        from everyone else's (the farthest-point start picks it first) -- and drops a real
        cluster that only one device holds.
    return_kept : also return the (total centers,) bool mask of the device centers the
        final merge used (all True unless ``min_devices`` left some out), in the stacked
        order of ``device_centers``.
    candidates : with more than 1, return ``([(centers, assignment), ...], kept)``: the up
        to ``candidates`` distinct groupings of the final merge, cheapest on the device
        centers first (what the devices' own data then choose among, ``kfed-evaluate``).

    Defaults (``to_convergence=True``, ``n_init=100`` with early stop, count weighting)
    are the most accurate in ``bench/kfed_table.py`` and ``bench/real_data.py``; the
    paper-faithful call is
    ``kfed_merge(..., to_convergence=False, n_init=1)``.

    Returns
    -------
    global_centers : (k, d).
    assignment : list (one per device) of (k''_z,) int64 arrays, the global cluster of each
        device center (the groups τ_1..τ_k). With one Lloyd round these are the groups
        around M, and ``global_centers`` are their means, exactly as in the paper.
    """
    if weighting not in WEIGHTINGS:
        raise ValueError(f"weighting must be one of {', '.join(WEIGHTINGS)}, got {weighting!r}")
    if len(device_counts) != len(device_centers):
        raise ValueError(f"{len(device_centers)} center arrays but {len(device_counts)} count arrays")
    points, owner = _stack_centers(device_centers)
    counts = _checked_counts(device_counts, device_centers)
    k = int(k)
    _check_k(k, points.shape[0])
    rng = _as_rng(rng)
    if weighting == "capped-count":
        counts = cap_device_weights(counts)
    weights = np.concatenate(counts) if weighting != "uniform" else np.ones(points.shape[0])

    min_devices = int(min_devices)
    if min_devices < 1:
        raise ValueError(f"min_devices must be >= 1, got {min_devices}")
    kept = np.ones(points.shape[0], dtype=bool)
    while True:
        found = _groupings(
            points[kept], owner[kept], weights[kept], k, rng, n_init, early_stop, max_iter if to_convergence else 1
        )
        _, best_centers, best_labels = found[0]
        weak = unsupported_centers(owner[kept], best_labels, k, min_devices) if min_devices > 1 else None
        if weak is None or not weak.any():
            break
        kept[np.flatnonzero(kept)[weak]] = False
        if kept.sum() < k:
            raise TooFewCenters(
                f"k={k} with min-devices={min_devices}: only {int(kept.sum())} device centers lie in "
                f"global clusters that {min_devices} or more devices share (lower k or min-devices)"
            )
    if candidates > 1:  # the distinct groupings, cheapest first, each with its assignment
        out = []
        for _, centers, grouped in found[:candidates]:
            labels = nearest(points, centers)
            labels[kept] = grouped
            out.append((centers, [labels[owner == z].astype(np.int64) for z in range(len(device_centers))]))
        return out, kept
    labels = nearest(points, best_centers)
    labels[kept] = best_labels
    assignment = [labels[owner == z].astype(np.int64) for z in range(len(device_centers))]
    return (best_centers, assignment, kept) if return_kept else (best_centers, assignment)


def unsupported_centers(owner: np.ndarray, labels: np.ndarray, k: int, min_devices: int) -> np.ndarray:
    """Mask of the device centers whose global cluster gathers centers of fewer than
    ``min_devices`` distinct devices (``owner``: the device of each center, ``labels``:
    its global cluster in 0..k-1)."""
    owner = np.asarray(owner, dtype=np.int64)
    labels = np.asarray(labels, dtype=np.int64)
    devices = int(owner.max(initial=0)) + 1
    pairs = np.unique(labels * devices + owner)  # distinct (cluster, device)
    support = np.bincount(pairs // devices, minlength=int(k))
    return support[labels] < int(min_devices)


def left_out_by_node(node_of_row: np.ndarray, kept: np.ndarray) -> list[dict[str, int]]:
    """``[{"node", "centers"}]``: how many device centers of each node the merge left out
    (``kept`` from ``kfed_merge(..., return_kept=True)``), by node id."""
    nodes, counts = np.unique(np.asarray(node_of_row)[~np.asarray(kept, dtype=bool)], return_counts=True)
    return [{"node": int(n), "centers": int(c)} for n, c in zip(nodes, counts)]


def _groupings(
    points: np.ndarray,
    owner: np.ndarray,
    weights: np.ndarray,
    k: int,
    rng: np.random.Generator,
    n_init: int,
    early_stop: int,
    lloyd_rounds: int,
) -> list[tuple[float, np.ndarray, np.ndarray]]:
    """Steps 2-7 from every start of :func:`kfed_merge` (the paper's farthest-point start
    from a seeded device first): the distinct groupings ``(weighted cost, centers, labels)``
    of ``points``, cheapest first (groupings of equal cost, relative 1e-9, count once)."""
    if weights.sum() <= 0:
        weights = np.ones(points.shape[0])  # all counts zero: fall back to uniform
    nonempty_devices = np.unique(owner)
    first = int(nonempty_devices[rng.integers(nonempty_devices.size)])
    other_devices = rng.permutation(nonempty_devices[nonempty_devices != first])

    found: list[tuple[float, np.ndarray, np.ndarray]] = []
    best_cost = np.inf
    hits = 0
    fp_used = 0
    for trial in range(max(1, int(n_init))):
        if trial == 0:
            rows = _farthest_point_indices(points, owner, k, first)
        elif trial % 2 == 1 and fp_used < other_devices.size:
            rows = _farthest_point_indices(points, owner, k, int(other_devices[fp_used]))
            fp_used += 1
        else:
            rows = kmeans_plus_plus(points, k, rng, weights, indices=True)
        # Step 7: Lloyd on the device centers from the start (one round: the groups around
        # M and their means, as in the paper; else until the grouping is stable).
        centers, labels, cost = lloyd_until_stable(points, points[rows], lloyd_rounds - 1, weights)
        if not any(abs(cost - other) <= 1e-9 * max(other, 1e-300) for other, _, _ in found):
            found.append((cost, centers, labels))
        if cost < best_cost * (1.0 - 1e-9):
            best_cost, hits = cost, 0
        elif cost <= best_cost * (1.0 + 1e-9):
            hits += 1
            if early_stop and hits >= early_stop:
                break  # the best grouping was reached from three different starts
    found.sort(key=lambda item: item[0])
    return found
