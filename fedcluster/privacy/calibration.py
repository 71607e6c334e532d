"""Calibration: the noise of a mechanism, or of several steps together, for a target ε.

- :func:`analytic_gaussian_sigma` -- the analytic Gaussian mechanism (Balle & Wang 2018,
  Thm. 8): the smallest σ, never below it. dp_accounting's ``get_sigma_gaussian`` solves
  the same equation with Brent's method, which can land ~1e-12 below the exact σ (δ then
  exceeded by a rounding hair); the tests check both agree.
- :func:`gaussian_sigma_for`, :func:`laplace_scale_for` -- one step, possibly repeated
  and/or Poisson-sampled.
- :func:`calibrate_to_total` -- every step of a run, so that the PLD composition of all of
  them meets a target ε at δ (what FedDP-KMeans' ``epsilon`` means, docs/ALGORITHMS.md §3).

Searches use a band, not a root: they stop as soon as the accounted ε lands in
``[target·(1 − tol), target]`` and are warm-started, so they take fewer PLD evaluations
than dp_accounting's ``calibrate_dp_mechanism`` (Brent to a parameter tolerance), which
the tests use as the oracle.

With Poisson sampling the cost is building PLDs of sampled Gaussians (point by point in
Python, on the accounting grid). :func:`calibrate_to_total` therefore searches a 10x
coarser grid first (cheap, nearly the same ε), remembers every evaluation of every ε(z)
curve to start later solves from, and keeps the PLDs it built to compose them again
(:func:`~.ledger.event_plds`): the search on the accounting grid then takes about one PLD
per step. The answer is accounted as before: every step and the total on the accounting
grid, in their bands, with the accountant's own numbers (bit for bit); the pilot only
chooses where to look (bench/dp_calibration.py times both searches).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

import numpy as np
from scipy import special

import dp_accounting

from ._checks import check_compositions, check_delta, check_epsilon, check_sampling_rate, check_sensitivity
from .ledger import SEARCH_DISCRETIZATION, composed_pld_epsilon, event_plds, pld_epsilon, wrap_event
from .mechanisms import MECHANISMS, NoiseMechanism

__all__ = [
    "analytic_gaussian_sigma",
    "gaussian_sigma_for",
    "laplace_scale_for",
    "StepSpec",
    "CalibratedStep",
    "Calibration",
    "calibrate_step",
    "calibrate_to_total",
]


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
    sensitivity = check_sensitivity(sensitivity)
    delta = check_delta(delta)
    epsilon = check_epsilon(epsilon)
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


def _use(epsilon: float, sensitivity: float, compositions: int, sampling_rate: float | None) -> tuple:
    """A mechanism's repeated use, checked: (ε, sensitivity, compositions, sampling rate)."""
    return (
        check_epsilon(epsilon),
        check_sensitivity(sensitivity),
        check_compositions(compositions),
        check_sampling_rate(sampling_rate),
    )


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
    delta = check_delta(delta)
    epsilon, sensitivity, compositions, sampling_rate = _use(epsilon, sensitivity, compositions, sampling_rate)
    if math.isinf(epsilon):
        return 0.0
    unsampled = math.sqrt(compositions) * analytic_gaussian_sigma(epsilon, delta)
    if sampling_rate is None:
        return sensitivity * unsampled
    return sensitivity * _sampled_gaussian_multiplier(epsilon, delta, compositions, sampling_rate, unsampled)


# Searches stop once the accounted ε lands in [target·(1 − tolerance), target]: never
# above (the guarantee), and close enough below that no budget worth having is wasted.
_INNER_TOLERANCE = 1e-4


