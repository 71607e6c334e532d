"""Federated GMM's math on plain arrays: the M-step from summed statistics (scikit-learn's
``GaussianMixture`` M-step, with the moments about the current means), the precision
factors the devices receive, BIC, the public ranges of a secure sum, and the checks of a
device's E-step reply against what it declared (:mod:`fedcluster.bounds`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from fedcluster.bounds import Declared, moments_violation, scatter_rounding, sums_rounding

from .device import log_responsibilities

EPS = 10 * np.finfo(np.float64).eps  # scikit-learn's guard on empty components
SLACK = 1e-8  # relative slack of the reply checks (sums of many float64 values)


@dataclass
class Mixture:
    """A Gaussian mixture with scikit-learn's attribute shapes: ``weights`` (k,), ``means``
    (k, d), ``covariances`` (k, d, d) full, (k, d) diag, (k,) spherical."""

    weights: np.ndarray
    means: np.ndarray
    covariances: np.ndarray
    covariance_type: str

    @property
    def full(self) -> bool:
        return self.covariance_type == "full"

    def precision_chol(self) -> np.ndarray:
        """The factors the devices receive (:func:`precision_factors`)."""
        return precision_factors(self.covariances, self.covariance_type, self.means.shape[1])

    def request(self) -> dict[str, np.ndarray]:
        """The ``gmm_estep`` request's arrays."""
        name = "precision-chol" if self.full else "precision-chol-diag"
        return {"means": self.means, "weights": self.weights, name: self.precision_chol()}

    def log_likelihood(self, X: np.ndarray) -> np.ndarray:
        """log p(x) of every row of ``X``."""
        return log_responsibilities(X, self.means, self.weights, self.precision_chol())[0]

    def responsibilities(self, X: np.ndarray) -> np.ndarray:
        return np.exp(log_responsibilities(X, self.means, self.weights, self.precision_chol())[1])


def precision_factors(covariances: np.ndarray, covariance_type: str, d: int) -> np.ndarray:
    """Upper factors U with Σ⁻¹ = U Uᵀ (full, (k, d, d)) or 1/σ per coordinate (diag and
    spherical, (k, d)); a covariance that is not positive definite is named (reg-covar)."""
    if covariance_type != "full":
        variances = covariances if covariance_type == "diag" else np.repeat(covariances[:, None], d, axis=1)
        if np.any(variances <= 0):
            raise np.linalg.LinAlgError("a component's variance is not positive: raise reg-covar")
        return 1.0 / np.sqrt(variances)
    factors = np.empty_like(covariances)
    for j, covariance in enumerate(covariances):
        try:
            lower = np.linalg.cholesky(covariance)
        except np.linalg.LinAlgError:
            raise np.linalg.LinAlgError(
                f"component {j}'s covariance is not positive definite: raise reg-covar"
            ) from None
        factors[j] = np.linalg.solve(lower, np.eye(covariance.shape[0])).T
    return factors


def m_step(
    counts: np.ndarray,
    sums: np.ndarray,
    second: np.ndarray,
    means: np.ndarray,
    covariance_type: str,
    reg_covar: float,
) -> Mixture:
    """The mixture the summed E-step statistics give (scikit-learn's M-step): with
    N = Σ r + ε, the new mean μ + Σ r (x − μ) / N, the covariance Σ r (x − μ)(x − μ)ᵀ / N − δδᵀ
    (δ the mean's move; the parallel axis theorem about the old mean) + reg-covar·I, the
    weights N / ΣN. ``second``: the outer products (k, d, d) or their diagonals (k, d)."""
    nk = np.asarray(counts, dtype=np.float64) + EPS
    shift = sums / nk[:, None]
    new_means = means + shift
    if second.ndim == 3:
        covariances = second / nk[:, None, None] - shift[:, :, None] * shift[:, None, :]
        covariances = 0.5 * (covariances + np.swapaxes(covariances, 1, 2))
        covariances = covariances + reg_covar * np.eye(means.shape[1])
        if covariance_type != "full":
            covariances = np.diagonal(covariances, axis1=1, axis2=2).copy()
    else:
        covariances = np.maximum(second / nk[:, None] - shift**2, 0.0) + reg_covar
    if covariance_type == "spherical":
        covariances = covariances.mean(axis=1)
    return Mixture(nk / nk.sum(), new_means, covariances, covariance_type)


