"""Differential privacy on the server: noise mechanisms, calibration, and accounting.

This module is server-side (it uses SciPy and Google's ``dp_accounting``); what devices
need -- clipping -- lives in :mod:`fedcluster.clipping`, which is NumPy only.

The pieces, in the order a private algorithm uses them:

1. **Budget** -- :func:`split_budget` splits one ε over the steps of FedDP-KMeans with the
   paper's rule of thumb; :func:`calibrate_to_total` instead finds the noise of every step
   so that the *accounted total* meets a target ε (what the user's ``epsilon`` means).
2. **Calibration** -- :func:`analytic_gaussian_sigma` (Balle & Wang 2018),
   :func:`gaussian_sigma_for` (one step, possibly repeated and/or Poisson-sampled),
   :func:`laplace_scale_for`.
3. **Mechanisms** -- :class:`GaussianMechanism`, :class:`SymmetricGaussianMechanism`,
   :class:`LaplaceMechanism`. Each holds its OWN random generator (get several
   independent ones from :func:`independent_generators`) and describes itself as a
   ``dp_accounting`` event via ``.event()``.
4. **Accounting** -- :class:`PrivacyLedger` records every step as a ``DpEvent`` and
   composes them with the privacy-loss-distribution (PLD) accountant, under the
   add-or-remove-one neighbouring relation (one data point, or one client, added or
   removed -- which one is the ledger's ``level``).

Conventions
-----------
``sensitivity`` is the L2 sensitivity for Gaussian mechanisms and the L1 sensitivity for
Laplace ones. ``noise_multiplier`` is ``dp_accounting``'s parameter: σ / sensitivity for
Gaussian noise, b / sensitivity for Laplace noise of scale b. ``noise_std`` is the actual
standard deviation of one noise coordinate: σ for Gaussian, √2·b for Laplace.

PLD discretization
------------------
The PLD accountant discretizes the privacy-loss axis; its estimate is *pessimistic* (it
can only over-state ε) and the error shrinks with the interval. Measured on this
project's typical events (σ_AGM-calibrated Gaussians with ε in 0.016..2.3, Laplace
counts, 5-20 sampled or repeated rounds), interval 1e-3 is within 1e-5 (relative) of
interval 1e-5 at ε ≳ 0.1 and within 0.2 % at ε ≈ 0.016, and one composition takes
~2-90 ms (1e-4: ~5-600 ms; 1e-5: up to 1.5 s). So:

- reports (:class:`PrivacyLedger`) use ``REPORT_DISCRETIZATION = 1e-4``;
- searches (calibration, dozens of compositions) use ``SEARCH_DISCRETIZATION = 1e-3``.

Both are pessimistic and, in every case we measured, the finer grid's estimate is the
smaller, so a calibration that meets ε at 1e-3 still meets it when the ledger re-accounts
it at 1e-4 (the tests check this on the FedDP-KMeans setup).

Measured CPU time (one core): FedDP-Init's four steps, ledger total 0.1 s at 1e-4
(0.02 s at 1e-3), :func:`calibrate_to_total` 0.04 s; six Poisson-sampled steps (q = 0.1,
two Lloyd rounds), ledger total 1.1 s at 1e-4, calibration 2.4 s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
from scipy import special

import dp_accounting
from dp_accounting.pld import pld_privacy_accountant

__all__ = [
    "REPORT_DISCRETIZATION",
    "SEARCH_DISCRETIZATION",
    "analytic_gaussian_sigma",
    "gaussian_sigma_for",
    "laplace_scale_for",
    "independent_generators",
    "GaussianMechanism",
    "SymmetricGaussianMechanism",
    "LaplaceMechanism",
    "PrivacyLedger",
    "LedgerStep",
    "pld_epsilon",
    "event_to_dict",
    "event_from_dict",
    "BudgetSplit",
    "split_budget",
    "StepSpec",
    "CalibratedStep",
    "Calibration",
    "calibrate_to_total",
    "normalize_level",
]

REPORT_DISCRETIZATION = 1e-4
SEARCH_DISCRETIZATION = 1e-3

DATA_POINT = "data_point"
CLIENT = "client"
_LEVEL_ALIASES = {
    "data_point": DATA_POINT, "datapoint": DATA_POINT, "data-point": DATA_POINT,
    "point": DATA_POINT, "record": DATA_POINT, "example": DATA_POINT,
    "client": CLIENT, "client_level": CLIENT, "client-level": CLIENT, "user": CLIENT,
    "user_level": CLIENT, "user-level": CLIENT, "device": CLIENT,
}


def normalize_level(level: str) -> str:
    """Return the canonical privacy level, ``"data_point"`` or ``"client"``."""
    key = str(level).strip().lower()
    if key not in _LEVEL_ALIASES:
        raise ValueError(f"unknown privacy level {level!r}; use 'data_point' or 'client'")
    return _LEVEL_ALIASES[key]


# ----------------------------------------------------------------------------------------
# Calibration
# ----------------------------------------------------------------------------------------

def _check_epsilon(epsilon: float) -> float:
    epsilon = float(epsilon)
    if not epsilon > 0.0:  # rejects NaN too
        raise ValueError(f"epsilon must be > 0 (inf means no privacy), got {epsilon}")
    return epsilon


def _check_delta(delta: float) -> float:
    delta = float(delta)
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must be in (0, 1) for a Gaussian mechanism, got {delta}")
    return delta


def _check_sensitivity(sensitivity: float) -> float:
    sensitivity = float(sensitivity)
    if not (sensitivity > 0.0 and math.isfinite(sensitivity)):
        raise ValueError(f"sensitivity must be a positive finite number, got {sensitivity}")
    return sensitivity


def _check_compositions(compositions: int) -> int:
    if int(compositions) != compositions or compositions < 1:
        raise ValueError(f"compositions must be an integer >= 1, got {compositions}")
    return int(compositions)


def _check_sampling_rate(sampling_rate: float | None) -> float | None:
    """None or 1 means no sampling; otherwise 0 < q < 1."""
    if sampling_rate is None:
        return None
    q = float(sampling_rate)
    if not 0.0 < q <= 1.0:
        raise ValueError(f"sampling_rate must be in (0, 1], got {sampling_rate}")
    return None if q == 1.0 else q


def _agm_delta(sigma: float, epsilon: float) -> float:
    """Exact δ of the Gaussian mechanism with L2 sensitivity 1 and std ``sigma`` at ε.

    Balle & Wang (2018), Theorem 8: the mechanism is (ε, δ)-DP iff
    Φ(1/(2σ) − εσ) − e^ε Φ(−1/(2σ) − εσ) ≤ δ. The second term is evaluated in log space
    (``log_ndtr``) so that e^ε does not overflow for large ε.
    """
    a = 0.5 / sigma
    b = epsilon * sigma
    first = math.exp(special.log_ndtr(a - b))
    second = math.exp(epsilon + special.log_ndtr(-a - b))
    return first - second


def analytic_gaussian_sigma(epsilon: float, delta: float, sensitivity: float = 1.0) -> float:
    """Smallest σ for which the Gaussian mechanism is (ε, δ)-DP (analytic Gaussian mechanism).

    Binary search (in log σ) on the exact condition of Balle & Wang (2018, Thm. 8), which
    is monotone in σ. Returns the upper end of the final bracket, so the σ returned always
    satisfies the condition (relative precision ~1e-12). ``epsilon = inf`` gives 0.

    Examples: σ_AGM(1, 1e-6) ≈ 4.2247 and σ_AGM(0.5, 1e-6) ≈ 8.0576 (sensitivity 1).
    """
    sensitivity = _check_sensitivity(sensitivity)
    delta = _check_delta(delta)
    epsilon = _check_epsilon(epsilon)
    if math.isinf(epsilon):
        return 0.0
    lo, hi = 1.0, 1.0
    while _agm_delta(hi, epsilon) > delta:
        hi *= 2.0
    while _agm_delta(lo, epsilon) <= delta:
        lo /= 2.0
        if lo < 1e-300:  # pragma: no cover - only for absurd epsilon
            return 0.0
    while hi / lo > 1.0 + 1e-12:
        mid = math.sqrt(lo * hi)
        if _agm_delta(mid, epsilon) > delta:
            lo = mid
        else:
            hi = mid
    return hi * sensitivity


def _wrap_event(
    event: dp_accounting.DpEvent, compositions: int = 1, sampling_rate: float | None = None
) -> dp_accounting.DpEvent:
    """Poisson-sample ``event`` at rate q (if q < 1), then repeat it ``compositions`` times."""
    compositions = _check_compositions(compositions)
    sampling_rate = _check_sampling_rate(sampling_rate)
    if sampling_rate is not None:
        event = dp_accounting.PoissonSampledDpEvent(sampling_rate, event)
    if compositions > 1:
        event = dp_accounting.SelfComposedDpEvent(event, compositions)
    return event


def pld_epsilon(
    event: dp_accounting.DpEvent,
    delta: float,
    value_discretization_interval: float = REPORT_DISCRETIZATION,
) -> float:
    """ε at ``delta`` of one (possibly composed) ``DpEvent`` with the PLD accountant
    (add-or-remove-one neighbours). Events with zero noise give ``inf``."""
    accountant = pld_privacy_accountant.PLDAccountant(
        value_discretization_interval=value_discretization_interval
    )
    accountant.compose(event)
    return float(accountant.get_epsilon(delta))


def gaussian_sigma_for(
    epsilon: float,
    delta: float,
    sensitivity: float = 1.0,
    compositions: int = 1,
    sampling_rate: float | None = None,
) -> float:
    """σ of a Gaussian mechanism whose ``compositions``-fold (Poisson-sampled) use is (ε, δ)-DP.

    - No sampling: the T-fold composition of Gaussian mechanisms with noise multiplier z
      has exactly the privacy loss of one Gaussian with multiplier z/√T, so the answer is
      the closed form ``sensitivity * sqrt(T) * σ_AGM(ε, δ)`` (exact, no search needed;
      for T = 1 it is the analytic Gaussian mechanism itself).
    - Poisson sampling at rate q < 1: there is no closed form, so the noise multiplier z is
      searched (bracketing, then Illinois false position in log z) until the PLD
      accountant's ε of ``SelfComposed(PoissonSampled(q, Gaussian(z)), T)`` at δ lies in
      ``[ε·(1 − 1e-4), ε]`` -- never above ε. The search starts from the unsampled answer
      (sampling only helps).

    ``epsilon = inf`` returns 0 (no noise).
    """
    sensitivity = _check_sensitivity(sensitivity)
    delta = _check_delta(delta)
    epsilon = _check_epsilon(epsilon)
    compositions = _check_compositions(compositions)
    sampling_rate = _check_sampling_rate(sampling_rate)
    if math.isinf(epsilon):
        return 0.0
    unsampled = math.sqrt(compositions) * analytic_gaussian_sigma(epsilon, delta)
    if sampling_rate is None:
        return sensitivity * unsampled
    return sensitivity * _sampled_gaussian_multiplier(epsilon, delta, compositions, sampling_rate, unsampled)


# Searches stop once the accounted ε lands in [target·(1 − tolerance), target]: never
# above (the guarantee), and close enough below that no budget worth having is wasted.
_INNER_TOLERANCE = 1e-4


def _solve_in_band(f, start: float, low: float, high: float, max_evaluations: int = 60):
    """Find u with ``low <= f(u) <= high`` for a positive increasing function ``f``.

    Both uses here (total ε against log scale, ε against −log noise multiplier) are close
    to ``f ∝ exp(u)``, so the search works on ``log f``: secant steps from ``start`` (the
    first with slope 1) until the band is bracketed, then the Illinois variant of false
    position. It aims at the middle of the band and stops as soon as an evaluation lands
    inside it -- PLD evaluations are the cost, so a band beats a root; typically 2-4
    evaluations. Returns ``(u, f(u))``; should the band not be hit within
    ``max_evaluations`` it returns the best point with ``f(u) < low`` (under the target,
    the constraint that matters).
    """
    log_low, log_high = math.log(low), math.log(high)
    aim = 0.5 * (log_low + log_high)
    evaluations = 0

    def g(u: float) -> float:  # log f − aim, increasing in u
        nonlocal evaluations
        evaluations += 1
        value = f(u)
        return math.log(value) - aim if value > 0 else -math.inf

    def inside(gu: float) -> bool:
        return log_low - aim <= gu <= log_high - aim

    u0, g0 = start, g(start)
    if inside(g0):
        return u0, math.exp(g0 + aim)
    slope = 1.0
    while True:  # secant steps until the sign of g changes
        step = -g0 / slope if math.isfinite(g0) else 1.0
        step = math.copysign(min(max(abs(step), 1e-6), 2.0), step)
        u1 = u0 + step
        g1 = g(u1)
        if inside(g1):
            return u1, math.exp(g1 + aim)
        if (g1 > 0) != (g0 > 0):
            break
        secant = (g1 - g0) / (u1 - u0) if math.isfinite(g1 - g0) else 0.0
        slope = secant if secant > 0 else slope / 2.0  # keep it positive
        u0, g0 = u1, g1
        if evaluations >= max_evaluations or abs(u1) > 700:
            raise RuntimeError("could not bracket the privacy target")
    (u_lo, g_lo), (u_hi, g_hi) = sorted([(u0, g0), (u1, g1)])
    side = 0
    while evaluations < max_evaluations:
        if math.isfinite(g_lo) and math.isfinite(g_hi):
            u = u_hi - g_hi * (u_hi - u_lo) / (g_hi - g_lo)
            if not u_lo < u < u_hi:
                u = 0.5 * (u_lo + u_hi)
        else:
            u = 0.5 * (u_lo + u_hi)
        gu = g(u)
        if inside(gu):
            return u, math.exp(gu + aim)
        if gu < 0:
            u_lo, g_lo = u, gu
            if side == -1:
                g_hi *= 0.5
            side = -1
        else:
            u_hi, g_hi = u, gu
            if side == 1:
                g_lo *= 0.5
            side = 1
    return u_lo, math.exp(g_lo + aim)


def _sampled_gaussian_multiplier(
    epsilon: float,
    delta: float,
    compositions: int,
    sampling_rate: float,
    upper_bound: float,
    guess: float | None = None,
) -> float:
    """Noise multiplier z of a T-fold Poisson-sampled Gaussian whose PLD ε at δ is in
    ``[epsilon·(1 − 1e-4), epsilon]``.

    ``upper_bound`` is a z known to suffice (the unsampled answer) and the default start;
    ``guess`` (a nearby earlier solution) saves most evaluations when called repeatedly
    from :func:`calibrate_to_total`. The search variable is u = −log z, so ε is
    increasing in u.
    """

    def accounted(u: float) -> float:
        event = _wrap_event(dp_accounting.GaussianDpEvent(math.exp(-u)), compositions, sampling_rate)
        return pld_epsilon(event, delta, SEARCH_DISCRETIZATION)

    start = guess if guess is not None and guess > 0 else upper_bound
    u, _ = _solve_in_band(accounted, -math.log(start), epsilon * (1.0 - _INNER_TOLERANCE), epsilon)
    return math.exp(-u)


def laplace_scale_for(
    epsilon: float,
    sensitivity: float = 1.0,
    compositions: int = 1,
    sampling_rate: float | None = None,
) -> float:
    """Scale b of a Laplace mechanism whose ``compositions``-fold (sampled) use is ε-DP.

    Pure ε-DP (δ = 0), by basic composition: each of the T rounds gets ε / T, which is
    tight for pure DP. (At δ > 0 the PLD total reported by the ledger will be a little
    lower; searching the scale with PLD at δ would buy less noise but make the Laplace
    steps' guarantee depend on δ -- we keep them pure.) With Poisson sampling at rate
    q < 1 the amplification bound for pure DP, ε_round = log(1 + q(e^ε₀ − 1)), is inverted
    exactly: ε₀ = log(1 + (e^(ε/T) − 1) / q), and b = sensitivity / ε₀.

    ``epsilon = inf`` returns 0 (no noise).
    """
    sensitivity = _check_sensitivity(sensitivity)
    epsilon = _check_epsilon(epsilon)
    compositions = _check_compositions(compositions)
    sampling_rate = _check_sampling_rate(sampling_rate)
    if math.isinf(epsilon):
        return 0.0
    per_round = epsilon / compositions
    if sampling_rate is not None:
        per_round = math.log1p(math.expm1(per_round) / sampling_rate)
    return sensitivity / per_round


# ----------------------------------------------------------------------------------------
# Mechanisms
# ----------------------------------------------------------------------------------------

def independent_generators(
    seed: int | Sequence[int] | np.random.SeedSequence | None, count: int
) -> list[np.random.Generator]:
    """``count`` statistically independent generators spawned from one ``SeedSequence``.

    Give each mechanism its own: the same ``seed`` reproduces the same streams, and the
    children of one SeedSequence are independent of each other. ``seed=None`` draws the
    parent from OS entropy (not reproducible, which is what a real deployment wants).
    """
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    parent = seed if isinstance(seed, np.random.SeedSequence) else np.random.SeedSequence(seed)
    return [np.random.default_rng(child) for child in parent.spawn(count)]


def _own_generator(rng: np.random.Generator | None) -> np.random.Generator:
    if rng is None:
        return np.random.default_rng()  # fresh OS entropy
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator or None, got {type(rng).__name__}")
    return rng


class GaussianMechanism:
    """Adds i.i.d. N(0, σ²) noise to every entry of a statistic with L2 sensitivity Δ.

    Parameters
    ----------
    sigma : float
        Noise standard deviation σ (``>= 0``; 0 adds nothing and is not private).
    sensitivity : float
        L2 (Frobenius) sensitivity Δ of the statistic; the accounted noise multiplier is
        σ / Δ.
    rng : numpy.random.Generator or None
        This mechanism's own generator; do not share one generator between mechanisms
        (use :func:`independent_generators`). ``None`` seeds a fresh one from OS entropy.
    """

    name = "gaussian"

    def __init__(self, sigma: float, sensitivity: float = 1.0, rng: np.random.Generator | None = None):
        sigma = float(sigma)
        if not (sigma >= 0.0 and math.isfinite(sigma)):
            raise ValueError(f"sigma must be a non-negative finite number, got {sigma}")
        self.sigma = sigma
        self.sensitivity = _check_sensitivity(sensitivity)
        self.rng = _own_generator(rng)

    @classmethod
    def calibrated(
        cls,
        epsilon: float,
        delta: float,
        sensitivity: float = 1.0,
        compositions: int = 1,
        sampling_rate: float | None = None,
        rng: np.random.Generator | None = None,
    ):
        """The mechanism whose ``compositions``-fold use is (ε, δ)-DP (:func:`gaussian_sigma_for`)."""
        sigma = gaussian_sigma_for(epsilon, delta, sensitivity, compositions, sampling_rate)
        return cls(sigma, sensitivity, rng)

    @property
    def noise_std(self) -> float:
        return self.sigma

    @property
    def noise_multiplier(self) -> float:
        return self.sigma / self.sensitivity

    def noise(self, shape: int | tuple[int, ...]) -> np.ndarray:
        """A fresh noise array of ``shape`` from this mechanism's stream."""
        if self.sigma == 0.0:
            return np.zeros(shape)
        return self.rng.normal(0.0, self.sigma, size=shape)

    def add(self, array: np.ndarray) -> np.ndarray:
        """Return ``array + noise`` as a new float64 array (``array`` is not modified)."""
        values = np.asarray(array, dtype=np.float64)
        return values + self.noise(values.shape)

    def event(self) -> dp_accounting.DpEvent:
        """One use of this mechanism as a ``GaussianDpEvent(noise_multiplier=σ/Δ)``."""
        return dp_accounting.GaussianDpEvent(noise_multiplier=self.noise_multiplier)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(sigma={self.sigma:.6g}, sensitivity={self.sensitivity:.6g})"


class SymmetricGaussianMechanism(GaussianMechanism):
    """Gaussian noise for a symmetric d x d statistic (e.g. Σ XᵢᵀXᵢ in FedDP-Init step 1).

    The upper triangle including the diagonal is drawn i.i.d. N(0, σ²) and mirrored, so
    the noisy matrix stays symmetric and every entry has standard deviation σ. The
    released information is the upper triangle, whose L2 norm is at most the Frobenius
    norm of the statistic, so calibrating σ to the Frobenius sensitivity (Δ² for xxᵀ
    with ||x|| ≤ Δ) is valid (slightly conservative: off-diagonal entries count once).
    """

    name = "symmetric_gaussian"

    def noise(self, shape: int | tuple[int, ...]) -> np.ndarray:
        shape = (shape, shape) if isinstance(shape, (int, np.integer)) else tuple(shape)
        if len(shape) != 2 or shape[0] != shape[1]:
            raise ValueError(f"symmetric noise needs a square d x d shape, got {shape}")
        d = shape[0]
        noise = np.zeros((d, d))
        if self.sigma == 0.0 or d == 0:
            return noise
        rows, cols = np.triu_indices(d)
        noise[rows, cols] = self.rng.normal(0.0, self.sigma, size=rows.size)
        noise[cols, rows] = noise[rows, cols]
        return noise

    def add(self, array: np.ndarray) -> np.ndarray:
        values = np.asarray(array, dtype=np.float64)
        if values.ndim != 2 or values.shape[0] != values.shape[1]:
            raise ValueError(f"expected a square d x d matrix, got shape {values.shape}")
        return values + self.noise(values.shape)


class LaplaceMechanism:
    """Adds i.i.d. Laplace(0, b) noise to every entry of a statistic with L1 sensitivity Δ.

    Pure (Δ/b)-DP for one use. ``scale = 0`` adds no noise (ε = ∞; it is what
    ``laplace_scale_for(inf)`` returns) and is accounted as non-private.

    Parameters
    ----------
    scale : float
        Laplace scale b (the noise standard deviation is √2·b).
    sensitivity : float
        L1 sensitivity Δ; the accounted noise multiplier is b / Δ.
    rng : numpy.random.Generator or None
        This mechanism's own generator (see :class:`GaussianMechanism`).
    """

    name = "laplace"

    def __init__(self, scale: float, sensitivity: float = 1.0, rng: np.random.Generator | None = None):
        scale = float(scale)
        if not (scale >= 0.0 and math.isfinite(scale)):
            raise ValueError(f"scale must be a non-negative finite number, got {scale}")
        self.scale = scale
        self.sensitivity = _check_sensitivity(sensitivity)
        self.rng = _own_generator(rng)

    @classmethod
    def calibrated(
        cls,
        epsilon: float,
        sensitivity: float = 1.0,
        compositions: int = 1,
        sampling_rate: float | None = None,
        rng: np.random.Generator | None = None,
    ):
        """The mechanism whose ``compositions``-fold use is ε-DP (:func:`laplace_scale_for`)."""
        return cls(laplace_scale_for(epsilon, sensitivity, compositions, sampling_rate), sensitivity, rng)

    @property
    def noise_std(self) -> float:
        return math.sqrt(2.0) * self.scale

    @property
    def noise_multiplier(self) -> float:
        return self.scale / self.sensitivity

    def noise(self, shape: int | tuple[int, ...]) -> np.ndarray:
        if self.scale == 0.0:
            return np.zeros(shape)
        return self.rng.laplace(0.0, self.scale, size=shape)

    def add(self, array: np.ndarray) -> np.ndarray:
        values = np.asarray(array, dtype=np.float64)
        return values + self.noise(values.shape)

    def event(self) -> dp_accounting.DpEvent:
        """One use as a ``LaplaceDpEvent(noise_multiplier=b/Δ)``."""
        return dp_accounting.LaplaceDpEvent(noise_multiplier=self.noise_multiplier)

    def __repr__(self) -> str:
        return f"LaplaceMechanism(scale={self.scale:.6g}, sensitivity={self.sensitivity:.6g})"


Mechanism = GaussianMechanism | LaplaceMechanism


# ----------------------------------------------------------------------------------------
# Events as plain data
# ----------------------------------------------------------------------------------------

def event_to_dict(event: dp_accounting.DpEvent) -> dict[str, Any]:
    """A JSON-friendly description of a ``DpEvent`` (``{"type": class name, fields...}``)."""
    if isinstance(event, dp_accounting.GaussianDpEvent):
        return {"type": "GaussianDpEvent", "noise_multiplier": float(event.noise_multiplier)}
    if isinstance(event, dp_accounting.LaplaceDpEvent):
        return {"type": "LaplaceDpEvent", "noise_multiplier": float(event.noise_multiplier)}
    if isinstance(event, dp_accounting.PoissonSampledDpEvent):
        return {
            "type": "PoissonSampledDpEvent",
            "sampling_probability": float(event.sampling_probability),
            "event": event_to_dict(event.event),
        }
    if isinstance(event, dp_accounting.SelfComposedDpEvent):
        return {"type": "SelfComposedDpEvent", "count": int(event.count), "event": event_to_dict(event.event)}
    if isinstance(event, dp_accounting.ComposedDpEvent):
        return {"type": "ComposedDpEvent", "events": [event_to_dict(e) for e in event.events]}
    if isinstance(event, dp_accounting.NoOpDpEvent):
        return {"type": "NoOpDpEvent"}
    if isinstance(event, dp_accounting.NonPrivateDpEvent):
        return {"type": "NonPrivateDpEvent"}
    raise TypeError(f"cannot describe {type(event).__name__} as data")


def event_from_dict(data: Mapping[str, Any]) -> dp_accounting.DpEvent:
    """Inverse of :func:`event_to_dict`."""
    kind = data["type"]
    if kind == "GaussianDpEvent":
        return dp_accounting.GaussianDpEvent(float(data["noise_multiplier"]))
    if kind == "LaplaceDpEvent":
        return dp_accounting.LaplaceDpEvent(float(data["noise_multiplier"]))
    if kind == "PoissonSampledDpEvent":
        return dp_accounting.PoissonSampledDpEvent(float(data["sampling_probability"]), event_from_dict(data["event"]))
    if kind == "SelfComposedDpEvent":
        return dp_accounting.SelfComposedDpEvent(event_from_dict(data["event"]), int(data["count"]))
    if kind == "ComposedDpEvent":
        return dp_accounting.ComposedDpEvent([event_from_dict(e) for e in data["events"]])
    if kind == "NoOpDpEvent":
        return dp_accounting.NoOpDpEvent()
    if kind == "NonPrivateDpEvent":
        return dp_accounting.NonPrivateDpEvent()
    raise ValueError(f"unknown event type {kind!r}")


# ----------------------------------------------------------------------------------------
# Accounting
# ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class LedgerStep:
    """One recorded private step. ``event`` is the full accounted event (sampling and
    repetition included); ``base_event`` is one unsampled use of the mechanism."""

    name: str
    mechanism: str
    sensitivity: float
    noise_std: float
    base_event: dp_accounting.DpEvent
    event: dp_accounting.DpEvent
    compositions: int = 1
    sampling_rate: float | None = None
    delta: float | None = None

    @property
    def noise_multiplier(self) -> float | None:
        return getattr(self.base_event, "noise_multiplier", None)


class PrivacyLedger:
    """Every private step of a run, as ``dp_accounting`` events, and their composition.

    Parameters
    ----------
    level : str
        ``"data_point"`` or ``"client"``: what "neighbouring" means for the whole ledger.
    value_discretization_interval : float
        PLD discretization for reports (see the module docstring; default 1e-4).

    Examples
    --------
    >>> ledger = PrivacyLedger("data_point")
    >>> mech = GaussianMechanism(sigma=4.2247, sensitivity=1.0)
    >>> _ = ledger.record_mechanism("step1", mech)
    >>> round(ledger.epsilon(1e-6), 2)
    1.0
    """

    def __init__(self, level: str = DATA_POINT, value_discretization_interval: float = REPORT_DISCRETIZATION):
        self.level = normalize_level(level)
        if not value_discretization_interval > 0:
            raise ValueError("value_discretization_interval must be > 0")
        self.value_discretization_interval = float(value_discretization_interval)
        self.steps: list[LedgerStep] = []

    def __len__(self) -> int:
        return len(self.steps)

    def record(
        self,
        name: str,
        mechanism_name: str,
        sensitivity: float,
        noise_std: float,
        event: dp_accounting.DpEvent,
        compositions: int = 1,
        sampling_rate: float | None = None,
        delta: float | None = None,
    ) -> dp_accounting.DpEvent:
        """Record a step and return its accounted event.

        ``event`` is ONE unsampled use of the mechanism (e.g. ``mechanism.event()``); the
        ledger wraps it in ``PoissonSampledDpEvent`` when ``sampling_rate < 1`` and in
        ``SelfComposedDpEvent`` when ``compositions > 1``. ``noise_std`` is the actual
        per-coordinate standard deviation (σ; √2·b for Laplace) and is checked against the
        event's noise multiplier so a mis-scaled record fails loudly. ``delta`` (optional)
        is the δ the step was calibrated for; per-step ε are reported at it.
        """
        sensitivity = _check_sensitivity(sensitivity)
        noise_std = float(noise_std)
        multiplier = getattr(event, "noise_multiplier", None)
        if isinstance(event, dp_accounting.GaussianDpEvent):
            expected = noise_std / sensitivity
        elif isinstance(event, dp_accounting.LaplaceDpEvent):
            expected = noise_std / (math.sqrt(2.0) * sensitivity)
        else:
            expected = multiplier
        if multiplier is not None and not math.isclose(multiplier, expected, rel_tol=1e-9, abs_tol=1e-300):
            raise ValueError(
                f"step {name!r}: event noise_multiplier {multiplier} does not match noise_std "
                f"{noise_std} and sensitivity {sensitivity} (expected {expected})"
            )
        if delta is not None:
            delta = _check_delta(delta)
        wrapped = _wrap_event(event, compositions, sampling_rate)
        self.steps.append(
            LedgerStep(
                name=str(name),
                mechanism=str(mechanism_name),
                sensitivity=sensitivity,
                noise_std=noise_std,
                base_event=event,
                event=wrapped,
                compositions=_check_compositions(compositions),
                sampling_rate=_check_sampling_rate(sampling_rate),
                delta=delta,
            )
        )
        return wrapped

    def record_mechanism(
        self,
        name: str,
        mechanism: Mechanism,
        compositions: int = 1,
        sampling_rate: float | None = None,
        delta: float | None = None,
    ) -> dp_accounting.DpEvent:
        """Record ``compositions`` (sampled) uses of ``mechanism`` under ``name``."""
        return self.record(
            name, mechanism.name, mechanism.sensitivity, mechanism.noise_std, mechanism.event(),
            compositions=compositions, sampling_rate=sampling_rate, delta=delta,
        )

    def event(self) -> dp_accounting.DpEvent:
        """All recorded steps as one ``ComposedDpEvent``."""
        return dp_accounting.ComposedDpEvent([step.event for step in self.steps])

    def epsilon(self, delta: float) -> float:
        """Total ε at ``delta`` of all recorded steps (PLD composition; 0 if empty)."""
        delta = _check_delta(delta)
        if not self.steps:
            return 0.0
        return pld_epsilon(self.event(), delta, self.value_discretization_interval)

    def _step_deltas(self, delta_per_step: float | Sequence[float] | None, default: float | None) -> list[float]:
        if delta_per_step is None:
            deltas = [step.delta if step.delta is not None else default for step in self.steps]
            if any(d is None for d in deltas):
                raise ValueError("some steps were recorded without a delta; pass delta_per_step")
            return [float(d) for d in deltas]
        if np.ndim(delta_per_step) == 0:
            return [float(delta_per_step)] * len(self.steps)
        deltas = [float(d) for d in delta_per_step]
        if len(deltas) != len(self.steps):
            raise ValueError(f"got {len(deltas)} deltas for {len(self.steps)} steps")
        return deltas

    def step_epsilons(self, delta_per_step: float | Sequence[float] | None = None) -> list[float]:
        """ε of every step on its own (PLD) at its δ: one float for all, one per step, or
        ``None`` for the δ each step was recorded with."""
        deltas = self._step_deltas(delta_per_step, None)
        return [
            pld_epsilon(step.event, _check_delta(d), self.value_discretization_interval)
            for step, d in zip(self.steps, deltas)
        ]

    def to_dict(self, delta: float) -> dict[str, Any]:
        """Everything needed to recompute the accounting, JSON-friendly.

        Steps recorded with their calibration δ report ε at that δ; others at ``delta``.
        ``epsilon`` is the PLD total at ``delta`` (``inf`` if a step adds no noise).
        """
        delta = _check_delta(delta)
        deltas = self._step_deltas(None, delta)
        epsilons = self.step_epsilons(deltas)
        steps = []
        for step, step_delta, step_epsilon in zip(self.steps, deltas, epsilons):
            steps.append({
                "name": step.name,
                "mechanism": step.mechanism,
                "sensitivity": step.sensitivity,
                "noise_std": step.noise_std,
                "noise_multiplier": step.noise_multiplier,
                "epsilon": step_epsilon,
                "delta": step_delta,
                "compositions": step.compositions,
                "sampling_rate": step.sampling_rate,
                "event": event_to_dict(step.event),
            })
        return {
            "level": self.level,
            "delta": delta,
            "epsilon": self.epsilon(delta),
            "accountant": "dp_accounting PLDAccountant (add-or-remove-one, pessimistic)",
            "value_discretization_interval": self.value_discretization_interval,
            "steps": steps,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "PrivacyLedger":
        """Rebuild a ledger from :meth:`to_dict` output (to recompute its accounting)."""
        ledger = cls(data["level"], data.get("value_discretization_interval", REPORT_DISCRETIZATION))
        for step in data["steps"]:
            full = event_from_dict(step["event"])
            base = full
            while isinstance(base, (dp_accounting.SelfComposedDpEvent, dp_accounting.PoissonSampledDpEvent)):
                base = base.event
            ledger.steps.append(LedgerStep(
                name=step["name"], mechanism=step["mechanism"], sensitivity=float(step["sensitivity"]),
                noise_std=float(step["noise_std"]), base_event=base, event=full,
                compositions=int(step["compositions"]), sampling_rate=step["sampling_rate"],
                delta=step["delta"],
            ))
        return ledger


# ----------------------------------------------------------------------------------------
# Budget: splitting and calibrating to a total
# ----------------------------------------------------------------------------------------

# App. H.1, rule of thumb (fractions of ε_init = ε1 + ε2 + ε3G + ε3L).
_RULE_OF_THUMB = {
    DATA_POINT: (0.20, 0.20, 0.45, 0.15),
    CLIENT: (0.35, 0.10, 0.45, 0.10),
}


@dataclass(frozen=True)
class BudgetSplit:
    """Per-step ε of FedDP-KMeans (the paper's ε1, ε2, ε3G, ε3L, and ε4G/ε4L for Lloyd).

    ``lloyd_gaussian`` / ``lloyd_laplace`` are the budgets of ALL FedDP-Lloyds rounds
    together (T-fold composition), not per round.
    """

    level: str
    step1: float
    step2: float
    step3_gaussian: float
    step3_laplace: float
    lloyd_gaussian: float = 0.0
    lloyd_laplace: float = 0.0

    def as_dict(self) -> dict[str, float]:
        return {
            "step1": self.step1, "step2": self.step2,
            "step3_gaussian": self.step3_gaussian, "step3_laplace": self.step3_laplace,
            "lloyd_gaussian": self.lloyd_gaussian, "lloyd_laplace": self.lloyd_laplace,
        }

    @property
    def total(self) -> float:
        """Sum of the shares (basic composition; the PLD total is lower)."""
        return sum(self.as_dict().values())


def split_budget(total_epsilon: float, level: str, lloyd_fraction: float = 0.0) -> BudgetSplit:
    """Split ``total_epsilon`` over the steps by the paper's rule of thumb (App. H.1).

    Data-point level: [ε1, ε2, ε3G, ε3L] = [0.20, 0.20, 0.45, 0.15] · ε_init;
    client level: [0.35, 0.10, 0.45, 0.10] · ε_init.

    Choices (the paper is silent or only indicative; documented here):

    - **Lloyd rounds.** In H.1 the fractions are of ε_init = ε1 + ε2 + ε3G + ε3L only;
      FedDP-Lloyds has its own separate budget, and Tables 4-5 show 0 rounds is optimal in
      80-100 % of the Pareto-optimal runs. So by default Lloyd takes no share
      (``lloyd_fraction=0``). With ``lloyd_fraction = f > 0``, ε_init = (1 − f)·total and
      the Lloyd rounds get f·total, divided between sums (Gaussian) and counts (Laplace)
      in the same ratio as step 3 (3:1 data-point, 4.5:1 client).
    - **δ.** The paper treats δ as fixed for all steps: every Gaussian step is calibrated
      at the full target δ, and the honest total is then the PLD composition of all steps
      at that δ (reported by :class:`PrivacyLedger`). δ is therefore NOT split. The shares
      sum to ``total_epsilon`` (basic composition), so the PLD total usually comes out a
      little below it -- use :func:`calibrate_to_total` to hit the target exactly.
    """
    total_epsilon = _check_epsilon(total_epsilon)
    level = normalize_level(level)
    lloyd_fraction = float(lloyd_fraction)
    if not 0.0 <= lloyd_fraction < 1.0:
        raise ValueError(f"lloyd_fraction must be in [0, 1), got {lloyd_fraction}")
    w1, w2, w3g, w3l = _RULE_OF_THUMB[level]
    init = (1.0 - lloyd_fraction) * total_epsilon
    lloyd = lloyd_fraction * total_epsilon
    return BudgetSplit(
        level=level,
        step1=w1 * init,
        step2=w2 * init,
        step3_gaussian=w3g * init,
        step3_laplace=w3l * init,
        lloyd_gaussian=lloyd * w3g / (w3g + w3l),
        lloyd_laplace=lloyd * w3l / (w3g + w3l),
    )


_GAUSSIAN_KINDS = ("gaussian", "symmetric_gaussian")
_MECHANISM_KINDS = _GAUSSIAN_KINDS + ("laplace",)


@dataclass(frozen=True)
class StepSpec:
    """One step to calibrate: its mechanism, relative ε weight, sensitivity, repetition.

    ``mechanism`` is ``"gaussian"``, ``"symmetric_gaussian"`` or ``"laplace"``;
    ``weight`` is the step's relative share of ε (e.g. a :class:`BudgetSplit` field);
    ``compositions`` is how many times it runs (Lloyd rounds), ``sampling_rate`` the
    Poisson client-sampling rate (``None`` = everyone).
    """

    name: str
    mechanism: str
    weight: float
    sensitivity: float = 1.0
    compositions: int = 1
    sampling_rate: float | None = None

    def __post_init__(self):
        if self.mechanism not in _MECHANISM_KINDS:
            raise ValueError(f"step {self.name!r}: mechanism must be one of {_MECHANISM_KINDS}, got {self.mechanism!r}")
        if not (float(self.weight) > 0 and math.isfinite(float(self.weight))):
            raise ValueError(f"step {self.name!r}: weight must be > 0 (leave a step with no budget out)")
        _check_sensitivity(self.sensitivity)
        _check_compositions(self.compositions)
        _check_sampling_rate(self.sampling_rate)


@dataclass(frozen=True)
class CalibratedStep:
    """A step with its noise found: ``noise_scale`` is σ (Gaussian) or b (Laplace)."""

    name: str
    mechanism: str
    sensitivity: float
    noise_scale: float
    epsilon_share: float
    delta: float | None
    compositions: int = 1
    sampling_rate: float | None = None

    @property
    def noise_multiplier(self) -> float:
        return self.noise_scale / self.sensitivity

    @property
    def noise_std(self) -> float:
        return self.noise_scale * (math.sqrt(2.0) if self.mechanism == "laplace" else 1.0)

    def base_event(self) -> dp_accounting.DpEvent:
        if self.mechanism == "laplace":
            return dp_accounting.LaplaceDpEvent(self.noise_multiplier)
        return dp_accounting.GaussianDpEvent(self.noise_multiplier)

    def event(self) -> dp_accounting.DpEvent:
        """The accounted event: sampled and repeated as specified."""
        return _wrap_event(self.base_event(), self.compositions, self.sampling_rate)

    def mechanism_instance(self, rng: np.random.Generator | None = None) -> Mechanism:
        """A mechanism with this step's noise and its own generator ``rng``."""
        if self.mechanism == "laplace":
            return LaplaceMechanism(self.noise_scale, self.sensitivity, rng)
        if self.mechanism == "symmetric_gaussian":
            return SymmetricGaussianMechanism(self.noise_scale, self.sensitivity, rng)
        return GaussianMechanism(self.noise_scale, self.sensitivity, rng)


@dataclass(frozen=True)
class Calibration:
    """Result of :func:`calibrate_to_total`; index it by step name."""

    target_epsilon: float
    delta: float
    total_epsilon: float
    scale: float
    steps: tuple[CalibratedStep, ...] = field(default_factory=tuple)

    def __getitem__(self, name: str) -> CalibratedStep:
        for step in self.steps:
            if step.name == name:
                return step
        raise KeyError(name)


def _calibrate_step(
    spec: StepSpec, epsilon: float, delta: float, guesses: dict[str, tuple[float, float]] | None = None
) -> CalibratedStep:
    """Calibrate one step on its own for ``epsilon``; ``guesses`` carries earlier sampled-
    Gaussian solutions between calls (warm start) and is updated in place."""
    sampling_rate = _check_sampling_rate(spec.sampling_rate)
    if spec.mechanism == "laplace":
        noise = laplace_scale_for(epsilon, spec.sensitivity, spec.compositions, sampling_rate)
        step_delta = None
    elif sampling_rate is None or math.isinf(epsilon):
        noise = gaussian_sigma_for(epsilon, delta, spec.sensitivity, spec.compositions, sampling_rate)
        step_delta = delta
    else:
        guesses = {} if guesses is None else guesses
        unsampled = math.sqrt(spec.compositions) * analytic_gaussian_sigma(epsilon, delta)
        guess = None
        if spec.name in guesses:  # z scales roughly like 1/ε: extrapolate from the last solve
            previous_epsilon, previous_multiplier = guesses[spec.name]
            guess = previous_multiplier * previous_epsilon / epsilon
        multiplier = _sampled_gaussian_multiplier(
            epsilon, delta, spec.compositions, sampling_rate, unsampled, guess
        )
        guesses[spec.name] = (epsilon, multiplier)
        noise = float(spec.sensitivity) * multiplier
        step_delta = delta
    return CalibratedStep(
        name=spec.name, mechanism=spec.mechanism, sensitivity=float(spec.sensitivity),
        noise_scale=noise, epsilon_share=epsilon, delta=step_delta,
        compositions=spec.compositions, sampling_rate=sampling_rate,
    )


def calibrate_to_total(
    target_epsilon: float,
    delta: float,
    step_specs: Iterable[StepSpec | Mapping[str, Any]],
    relative_tolerance: float = 1e-3,
) -> Calibration:
    """Noise for every step so that the PLD total of ALL steps is ``target_epsilon`` at δ.

    The weights fix the steps' relative budgets: for a scale s, step i is calibrated on its
    own for ε_i = s · wᵢ / Σw (Gaussian steps at δ via :func:`gaussian_sigma_for`, Laplace
    steps via :func:`laplace_scale_for`, each with its own compositions and sampling).
    The composition of all steps is accounted with PLD (discretization
    ``SEARCH_DISCRETIZATION``), and s is searched (bracketing, then Illinois false
    position on log s) until the total lies in ``[target·(1 − relative_tolerance),
    target]`` -- never above the target. s is the
    "basic composition" budget; since PLD composition is tighter, s ≥ target usually.

    Cost: with no sampled Gaussian step, 2-4 PLD compositions (0.04 s CPU for FedDP-Init's
    four steps). Each Poisson-sampled Gaussian step adds an inner PLD search per outer
    evaluation (warm-started from the previous one, 1-4 evaluations): 2.4 s CPU for six
    sampled steps. Results are cached per process (same arguments -> same
    :class:`Calibration` object).
    """
    target_epsilon = _check_epsilon(target_epsilon)
    delta = _check_delta(delta)
    specs = tuple(spec if isinstance(spec, StepSpec) else StepSpec(**spec) for spec in step_specs)
    key = (target_epsilon, delta, specs, float(relative_tolerance))
    if key not in _CALIBRATION_CACHE:
        if len(_CALIBRATION_CACHE) >= 256:
            _CALIBRATION_CACHE.clear()
        _CALIBRATION_CACHE[key] = _calibrate_to_total(target_epsilon, delta, specs, float(relative_tolerance))
    return _CALIBRATION_CACHE[key]


# Calibrations are deterministic and immutable, and a sampled one can take seconds, so
# repeated runs in one process (seeds of an experiment) reuse them.
_CALIBRATION_CACHE: dict[tuple, Calibration] = {}


def _calibrate_to_total(
    target_epsilon: float, delta: float, specs: tuple[StepSpec, ...], relative_tolerance: float
) -> Calibration:
    if not specs:
        raise ValueError("calibrate_to_total needs at least one step")
    names = [spec.name for spec in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"step names must be unique, got {names}")
    if math.isinf(target_epsilon):
        steps = tuple(_calibrate_step(spec, math.inf, delta) for spec in specs)
        return Calibration(target_epsilon, delta, math.inf, math.inf, steps)
    weight_sum = sum(float(spec.weight) for spec in specs)

    cache: dict[float, tuple[float, tuple[CalibratedStep, ...]]] = {}
    guesses: dict[str, tuple[float, float]] = {}

    def evaluate(scale: float) -> tuple[float, tuple[CalibratedStep, ...]]:
        if scale not in cache:
            steps = tuple(
                _calibrate_step(spec, scale * float(spec.weight) / weight_sum, delta, guesses) for spec in specs
            )
            event = dp_accounting.ComposedDpEvent([step.event() for step in steps])
            cache[scale] = (pld_epsilon(event, delta, SEARCH_DISCRETIZATION), steps)
        return cache[scale]

    log_scale, _ = _solve_in_band(
        lambda u: evaluate(math.exp(u))[0],
        math.log(target_epsilon),
        target_epsilon * (1.0 - relative_tolerance),
        target_epsilon,
    )
    scale = math.exp(log_scale)
    total, steps = evaluate(scale)
    return Calibration(target_epsilon, delta, total, scale, steps)