def _solve_in_band(f, start: float, low: float, high: float, max_evaluations: int = 60, slope: float = 1.0):
    """Find u with ``low <= f(u) <= high`` for a positive increasing function ``f``.

    Both uses here (total ε against log scale, ε against −log noise multiplier) are close
    to ``f ∝ exp(u)``, so the search works on ``log f``: secant steps from ``start`` (the
    first with ``slope``, d log f / du: 1 unless earlier evaluations tell better) until
    the band is bracketed, then the Illinois variant of false position. It aims at the
    middle of the band and stops as soon as an evaluation lands inside it -- PLD
    evaluations are the cost, so a band beats a root; typically 1-4 evaluations. Returns
    ``(u, f(u))``; should the band not be hit within ``max_evaluations`` it returns the
    best point with ``f(u) < low`` (under the target, the constraint that matters).
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
    slope = slope if slope > 0 and math.isfinite(slope) else 1.0
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


def _segment(curve: list[tuple[float, float]], index: int, value: float) -> tuple[float, float, float]:
    """The segment of ``curve`` (points ``(u, log f)`` sorted by u) around ``value`` in
    coordinate ``index`` (0: u, 1: log f), the end ones beyond the ends: its first point
    and slope d log f / du (``nan`` if not positive)."""
    i = 1
    while i < len(curve) - 1 and curve[i][index] < value:
        i += 1
    (u0, l0), (u1, l1) = curve[i - 1], curve[i]
    slope = (l1 - l0) / (u1 - u0)
    return u0, l0, slope if slope > 0 else math.nan


def _start_from(
    points: list[tuple[float, float]], log_target: float, hints: list[tuple[float, float]] = ()
) -> tuple[float, float] | None:
    """Start and slope for :func:`_solve_in_band` from earlier evaluations ``points`` =
    ``(u, log f(u))`` of the same smooth increasing function, and ``hints``, evaluations
    of a nearby one (the same ε on a coarser PLD grid); ``None`` without either.

    The piecewise-linear curve through the hints (else through the points) is solved
    for ``log_target`` (linear beyond its ends, at most 2 past them, as the search's own
    steps); when the hints give the shape, the point nearest ``log_target`` gives the
    offset between the two functions. A single point gives a Newton step with slope 1
    (f ∝ exp(u)).
    """
    own = sorted({u: v for u, v in points if math.isfinite(v)}.items())
    model = sorted({u: v for u, v in hints if math.isfinite(v)}.items())
    shift = 0.0
    if len(model) >= 2 and own:
        u0, l0 = min(own, key=lambda point: abs(point[1] - log_target))
        base_u, base_l, slope = _segment(model, 0, u0)
        shift = l0 - (base_l + (u0 - base_u) * slope) if math.isfinite(slope) else 0.0
    elif len(own) >= 2 or not model:
        model = own
    if not model:
        return None
    if len(model) == 1:
        (u0, l0), slope = model[0], 1.0
    else:
        u0, l0, slope = _segment(model, 1, log_target - shift)
        if not math.isfinite(slope):
            u0, l0 = min(model, key=lambda point: abs(point[1] - log_target + shift))
            slope = 1.0
    u = u0 + (log_target - shift - l0) / slope
    return max(model[0][0] - 2.0, min(model[-1][0] + 2.0, u)), slope


def _first_multiplier_guess(epsilon: float, delta: float, compositions: int, sampling_rate: float) -> float:
    """A first guess of a T-fold Poisson-sampled Gaussian's noise multiplier, closed form.

    Two bounds bracket it in practice: amplification by sampling with basic composition,
    σ_AGM(log(1 + (e^(ε/T) − 1)/q), δ/(qT)), is an upper bound (exact for T = 1 on the
    FedDP-KMeans grid, up to 4x too large at T = 20), and the central-limit μ-GDP
    approximation of Dong, Roth & Su (2019), μ = q·√(T·(exp(1/z²) − 1)) with
    μ = 1/σ_AGM(ε, δ), is too small by up to 2x for small q·√T. The guess interpolates
    geometrically, weight 1/√T on the first: within ~40% of the answer; only a start.
    """
    amplified = analytic_gaussian_sigma(
        math.log1p(math.expm1(epsilon / compositions) / sampling_rate), min(0.5, delta / (sampling_rate * compositions))
    )  # a start only: δ/(qT) at or above 1 (a tiny q) bounds nothing, and the Gaussian needs δ < 1
    mu = 1.0 / analytic_gaussian_sigma(epsilon, delta)
    central = 1.0 / math.sqrt(math.log1p(mu * mu / (sampling_rate * sampling_rate * compositions)))
    weight = 1.0 / math.sqrt(compositions)
    return amplified**weight * central ** (1.0 - weight)


def _gaussian_composition_scale(target_epsilon: float, delta: float, specs: tuple[StepSpec, ...]) -> float:
    """A first guess of the scale s of :func:`calibrate_to_total`, closed form: every step
    treated as a Gaussian mechanism calibrated to its share (μᵢ = 1/σ_AGM(s·wᵢ/Σw, δ)),
    and Gaussians compose exactly (μ² = Σ μᵢ²). Exact for unsampled Gaussian steps; with
    sampling and Laplace steps within a factor ~1.5 of the answer (start = target is up
    to 3x off), which saves the pilot search an outer evaluation. Bisection in log s to
    0.1%.
    """
    weight_sum = sum(float(spec.weight) for spec in specs)
    goal = analytic_gaussian_sigma(target_epsilon, delta) ** -2

    def precision(scale: float) -> float:  # Σ μᵢ², increasing in s
        return sum(analytic_gaussian_sigma(scale * float(spec.weight) / weight_sum, delta) ** -2 for spec in specs)

    low, high = target_epsilon, target_epsilon
    while precision(high) < goal:
        high *= 2.0
    while precision(low) > goal:
        low /= 2.0
    while high / low > 1.001:
        middle = math.sqrt(low * high)
        low, high = (middle, high) if precision(middle) < goal else (low, middle)
    return math.sqrt(low * high)


def _sampled_gaussian_multiplier(
    epsilon: float,
    delta: float,
    compositions: int,
    sampling_rate: float,
    upper_bound: float,
    guess: float | None = None,
    discretization: float = SEARCH_DISCRETIZATION,
    points: list[tuple[float, float]] | None = None,
    hints: list[tuple[float, float]] = (),
    plds: dict | None = None,
    sensitivity: float = 1.0,
) -> float:
    """Noise multiplier z of a T-fold Poisson-sampled Gaussian whose PLD ε at δ (grid
    ``discretization``) is in ``[epsilon·(1 − 1e-4), epsilon]``.

    ``upper_bound`` is a z known to suffice (the unsampled answer) and the default start;
    ``guess`` (a nearby earlier solution) saves most evaluations when called repeatedly.
    ``points``, if given, collects every evaluation ``(u, log ε)`` and, with ``hints``
    (the same curve on another grid), gives the start (:func:`_start_from`): repeated
    solves along one curve then take about one evaluation each. ``plds`` (see :func:`_accounted`) keeps the PLDs built;
    the event accounted is then the one a step of ``sensitivity`` with noise
    ``sensitivity·z`` describes (z = that noise / ``sensitivity``, to the last bit), so
    that the total reuses its PLD. The search variable is u = −log z, so ε is increasing
    in u.
    """

    def accounted(u: float) -> float:
        multiplier = sensitivity * math.exp(-u) / sensitivity
        event = wrap_event(dp_accounting.GaussianDpEvent(multiplier), compositions, sampling_rate)
        value = _accounted([event], delta, discretization, plds)
        if points is not None:
            points.append((u, math.log(value) if value > 0 else -math.inf))
        return value

    start, slope = -math.log(guess if guess is not None and guess > 0 else upper_bound), 1.0
    if points is not None:
        log_aim = math.log(epsilon) + 0.5 * math.log1p(-_INNER_TOLERANCE)  # the band's middle
        start, slope = _start_from(points, log_aim, hints) or (start, slope)
    u, _ = _solve_in_band(accounted, start, epsilon * (1.0 - _INNER_TOLERANCE), epsilon, slope=slope)
    return math.exp(-u)


def _accounted(events, delta: float, discretization: float, plds: dict | None = None) -> float:
    """``pld_epsilon`` of the composition of ``events`` -- the same number, bit for bit --
    keeping each event's PLDs in ``plds`` (keyed by event and grid) when given, so that an
    event accounted before (a step's solution, now in the total) is not built again."""
    if plds is None:
        return pld_epsilon(dp_accounting.ComposedDpEvent(list(events)), delta, discretization)
    built = []
    for event in events:
        key = (event, discretization)
        if key not in plds:
            plds[key] = event_plds(event, discretization)
        built.extend(plds[key])
    return composed_pld_epsilon(built, delta, discretization)


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
    epsilon, sensitivity, compositions, sampling_rate = _use(epsilon, sensitivity, compositions, sampling_rate)
    if math.isinf(epsilon):
        return 0.0
    per_round = epsilon / compositions
    if sampling_rate is not None:
        per_round = math.log1p(math.expm1(per_round) / sampling_rate)
    return sensitivity / per_round


@dataclass(frozen=True)
class StepSpec:
    """One step to calibrate: its mechanism, relative ε weight, sensitivity, repetition.

    ``mechanism`` is a key of :data:`~fedcluster.privacy.mechanisms.MECHANISMS`
    (``"gaussian"``, ``"symmetric_gaussian"``, ``"laplace"``); ``weight`` is the step's
    relative share of ε;
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
        if self.mechanism not in MECHANISMS:
            raise ValueError(
                f"step {self.name!r}: mechanism must be one of {tuple(MECHANISMS)}, got {self.mechanism!r}"
            )
        if not (float(self.weight) > 0 and math.isfinite(float(self.weight))):
            raise ValueError(f"step {self.name!r}: weight must be > 0 (leave a step with no budget out)")
        check_sensitivity(self.sensitivity)
        check_compositions(self.compositions)
        check_sampling_rate(self.sampling_rate)


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

    def event(self) -> dp_accounting.DpEvent:
        """The accounted event: one use of the mechanism, sampled and repeated as specified."""
        base = MECHANISMS[self.mechanism].event_class(noise_multiplier=self.noise_multiplier)
        return wrap_event(base, self.compositions, self.sampling_rate)

    def mechanism_instance(self, rng: np.random.Generator | None = None) -> NoiseMechanism:
        """A mechanism with this step's noise and its own generator ``rng``."""
        return MECHANISMS[self.mechanism](self.noise_scale, self.sensitivity, rng)


@dataclass(frozen=True)
class Calibration:
    """Result of :func:`calibrate_to_total`."""

    target_epsilon: float
    delta: float
    total_epsilon: float
    scale: float
    steps: tuple[CalibratedStep, ...] = field(default_factory=tuple)


def calibrate_step(
    spec: StepSpec, epsilon: float, delta: float, guesses: dict[str, tuple[float, float]] | None = None
) -> CalibratedStep:
    """Calibrate one step on its own for ``epsilon`` (its T-fold, sampled use): Gaussian
    steps at ``delta``, Laplace steps pure. ``guesses`` carries earlier sampled-Gaussian
    solutions between calls (warm start) and is updated in place."""
    sampling_rate = check_sampling_rate(spec.sampling_rate)
    if spec.mechanism != "laplace" and sampling_rate is not None and not math.isinf(epsilon):
        guesses = {} if guesses is None else guesses
        unsampled = math.sqrt(spec.compositions) * analytic_gaussian_sigma(epsilon, delta)
        guess = None
        if spec.name in guesses:  # z scales roughly like 1/ε: extrapolate from the last solve
            previous_epsilon, previous_multiplier = guesses[spec.name]
            guess = previous_multiplier * previous_epsilon / epsilon
        multiplier = _sampled_gaussian_multiplier(epsilon, delta, spec.compositions, sampling_rate, unsampled, guess)
        guesses[spec.name] = (epsilon, multiplier)
        return _calibrated(spec, epsilon, delta, float(spec.sensitivity) * multiplier)
    return _calibrated(spec, epsilon, delta)


def _calibrated(spec: StepSpec, epsilon: float, delta: float, noise: float | None = None) -> CalibratedStep:
    """``spec`` calibrated for ``epsilon``: with ``noise`` given (a searched sampled
    Gaussian), that; otherwise the closed forms (Laplace pure, unsampled Gaussian at δ)."""
    sampling_rate = check_sampling_rate(spec.sampling_rate)
    if noise is None and spec.mechanism == "laplace":
        noise = laplace_scale_for(epsilon, spec.sensitivity, spec.compositions, sampling_rate)
    elif noise is None:
        noise = gaussian_sigma_for(epsilon, delta, spec.sensitivity, spec.compositions, sampling_rate)
    return CalibratedStep(
        name=spec.name,
        mechanism=spec.mechanism,
        sensitivity=float(spec.sensitivity),
        noise_scale=noise,
        epsilon_share=epsilon,
        delta=None if spec.mechanism == "laplace" else delta,
        compositions=spec.compositions,
        sampling_rate=sampling_rate,
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

    Cost: a few PLD compositions; each Poisson-sampled Gaussian step adds an inner PLD
    search per outer evaluation. Those dominate (a sampled Gaussian's PLD is built point
    by point in Python), so with sampling the whole search first runs on a 10x coarser
    grid (``_PILOT_DISCRETIZATION``, cheaper PLDs, nearly the same ε) and the
    search on ``SEARCH_DISCRETIZATION`` then starts from its answer and slopes: the
    result -- every step in its inner band and the total in the band, all accounted on
    ``SEARCH_DISCRETIZATION`` -- is as before, in a handful of fine evaluations. Results
    are cached per process (same arguments -> same :class:`Calibration` object).
    """
    target_epsilon = check_epsilon(target_epsilon)
    delta = check_delta(delta)
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

# The pilot search (sampled Gaussian steps only) runs on min(1e-2, ε/100): 10x
# SEARCH_DISCRETIZATION builds a sampled Gaussian's PLD from fewer points, so faster
# (bench/dp_calibration.py times the search), and its ε differs by ~1e-4 (relative) for
# ε ≳ 0.5, so its answer is nearly the fine one; for small ε the coarse grid's pessimism
# would dominate (and fine PLDs are cheap there), so no pilot. Its results are only
# starting points, so its band (centred on the final band's middle, above the target
# allowed) is _PILOT_BAND times wider: one outer step fewer.
_PILOT_DISCRETIZATION = 1e-2
_PILOT_RELATIVE_DISCRETIZATION = 1e-2
_PILOT_BAND = 3.0


def _calibrate_to_total(
    target_epsilon: float,
    delta: float,
    specs: tuple[StepSpec, ...],
    relative_tolerance: float,
) -> Calibration:
    """:func:`calibrate_to_total` without the cache."""
    if not specs:
        raise ValueError("calibrate_to_total needs at least one step")
    names = [spec.name for spec in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"step names must be unique, got {names}")
    if math.isinf(target_epsilon):
        steps = tuple(calibrate_step(spec, math.inf, delta) for spec in specs)
        return Calibration(target_epsilon, delta, math.inf, math.inf, steps)
    band = (target_epsilon * (1.0 - relative_tolerance), target_epsilon)
    searched = [spec for spec in specs if spec.mechanism != "laplace" and spec.sampling_rate is not None]
    if not searched:  # no sampled step: one search on the accounting grid
        guesses: dict[str, tuple[float, float]] = {}
        return _search_scale(
            target_epsilon,
            delta,
            specs,
            band,
            SEARCH_DISCRETIZATION,
            lambda spec, epsilon: calibrate_step(spec, epsilon, delta, guesses),
        )[0]
    # The search on a coarser grid first, then on the accounting grid from its answer:
    # the pilot's evaluations (u, log ε) per curve are the hints, its (log s, log total)
    # the start. Its grid must stay well under ε, where discretization dominates.
    plds: dict = {}
    hints: dict = {}
    aim = 0.5 * (math.log(band[0]) + math.log(band[1]))
    start, slope = math.log(_gaussian_composition_scale(target_epsilon, delta, specs)), 1.0
    grid = min(_PILOT_DISCRETIZATION, _PILOT_RELATIVE_DISCRETIZATION * target_epsilon)
    if grid >= 2.0 * SEARCH_DISCRETIZATION:
        width = _PILOT_BAND * relative_tolerance
        try:
            outer = _search_scale(
                target_epsilon,
                delta,
                specs,
                (math.exp(aim) * (1.0 - width), math.exp(aim) * (1.0 + width)),
                grid,
                _curve_calibrator(delta, grid, hints, {}, plds),
                plds,
                start,
            )[1]
            start, slope = _start_from(outer, aim)
        except RuntimeError:  # the pilot is only a shortcut
            hints = {}
        plds.clear()  # on the pilot grid: never composed again
    return _search_scale(
        target_epsilon,
        delta,
        specs,
        band,
        SEARCH_DISCRETIZATION,
        _curve_calibrator(delta, SEARCH_DISCRETIZATION, {}, hints, plds),
        plds,
        start,
        slope,
    )[0]


def _curve_calibrator(delta: float, discretization: float, curves: dict, hints: dict, plds: dict):
    """``(spec, ε) -> CalibratedStep`` for :func:`_search_scale` that solves sampled
    Gaussian steps on ``discretization``, recording every evaluation in ``curves`` under
    the step's (compositions, sampling rate) -- steps that share them share ε(z) -- and
    starting from them (or from ``hints``, the same curves on another grid; or from
    :func:`_first_multiplier_guess`): successive solves along one curve then take ~1
    evaluation each. The PLDs built go to ``plds``."""

    def calibrate(spec: StepSpec, epsilon: float) -> CalibratedStep:
        if spec.mechanism == "laplace" or spec.sampling_rate is None or math.isinf(epsilon):
            return _calibrated(spec, epsilon, delta)
        curve = (spec.compositions, float(spec.sampling_rate))
        unsampled = math.sqrt(spec.compositions) * analytic_gaussian_sigma(epsilon, delta)
        guess = min(unsampled, _first_multiplier_guess(epsilon, delta, spec.compositions, spec.sampling_rate))
        multiplier = _sampled_gaussian_multiplier(
            epsilon,
            delta,
            spec.compositions,
            spec.sampling_rate,
            unsampled,
            guess,
            discretization,
            curves.setdefault(curve, []),
            hints.get(curve, ()),
            plds,
            float(spec.sensitivity),
        )
        return _calibrated(spec, epsilon, delta, float(spec.sensitivity) * multiplier)

    return calibrate


def _search_scale(
    target_epsilon: float,
    delta: float,
    specs: tuple[StepSpec, ...],
    band: tuple[float, float],
    discretization: float,
    calibrate,
    plds: dict | None = None,
    start: float | None = None,
    slope: float = 1.0,
) -> tuple[Calibration, list[tuple[float, float]]]:
    """Search the scale s (over u = log s, from ``start``, default log target, with
    ``slope`` = d log total / d log s to begin with) until the PLD total on
    ``discretization`` of the steps ``calibrate(spec, s·wᵢ/Σw)`` is in ``band``; ``plds``
    as in :func:`_accounted`. Returns the calibration and every evaluation
    ``(log s, log total)``."""
    weight_sum = sum(float(spec.weight) for spec in specs)
    cache: dict[float, tuple[float, tuple[CalibratedStep, ...]]] = {}
    points: list[tuple[float, float]] = []

    def evaluate(scale: float) -> tuple[float, tuple[CalibratedStep, ...]]:
        if scale not in cache:
            steps = tuple(calibrate(spec, scale * float(spec.weight) / weight_sum) for spec in specs)
            total = _accounted([step.event() for step in steps], delta, discretization, plds)
            cache[scale] = (total, steps)
            points.append((math.log(scale), math.log(total) if total > 0 else -math.inf))
        return cache[scale]

    first = math.log(target_epsilon) if start is None else start
    log_scale, _ = _solve_in_band(lambda u: evaluate(math.exp(u))[0], first, *band, slope=slope)
    scale = math.exp(log_scale)
    total, steps = evaluate(scale)
    return Calibration(target_epsilon, delta, total, scale, steps), points
