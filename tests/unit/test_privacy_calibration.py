"""Calibration with Poisson sampling (fedcluster.privacy.calibration.calibrate_to_total).

The search runs a pilot on a coarser PLD grid and keeps the PLDs it built; whatever it
does on the way, the result must be certified by the PLD accountant on the search grid:
total in [target·(1 − tol), target], never above, every sampled Gaussian step in its own
band, and the same answer as the previous algorithm and as dp_accounting's
calibrate_dp_mechanism (the oracle). No timings here: see bench/dp_calibration.py.
"""

from __future__ import annotations

import math

import pytest

dp_accounting = pytest.importorskip("dp_accounting")
from dp_accounting.pld import pld_privacy_accountant  # noqa: E402

from fedcluster.privacy import (  # noqa: E402
    SEARCH_DISCRETIZATION,
    PrivacyLedger,
    StepSpec,
    calibrate_to_total,
    pld_epsilon,
    wrap_event,
)
from fedcluster.privacy import calibration  # noqa: E402
from fedcluster.privacy.ledger import composed_pld_epsilon, event_plds  # noqa: E402


def calibrated_without_pilot(target_epsilon: float, delta: float, specs: tuple, relative_tolerance: float):
    """The search before the pilot (one search on the accounting grid, every step
    warm-started through ``calibrate_step``'s guesses): the baseline it is compared with."""
    guesses: dict = {}
    band = (target_epsilon * (1.0 - relative_tolerance), target_epsilon)
    return calibration._search_scale(
        target_epsilon,
        delta,
        specs,
        band,
        SEARCH_DISCRETIZATION,
        lambda spec, epsilon: calibration.calibrate_step(spec, epsilon, delta, guesses),
    )[0]


DELTA = 1e-6
TOLERANCE = 1e-3


def sampled_specs(q: float, rounds: int) -> list[StepSpec]:
    """A FedDP-KMeans-like run: Gaussian and Laplace once, then both for ``rounds`` rounds."""
    return [
        StepSpec("outer", "symmetric_gaussian", 0.25, sensitivity=9.0, sampling_rate=q),
        StepSpec("histogram", "laplace", 0.1, sampling_rate=q),
        StepSpec("means", "gaussian", 0.3, sensitivity=3.0, sampling_rate=q),
        StepSpec("sums", "gaussian", 0.25, sensitivity=3.0, compositions=rounds, sampling_rate=q),
        StepSpec("counts", "laplace", 0.1, compositions=rounds, sampling_rate=q),
    ]


@pytest.mark.parametrize("interval", [SEARCH_DISCRETIZATION, 1e-2])
def test_event_plds_compose_to_the_accountants_epsilon_bit_for_bit(interval):
    events = [
        wrap_event(dp_accounting.GaussianDpEvent(1.3), 1, 0.1),
        wrap_event(dp_accounting.LaplaceDpEvent(4.0), 3, 0.1),
        wrap_event(dp_accounting.GaussianDpEvent(0.9), 5, 0.2),
        wrap_event(dp_accounting.LaplaceDpEvent(7.0), 2),
        wrap_event(dp_accounting.GaussianDpEvent(3.0), 4),
        dp_accounting.PoissonSampledDpEvent(0.0, dp_accounting.GaussianDpEvent(1.0)),
        dp_accounting.SelfComposedDpEvent(
            dp_accounting.ComposedDpEvent(
                [wrap_event(dp_accounting.GaussianDpEvent(2.0), 2, 0.3), dp_accounting.LaplaceDpEvent(3.0)]
            ),
            2,
        ),
    ]
    for event in events:
        assert composed_pld_epsilon(event_plds(event, interval), DELTA, interval) == pld_epsilon(event, DELTA, interval)
    plds = [pld for event in events for pld in event_plds(event, interval)]
    total = pld_epsilon(dp_accounting.ComposedDpEvent(events), DELTA, interval)
    assert composed_pld_epsilon(plds, DELTA, interval) == total
    with pytest.raises(ValueError, match="no PLD"):
        event_plds(dp_accounting.GaussianDpEvent(0.0), interval)