def lloyd_means(counts: np.ndarray, sums: np.ndarray, means: np.ndarray) -> np.ndarray:
    """A hard E-step's Lloyd step: each mean moved to its points' mean; an empty one stays."""
    seen = counts > 0
    out = means.copy()
    out[seen] += sums[seen] / counts[seen, None]
    return out


def n_parameters(k: int, d: int, covariance_type: str) -> int:
    """Free parameters of a mixture (scikit-learn's ``_n_parameters``)."""
    covariance = {"full": k * d * (d + 1) // 2, "diag": k * d, "spherical": k}[covariance_type]
    return int(covariance + k * d + k - 1)


def bic(total_log_likelihood: float, points: int, k: int, d: int, covariance_type: str) -> float:
    """−2 log L + p ln N (scikit-learn's ``bic``)."""
    return -2.0 * total_log_likelihood + n_parameters(k, d, covariance_type) * math.log(points)


def start_means(
    mean: np.ndarray, std: np.ndarray, device_means: np.ndarray, weights: np.ndarray, k: int, rng: np.random.Generator
) -> np.ndarray:
    """Means to start hard E-steps from without asking a device anything but its data
    summary: k-means++ draws among the devices' means where there are at least k distinct
    ones, the other means drawn from N(mean, std²) of the federation."""
    distinct, index = np.unique(device_means, axis=0, return_index=True)
    if distinct.shape[0] >= k:
        from fedcluster.lloyd import kmeans_plus_plus

        return kmeans_plus_plus(distinct, k, rng, weights=weights[index])
    drawn = mean + std * rng.standard_normal((k - distinct.shape[0], mean.shape[0]))
    return np.concatenate([distinct, drawn])


def box_reach(low: np.ndarray, high: np.ndarray, means: np.ndarray) -> np.ndarray:
    """Per component and coordinate, the farthest a point of the box lies from its mean."""
    return np.maximum(np.abs(low - means), np.abs(high - means))


def log_density_bounds(mixture: Mixture, low: np.ndarray, high: np.ndarray) -> tuple[float, float]:
    """Bounds of log p(x) over the box: the largest any density of the mixture reaches, and
    the least its best component gives a point of the box (Mahalanobis distance at most
    λ_max(Σ⁻¹) times the squared reach)."""
    factors = mixture.precision_chol()
    d = mixture.means.shape[1]
    if factors.ndim == 3:
        log_det = np.sum(np.log(np.diagonal(factors, axis1=1, axis2=2)), axis=1)
        largest = np.array([np.linalg.eigvalsh(U @ U.T)[-1] for U in factors])
    else:
        log_det, largest = np.sum(np.log(factors), axis=1), np.max(factors**2, axis=1)
    peak = log_det - 0.5 * d * math.log(2 * math.pi)
    reach = np.sum(box_reach(low, high, mixture.means) ** 2, axis=1)
    with np.errstate(divide="ignore"):
        floor = np.log(mixture.weights) + peak - 0.5 * largest * reach
    return float(np.max(peak)), float(np.max(floor))


def secure_ranges(mixture: Mixture, low: np.ndarray, high: np.ndarray, points: float) -> dict[str, float]:
    """The public clipping range of every summed array for devices of at most ``points``
    points inside the federation's box [low, high]: no honest coordinate exceeds it."""
    reach = float(np.max(box_reach(low, high, mixture.means)))
    top, floor = log_density_bounds(mixture, low, high)
    second = "outer" if mixture.full else "squares"
    return {
        "counts": float(points),
        "sums": float(points) * max(reach, 1e-300),
        second: float(points) * max(reach * reach, 1e-300),
        "loglik": float(points) * max(abs(top), abs(floor), 1.0),
    }


def estep_violation(arrays: Mapping[str, np.ndarray], mixture: Mixture, declared: Declared | None) -> str | None:
    """Why an E-step reply of a device with these declarations is none its points in its box
    could give (None: it could): each component's implied mean inside the box, its second
    moments within what points of the box reach and at least what its first moments imply
    (Cauchy–Schwarz; full: Σ r (x − μ)(x − μ)ᵀ − s sᵀ / N positive semi-definite), the
    totals its declared moments fix, and its log-likelihood within the mixture's range on
    the box. The responsibilities' total is the declared point count (``counts = "all"``)."""
    if declared is None or declared.low is None:
        return None
    counts, sums, means = arrays["counts"], arrays["sums"], mixture.means
    full = "outer" in arrays
    second = np.diagonal(arrays["outer"], axis1=1, axis2=2) if full else arrays["squares"]
    low, high = declared.low, declared.high
    slack = sums_rounding(counts, declared, (means,), terms=max(float(declared.points), 1.0))
    if np.any(sums < counts[:, None] * (low - means) - slack) or np.any(
        sums > counts[:, None] * (high - means) + slack
    ):
        return "its moments put a component's mean outside its declared bounding box"
    reach = box_reach(low, high, means)
    width = counts[:, None] * reach**2
    spread = SLACK * width + 2 * slack * reach + 1e-300
    if np.any(second > width + spread):
        return "its second moments spread more than points inside its declared bounding box can"
    seen = counts > SLACK * max(declared.points, 1.0)
    floor = sums[seen] ** 2 / counts[seen, None]
    if np.any(second[seen] < floor - spread[seen] - SLACK * floor):
        return "its second moments are smaller than its first moments imply"
    if full:
        for j in np.flatnonzero(seen):
            scatter = arrays["outer"][j] - np.outer(sums[j], sums[j]) / counts[j]
            if np.linalg.eigvalsh(0.5 * (scatter + scatter.T))[0] < -(
                np.sum(spread[j]) + SLACK * np.trace(np.abs(scatter))
            ):
                return f"its second moments of component {j} are not those of any points (not positive semi-definite)"
    totals = counts[:, None] * means + sums
    reason = moments_violation(totals, None, declared, about=(means,))
    if reason:
        return reason
    if declared.moment_sum is not None:  # the scatter about the declared mean, by the parallel axis theorem
        between = counts[:, None] * (means - declared.moment_mean) ** 2 + 2 * sums * (means - declared.moment_mean)
        pooled = np.sum(second + between, axis=0)
        # second moments about far means cancel: the slack is relative to them, not to the scatter
        slack = scatter_rounding(declared, (means,)) + 1e-9 * (np.sum(second, axis=0) + np.sum(np.abs(between), axis=0))
        if np.any(np.abs(pooled - declared.moment_scatter) > slack + 1e-300):
            return "its second moments add up to another scatter of its points than the one its data summary declared"
    top, bottom = log_density_bounds(mixture, low, high)
    loglik, n = float(arrays["loglik"][0]), declared.points
    margin = SLACK * n * (abs(top) + abs(bottom) + 1.0)
    if loglik > n * top + margin or loglik < n * bottom - margin:
        return f"its log-likelihood {loglik:.6g} is outside what {n:g} points inside its declared box can have"
    return None


def unit_mixture(means: np.ndarray, covariance_type: str) -> Mixture:
    """Equal weights and unit covariances about ``means``: the request of a hard E-step
    (which uses the means alone)."""
    k, d = means.shape
    covariances = {"full": np.tile(np.eye(d), (k, 1, 1)), "diag": np.ones((k, d)), "spherical": np.ones(k)}
    return Mixture(np.full(k, 1.0 / k), means, covariances[covariance_type], covariance_type)


def summary_start(
    counts: list[float], sums: list[np.ndarray], scatters: list[np.ndarray], k: int, rng: np.random.Generator
) -> np.ndarray:
    """:func:`start_means` from the devices' data summaries (points, per-feature sums and
    scatters about their means), pooled by the parallel axis theorem."""
    n = np.asarray(counts, dtype=np.float64)
    device_means = np.stack(sums) / np.maximum(n, 1.0)[:, None]
    mean = n @ device_means / n.sum()
    scatter = np.sum(np.stack(scatters), axis=0) + n @ (device_means - mean) ** 2
    return start_means(mean, np.sqrt(scatter / n.sum()), device_means, n, k, rng)


def summed_statistics(total: Mapping[str, np.ndarray], second: str) -> dict[str, object]:
    """The E-step's summed arrays as the M-step takes them, with the points they cover."""
    counts = np.maximum(total["counts"], 0.0)
    return {
        "counts": counts,
        "sums": total["sums"],
        "second": total[second],
        "loglik": float(total["loglik"][0]),
        "points": float(counts.sum()),
    }


# ------------------------------------------------------------------------ EM starts side by side
def stacked_request(mixtures: list[Mixture]) -> dict[str, np.ndarray]:
    """The ``gmm_estep`` request of several mixtures (the EM starts side by side): each
    array of :meth:`Mixture.request` stacked on a leading start axis."""
    requests = [mixture.request() for mixture in mixtures]
    return {name: np.stack([request[name] for request in requests]) for name in requests[0]}


def start_arrays(arrays: Mapping[str, np.ndarray], start: int) -> dict[str, np.ndarray]:
    """One start's E-step arrays out of a reply (or sum) of every start's, as a one-start
    reply has them (``loglik`` of shape (1,))."""
    return {name: value[start : start + 1] if name == "loglik" else value[start] for name, value in arrays.items()}


def starts_violation(
    arrays: Mapping[str, np.ndarray], mixtures: list[Mixture], declared: Declared | None
) -> str | None:
    """:func:`estep_violation` of every start's statistics against that start's mixture."""
    for start, mixture in enumerate(mixtures):
        reason = estep_violation(start_arrays(arrays, start), mixture, declared)
        if reason:
            return f"start {start}: {reason}" if len(mixtures) > 1 else reason
    return None


def starts_ranges(mixtures: list[Mixture], low: np.ndarray, high: np.ndarray, points: float) -> dict[str, float]:
    """The public clipping range of every summed array (:func:`secure_ranges`) that holds
    for every start's: the largest."""
    ranges = [secure_ranges(mixture, low, high, points) for mixture in mixtures]
    return {name: max(r[name] for r in ranges) for name in ranges[0]}


def distinct_starts(means: list[np.ndarray]) -> list[int]:
    """The starts whose means (as a set of rows) differ from every earlier start's (relative
    1e-9): two starts at the same means run the same EM."""
    kept: list[int] = []
    for index, candidate in enumerate(means):
        rows = candidate[np.lexsort(candidate.T[::-1])]
        scale = 1e-9 * max(float(np.max(np.abs(rows))), 1e-300)
        if all(np.max(np.abs(rows - means[j][np.lexsort(means[j].T[::-1])])) > scale for j in kept):
            kept.append(index)
    return kept


AUTO_STARTS = 16  # em-starts = 0: this many starts side by side while their statistics fit ...
AUTO_START_FLOATS = 2**17  # ... in this many floats of one device's reply (1 MiB)


def start_count(em_starts: int, k: int, d: int, covariance_type: str) -> int:
    """The EM starts run side by side: ``em_starts``, or with 0 (auto) 16 while one
    device's statistics of all of them fit in 2**17 floats, fewer for large k·d², at least 1."""
    second = d * d if covariance_type == "full" else d
    return em_starts or max(1, min(AUTO_STARTS, AUTO_START_FLOATS // max(k * (1 + d + second), 1)))


def topped_up_starts(
    starts: list[np.ndarray], count: int, points: np.ndarray, weights: np.ndarray, rng: np.random.Generator
) -> list[np.ndarray]:
    """``starts`` (distinct), then draws of k distinct summary points (probability by
    weight, without replacement) that no earlier start has, until there are ``count`` or
    the pool yields no new one in as many tries: EM from rough partitions reaches optima
    that starts refined by k-means all miss, and a small pool (few devices, small k) gives
    FedKMeans' k-means++ draws few distinct sets."""
    starts = [starts[i] for i in distinct_starts(starts)][:count]
    if not starts:
        return starts
    k = starts[0].shape[0]
    p = np.maximum(np.asarray(weights, dtype=np.float64), 0.0)
    positive = int(np.count_nonzero(p))
    if positive < k:
        return starts
    p = p / p.sum()
    for _ in range(4 * count):
        if len(starts) >= count:
            break
        drawn = points[rng.choice(points.shape[0], size=k, replace=False, p=p)]
        if len(distinct_starts([*starts, drawn])) > len(starts):
            starts.append(drawn)
    return starts


def best_start(lower: list[float]) -> int:
    """The start of highest mean log-likelihood (the first of equals)."""
    return int(np.argmax(lower))


def em_survivors(live: list[int], converged: list[bool], lower: list[float], finished: bool) -> list[int]:
    """The EM starts that go on (indices, in order): a converged start stops (its mixture no
    longer changes by ``em-tol``); once ``finished`` (half of ``em-rounds`` done) only the
    leader (highest mean log-likelihood of all starts) goes on, and none if it converged,
    as FedKMeans' center sets (:func:`fedcluster.algorithms.fedkmeans.model.keep_sets`)."""
    running = [i for i in live if not converged[i]]
    if not finished:
        return running
    leader = best_start(lower)
    return [leader] if leader in running else []
