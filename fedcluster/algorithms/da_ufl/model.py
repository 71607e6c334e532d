"""DA-UFL: dual-averaging federated k-means with bin or SOM weights (device and server math).

Servetnyk, Fung & Han, "Unsupervised Federated Learning for Unbalanced Data" (GLOBECOM
2020); working specification docs/ALGORITHMS.md §2, which corrects the paper's update
(4b) and says how ξ is drawn. NumPy only: a device imports this module.

Device kernels (declared in :mod:`fedcluster.protocol`):

``som_codebook``  a batch Kohonen SOM (grid × grid units, at most one per point of the
                  device; Gaussian neighbourhood, exponentially decaying radius, seeded)
                  trained on the device's points;
``bin_counts``    points per bin: cells of a grid over the federated bounding box (UFLBin)
                  or Voronoi cells of the concatenated codebooks P (UFLSOM);
``daufl_step``    one inner step: the perturbed labels of the outer iteration (eq. 2, ξ
                  drawn per point AND per cluster), the weighted gradient
                  g_k = Σ μ_nk w_b(n) (m_k − x_n) and weighted count W_k = Σ μ_nk w_b(n);
                  on the first step of an outer iteration also how many labels changed.

The device is stateless: the labels of an outer iteration are a function of (anchor
centers m^(0), t1, ξ_max, the seed the server chose for this node and iteration), so the
request carries them and the device recomputes (a small cache avoids recomputing within
one process). ξ is redrawn every outer iteration (the simulated-annealing reading of
eq. 2, whose perturbation decays as 1/t1).

Server math: :func:`bin_weights` (w_jb = c_jb / Σ_j c_jb), :func:`grid_cells` (b^d with a
clear refusal when too many), :func:`grid_centers`, :func:`weighted_init` (k-means++ on the
codebook or bin centers weighted by total counts), :func:`dual_averaging_update`
(m_k = m_k^(0) − z_k / (2 α_k), α_k = W_k / (2η): the recentred eq. (4b); η = 1 is one
weighted Lloyd step), :func:`max_move` (the ε_glo test).
"""

from __future__ import annotations


import numpy as np

from fedcluster.bounds import coordinate_rounding
from fedcluster.kernel import DeviceData
from fedcluster.lloyd import (
    kmeans_plus_plus,
    label_sums,
    largest_magnitudes,
    lloyd_of_sets,
    nearest,
    reference,
    squared_distances,
)
from fedcluster.robust import aggregate_centers

from .config import MAX_BINS, RUN_CONFIG  # noqa: F401

# ------------------------------------------------------------------------------- SOM


def train_som(
    X: np.ndarray,
    grid: int,
    epochs: int,
    rng: np.random.Generator,
    radius: tuple[float, float] | None = None,
) -> np.ndarray:
    """Batch Kohonen SOM on ``X``: the (grid², d) codebook, units in row-major grid order.

    Units start at distinct random data points (with repetition only when the device has
    fewer points than units). Each of ``epochs`` passes finds every point's best matching
    unit (BMU) and sets every unit u to the neighbourhood-weighted mean of the points,
    ``p_u = Σ_x h(u, bmu(x)) x / Σ_x h(u, bmu(x))`` with the Gaussian neighbourhood
    ``h = exp(−||g_u − g_bmu||² / (2 σ²))`` on the grid coordinates; σ decays exponentially
    from its first to its last value (default: grid/2 down to 0.5), so the last passes are
    nearly Lloyd steps. A unit no point's neighbourhood reaches keeps its place. (The batch
    form of Kohonen's rule: the same fixed points as the online one without its per-point
    learning rate, and whole-array NumPy passes instead of one Python step per point.)"""
    X = np.asarray(X, dtype=np.float64)
    n = X.shape[0]
    if n == 0:
        raise ValueError("a SOM needs at least one point")
    units = grid * grid
    rows, cols = np.divmod(np.arange(units), grid)
    coords = np.stack([rows, cols], axis=1).astype(np.float64)
    grid_d2 = squared_distances(coords, coords)
    codebook = X[rng.choice(n, size=units, replace=n < units)].copy()
    r0, r1 = radius if radius is not None else (max(grid / 2.0, 0.5), 0.5)
    for epoch in range(epochs):
        sigma = r0 * (r1 / r0) ** (epoch / max(epochs - 1, 1))
        sums, counts = label_sums(X, nearest(X, codebook), units)
        h = np.exp(-grid_d2 / (2.0 * sigma * sigma))
        mass = h @ counts
        moved = mass > 0
        codebook[moved] = (h @ sums)[moved] / mass[moved, None]
    return codebook


