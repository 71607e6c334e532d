"""FedKMeans: federated mini-batch k-means (Triebe et al. 2019; docs/ALGORITHMS.md section 1).

Device (NumPy only): ClientKMeans (:func:`client_kmeans`, task ``fedkmeans_train``)
starts from the global centers, runs E passes of mini-batch k-means with learning rate β
and returns its last epoch's per-cluster counts, its updated centers, per-cluster scatter
(squared deviations from each cluster's mean, per coordinate: the server's spread estimate
for reassignment, no point leaves the device) and the cost of the centers it RECEIVED (the federated cost of the
previous
global model without an extra round trip). Initialization tasks: ``local_summary`` (a
small local k-means whose clusters under ``min-count`` points are suppressed) and
``score_candidates`` (the cost of m candidate center sets in one pass).

Server (pure functions the strategy ``fedcluster/algorithms/fedkmeans/strategy.py`` calls):
:func:`server_update` (weighted centroid average, momentum, server learning rate),
:func:`reassign_starved` (a starved cluster is re-seeded by splitting the largest one
along its axis of largest spread), :func:`summary_candidates` (k-means++ + Lloyd
candidates on the devices' local summaries).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from fedcluster.bounds import (
    _EPS,
    MOMENT_SLACK,
    OFFSET_ULPS,
    RELATIVE_SLACK,
    coordinate_rounding,
    deviation_rounding,
    expansion_rounding,
    expansion_roundings,
    scatter_rounding,
)
from fedcluster.lloyd import (
    CHUNK_FLOATS,
    kmeans_plus_plus,
    largest_magnitudes,
    lloyd_statistics,
    lloyd_of_sets,
    lloyd_statistics_of_sets,
    block_references,
    pooled_scatter,
    sum_of_squares,
)
from fedcluster.points import center_shift
from fedcluster.robust import aggregate_centers

from .config import INITS, KFED_START_KEYS, RUN_CONFIG  # noqa: F401

# Reassignment moves the two halves of a split cluster to c ± SPLIT_OFFSET·σ·e: 0.8 ≈
# √(2/π), the mean offset of each half of a Gaussian cut through its centre.
SPLIT_OFFSET = 0.8


def client_step(X: np.ndarray, centers: np.ndarray, learning_rate: float = 1.0) -> tuple[np.ndarray, ...]:
    """ClientKMeans with one epoch and one full batch (the default), from one pass over the
    points: ``(counts, centers, scatter, cost)`` as :func:`client_kmeans` returns them, and
    the cost of the centers received, which that pass's assignment already fixes."""
    if not 0 < learning_rate <= 1:
        raise ValueError(f"client learning rate must be in (0, 1], got {learning_rate}")
    centers = np.array(centers, dtype=np.float64, copy=True)
    stats = lloyd_statistics(np.asarray(X, dtype=np.float64), centers, with_scatter=True)
    seen = stats.counts > 0
    means = stats.sums[seen] / stats.counts[seen, None]
    centers[seen] += learning_rate * (means - centers[seen])
    return stats.counts, centers, stats.scatter, stats.cost


def client_steps(X: np.ndarray, incoming: np.ndarray, learning_rate: float = 1.0) -> tuple[np.ndarray, ...]:
    """:func:`client_step` from every set of ``incoming`` (m, k, d) in one pass
    (:func:`fedcluster.lloyd.lloyd_statistics_of_sets`): ``(counts (m, k), centers (m, k, d),
    scatter (m, k, d), cost (m,))``."""
    if not 0 < learning_rate <= 1:
        raise ValueError(f"client learning rate must be in (0, 1], got {learning_rate}")
    centers = np.array(incoming, dtype=np.float64, copy=True)
    sums, counts, cost, scatter = lloyd_statistics_of_sets(np.asarray(X, dtype=np.float64), centers)
    seen = counts > 0
    means = sums[seen] / counts[seen, None]
    centers[seen] += learning_rate * (means - centers[seen])
    return counts, centers, scatter, cost