@pytest.mark.parametrize("q", [0.05, 0.5])
@pytest.mark.parametrize("rounds", [1, 4])
@pytest.mark.parametrize("target", [0.3, 3.0, 10.0])
def test_sampled_calibration_lands_in_the_band_and_never_above_the_target(q, rounds, target):
    result = calibration._calibrate_to_total(target, DELTA, tuple(sampled_specs(q, rounds)), TOLERANCE)
    # The total is certified by the PLD accountant itself, on the search grid.
    accounted = pld_epsilon(
        dp_accounting.ComposedDpEvent([step.event() for step in result.steps]), DELTA, SEARCH_DISCRETIZATION
    )
    assert result.total_epsilon == accounted
    assert target * (1 - TOLERANCE) <= accounted <= target
    # Every sampled Gaussian step is calibrated on its own for its share, in its band.
    for step in result.steps:
        if step.mechanism != "laplace":
            own = pld_epsilon(step.event(), DELTA, SEARCH_DISCRETIZATION)
            assert step.epsilon_share * (1 - 1e-4) <= own <= step.epsilon_share
    shares = {step.name: step.epsilon_share for step in result.steps}
    assert shares["means"] / shares["outer"] == pytest.approx(0.3 / 0.25)


@pytest.mark.parametrize("q, rounds, target", [(0.05, 4, 3.0), (0.5, 1, 0.3)])
def test_sampled_calibration_is_under_the_target_as_the_ledger_reports_it(q, rounds, target):
    result = calibrate_to_total(target, DELTA, sampled_specs(q, rounds))
    ledger = PrivacyLedger("client")  # reports on the finer grid, REPORT_DISCRETIZATION
    for step in result.steps:
        ledger.record(step.name, step.mechanism_instance(), step.compositions, step.sampling_rate)
    assert ledger.epsilon(DELTA) <= target
    assert ledger.epsilon(DELTA) == pytest.approx(target, rel=0.01)


@pytest.mark.parametrize("q, rounds, target", [(0.1, 2, 2.0), (0.3, 3, 1.0), (0.1, 1, 0.005)])
def test_calibration_agrees_with_the_previous_algorithm(q, rounds, target):
    specs = tuple(sampled_specs(q, rounds))
    new = calibration._calibrate_to_total(target, DELTA, specs, TOLERANCE)
    old = calibrated_without_pilot(target, DELTA, specs, TOLERANCE)
    for ours, previous in zip(new.steps, old.steps):
        assert ours.name == previous.name
        assert ours.noise_scale == pytest.approx(previous.noise_scale, rel=3e-3)
    assert new.scale == pytest.approx(old.scale, rel=2e-3)
    assert target * (1 - TOLERANCE) <= old.total_epsilon <= target


@pytest.mark.parametrize("q, rounds, target", [(0.01, 2, 2.0), (0.2, 5, 0.5), (0.5, 1, 8.0)])
def test_one_sampled_step_calibrates_like_dp_accountings_calibrate_dp_mechanism(q, rounds, target):
    spec = StepSpec("sums", "gaussian", 1.0, sensitivity=2.0, compositions=rounds, sampling_rate=q)
    ours = calibration._calibrate_to_total(target, DELTA, (spec,), TOLERANCE).steps[0].noise_multiplier

    def accountant():
        return pld_privacy_accountant.PLDAccountant(value_discretization_interval=SEARCH_DISCRETIZATION)

    def event(inverse_multiplier):
        return wrap_event(dp_accounting.GaussianDpEvent(1.0 / inverse_multiplier), rounds, q)

    # dp_accounting searches an increasing ε, so over 1/z; its answer does not exceed ε
    inverse = dp_accounting.calibrate_dp_mechanism(
        accountant, event, target, DELTA, dp_accounting.LowerEndpointAndGuess(1e-3, 1.0), tol=1e-7
    )
    assert ours == pytest.approx(1.0 / inverse, rel=2e-3)
    assert pld_epsilon(event(1.0 / ours), DELTA, SEARCH_DISCRETIZATION) <= target


def test_start_from_uses_the_hints_shape_and_the_points_offset():
    hints = [(u, 2.0 * u) for u in (-1.0, 0.0, 1.0)]  # log f = 2u on the pilot grid
    start, slope = calibration._start_from([], 1.0, hints)
    assert (start, slope) == (0.5, 2.0)
    # the fine grid's function is lower by 0.1 in log f: the offset moves the start
    start, slope = calibration._start_from([(0.5, 0.9)], 1.0, hints)
    assert start == pytest.approx(0.55) and slope == 2.0
    assert calibration._start_from([], 0.0) is None
    assert calibration._start_from([(0.0, -1.0)], 0.0) == (1.0, 1.0)  # one point: slope 1
    assert calibration._start_from([(0.0, 0.0), (1.0, 1.0)], 50.0) == (3.0, 1.0)  # at most 2 past the ends
    assert calibration._start_from([(0.0, 0.0), (1.0, -math.inf)], 0.5) == (0.5, 1.0)