def som_grid(k: int) -> int:
    """Grid side of the auto SOM (``som-grid = 0``): about 4k units, at least 4 × 4, so that
    a device holding every cluster has several units in each (a device with fewer points
    than units uses a smaller grid, :func:`device_grid`)."""
    return max(4, int(np.ceil(np.sqrt(4 * k))))


def is_grid(units: int, grid: int) -> bool:
    """Is ``units`` the size of a square SOM grid of side at most ``grid``?"""
    side = int(round(np.sqrt(units)))
    return side * side == units and 1 <= side <= grid


def device_grid(grid: int, points: int) -> int:
    """The grid side a device trains: ``grid``, or the largest whose units it has points for."""
    return max(1, min(grid, int(np.sqrt(points))))


# ------------------------------------------------------------------------------- bins


class TooManyBins(ValueError):
    """The grid of the bin variant has more than ``max_bins`` cells (b^d grows fast)."""


def grid_cells(bins: int, d: int, max_bins: int) -> int:
    """b^d, the number of grid cells, or :class:`TooManyBins` when it exceeds ``max_bins``."""
    cells = bins**d  # exact (Python int)
    if cells > max_bins:
        raise TooManyBins(
            f"the bin grid has bins^d = {bins}^{d} = {cells:.3g} cells, more than max-bins={max_bins}: "
            "bins grow exponentially with the dimension; use weighting='som' (SOM codebooks, "
            "grid² cells per device whatever the dimension) or fewer bins"
        )
    return cells


def grid_index(X: np.ndarray, low: np.ndarray, high: np.ndarray, bins: int) -> np.ndarray:
    """Flat (row-major) grid cell of every row of ``X``; b cells per dimension over
    [low, high]; points outside are clipped to the border cells; a flat dimension has one
    populated cell (0)."""
    width = np.where(high > low, high - low, 1.0)
    cell = np.floor((X - low) / width * bins).astype(np.int64)
    np.clip(cell, 0, bins - 1, out=cell)
    flat = np.zeros(X.shape[0], dtype=np.int64)
    for j in range(X.shape[1]):
        flat = flat * bins + cell[:, j]
    return flat


def grid_centers(low: np.ndarray, high: np.ndarray, bins: int) -> np.ndarray:
    """(b^d, d) centers of the grid cells, in the order of :func:`grid_index`."""
    d = low.shape[0]
    steps = (high - low) / bins
    idx = np.indices((bins,) * d).reshape(d, -1).T  # row-major, last dimension fastest
    return low + (idx + 0.5) * steps


def bin_weights(counts: np.ndarray) -> np.ndarray:
    """Per-agent per-bin weights w_jb = c_jb / Σ_j c_jb from the (J, q) counts; a bin no
    agent populated gets weight 0 everywhere. Every populated bin's weights sum to 1."""
    counts = np.asarray(counts, dtype=np.float64)
    total = counts.sum(axis=0)
    return np.divide(counts, total, out=np.zeros_like(counts), where=total > 0)