def client_kmeans(
    X: np.ndarray,
    centers: np.ndarray,
    *,
    epochs: int = 1,
    batch_size: int | None = None,
    learning_rate: float = 1.0,
    rng: np.random.Generator | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ClientKMeans: local mini-batch k-means from ``centers``.

    For each epoch the per-cluster counts restart at zero, the data are shuffled into
    batches of ``batch_size`` (None or <= 0: one full batch), and for every batch b and
    cluster j with members in it::

        counts_j += batch_counts_j
        centers_j += learning_rate * (batch_counts_j / counts_j) * (batch_mean_j - centers_j)

    Returns ``(counts, centers, scatter)`` of the LAST epoch, where ``scatter`` (k x d) is the
    per-cluster sum of squared deviations of the points assigned in that epoch from their
    mean (the batches' scatters pooled by the parallel axis theorem).
    """
    if epochs < 1:
        raise ValueError(f"epochs must be >= 1, got {epochs}")
    if not 0 < learning_rate <= 1:
        raise ValueError(f"client learning rate must be in (0, 1], got {learning_rate}")
    X = np.asarray(X, dtype=np.float64)
    centers = np.array(centers, dtype=np.float64, copy=True)
    n = X.shape[0]
    k = centers.shape[0]
    full_batch = batch_size is None or batch_size <= 0 or batch_size >= n
    rng = rng if rng is not None else np.random.default_rng()
    counts = np.zeros(k)
    scatter = np.zeros_like(centers)
    for _ in range(epochs):
        counts = np.zeros(k)
        scatter, sums = np.zeros_like(centers), np.zeros_like(centers)
        if full_batch:
            batches = [X]
        else:
            order = rng.permutation(n)
            batches = [X[order[s : s + batch_size]] for s in range(0, n, batch_size)]
        for batch in batches:
            stats = lloyd_statistics(batch, centers, with_scatter=True)
            seen = stats.counts > 0
            scatter = (
                pooled_scatter(
                    np.stack([counts, stats.counts]), np.stack([sums, stats.sums]), np.stack([scatter, stats.scatter])
                )
                if len(batches) > 1
                else stats.scatter
            )
            sums += stats.sums
            counts[seen] += stats.counts[seen]
            batch_means = stats.sums[seen] / stats.counts[seen, None]
            step = learning_rate * (stats.counts[seen] / counts[seen])
            centers[seen] += step[:, None] * (batch_means - centers[seen])
    return counts, centers, scatter


# ------------------------------------------------------------------------ server math
@dataclass
class ServerState:
    """What the server carries between rounds besides the centers: the momentum ``v``
    and, per cluster, for how many consecutive rounds it has been starved."""

    velocity: np.ndarray
    starved_rounds: np.ndarray

    @classmethod
    def start(cls, centers: np.ndarray) -> "ServerState":
        return cls(np.zeros_like(centers), np.zeros(centers.shape[0], dtype=int))


def server_update(
    centers: np.ndarray,
    counts: np.ndarray,
    weighted_sums: np.ndarray,
    state: ServerState,
    server_lr: float,
    momentum: float,
) -> tuple[np.ndarray, np.ndarray]:
    """One server step of docs/ALGORITHMS.md §1 from the summed replies::

        Γ* = Σ_i Λ^(i) Γ^(i) / Λ_t  where Λ_t > 0     (weighted centroid average)
        v  = μ v + (1 − μ)(Γ* − Γ_{t−1})  if μ > 0  else  Γ* − Γ_{t−1}
        Γ_t = Γ_{t−1} + α v

    ``counts`` = Λ_t (k,), ``weighted_sums`` = Σ_i Λ^(i) Γ^(i) (k, d). A cluster no
    sampled client saw keeps its center and its momentum is reset (``state.velocity`` is
    updated in place). Returns ``(new centers, Γ*)`` (Γ* = the old center where unseen).
    """
    seen = counts > 0
    target = centers.copy()
    target[seen] = weighted_sums[seen] / counts[seen, None]
    step = target - centers
    velocity = momentum * state.velocity + (1 - momentum) * step if momentum > 0 else step
    velocity[~seen] = 0.0
    state.velocity = velocity
    new = centers + server_lr * velocity
    new[~seen] = centers[~seen]
    return new, target


def reassign_starved(
    centers: np.ndarray,
    counts: np.ndarray,
    scatter: np.ndarray,
    state: ServerState,
    threshold: float,
    patience: int,
    orphaned: Sequence[int] = (),
    allowed: np.ndarray | None = None,
) -> list[int]:
    """Reassignment (ρ = ``threshold``, R = ``patience``): a cluster whose count stays
    below ρ × (the largest cluster's count, as scikit-learn's MiniBatchKMeans) for R
    consecutive rounds is re-seeded by
    SPLITTING the currently largest cluster along its coordinate axis of largest variance
    e: the two centers move to ``c ± SPLIT_OFFSET·σ·e``. The variance comes from the
    per-cluster ``scatter`` about each cluster's mean (the devices' pooled). An
    ``orphaned`` cluster (:meth:`Memory.orphaned`) below the threshold is re-seeded at
    once. ``allowed`` (k bools): the clusters that may be re-seeded now (the others keep
    counting their starved rounds). Works on ``centers`` and ``state.starved_rounds`` in
    place; returns the re-seeded clusters."""
    if threshold <= 0 or patience <= 0:
        return []
    below = state.starved_rounds
    starved = counts < threshold * counts.max()
    below[:] = np.where(starved, below + 1, 0)
    orphans = np.zeros(below.shape[0], dtype=bool)
    orphans[list(orphaned)] = True
    below[orphans & starved] = np.maximum(below[orphans & starved], patience)
    moved = []
    sizes = counts.astype(float).copy()
    due = below >= patience
    if allowed is not None:
        due &= allowed | orphans
    for j in np.flatnonzero(due):
        big = int(np.argmax(sizes))
        if sizes[big] <= 0 or big == j:
            continue
        variance = scatter[big] / counts[big]
        axis = int(np.argmax(variance))
        offset = SPLIT_OFFSET * np.sqrt(variance[axis])
        base = centers[big].copy()
        centers[j] = base
        centers[j, axis] += offset
        centers[big, axis] -= offset
        sizes[big] /= 2
        sizes[j] = sizes[big]
        below[j] = 0
        moved.append(int(j))
    return moved


def reseed_allowed(counts: np.ndarray, protected: np.ndarray, rounds_left: bool, measured_next: bool) -> np.ndarray:
    """Which clusters a re-seed may move now (k bools): a re-seed must be measured by a later
    round, so none in the last round; an empty cluster (moving it cannot raise the cost)
    whenever rounds are left; a cluster that still owns points only when the next round
    measures every node (so that a re-seed that made things worse is undone), and never one
    whose re-seed was undone before (``protected``)."""
    if not rounds_left:
        return np.zeros(len(counts), dtype=bool)
    return ~protected & ((counts <= 0) | measured_next)


def implied_means(incoming: np.ndarray, centers: np.ndarray, learning_rate: float) -> np.ndarray:
    """The cluster means a full-batch ClientKMeans reply implies: its one step moved each
    received center Γ_j to Γ_j + β (μ_j − Γ_j), so μ_j = Γ_j + (c_j − Γ_j) / β."""
    return incoming + (centers - incoming) / learning_rate


def train_cost_mismatch(
    incoming: np.ndarray,
    centers: np.ndarray,
    counts: np.ndarray,
    scatter: np.ndarray,
    cost: float,
    learning_rate: float,
    relative: float = 1e-8,
) -> str | None:
    """A full-batch, one-epoch training reply fixes the cost of the centers it received:
    every seen cluster's mean is μ_j = Γ_j + (c_j − Γ_j)/β (ClientKMeans' one step), and by
    the parallel axis theorem

        cost = Σ_j [ Σ_d scatter_jd + n_j ||μ_j − Γ_j||² ].

    Returns why the reported ``cost`` is not that (None when it is, up to rounding: relative
    to the terms, plus what the coordinates' own size costs far from the origin). A device
    can still lower its cost only by lowering its scatters too, which are at least 0: the
    lowest cost it can claim is Σ_j n_j ||μ_j − Γ_j||²."""
    seen = counts > 0
    if not np.any(seen):
        return None if cost == 0 else f"cost {cost:.6g} reported for no assigned point"
    gamma = incoming[seen]
    means = implied_means(gamma, centers[seen], learning_rate)
    n = counts[seen]
    moved = n * np.sum((means - gamma) ** 2, axis=1)
    implied = float(np.sum(scatter[seen]) + np.sum(moved))
    # the implied means carry the centers' rounding over β
    rounding = deviation_rounding(float(n.sum()), implied, coordinate_rounding(incoming, centers) / learning_rate)
    if abs(cost - implied) > relative * (implied + abs(cost)) + rounding:
        return (
            f"cost {cost:.10g} of the received centers does not match its counts, centers and scatters ({implied:.10g})"
        )
    return None


# A screen's slack is this much tighter than the check's: a set near a check's threshold is
# left to the check itself (the screen only spares the checks of sets far inside them).
SCREEN_MARGIN = 1e-6


def sets_to_check(
    incoming: np.ndarray,
    centers: np.ndarray,
    counts: np.ndarray,
    scatter: np.ndarray,
    cost: np.ndarray,
    learning_rate: float,
    declared: Any = None,
) -> np.ndarray:
    """The center sets of a full-batch training reply (``incoming``, ``centers``,
    ``scatter``: (m, k, d); ``counts``: (m, k); ``cost``: (m,)) that :func:`train_cost_mismatch`,
    :func:`fedcluster.bounds.voronoi_violation` (ratio 1) or, with ``declared`` moments,
    :func:`fedcluster.bounds.moments_violation` might refuse: the same arithmetic over every set
    at once, with slacks :data:`SCREEN_MARGIN` tighter, so that a set it passes each check
    passes too. The checks run on the sets it returns (indices), for their reasons.
    ``declared``: the device's declaration, or one per set (several devices' replies stacked
    set after set, each with its own)."""
    m, k, d = incoming.shape
    seen = counts > 0
    n = np.where(seen, counts, 0.0)
    means = implied_means(incoming, centers, learning_rate)
    tight = 1.0 - SCREEN_MARGIN
    # train_cost_mismatch: cost = Σ_seen scatter + n ||μ − Γ||²
    moved = np.sum(n * np.sum((means - incoming) ** 2, axis=2), axis=1)
    implied = np.sum(np.where(seen[..., None], scatter, 0.0), axis=(1, 2)) + moved
    size = np.maximum(largest_magnitudes(incoming), largest_magnitudes(centers))  # (m, d)
    e = np.sqrt(np.sum((OFFSET_ULPS * _EPS * size / learning_rate) ** 2, axis=1))
    total = n.sum(axis=1)
    rounding = 2.0 * e * np.sqrt(total) * np.sqrt(np.maximum(implied, 0.0)) + total * e * e
    suspect = np.abs(cost - implied) > tight * (1e-8 * (implied + np.abs(cost)) + rounding)
    suspect |= ~seen.any(axis=1) & (cost != 0)
    # voronoi_violation: each seen cluster's mean nearest its own center
    if k > 1:
        coord = (
            OFFSET_ULPS
            * _EPS
            * np.maximum(largest_magnitudes(np.where(seen[..., None], means, 0.0)), largest_magnitudes(incoming))
        )
        suspect |= _nearer_suspect(means, incoming, seen, np.sqrt(np.sum(coord**2, axis=1)), tight)
    if declared is not None:
        suspect |= _moments_suspect(means, n, scatter, seen, incoming, declared, tight)
    return np.flatnonzero(suspect)


def _nearer_suspect(means, incoming, seen, ev, tight) -> np.ndarray:
    """:func:`sets_to_check`'s screen of :func:`fedcluster.bounds.voronoi_violation` per set:
    a seen cluster's mean nearer another center of its set than its own, beyond the check's
    slack (``ev``: each set's coordinate rounding), with the check's own sums. The seen
    clusters go in blocks of about ``CHUNK_FLOATS`` distances (temporaries that stay small),
    below 8 coordinates coordinate by coordinate (:func:`fedcluster.lloyd.sum_of_squares`)."""
    sets, parts = np.nonzero(seen)
    k, d = incoming.shape[1], incoming.shape[2]
    across = np.ascontiguousarray(incoming.transpose(0, 2, 1)) if d < 8 else None  # (m, d, k)
    suspect = np.zeros(incoming.shape[0], dtype=bool)
    step = max(1, CHUNK_FLOATS // k)
    for first in range(0, sets.size, step):
        s, j = sets[first : first + step], parts[first : first + step]
        mean = means[s, j]
        if across is not None:
            gaps = sum_of_squares(across[s, q, :] - mean[:, q, None] for q in range(d))  # (p, k)
        else:
            gaps = ((mean[:, None, :] - incoming[s]) ** 2).sum(axis=2)
        own = gaps[np.arange(s.size), j]
        # the slack is at least 0: only a center nearer than the own one can be beyond it
        rows, others = np.nonzero(gaps < own[:, None])
        gap, own, e = gaps[rows, others], own[rows], ev[s[rows]]
        slack = RELATIVE_SLACK * (2.0 * gap + own) + 2.0 * e * (np.sqrt(own) + np.sqrt(gap)) + 2.0 * e * e
        suspect[s[rows[gap + tight * slack < own]]] = True
    return suspect


def _moments_suspect(means, n, scatter, seen, incoming, declared, tight) -> np.ndarray:
    """:func:`sets_to_check`'s screen of :func:`fedcluster.bounds.moments_violation` per set;
    ``declared``: one device's declaration for every set, or one per set (None: not screened)."""
    m, _, d = incoming.shape
    each = list(declared) if isinstance(declared, (list, tuple)) else [declared] * m
    held = np.array([one is not None and one.moment_sum is not None for one in each])
    if not held.any():
        return np.zeros(m, dtype=bool)
    rows = [one for one in each if one is not None and one.moment_sum is not None]
    points = np.maximum(np.array([float(one.points) for one in rows]), 1.0)[:, None]
    base = np.stack([np.broadcast_to(np.asarray(one.coordinate_rounding(), dtype=np.float64), (d,)) for one in rows])
    low, high = np.stack([one.low for one in rows]), np.stack([one.high for one in rows])
    moment_sum, moment_scatter = (
        np.stack([one.moment_sum for one in rows]),
        np.stack([one.moment_scatter for one in rows]),
    )
    moment_mean = np.stack([one.moment_mean for one in rows])
    means, n, scatter, seen = means[held], n[held], scatter[held], seen[held]
    delta = np.maximum(base, OFFSET_ULPS * _EPS * largest_magnitudes(incoming[held]))  # (sets, d)
    sums = np.sum(n[..., None] * means, axis=1)
    slack = RELATIVE_SLACK * points * (high - low) + points * np.maximum(1.0, np.sqrt(points)) * delta
    bad = np.any(np.abs(sums - moment_sum) > tight * slack, axis=1)
    between = n[..., None] * (means - moment_mean[:, None, :]) ** 2
    pooled = np.sum(np.where(seen[..., None], scatter + between, 0.0), axis=1)
    S = np.maximum(moment_scatter, 0.0)
    e = np.abs(delta)
    rounding = MOMENT_SLACK * S + 2.0 * e * np.sqrt(points) * np.sqrt(S) + points * e * e
    suspect = np.zeros(m, dtype=bool)
    suspect[held] = bad | np.any(np.abs(pooled - moment_scatter) > tight * (rounding + MOMENT_SLACK * pooled), axis=1)
    return suspect


def replies_scatter(replies: Sequence[Any], incoming: np.ndarray | None, learning_rate: float) -> np.ndarray:
    """Per cluster and coordinate, the scatter of the replying nodes' points about their
    pooled mean (parallel axis), each node's clusters at its full-batch reply's implied
    means (``incoming``: the centers sent), else at its centers."""
    centers = np.stack([r.arrays["centers"] for r in replies])
    counts = np.stack([r.arrays["counts"] for r in replies])
    means = centers if incoming is None else implied_means(incoming[None], centers, learning_rate)
    return pooled_scatter(counts, counts[..., None] * means, np.stack([r.arrays["scatter"] for r in replies]))


def coarse_summary_k(k: int) -> int:
    """Local clusters of the coarse summary (``init-coarse``): ceil(sqrt(k)), k-FED's k'."""
    return max(1, math.ceil(math.sqrt(k)))


def summary_candidates(
    points: np.ndarray,
    weights: np.ndarray,
    k: int,
    count: int,
    low: np.ndarray,
    high: np.ndarray,
    rng: np.random.Generator,
    starts: int = 0,
) -> np.ndarray:
    """``count`` candidate center sets (count, k, d) for ``init=local-summaries``: weighted
    k-means++ + Lloyd on the devices' summary centers ``points`` (weights = their counts);
    uniform draws in the box [low, high] when there are fewer than k summary centers.

    With ``starts`` > ``count`` (``init-server-starts``), that many k-means++ starts are
    screened by their weighted cost ON THE SUMMARY after ``SCREEN_ITERATIONS`` Lloyd
    iterations, and only the ``count`` cheapest (in the order they were drawn) are refined
    to convergence: more starts cost server time only (about 1 + starts · 5 / (count · the
    iterations a refinement takes) times the plain draw), while the devices still score
    ``count``. ``starts <= count`` is the plain draw of ``count``."""
    candidates = []
    if points.shape[0] >= k:
        seeds = np.stack([kmeans_plus_plus(points, k, rng, weights) for _ in range(max(count, int(starts)))])
        if len(seeds) > count:
            screened, costs, _ = lloyd_of_sets(points, seeds, weights, max_iter=SCREEN_ITERATIONS)
            seeds = screened[np.sort(np.argsort(costs, kind="stable")[:count])]
        candidates = list(lloyd_of_sets(points, seeds, weights, max_iter=100)[0])
    while len(candidates) < count:
        candidates.append(rng.uniform(low, high, size=(k, low.size)))
    return np.stack(candidates)


# Lloyd iterations a start gets before the starts are ranked (init-server-starts).
SCREEN_ITERATIONS = 5


def box_candidates(k: int, count: int, low: np.ndarray, high: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``count`` candidate center sets drawn uniformly in the box [low, high]."""
    return np.stack([rng.uniform(low, high, size=(k, low.size)) for _ in range(count)])


def summary_seeds(
    points: np.ndarray,
    weights: np.ndarray,
    k: int,
    count: int,
    low: np.ndarray,
    high: np.ndarray,
    rng: np.random.Generator,
) -> np.ndarray:
    """``count`` UNREFINED weighted k-means++ draws on the devices' summaries (count, k, d)
    (box draws when there are fewer than k summary centers). Candidates refined on the
    summaries all fall into the summaries' best basin; these seeds keep the diversity of
    scikit-learn's ``n_init`` starts, and the devices' data decide among them."""
    if points.shape[0] < k:
        return box_candidates(k, count, low, high, rng) if count else np.zeros((0, k, low.size))
    return (
        np.stack([kmeans_plus_plus(points, k, rng, weights) for _ in range(count)])
        if count
        else np.zeros((0, k, low.size))
    )


# n-init = 0: as many center sets as fit in this many floats of centers, at most AUTO_SETS
# (chosen with bench/real_data.py --variant; each set adds k·d floats down and about twice
# that up per round).
AUTO_SETS, AUTO_SET_FLOATS = 16, 1 << 16


def set_count(n_init: int, k: int, d: int) -> int:
    """The number of center sets trained side by side: ``n_init``, or with 0 (auto) 16 while
    they fit in 65536 floats of centers, fewer for large k·d, at least 1."""
    return n_init or max(1, min(AUTO_SETS, AUTO_SET_FLOATS // max(k * d, 1)))


def start_sets(costs: np.ndarray, sets: int, seeds: Sequence[int] = ()) -> list[int]:
    """Which scored candidates start the center sets trained side by side (``n-init``):
    the cheapest first, then the ``seeds`` (indices of unrefined draws, in order), then the
    next cheapest, skipping any whose cost equals one already chosen (relative 1e-9: the
    same local optimum twice trains nothing new)."""
    order = list(np.argsort(costs, kind="stable"))
    chosen: list[int] = []
    for index in [order[0], *seeds, *order[1:]]:
        if len(chosen) == sets:
            break
        if index not in chosen and all(
            abs(costs[index] - costs[c]) > 1e-9 * max(abs(costs[c]), 1e-300) for c in chosen
        ):
            chosen.append(int(index))
    return chosen


def cheapest_estimates(pool: list[tuple], entry: tuple, size: int) -> list[tuple]:
    """The ``size`` entries ``(estimated cost, round, set, centers)`` of lowest estimated
    cost among ``pool`` and ``entry`` (ties: the earlier kept). Under partial participation a
    round's estimate is the cost per point of the centers on the sampled devices only; the
    pool's centers are scored on every device once, at the end."""
    return sorted(pool + [entry], key=lambda e: e[0])[:size]


def last_versus_best(
    last_cost: float,
    last_round: int,
    last_set: int,
    cost: float,
    best_round: int,
    best_set: int,
    several_sets: bool,
    warn_above: float,
    last_centers: np.ndarray | None = None,
    best_centers: np.ndarray | None = None,
    tie: float = 0.0,
) -> tuple[dict[str, Any] | None, str, bool]:
    """When the centers returned (the cheapest measured) are not the last ones: the
    ``last`` and ``best_seen`` records of result.json, the sentence that says so, and
    whether the last cost so much more (``warn_above``, relative) that it is a warning.
    The same centers (``last_centers`` equal to ``best_centers``: they did not move since)
    are the same result, whatever rounds measured them; costs within ``tie`` (per point,
    :func:`cost_tie`) are the same cost: no warning."""
    same = last_centers is not None and best_centers is not None and np.array_equal(last_centers, best_centers)
    if (best_round == last_round and best_set == last_set) or same:
        return None, "", False
    extras = {
        "last": {"cost": last_cost, "round": last_round, "set": last_set},
        "best_seen": {"round": best_round, "cost": cost, "set": best_set, "returned": "centers.npy"},
    }
    text = (
        f"the last centers (round {last_round}) cost {last_cost:.6g} per point, "
        f"{how_much_more(last_cost, cost)} those of round {best_round}"
        f"{f' (set {best_set})' if several_sets else ''}{'' if cost > 0 else ', which cost 0'}: centers.npy holds the "
        "cheaper ones, "
        "last_centers.npy the last"
    )
    return extras, text, last_cost > (1 + warn_above) * cost + tie


# Costs per point closer than this share of the data's spread per point are the same cost:
# centers rounded to their last place (points that coincide with them cost 0 or a rounding).
COST_TIE = 1e-12


def cost_tie(declared: Sequence[Any]) -> float:
    """How close two costs per point must be to be the same cost (ties go to the later
    measurement): ``COST_TIE`` times the devices' points' scatter per point about their
    pooled mean, from what they declared (:class:`fedcluster.bounds.Declared`; 0 without)."""
    known = [d for d in declared if d is not None and d.moment_sum is not None]
    if not known:
        return 0.0
    counts = np.array([d.points for d in known], dtype=np.float64)
    scatter = pooled_scatter(
        counts, np.stack([d.moment_sum for d in known]), np.stack([d.moment_scatter for d in known])
    )
    return COST_TIE * float(np.sum(scatter)) / max(float(counts.sum()), 1.0)


def how_much_more(cost: float, reference: float) -> str:
    """``cost`` against a lower ``reference``, as words that read before "those": a
    percentage up to 100 % more, a ratio beyond (never a number of hundreds of digits), and
    plain "more than" when the reference is 0."""
    if not reference > 0:
        return "more than"
    ratio = cost / reference
    if ratio <= 2.0:
        return f"{100 * (ratio - 1):.2f} % more than"
    return f"{ratio:.3g} times as much as"


def keep_sets(costs: Sequence[float], stalled: Sequence[bool], finished: bool) -> list[int]:
    """The center sets that train on (indices into ``costs``, in order): ``costs`` are
    this round's measured costs of the sets (from the same devices), ``stalled[i]``: set i
    did not move and has no starved cluster, so its cost can no longer change. A stalled set
    other than the cheapest can never win (it costs as much or more) and stops; once
    ``finished`` (half of the rounds are done) only the cheapest trains on. (Keeping only
    the cheaper half at rounds 2, 4, 8, … was tried: no faster on the real-data suite, where
    stalled sets stop anyway, and worse on one case.)"""
    best = int(np.argmin(costs))
    if finished:
        return [best]
    return [i for i in range(len(costs)) if i == best or not stalled[i]]


# ------------------------------------------------------------------------ choosing k
def k_range_candidates(
    points: np.ndarray,
    weights: np.ndarray,
    ks: Sequence[int],
    count: int,
    low: np.ndarray,
    high: np.ndarray,
    rng: np.random.Generator,
) -> np.ndarray:
    """Every k's ``count`` candidate sets from the summaries, plus the summaries' mean (the
    k = 1 set, last), padded to max(ks) centers by repeating each set's first center: a
    duplicate center changes no point's nearest distance, so one ``score_candidates`` round
    prices every k. Shape ``(len(ks) * count + 1, max(ks), d)``."""
    k_max = max(ks)
    sets = [summary_candidates(points, weights, k, count, low, high, rng) for k in ks]
    mean = (np.average(points, axis=0, weights=weights) if points.shape[0] else (low + high) / 2)[None, None]
    padded = [np.concatenate([s, np.repeat(s[:, :1], k_max - s.shape[1], axis=1)], axis=1) for s in sets + [mean]]
    return np.concatenate(padded)


def k_range_report(ks: Sequence[int], count: int, costs: np.ndarray, num_points: int) -> dict[str, Any]:
    """Best candidate per k, the elbow of the cost curve and the Calinski–Harabasz choice.

    ``costs`` are the total costs of :func:`k_range_candidates`' sets in order. The total
    scatter T is the cost of the summaries' mean (≥ the scatter about the true mean);
    CH(k) = ((T − W_k)/(k − 1)) / (W_k/(n − k)), from sufficient statistics only. The elbow
    is the k farthest below the chord from the first to the last point of the normalised
    log-cost curve (the "kneedle" rule on log W_k: on the raw cost the first big drop wins
    whenever clusters come in groups)."""
    ks = list(ks)
    per_k = costs[: len(ks) * count].reshape(len(ks), count)
    chosen = [int(i * count + b) for i, b in enumerate(per_k.argmin(axis=1))]
    for i in range(1, len(ks)):  # more centers can always do as well as fewer (a padded smaller set)
        if costs[chosen[i - 1]] < costs[chosen[i]]:
            chosen[i] = chosen[i - 1]
    W = costs[chosen].astype(np.float64)
    T = max(float(costs[-1]), float(W[0]))
    n = num_points
    ch = [((T - w) / (k - 1)) / (w / (n - k)) if w > 0 and n > k else float("inf") for k, w in zip(ks, W)]
    x = (np.array(ks) - ks[0]) / (ks[-1] - ks[0])
    logs = np.log(np.maximum(W, 1e-300))  # log scale: the last large RELATIVE drop, not the first large one
    span = logs[0] - logs[-1]
    y = (logs - logs[-1]) / span if span > 0 else np.zeros(len(ks))
    below = 1.0 - x - y
    return {
        "k": ks,
        "cost": (W / n).tolist(),
        "calinski_harabasz": ch,
        "elbow_k": int(ks[int(np.argmax(below))]) if span > 0 else ks[0],
        "calinski_harabasz_k": int(ks[int(np.argmax(ch))]),
        "total_scatter": T / n,
        "best_candidate": chosen,
    }


# ------------------------------------------------------------------------ server state
# What the server keeps per center set between rounds; replies are the strategy's (any
# object with ``node_id`` and ``arrays``).
class Memory:
    """Every node's latest statistics for one center set (``server-memory``): its centers,
    counts, per-cluster scatters and means (a full-batch reply's implied means, else its
    centers), and whether the reply states the partition of its points (a full-batch one
    does: its clusters' counts, means and scatters), as rows of dense arrays, one row per node. A round's server step
    over
    every node's memory is then a few array operations, not a loop over the nodes: its
    cost follows the nodes sampled, not the population. Rows follow :meth:`reserve`'s
    order (the strategy's node order), then the order nodes first report (newcomers:
    still the same order on every engine); a node not in memory has zeros in its row, so
    the count-weighted sums are those over the nodes in memory, in row order. A
    :meth:`checkpoint` records the rows that change from then on, so that
    :meth:`rollback` (the undo of a re-seed) costs what changed, not a copy of it all."""

    def __init__(self, k: int, d: int) -> None:
        self.k, self.d = k, d
        self.rows: dict[int, int] = {}
        self._journal: dict[int, tuple] | None = None  # row -> its arrays at the checkpoint
        self._journal_rows, self._forgotten = 0, set()
        self._grow(0)

    def _grow(self, capacity: int) -> None:
        k, d = self.k, self.d
        old = {name: getattr(self, name) for name in self._ARRAYS} if hasattr(self, "present") else {}
        self.present = np.zeros(capacity, dtype=bool)
        self.stated = np.zeros(capacity, dtype=bool)  # its latest reply stated a partition
        self.centers, self.counts, self.scatter = (
            np.zeros((capacity, k, d)),
            np.zeros((capacity, k)),
            np.zeros((capacity, k, d)),
        )
        self.means = np.zeros((capacity, k, d))  # of its clusters: implied by a full-batch reply, else its centers
        for name, values in old.items():
            getattr(self, name)[: len(values)] = values

    _ARRAYS = ("present", "stated", "centers", "counts", "scatter", "means")

    def _row(self, node: int) -> int:
        row = self.rows.get(node)
        if row is None:
            row = self.rows[node] = len(self.rows)
            if row >= self.present.size:
                self._grow(max(16, 2 * self.present.size))
        return row

    def reserve(self, nodes: Iterable[int]) -> None:
        """Give ``nodes`` their rows in this order (before any of them reports)."""
        for node in nodes:
            self._row(node)

    def __len__(self) -> int:
        return int(self.present[: len(self.rows)].sum())

    def __contains__(self, node: int) -> bool:
        row = self.rows.get(node)
        return row is not None and bool(self.present[row])

    def _save(self, row: int) -> None:
        if self._journal is not None and row < self._journal_rows and row not in self._journal:
            self._journal[row] = tuple(getattr(self, name)[row].copy() for name in self._ARRAYS)

    def checkpoint(self) -> None:
        """From now on, record what changes (see :meth:`rollback`)."""
        self._journal, self._journal_rows, self._forgotten = {}, len(self.rows), set()

    def commit(self) -> None:
        """Keep what changed since the checkpoint; stop recording."""
        self._journal = None

    def rollback(self) -> None:
        """Every node's statistics as at the :meth:`checkpoint`, except that a node
        forgotten since (it left, or sent an invalid reply) stays forgotten."""
        if self._journal is None:
            raise RuntimeError("rollback without a checkpoint")
        for row, saved in self._journal.items():
            for name, value in zip(self._ARRAYS, saved):
                getattr(self, name)[row] = value
        for node in [node for node, row in self.rows.items() if row >= self._journal_rows]:
            self.rows.pop(node)  # first reported since: the last rows, so the rows stay 0..len-1
        for name in self._ARRAYS:
            getattr(self, name)[self._journal_rows :] = 0
        for row in self._forgotten:
            for name in self._ARRAYS:
                getattr(self, name)[row] = 0
        self._journal = None

    def remember(self, replies: list[Any], incoming: np.ndarray | None = None, learning_rate: float = 1.0) -> None:
        """Keep each node's latest statistics and, for a full-batch reply to ``incoming``
        (one local epoch), the partition of its points it states."""
        for r in replies:
            row = self._row(r.node_id)
            self._save(row)
            self.present[row] = True
            self.centers[row], self.counts[row], self.scatter[row] = (
                r.arrays["centers"],
                r.arrays["counts"],
                r.arrays["scatter"],
            )
            self.stated[row] = incoming is not None
            self.means[row] = (
                r.arrays["centers"] if incoming is None else implied_means(incoming, r.arrays["centers"], learning_rate)
            )

    def forget(self, nodes: Iterable[int]) -> None:
        for node in nodes:
            row = self.rows.get(node)
            if row is not None:
                self._save(row)
                if self._journal is not None:
                    self._forgotten.add(row)
                for name in self._ARRAYS:
                    getattr(self, name)[row] = 0

    def _used(self) -> slice:
        return slice(0, len(self.rows))

    def aggregate(self, method: str, trim: float) -> tuple[np.ndarray, np.ndarray]:
        """:func:`fedcluster.robust.aggregate_centers` over every node in memory."""
        used = self._used()
        if method == "mean":  # zero rows add nothing
            return aggregate_centers(self.centers[used], self.counts[used], method, trim)
        present = self.present[used]
        return aggregate_centers(self.centers[used][present], self.counts[used][present], method, trim)

    def total_scatter(self) -> np.ndarray:
        """Per cluster and coordinate, the scatter of every node's points in memory about
        their pooled mean (parallel axis: no sum of squared coordinates)."""
        used = self._used()
        counts = self.counts[used]
        return pooled_scatter(counts, counts[..., None] * self.means[used], self.scatter[used])

    def orphaned(self, left: Iterable[int]) -> list[int]:
        """The clusters that, in the counts every node last reported, only nodes that have
        now ``left`` the run fed: nobody will feed them again, so they are re-seeded at once
        instead of after ``reassign-patience`` rounds."""
        rows = [self.rows[node] for node in left if node in self]
        if not rows:
            return []
        used = self._used()
        leaving = np.zeros(len(self.rows), dtype=bool)
        leaving[rows] = True
        counts = self.counts[used]
        staying = counts[~leaving].sum(axis=0)
        return np.flatnonzero((counts[leaving].sum(axis=0) > 0) & (staying <= 0)).tolist()

    def bound(self, centers: np.ndarray) -> float | None:
        """An upper bound of ``centers``' cost per point on every node in memory, with no
        message: each node's latest stated partition, every part sent whole to its cheapest
        center (:func:`partition_bound`). None unless every node in memory stated one."""
        used = self._used()
        present = self.present[used]
        if not present.any() or not np.array_equal(self.stated[used], present):
            return None
        n = self.counts[used].reshape(-1)
        parts = n > 0  # the parts of the stated partitions (a cluster a node did not see has none)
        every = (
            n[parts],
            self.means[used].reshape(-1, self.d)[parts],
            self.scatter[used].sum(axis=-1).reshape(-1)[parts],
        )
        return partition_bound(every, centers)[0] / max(float(every[0].sum()), 1.0)


@dataclass
class Undo:
    """A re-seed waiting for the next round's measurement: the centers without it, the
    cost they were measured at before it, the clusters moved (the statistics memory keeps
    a checkpoint meanwhile: :meth:`Memory.checkpoint`)."""

    centers: np.ndarray
    cost_before: float
    clusters: list[int]


@dataclass
class CenterSet:
    """One of the center sets trained side by side (``n-init``), with the server state the
    paper's update carries (momentum, starved rounds), the latest statistics of every node
    (``server-memory``) and what the round records."""

    index: int
    centers: np.ndarray
    state: ServerState
    memory: Memory | None = None  # every node's latest statistics and stated partition
    protected: np.ndarray | None = None  # clusters whose re-seed was undone: not re-seeded again
    undo: Undo | None = None
    incoming: list[Any] = field(default_factory=list)
    shift: float = 0.0
    moved: list[int] = field(default_factory=list)
    orphans: list[int] = field(default_factory=list)
    empty: int = 0
    undone: list[int] = field(default_factory=list)
    undo_cost_before: float = 0.0
    cost: float = 0.0  # its latest measured cost per point (of the centers it received)

    def __post_init__(self) -> None:
        if self.protected is None:
            self.protected = np.zeros(self.centers.shape[0], dtype=bool)
        if self.memory is None:
            self.memory = Memory(*self.centers.shape)

    def remember(self, replies: list[Any], incoming: np.ndarray | None = None, learning_rate: float = 1.0) -> None:
        self.memory.remember(replies, incoming, learning_rate)

    def forget(self, nodes: Iterable[int]) -> None:
        self.memory.forget(nodes)

    def memory_bound(self) -> float | None:
        """:meth:`Memory.bound` of this set's current centers."""
        return self.memory.bound(self.centers)

    def hold(self, undo: Undo) -> None:
        """A re-seed waits for the next round's measurement (:meth:`revert` or :meth:`settle`)."""
        self.undo = undo
        self.memory.checkpoint()

    def settle(self) -> None:
        """The pending re-seed, if any, stays."""
        if self.undo is not None:
            self.memory.commit()
        self.undo = None

    def step(self, new: np.ndarray, counts: np.ndarray, moved: list[int], orphans: list[int], shift: float) -> None:
        self.centers, self.moved, self.orphans, self.shift = new, moved, orphans, shift
        self.empty, self.undone = int((counts <= 0).sum()), []

    def revert(self, cost: float) -> None:
        """Undo the previous round's re-seed: back to the centers without it, its clusters
        never re-seeded again (unless empty), the statistics memory as it was."""
        undo = self.undo
        self.shift = center_shift(undo.centers, self.centers)
        self.centers = undo.centers
        self.memory.rollback()
        self.protected[undo.clusters] = True
        self.state.starved_rounds[undo.clusters] = 0
        self.state.velocity[:] = 0.0
        self.undone, self.moved, self.orphans, self.undo_cost_before, self.undo = (
            undo.clusters,
            [],
            [],
            undo.cost_before,
            None,
        )

    @property
    def stalled(self) -> bool:
        """Did not move (beyond the rounding of its coordinates: the same partition averaged
        again jitters by units in the last place), nothing pending: its cost can no longer
        change."""
        still = self.shift <= math.sqrt(self.centers.shape[0]) * float(
            np.linalg.norm(coordinate_rounding(self.centers))
        )
        return still and not self.moved and self.undo is None and not self.state.starved_rounds.any()

    def record(self, report: dict[str, Any]) -> dict[str, Any]:
        return {
            "set": self.index,
            "sampled_cost_of_received": report["sampled_cost"],
            "center_shift": self.shift,
            "empty_clusters": self.empty,
            "reassigned": self.moved,
            "orphaned": self.orphans,
            **({"reseed_undone": self.undone} if self.undone else {}),
        }


def partition_of_reply(
    incoming: np.ndarray, centers: np.ndarray, counts: np.ndarray, scatter: np.ndarray, learning_rate: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The partition of its points a full-batch training reply states, as ``(n, means,
    scatters)`` of its non-empty clusters (counts, implied means, each cluster's scatter
    about its mean summed over the coordinates)."""
    seen = counts > 0
    return counts[seen], implied_means(incoming[seen], centers[seen], learning_rate), scatter[seen].sum(axis=1)


def part_costs(
    partition: tuple[np.ndarray, np.ndarray, np.ndarray], centers: np.ndarray, columns: Sequence[int] = (0,)
) -> np.ndarray:
    """Every part of ``partition`` (n, means, scatters) sent whole to every center:
    ``V_p + n_p ‖μ_p − c_i‖²`` (parts x centers; parallel axis). ``centers`` holds center
    sets one after another, set j from column ``columns[j]``: each set's distances by the
    BLAS form about that set's reference, whose rounding :func:`fedcluster.bounds.expansion_rounding`
    bounds (the checks add it to their slack: no row needs settling by its differences)."""
    n, means, scatter = partition
    centers = np.asarray(centers, dtype=np.float64)
    starts = np.asarray(columns, dtype=np.int64)
    priced = np.diff(np.append(starts, centers.shape[0])) > 0  # an empty set has no column to price
    d2 = np.empty((np.shape(means)[0], centers.shape[0]))
    for first, slots, kept, block in _set_distances(means, centers, starts[priced]):
        d2[:, slots[kept]] = block.transpose(1, 0, 2)[:, kept]
    return scatter[:, None] + n[:, None] * d2


def part_minima(
    partition: tuple[np.ndarray, np.ndarray, np.ndarray], centers: np.ndarray, columns: Sequence[int]
) -> np.ndarray:
    """Every part of ``partition`` sent whole to its cheapest center of each set (parts x
    sets; none empty): the minimum over each set's columns of :func:`part_costs`, the
    same numbers to the bit (``V + n·x`` rises with x), without the parts x centers table."""
    n, means, scatter = partition
    means, centers = np.asarray(means, dtype=np.float64), np.asarray(centers, dtype=np.float64)
    starts = np.asarray(columns, dtype=np.int64)
    sizes = np.diff(np.append(starts, centers.shape[0]))
    nearest = np.full((means.shape[0], starts.size), np.inf)  # a set with no center: no bound
    priced = np.flatnonzero(sizes > 0)
    step = max(1, CHUNK_FLOATS * 8 // max(int(np.max(sizes, initial=1)) * starts.size, 1))  # the blocks stay small
    for row in range(0, means.shape[0], step):
        for first, _, _, block in _set_distances(means[row : row + step], centers, starts[priced]):
            # a set's repeats bring no new minimum
            nearest[row : row + step, priced[first : first + block.shape[0]]] = block.min(axis=2).T
    return scatter[:, None] + n[:, None] * nearest


def _set_distances(means, centers: np.ndarray, starts: np.ndarray):
    """For groups of the center sets (set j from row ``starts[j]`` of ``centers``; none
    empty): ``(first set, slots, kept, block)`` with ``block`` (sets, parts, width) the
    squared distances of every mean to every center of each set, by the BLAS form about
    the set's reference, each set padded to the widest by repeats of its own centers
    (``slots``: their rows of ``centers``; ``kept``: the ones not repeats). A group's block
    holds about 2^20 floats."""
    means = np.asarray(means, dtype=np.float64)
    if not centers.shape[0]:
        return
    origins = block_references(centers, starts)[0]  # zero rows: that set about the origin, exactly
    sizes = np.append(starts[1:], centers.shape[0]) - starts
    width = int(sizes.max())
    group = max(1, CHUNK_FLOATS * 32 // max(means.shape[0] * max(width, means.shape[1]), 1))
    for first in range(0, starts.size, group):
        part = slice(first, first + group)
        slots = starts[part, None] + np.minimum(np.arange(width)[None, :], sizes[part, None] - 1)  # (sets, width)
        about = centers[slots] - origins[part, None, :]
        rows = means[None, :, :] - origins[part, None, :]  # (sets, parts, d)
        block = _expanded(rows, about, np.einsum("spd,spd->sp", rows, rows), np.einsum("skd,skd->sk", about, about))
        yield first, slots, np.arange(width)[None, :] < sizes[part, None], block


def _expanded(rows: np.ndarray, about: np.ndarray, rows_sq: np.ndarray, about_sq: np.ndarray) -> np.ndarray:
    """Squared distances (..., parts, centers) by the BLAS form ``||x||² − 2 x·c + ||c||²``,
    clipped at 0, of ``rows`` (..., parts, d) to ``about`` (..., centers, d), both about the
    same reference, with their squared norms ``rows_sq`` and ``about_sq``; its rounding is
    :func:`fedcluster.bounds.expansion_rounding`'s. One product of the rows lifted by
    ``(x, ||x||², 1)`` and the centers by ``(−2 c, 1, ||c||²)``, without two passes over the
    block that add the norms: the scale by −2 is exact and the norms come last, in that
    order (BLAS may add the terms of a product in another order; the bound holds either way)."""
    lifted = np.concatenate([rows, rows_sq[..., None], np.ones(rows.shape[:-1] + (1,))], axis=-1)
    form = np.concatenate([-2.0 * about, np.ones(about.shape[:-1] + (1,)), about_sq[..., None]], axis=-1)
    block = np.matmul(lifted, np.swapaxes(form, -1, -2))
    return np.maximum(block, 0.0, out=block)


def _expanded_minima(rows: np.ndarray, about: np.ndarray, rows_sq: np.ndarray, about_sq: np.ndarray) -> np.ndarray:
    """The smallest of :func:`_expanded`'s squared distances of each row (..., parts): the
    same BLAS form, ``||c||²`` taken into the product as one more coordinate (the rows' is 1)
    and ``||x||²`` added after the minimum over the centers (two passes less over the
    block), clipped at 0; its rounding is still
    :func:`fedcluster.bounds.expansion_rounding`'s (one more term of the same size). The
    product is taken as (centers x parts), the minimum down whole rows: BLAS may add its
    three terms in another order than :func:`_expanded`'s, so the last bits may differ."""
    lifted = np.concatenate([np.swapaxes(rows, -1, -2), np.ones(rows.shape[:-2] + (1, rows.shape[-2]))], axis=-2)
    form = np.concatenate([-2.0 * about, about_sq[..., None]], axis=-1)
    least = np.matmul(form, lifted).min(axis=-2)  # (centers, parts): the minimum runs down whole rows
    least += rows_sq
    return np.maximum(least, 0.0, out=least)


def partition_rounding(points: float, bound: float, means: np.ndarray, centers: np.ndarray) -> float:
    """How far a bound of ``points`` points' cost near ``bound`` may be off by the rounding
    of the coordinates' own size (the means stated, the centers): nothing near the origin,
    what an offset costs far from it."""
    return deviation_rounding(points, max(bound, 0.0), coordinate_rounding(means, centers))


def partition_bound(partition: tuple[np.ndarray, np.ndarray, np.ndarray], centers: np.ndarray) -> tuple[float, float]:
    """What a partition of a device's points says about the cost of ``centers`` on them:
    every part sent whole to its cheapest center costs ``Σ_p min_i (V_p + n_p ‖μ_p − c_i‖²)``,
    which nearest-center labels can only undercut. Returns that bound and its rounding
    (:func:`partition_rounding`)."""
    n, means, scatter = partition
    if n.size == 0:
        return 0.0, 0.0
    bound = float(part_minima(partition, centers, [0]).sum())
    return bound, partition_rounding(float(n.sum()), bound, means, centers) + expansion_rounding(n, means, centers)


Stated = tuple[float, np.ndarray, tuple[np.ndarray, np.ndarray, np.ndarray]]  # (cost, centers, partition)


def partitions_violation(
    stated: list[Stated],
    earlier: Sequence[Stated] = (),
    whole: Stated | None = None,
    relative: float = RELATIVE_SLACK,
    names: Sequence[str] = (),
) -> str | None:
    """Why the center sets of one training reply (``stated``: each set's cost of its
    received centers and the partition it states; ``names``: what to call them, default
    "set s"), the node's earlier accepted replies (``earlier``) and its declared moments
    (``whole``: all its points as one part, cost 0) cannot all come from one fixed set of
    points: some cost exceeds what another of these partitions costs with the same centers
    (:func:`partition_bound`, every pair at once; up to a rounding slack relative to the
    costs compared, plus the coordinates' own rounding far from the origin). None when they
    can. Honest replies never fail it: nearest-center labels cost least for any fixed data.
    :func:`partitions_violations` of this one statement."""
    return partitions_violations([(stated, earlier, whole)], relative, [names])[0]


def partitions_violations(
    statements: Sequence[tuple[list[Stated], Sequence[Stated], Stated | None]],
    relative: float = RELATIVE_SLACK,
    names: Sequence[Sequence[str]] | None = None,
) -> list[str | None]:
    """:func:`partitions_violation` of many devices' statements (each ``(stated, earlier,
    whole)``, with its ``names``) at once: every device's partitions against its own center
    sets only, all devices' pairs in the same few array passes (a round's replies checked
    together cost about what one costs in calls). One reason or None per statement."""
    groups = []
    for stated, earlier, whole in statements:
        every = [s for s in list(stated) + list(earlier) + ([whole] if whole is not None else []) if s[2][0].size]
        groups.append((every, np.array([any(e is s for s in stated) for e in every], dtype=bool)))
    reasons: list[str | None] = [None] * len(groups)
    live = [g for g, (every, _) in enumerate(groups) if len(every) >= 2]
    if not live:
        return reasons
    E = max(len(groups[g][0]) for g in live)
    parts = max(s[2][0].size for g in live for s in groups[g][0])
    widest = max(max(len(s[1]) for g in live for s in groups[g][0]), 1)
    d = np.shape(groups[live[0]][0][0][1])[-1]
    # devices per pass: their padded means (E, parts, d), centers (E, widest, d) and minima (E, E·parts) stay small
    step = max(1, CHUNK_FLOATS * 4 // (E * ((parts + widest) * d + 2 * E * parts)))
    for first in range(0, len(live), step):
        chunk = live[first : first + step]
        bad, bounds, costs = _partition_pairs([groups[g] for g in chunk], relative)
        for row, g in enumerate(chunk):
            if bad[row].any():
                j, i = (int(x) for x in np.argwhere(bad[row])[0])
                every, new = groups[g]
                stated = statements[g][0]
                labels = list(names[g]) if names is not None and names[g] else [f"set {t}" for t in range(len(stated))]
                reasons[g] = _pair_reason(every, new, stated, labels, statements[g][2], j, i, bounds[row], costs[row])
    return reasons


def _pair_reason(every, new, stated, labels, whole, j: int, i: int, bounds: np.ndarray, costs: np.ndarray) -> str:
    """What :func:`partitions_violations` says of partition j's bound on set i's cost."""

    def name(k: int) -> str:
        if new[k]:
            return labels[next(t for t, s in enumerate(stated) if s is every[k])]
        return "its declared moments" if every[k] is whole else "an earlier reply"

    return (
        f"{name(i)} against {name(j)}: cost {costs[i]:.10g} of the received centers exceeds {bounds[j, i]:.10g}, "
        f"what another partition of its points it stated costs with them: its statistics do not come from one "
        f"fixed set of points"
    )


def _partition_pairs(groups: list[tuple[list[Stated], np.ndarray]], relative: float):
    """For every device (a group: its stated partitions, and which of them are new), the bound
    of each partition j with each set i's centers, every part sent whole to its cheapest
    center (:func:`_expanded_minima`: the BLAS form about set i's reference), against set i's stated
    cost, all devices at once: ``(bad (G, E, E), bounds (G, E, E), costs (G, E))``. Devices are
    padded to the largest (E partitions) with parts of no points and centers repeated, which
    change no minimum and add nothing. The slack between a bound and a cost is relative to both,
    plus the coordinates' own rounding of partition j's means and set i's centers, plus the
    rounding of bound (j, i)'s squared distances (:func:`fedcluster.bounds.expansion_rounding`)."""
    G, E = len(groups), max(len(every) for every, _ in groups)
    P = max(s[2][0].size for every, _ in groups for s in every)
    W = max(max(len(s[1]) for every, _ in groups for s in every), 1)
    d = groups[0][0][0][1].shape[-1]
    n, scatter = np.zeros((G, E, P)), np.zeros((G, E, P))
    means, centers = np.zeros((G, E, P, d)), np.zeros((G, E, W, d))
    costs, new = np.zeros((G, E)), np.zeros((G, E), dtype=bool)
    present, priced = np.zeros((G, E), dtype=bool), np.zeros((G, E), dtype=bool)  # a partition; a set with centers
    real = []  # every set's centers, one after another, for their references
    for g, (every, fresh) in enumerate(groups):
        new[g, : len(every)] = fresh
        for e, (cost, c, (count, mu, v)) in enumerate(every):
            costs[g, e], present[g, e] = cost, True
            n[g, e, : count.size], scatter[g, e, : count.size] = count, v
            means[g, e, : count.size], means[g, e, count.size :] = mu, mu[0]  # a padded part sits on a real one
            c = np.asarray(c, dtype=np.float64).reshape(-1, d)
            if len(c):  # a set with no center bounds nothing
                centers[g, e], priced[g, e] = c[np.minimum(np.arange(W), len(c) - 1)], True
                real.append(c)
    refs = np.zeros((G, E, d))
    if real:
        sizes = np.array([len(c) for c in real])
        refs[priced] = block_references(np.concatenate(real), np.cumsum(np.append(0, sizes[:-1])))[0]
    about = centers - refs[:, :, None, :]
    reach = np.einsum("giwd,giwd->giw", about, about)  # ||c − r_i||²
    gaps = np.empty((G * E, E * P))  # ||μ − r_i||² of every part: [(g, i), parts of every j]
    nearest = np.empty((G * E, E * P))  # every part's cheapest center of set i, by the BLAS form about r_i
    every_part = means.reshape(G, E * P, d)
    per_pass = max(1, CHUNK_FLOATS * 4 // (E * P * max(W, d)))  # (device, set) slabs per pass: blocks in cache
    for first in range(0, G * E, per_pass):
        slabs = slice(first, first + per_pass)
        g, i = np.divmod(np.arange(G * E)[slabs], E)
        rows = every_part[g] - refs[g, i, None, :]
        gaps[slabs] = np.einsum("spd,spd->sp", rows, rows)
        nearest[slabs] = _expanded_minima(rows, about[g, i], gaps[slabs], reach[g, i])
    nearest, gaps = nearest.reshape(G, E, E, P), gaps.reshape(G, E, E, P)  # [g, i, j, p]
    bounds = np.sum(scatter[:, None] + n[:, None] * nearest, axis=3).transpose(0, 2, 1)  # [g, j, i]
    points = n.sum(axis=2)[:, :, None]
    of_means = OFFSET_ULPS * _EPS * largest_magnitudes(means)  # (G, E, d): a padded part repeats a real one
    of_centers = OFFSET_ULPS * _EPS * largest_magnitudes(centers)
    e = np.sqrt(np.sum(np.maximum(of_means[:, :, None, :], of_centers[:, None, :, :]) ** 2, axis=3))
    spread = np.sum(n[:, None] * gaps, axis=3).transpose(0, 2, 1)
    expansion = (d + OFFSET_ULPS) * _EPS * (spread + points * reach.max(axis=2)[:, None, :])
    slack = (
        relative * (np.abs(bounds) + np.abs(costs)[:, None, :])
        + 2.0 * e * np.sqrt(points * np.maximum(bounds, 0.0))
        + points * e * e
        + expansion
    )
    pairs = (
        present[:, :, None] & priced[:, None, :] & ~np.eye(E, dtype=bool)[None] & (new[:, :, None] | new[:, None, :])
    )
    return (costs[:, None, :] > bounds + slack) & pairs, bounds, costs


def whole_partition(declared: Any) -> Stated | None:
    """A device's declared moments (a :class:`fedcluster.bounds.Declared`) as a stated
    partition: all its points in one part, at its mean with its scatter (its cost, 0, is
    never checked). Its scatter carries the rounding :func:`fedcluster.bounds.scatter_rounding`
    grants it, which only raises the bounds taken from it."""
    if declared is None or declared.moment_sum is None:
        return None
    mean = declared.moment_mean[None, :]
    part = (
        np.array([declared.points]),
        mean,
        np.array([float(np.sum(declared.moment_scatter)) + float(np.sum(scatter_rounding(declared)))]),
    )
    return 0.0, mean, part


def evaluation_statement(
    arrays: Mapping[str, np.ndarray], centers: np.ndarray, declared: Any, earlier: Sequence[Stated] = ()
) -> Stated | None:
    """An evaluation reply (``lloyd_stats``: the counts, sums and cost of its points'
    nearest-center partition for ``centers``) as a stated partition, so that
    :func:`partitions_violation` holds it against the device's training replies. Its parts'
    scatters are not sent, but a partition bound needs only their total: the scatter of all
    its points about their mean, less its parts' spread about that mean (parallel axis),
    with that total scatter and mean from its last training statement (``earlier``, in the
    run's units), else from its declared moments with their rounding margin. It sits on the
    first part. None without either."""
    if earlier and earlier[0][2][0].size:
        n, means, scatter = earlier[0][2]
        mean = (n[:, None] * means).sum(axis=0) / n.sum()
        total = float(scatter.sum() + np.sum(n * np.sum((means - mean) ** 2, axis=1)))
    elif declared is not None and declared.moment_sum is not None:
        mean = declared.moment_mean
        total = float(np.sum(declared.moment_scatter)) + float(np.sum(scatter_rounding(declared)))
    else:
        return None
    counts = np.asarray(arrays["counts"], dtype=np.float64)
    seen = counts > 0
    n = counts[seen]
    means = np.asarray(arrays["sums"], dtype=np.float64)[seen] / n[:, None]
    within = np.zeros(n.size)
    if within.size:
        within[0] = total - float(np.sum(n * np.sum((means - mean) ** 2, axis=1)))
    return float(arrays["cost"][0]), centers, (n, means, within)


def scores_violation(
    costs: np.ndarray,
    candidates: np.ndarray,
    earlier: Sequence[Stated],
    whole: Stated | None,
    relative: float = RELATIVE_SLACK,
) -> str | None:
    """Why a device's costs of candidate center sets (``score_candidates``; ``candidates``
    (m, k, d)) cannot come from the points its stated partitions (``earlier``, ``whole``)
    describe: a cost above what one of those partitions costs with the same centers
    (:func:`partition_bound`, every candidate of a partition at once: the same bound and
    rounding), which nearest-center labels can only undercut. None when every cost fits."""
    statements = [s for s in list(earlier) + ([whole] if whole is not None else []) if s[2][0].size]
    costs = np.asarray(costs, dtype=np.float64)
    candidates = np.asarray(candidates, dtype=np.float64)
    if not statements or not candidates.size:
        return None
    m, k, d = candidates.shape
    flat, starts = candidates.reshape(m * k, d), np.arange(m) * k
    sizes = np.abs(candidates).max(axis=1)  # (m, d): each candidate's largest coordinates
    bad = np.zeros((len(statements), m), dtype=bool)
    bounds = np.zeros((len(statements), m))
    for t, (_, _, partition) in enumerate(statements):
        n, means, _ = partition
        bounds[t] = part_minima(partition, flat, starts).sum(axis=0)
        points = float(n.sum())
        # partition_bound's rounding for every candidate: coordinate_rounding(means, candidate) per row
        coordinate = OFFSET_ULPS * _EPS * np.maximum(largest_magnitudes(means)[None], sizes)
        rounding = deviation_rounding(points, np.maximum(bounds[t], 0.0), coordinate)
        rounding = rounding + expansion_roundings(n, means, candidates)
        bad[t] = costs > bounds[t] + relative * (np.abs(bounds[t]) + np.abs(costs)) + rounding
    if not bad.any():
        return None
    c = int(np.flatnonzero(bad.any(axis=0))[0])
    t = int(np.flatnonzero(bad[:, c])[0])
    source = "its declared moments" if statements[t] is whole else "an earlier reply"
    return (
        f"candidate {c}: cost {costs[c]:.10g} exceeds {bounds[t, c]:.10g}, what {source} costs with these centers: "
        f"its statistics do not come from one fixed set of points"
    )


def lloyd_step(
    replies_counts: np.ndarray, replies_sums: np.ndarray, centers: np.ndarray, method: str = "mean", trim: float = 0.1
) -> np.ndarray:
    """One Lloyd step from evaluation replies (per device: counts (m, k), sums (m, k, d)
    of ``centers``), combined like training replies (:func:`fedcluster.robust.aggregate_centers`);
    a cluster no device saw keeps its center."""
    counts = np.asarray(replies_counts, dtype=np.float64)
    means = np.divide(replies_sums, np.maximum(counts, 1.0)[:, :, None])
    totals, weighted = aggregate_centers(means, counts, method, trim)
    seen = totals > 0
    new = np.array(centers, dtype=np.float64, copy=True)
    new[seen] = weighted[seen] / totals[seen, None]
    return new


def stated_in_reply(incoming: np.ndarray, arrays: Mapping[str, np.ndarray], learning_rate: float) -> list[Stated]:
    """Each center set of a full-batch training reply: its cost of the centers it received,
    those centers and the partition it states (:func:`partition_of_reply`)."""
    return [
        (
            float(arrays["cost"][s]),
            incoming[s],
            partition_of_reply(
                incoming[s], arrays["centers"][s], arrays["counts"][s], arrays["scatter"][s], learning_rate
            ),
        )
        for s in range(incoming.shape[0])
    ]