def start_support(points: np.ndarray, counts: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The bin representatives a start is drawn from and their weights (``counts``: (q,)
    totals or (J, q) per agent, summed here): the populated ones, weighted by their counts.
    When fewer than k bins hold a point (few points per agent: SOM units crowd onto the same
    points), the empty representatives join with a weight a millionth of the lightest
    populated one, so k-means++ takes them only after every populated one; refused only
    when there are fewer than k distinct representatives."""
    weights = np.asarray(counts, dtype=np.float64)
    if weights.ndim == 2:
        weights = weights.sum(axis=0)
    keep = weights > 0
    if int(keep.sum()) >= k:
        return points[keep], weights[keep]
    distinct = np.unique(points, axis=0).shape[0]
    if distinct < k:
        raise ValueError(
            f"only {distinct} distinct bin representatives ({int(keep.sum())} populated) for k={k} clusters: "
            f"the agents' points hold too few distinct values for k={k} (lower k)"
        )
    filler = 1e-6 * float(weights[keep].min()) if keep.any() else 1.0
    return points, np.where(keep, weights, filler)


def weighted_init(
    points: np.ndarray, counts: np.ndarray, k: int, rng: np.random.Generator, restarts: int = 0
) -> np.ndarray:
    """k-means++ on bin representatives (codebook vectors or grid-cell centers) weighted
    by their total counts (:func:`start_support`). ``restarts = 0`` is the paper's single
    k-means++ draw; ``restarts > 0`` draws that many, refines each by weighted Lloyd on the
    representatives and keeps the cheapest (server only: no data leaves an agent)."""
    return init_candidates(points, counts, k, rng, restarts, 1)[0]


def init_candidates(
    points: np.ndarray, counts: np.ndarray, k: int, rng: np.random.Generator, restarts: int, count: int
) -> np.ndarray:
    """The starts the agents choose among (``init-candidates``): the ``count`` cheapest
    DISTINCT weighted-Lloyd optima (relative cost 1e-9) of ``restarts`` k-means++ draws on
    the bin representatives (:func:`start_support`), cheapest on them first; (m, k, d) with
    m ≤ count. The bins summarize the agents' points; which optimum is cheapest on the
    points themselves the agents measure in one round (``score_candidates``).
    ``restarts = 0``: the paper's single draw, unrefined."""
    P, w = start_support(points, counts, k)
    if restarts == 0:
        return kmeans_plus_plus(P, k, rng, weights=w)[None]
    found: list[tuple[float, np.ndarray]] = []
    seeds = np.stack([kmeans_plus_plus(P, k, rng, w) for _ in range(restarts)])  # Lloyd draws nothing
    for centers, cost in zip(*lloyd_of_sets(P, seeds, w, max_iter=300)[:2]):
        if not any(abs(cost - other) <= 1e-9 * max(other, 1e-300) for other, _ in found):
            found.append((cost, centers))
    found.sort(key=lambda item: item[0])
    return np.stack([centers for _, centers in found[: max(1, count)]])


def point_weights(X: np.ndarray, bin_weight: np.ndarray, binning: str, arrays: dict, bins: int) -> np.ndarray:
    """The weight w_{j, b(x)} of each of this agent's points."""
    if binning == "uniform":
        return np.full(X.shape[0], bin_weight[0])
    if binning == "grid":
        return bin_weight[grid_index(X, arrays["low"], arrays["high"], bins)]
    return bin_weight[nearest(X, arrays["codebook"])]


# ------------------------------------------------------------------------------- DA


def perturbed_labels(
    X: np.ndarray, centers: np.ndarray, outer: int, xi_max: float, rng: np.random.Generator
) -> np.ndarray:
    """Eq. (2): label = argmin_k (1 + ξ_nk / t1) · ||x_n − m_k||, ξ_nk ~ U(0, ξ_max) drawn
    per point and per cluster; ξ_max = 0 is the plain nearest center (no draw)."""
    if xi_max == 0:
        return nearest(X, centers)
    xi = rng.uniform(0.0, xi_max, size=(X.shape[0], centers.shape[0]))
    return np.argmin((1.0 + xi / outer) * np.sqrt(squared_distances(X, centers)), axis=1)


def weighted_gradient(
    X: np.ndarray, labels: np.ndarray, weights: np.ndarray, centers: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """g_k = Σ_n μ_nk w_n (m_k − x_n) = W_k m_k − S_k and W_k = Σ_n μ_nk w_n, far from the
    origin about the centers' reference r (W_k (m_k − r) − Σ w (x_n − r): no difference of
    two sums of the offset)."""
    origin = reference(centers)
    if origin is not None:
        X, centers = X - origin, centers - origin
    sums, weight = label_sums(X, labels, centers.shape[0], weights)
    return weight[:, None] * centers - sums, weight


def implied_statistics(
    centers: np.ndarray, gradient: np.ndarray, weight: np.ndarray, point_weight: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The per-cluster sums, counts and means of an agent's points that its step reply
    implies when every point weighs ``point_weight`` (``weighting = uniform``):
    S_k = (W_k m_k − g_k) / w, n_k = W_k / w."""
    sums = (weight[:, None] * centers - gradient) / point_weight
    counts = weight / point_weight
    return sums, counts, sums / np.maximum(counts, 1e-300)[:, None]


def dual_averaging_update(anchor: np.ndarray, z: np.ndarray, weight: np.ndarray, eta: float) -> np.ndarray:
    """m_k = m_k^(0) − z_k / (2 α_k) with α_k = W_k / (2 η), i.e. m_k^(0) − η z_k / W_k
    (docs/ALGORITHMS.md §2, the recentred eq. 4b); a cluster with W_k = 0 keeps m_k^(0)."""
    out = np.array(anchor, dtype=np.float64, copy=True)
    live = weight > 0
    out[live] = anchor[live] - eta * z[live] / weight[live, None]
    return out


def combine_gradients(
    centers: np.ndarray, gradients: np.ndarray, weights: np.ndarray, method: str = "mean", trim: float = 0.1
) -> tuple[np.ndarray, np.ndarray]:
    """The agents' gradients g (m, k, d) and weighted counts W (m, k), computed at
    ``centers``, combined into ``(Σ g, Σ W)`` for :func:`dual_averaging_update`.

    ``mean``: the plain sums (the paper). Otherwise every agent's implied mean
    ``m_k − g_k / W_k`` (= its weighted points' mean S_k / W_k) is combined by
    :func:`fedcluster.robust.aggregate_centers` into (W*, Σ* W m*), returned as the
    gradient ``W* m_k − Σ* W m*`` the honest agents alone could have sent: one agent among
    several cannot move a cluster's step beyond the honest agents' range.
    """
    gradients = np.asarray(gradients, dtype=np.float64)
    weights = np.asarray(weights, dtype=np.float64)
    if method == "mean":
        return gradients.sum(axis=0), weights.sum(axis=0)
    safe = np.where(weights > 0, weights, 1.0)
    means = np.where(weights[..., None] > 0, centers[None] - gradients / safe[..., None], centers[None])
    totals, weighted = aggregate_centers(means, weights, method, trim)
    return totals[:, None] * centers - weighted, totals


def max_move(new: np.ndarray, old: np.ndarray) -> float:
    """max_k ||m_k^new − m_k^old||, the inner loop's ε_glo test, less what the coordinates'
    own rounding moves them (far from the origin a center is known to a few units in its
    last place: a step that moves it no further has not moved it; else ε_glo × the box's
    diagonal would be out of reach there)."""
    move = float(np.sqrt(np.max(np.sum((new - old) ** 2, axis=1))))
    return max(move - float(np.linalg.norm(coordinate_rounding(new, old))), 0.0)


def frobenius(z: np.ndarray) -> float:
    """Frobenius norm (of the accumulated gradient z, for the history)."""
    return float(np.sqrt(np.sum(z * z)))


def centers_problem(centers: np.ndarray, low: np.ndarray, high: np.ndarray, slack: float = 0.01) -> str | None:
    """Why the server's own centers cannot be right, or None: an honest step (a weighted
    Lloyd step for η = 1, a shorter one below) keeps every center inside the points' convex
    hull, so inside the federation's bounding box; a center outside it by more than
    ``slack`` of its diagonal, or not finite, came from a reply that no points produce."""
    if not np.all(np.isfinite(centers)):
        return "to values that are not finite"
    margin = slack * diagonal(low, high) + 1e-12 * float(np.max(np.abs(np.concatenate([low, high]))))
    beyond = box_overshoot(centers, low - margin, high + margin)
    if beyond > 0:
        return f"{beyond:.3g} outside the federation's bounding box"
    return None


def box_overshoot(centers: np.ndarray, low: np.ndarray, high: np.ndarray) -> float:
    """How far ``centers`` lie outside the box [low, high] at most (inf when not finite):
    which reply, left out, brings a step back the most."""
    if not np.all(np.isfinite(centers)):
        return float("inf")
    return float(np.max(np.maximum(0.0, np.maximum(low - centers, centers - high))))


def diagonal(low: np.ndarray, high: np.ndarray) -> float:
    """Length of the bounding box's diagonal (the scale ε_glo is relative to)."""
    return float(np.sqrt(np.sum((high - low) ** 2)))


# ------------------------------------------------------------------------------- agents that come and go


def gradients_at(centers: np.ndarray, gradients: np.ndarray, weights: np.ndarray, at: np.ndarray) -> np.ndarray:
    """Every agent's gradient (m, k, d) at ``centers`` from the one it sent at ``at``
    (m, k, d): with its labels fixed (one outer iteration), g_j(m) = W_j m − S_j is affine
    in m, so g_j(m) = g_j(m_r) + W_j (m − m_r) — exact, and without the cancellation of
    forming W_j m − S_j from S_j."""
    return gradients + weights[..., None] * (centers[None] - at)


def inner_step(
    origin: np.ndarray,
    z: np.ndarray,
    centers: np.ndarray,
    gradients: np.ndarray,
    weights: np.ndarray,
    at: np.ndarray,
    eta: float,
    method: str = "mean",
    trim: float = 0.1,
) -> tuple[np.ndarray, np.ndarray]:
    """One dual-averaging step (docs/ALGORITHMS.md §2) over every agent the server holds
    statistics of: the gradients (m, k, d) each agent sent at ``at`` moved to ``centers``
    (:func:`gradients_at`), combined (:func:`combine_gradients`), added to ``z``; the new
    centers from ``origin``, the regularizer's centre. Returns ``(z, centers)``."""
    g, w = combine_gradients(centers, gradients_at(centers, gradients, weights, at), weights, method, trim)
    z = z + g
    return z, dual_averaging_update(origin, z, w, eta)


# An implied mean may lie this far (relative to the size of its coordinates) outside the
# box: the device forms g = W m − S and the server m − g / W, each with rounding.
IMPLIED_SLACK = 1e-8


def implied_mean_violation(
    centers: np.ndarray, gradient: np.ndarray, weight: np.ndarray, low: np.ndarray, high: np.ndarray
) -> str | None:
    """Why an agent's step reply cannot come from points inside the box ``[low, high]`` it
    declared, or None. Its weights are nonnegative, so each cluster's implied mean
    S_k / W_k = m_k − g_k / W_k is a weighted mean of its points and lies in that box; a
    cluster with no weight has no gradient. Whatever a reply passing this says, a step
    over such replies keeps every center in the federation's box."""
    empty = weight <= 0
    if np.any(gradient[empty] != 0):
        return (
            f"it sends a gradient for cluster {int(np.flatnonzero(empty & np.any(gradient != 0, axis=1))[0])} "
            "that holds none of its points (weight 0)"
        )
    live = ~empty
    means = centers[live] - gradient[live] / weight[live, None]
    # relative to each coordinate's size over ALL centers: the device takes its sums about
    # their reference, so a cluster at 0 next to others at 1 rounds like 1 (a feature
    # constant at 0 on the device has a box of width 0 that shows no rounding at all)
    slack = IMPLIED_SLACK * (largest_magnitudes(centers) + np.maximum(np.abs(low), np.abs(high)))
    outside = ~np.all((means >= low - slack) & (means <= high + slack), axis=1)  # NaN counts as outside
    if np.any(outside):
        return (
            f"the mean its gradient implies for cluster {int(np.flatnonzero(live)[np.argmax(outside)])} lies "
            "outside the bounding box its data summary declared (a step no points of its produce)"
        )
    return None


def restated_violation(
    centers: np.ndarray,
    gradient: np.ndarray,
    weight: np.ndarray,
    held_at: np.ndarray,
    held_gradient: np.ndarray,
    held_weight: np.ndarray,
) -> str | None:
    """Why an agent's step reply cannot follow its reply held from an earlier step of the
    same outer iteration, or None. Its labels and its point weights are fixed for the outer
    iteration, so its per-cluster weights W and weighted sums S = W m − g are too: the
    implied means m − g / W at the centers sent now must be those it implied before (up to
    rounding of the coordinates' size and of the spread). Points do not move between steps,
    so an agent whose statistics follow the centers it is sent is lying."""
    weight, held_weight = np.asarray(weight, dtype=np.float64), np.asarray(held_weight, dtype=np.float64)
    tolerance = 1e-9 * np.maximum(np.abs(weight), np.abs(held_weight)) + 1e-300
    moved = np.flatnonzero(np.abs(weight - held_weight) > tolerance)
    if moved.size:
        return (
            f"its weight of cluster {int(moved[0])} changed within one outer iteration (its labels and weights "
            "are fixed for it)"
        )
    live = weight > 0
    if not np.any(live):
        return None
    now = centers[live] - gradient[live] / weight[live, None]
    before = held_at[live] - held_gradient[live] / held_weight[live, None]
    spread = np.maximum(np.ptp(np.concatenate([now, before, centers, held_at]), axis=0), 1e-300)
    slack = 4.0 * coordinate_rounding(centers, held_at, now, before) + 1e-9 * spread
    apart = ~np.all(np.abs(now - before) <= slack, axis=1)  # NaN counts as apart
    if np.any(apart):
        return (
            f"the mean its gradient implies for cluster {int(np.flatnonzero(live)[np.argmax(apart)])} moved "
            "within one outer iteration (its points and labels did not: the same weighted sums at every step)"
        )
    return None


def effective_counts(weight: np.ndarray, table: np.ndarray, bin_counts: np.ndarray) -> np.ndarray:
    """The fewest points a cluster's weight W_k can stand for when each of the agent's
    points weighs its bin's weight: W_k / the largest weight of a bin the agent has points
    in (for uniform weights, the cluster's point count). A weighted mean of points in a
    region with scatter V about the agent's mean has weighted variance ≤ V / this."""
    populated = np.asarray(bin_counts) > 0
    heaviest = float(np.max(np.asarray(table)[populated])) if np.any(populated) else 0.0
    if heaviest <= 0.0:
        return np.zeros_like(np.asarray(weight, dtype=np.float64))
    return np.asarray(weight, dtype=np.float64) / heaviest


def weighted_step_violation(
    centers: np.ndarray,
    gradient: np.ndarray,
    weight: np.ndarray,
    anchor: np.ndarray,
    ratio: float,
    table: np.ndarray,
    bin_counts: np.ndarray,
    scatter: float | None,
) -> str | None:
    """Why an agent's step reply under bin or SOM weights cannot be its own, or None. The
    server sent the weight of each bin (``table``) and holds the agent's points per bin
    (``bin_counts``): its cluster weights must add up to Σ_b w_b c_b, and each cluster's
    weighted mean must be one its labels allow (:func:`fedcluster.bounds.voronoi_violation`
    with the fewest points its weight stands for, :func:`effective_counts`)."""
    from fedcluster.bounds import voronoi_violation

    expected = float(np.asarray(table, dtype=np.float64) @ np.asarray(bin_counts, dtype=np.float64))
    if abs(float(np.sum(weight)) - expected) > 1e-8 * max(expected, 1e-300):
        return "its cluster weights do not add up to its points per bin times the bins' weights"
    means = centers - gradient / np.maximum(weight, 1e-300)[:, None]
    return voronoi_violation(means, effective_counts(weight, table, bin_counts), anchor, ratio, scatter or 0.0)


# ------------------------------------------------------------------------------- kernels


def _cached_labels(
    data: DeviceData, X: np.ndarray, anchor: np.ndarray, outer: int, xi_max: float, seed: int
) -> np.ndarray:
    """Labels of one outer iteration, recomputed from (anchor, t1, ξ_max, seed) or cached."""
    key = (anchor.tobytes(), outer, xi_max, seed)
    cache = data.extra.setdefault("da-ufl-labels", {})
    if key not in cache:
        if len(cache) >= 4:
            cache.pop(next(iter(cache)))
        cache[key] = perturbed_labels(X, anchor, outer, xi_max, np.random.default_rng(seed))
    return cache[key]
