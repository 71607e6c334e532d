"""Tests for fedcluster.privacy: mechanisms, calibration, ledger, clipping.

Accounting is checked against dp_accounting itself (events built by hand here), σ_AGM
against Balle & Wang's values and dp_accounting's own solver, calibration against the PLD
accountant and dp_accounting's calibrate_dp_mechanism, noise against its empirical
distribution.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

dp_accounting = pytest.importorskip("dp_accounting")
from dp_accounting.pld import pld_privacy_accountant  # noqa: E402

from fedcluster.privacy import (  # noqa: E402
    MECHANISMS,
    REPORT_DISCRETIZATION,
    GaussianMechanism,
    LaplaceMechanism,
    NoiseMechanism,
    PrivacyLedger,
    StepSpec,
    SymmetricGaussianMechanism,
    analytic_gaussian_sigma,
    calibrate_step,
    calibrate_to_total,
    clip_l1,
    clip_l2,
    scale_l2,
    clip_rows_l2,
    event_to_dict,
    gaussian_sigma_for,
    independent_generators,
    laplace_scale_for,
    pld_epsilon,
)

DELTA = 1e-6


def hand_pld_epsilon(events, delta=DELTA, interval=REPORT_DISCRETIZATION):
    accountant = pld_privacy_accountant.PLDAccountant(value_discretization_interval=interval)
    accountant.compose(dp_accounting.ComposedDpEvent(list(events)))
    return accountant.get_epsilon(delta)


# ------------------------------------------------------------------ analytic Gaussian


@pytest.mark.parametrize("epsilon, expected", [(1.0, 4.2247), (0.5, 8.0576)])
def test_analytic_gaussian_sigma_matches_balle_wang_values(epsilon, expected):
    assert analytic_gaussian_sigma(epsilon, 1e-6) == pytest.approx(expected, abs=1e-3)


def test_analytic_gaussian_sigma_scales_with_sensitivity_and_handles_infinity():
    base = analytic_gaussian_sigma(1.0, 1e-6)
    assert analytic_gaussian_sigma(1.0, 1e-6, sensitivity=121.0) == pytest.approx(121.0 * base, rel=1e-12)
    assert analytic_gaussian_sigma(math.inf, 1e-6) == 0.0
    # Monotone: more privacy, more noise.
    assert analytic_gaussian_sigma(0.1, 1e-6) > analytic_gaussian_sigma(1.0, 1e-6) > analytic_gaussian_sigma(10.0, 1e-6)
    with pytest.raises(ValueError):
        analytic_gaussian_sigma(0.0, 1e-6)
    with pytest.raises(ValueError):
        analytic_gaussian_sigma(1.0, 0.0)


@pytest.mark.parametrize("epsilon", [1e-3, 0.016, 0.3, 1.0, 10.0, 200.0])
@pytest.mark.parametrize("delta", [1e-3, 1e-6, 1e-9])
def test_analytic_gaussian_sigma_is_dp_accountings_sigma_and_never_below_it(epsilon, delta):
    sigma = analytic_gaussian_sigma(epsilon, delta)
    assert sigma == pytest.approx(dp_accounting.get_sigma_gaussian(epsilon, delta), rel=1e-10)
    # the guarantee side: the ε of σ at δ (dp_accounting's exact conversion) is not above ε
    assert dp_accounting.get_epsilon_gaussian(sigma, delta) <= epsilon * (1 + 1e-9)


@pytest.mark.parametrize("epsilon", [0.05, 0.3, 1.0, 3.0, 10.0])
def test_gaussian_at_agm_sigma_reports_its_epsilon_via_pld_and_is_tight(epsilon):
    sigma = analytic_gaussian_sigma(epsilon, DELTA)
    reported = pld_epsilon(dp_accounting.GaussianDpEvent(sigma), DELTA)
    assert reported == pytest.approx(epsilon, rel=0.01)
    # Tight: 2 % less noise must already exceed the budget.
    assert pld_epsilon(dp_accounting.GaussianDpEvent(0.98 * sigma), DELTA) > epsilon


# ------------------------------------------------------------------ calibration helpers


def test_gaussian_sigma_for_repeated_rounds_is_sqrt_t_agm_and_meets_epsilon():
    sigma = gaussian_sigma_for(1.0, DELTA, sensitivity=11.0, compositions=4)
    assert sigma == pytest.approx(11.0 * 2.0 * analytic_gaussian_sigma(1.0, DELTA), rel=1e-12)
    event = dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(sigma / 11.0), 4)
    assert pld_epsilon(event, DELTA) == pytest.approx(1.0, rel=0.01)


def test_gaussian_sigma_for_poisson_sampled_rounds_meets_epsilon_and_uses_amplification():
    sigma = gaussian_sigma_for(1.0, DELTA, sensitivity=2.0, compositions=3, sampling_rate=0.05)
    unsampled = gaussian_sigma_for(1.0, DELTA, sensitivity=2.0, compositions=3)
    assert sigma < 0.5 * unsampled
    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(0.05, dp_accounting.GaussianDpEvent(sigma / 2.0)), 3
    )
    reported = pld_epsilon(event, DELTA)
    assert reported <= 1.0 + 1e-3
    assert reported == pytest.approx(1.0, rel=0.01)


def test_sampled_gaussian_calibration_agrees_with_dp_accountings_calibrate_dp_mechanism():
    def accountant():
        return pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-3)

    def event(multiplier):
        sampled = dp_accounting.PoissonSampledDpEvent(0.1, dp_accounting.GaussianDpEvent(multiplier))
        return dp_accounting.SelfComposedDpEvent(sampled, 2)

    ours = gaussian_sigma_for(0.5, DELTA, compositions=2, sampling_rate=0.1)
    # dp_accounting searches an increasing ε, so over 1/z; the answer must not exceed ε
    inverse = dp_accounting.calibrate_dp_mechanism(
        accountant, lambda s: event(1.0 / s), 0.5, DELTA, dp_accounting.LowerEndpointAndGuess(0.05, 0.4), tol=1e-6
    )
    assert ours == pytest.approx(1.0 / inverse, rel=2e-4)
    assert pld_epsilon(event(ours), DELTA, 1e-3) <= 0.5


def test_laplace_scale_for_basic_composition_and_sampling():
    assert laplace_scale_for(0.5, sensitivity=2.0) == pytest.approx(4.0)
    assert laplace_scale_for(1.0, sensitivity=1.0, compositions=5) == pytest.approx(5.0)
    scale = laplace_scale_for(1.0, sensitivity=1.0, compositions=2, sampling_rate=0.1)
    assert scale < 2.0  # amplification lets each round use less noise
    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(0.1, dp_accounting.LaplaceDpEvent(scale)), 2
    )
    reported = pld_epsilon(event, DELTA)
    assert 0.9 <= reported <= 1.0 + 1e-3


def test_laplace_with_infinite_epsilon_is_noiseless_and_accounted_as_not_private():
    assert laplace_scale_for(math.inf) == 0.0
    assert gaussian_sigma_for(math.inf, DELTA) == 0.0
    rng = np.random.default_rng(3)
    state_before = rng.bit_generator.state
    mechanism = LaplaceMechanism(laplace_scale_for(math.inf), sensitivity=1.0, rng=rng)
    counts = np.array([3.0, 0.0, 7.5])
    noisy = mechanism.add(counts)
    np.testing.assert_array_equal(noisy, counts)
    assert noisy is not counts
    assert rng.bit_generator.state == state_before  # no randomness consumed
    ledger = PrivacyLedger("data-point")
    ledger.record("counts", mechanism)
    assert ledger.epsilon(DELTA) == math.inf
    assert ledger.steps[0].noise_std == 0.0 and ledger.steps[0].event == dp_accounting.LaplaceDpEvent(0.0)


# ------------------------------------------------------------------ mechanisms' noise

N_DRAWS = 200_000


def test_gaussian_noise_has_std_sigma():
    mechanism = GaussianMechanism(3.5, sensitivity=2.0, rng=np.random.default_rng(0))
    noise = mechanism.add(np.zeros(N_DRAWS))
    assert abs(noise.mean()) < 5 * 3.5 / math.sqrt(N_DRAWS)
    # std of the sample std ~ sigma / sqrt(2n) ~ 0.16 %; allow 1 %.
    assert noise.std() == pytest.approx(3.5, rel=0.01)
    assert mechanism.event() == dp_accounting.GaussianDpEvent(noise_multiplier=1.75)


def test_laplace_noise_has_scale_b():
    mechanism = LaplaceMechanism(2.0, sensitivity=0.5, rng=np.random.default_rng(1))
    noise = mechanism.add(np.zeros(N_DRAWS))
    assert abs(noise.mean()) < 5 * math.sqrt(2) * 2.0 / math.sqrt(N_DRAWS)
    assert np.abs(noise).mean() == pytest.approx(2.0, rel=0.01)  # E|X| = b
    assert noise.std() == pytest.approx(math.sqrt(2.0) * 2.0, rel=0.015)  # sd = sqrt(2) b
    assert mechanism.noise_std == pytest.approx(math.sqrt(2.0) * 2.0)
    assert mechanism.event() == dp_accounting.LaplaceDpEvent(noise_multiplier=4.0)


def test_symmetric_gaussian_noise_is_symmetric_with_std_sigma_everywhere():
    sigma, d, draws = 2.5, 40, 300
    mechanism = SymmetricGaussianMechanism(sigma, sensitivity=121.0, rng=np.random.default_rng(2))
    base = np.arange(d * d, dtype=float).reshape(d, d)
    base = base + base.T
    diagonals, off_diagonals = [], []
    for _ in range(draws):
        noisy = mechanism.add(base)
        noise = noisy - base
        np.testing.assert_array_equal(noisy, noisy.T)
        diagonals.append(np.diag(noise))
        off_diagonals.append(noise[np.triu_indices(d, k=1)])
    diagonals = np.concatenate(diagonals)
    off_diagonals = np.concatenate(off_diagonals)
    assert diagonals.std() == pytest.approx(sigma, rel=0.03)  # 12,000 draws
    assert off_diagonals.std() == pytest.approx(sigma, rel=0.01)  # 234,000 draws
    assert abs(off_diagonals.mean()) < 5 * sigma / math.sqrt(off_diagonals.size)
    assert mechanism.event() == dp_accounting.GaussianDpEvent(noise_multiplier=sigma / 121.0)
    with pytest.raises(ValueError):
        mechanism.add(np.zeros((3, 4)))


def test_mechanisms_share_one_base_class_and_its_conventions():
    assert set(MECHANISMS) == {"gaussian", "symmetric_gaussian", "laplace"}
    for name, cls in MECHANISMS.items():
        assert issubclass(cls, NoiseMechanism) and cls.name == name
        mechanism = cls(2.0, sensitivity=4.0, rng=np.random.default_rng(0))
        assert mechanism.noise_multiplier == 0.5
        assert mechanism.noise_std == (2.0 * math.sqrt(2.0) if name == "laplace" else 2.0)
        assert mechanism.event() == mechanism.event_class(noise_multiplier=0.5)
        with pytest.raises(ValueError):
            cls(-1.0)
        with pytest.raises(ValueError):
            cls(1.0, sensitivity=0.0)
        with pytest.raises(TypeError):
            cls(1.0, rng=5)


def test_mechanisms_from_one_parent_seed_have_independent_reproducible_streams():
    first, second, third = independent_generators(1234, 3)
    a = GaussianMechanism(1.0, rng=first).add(np.zeros(N_DRAWS))
    b = GaussianMechanism(1.0, rng=second).add(np.zeros(N_DRAWS))
    c = LaplaceMechanism(1.0, rng=third).add(np.zeros(N_DRAWS))
    bound = 5.0 / math.sqrt(N_DRAWS)
    assert abs(np.corrcoef(a, b)[0, 1]) < bound
    assert abs(np.corrcoef(a, c)[0, 1]) < bound
    assert abs(np.corrcoef(b, c)[0, 1]) < bound
    # Reproducible from the same parent seed.
    again = GaussianMechanism(1.0, rng=independent_generators(1234, 3)[0]).add(np.zeros(N_DRAWS))
    np.testing.assert_array_equal(a, again)
    # Negative control (the authors' bug): one seed reused for two mechanisms correlates them.
    shared_a = GaussianMechanism(1.0, rng=np.random.default_rng(5)).add(np.zeros(1000))
    shared_b = GaussianMechanism(1.0, rng=np.random.default_rng(5)).add(np.zeros(1000))
    assert np.corrcoef(shared_a, shared_b)[0, 1] > 0.99


def test_mechanism_without_rng_draws_fresh_entropy():
    a = GaussianMechanism(1.0).add(np.zeros(8))
    b = GaussianMechanism(1.0).add(np.zeros(8))
    assert not np.array_equal(a, b)


# ------------------------------------------------------------------ ledger


def _fixed_ledger() -> PrivacyLedger:
    ledger = PrivacyLedger("data-point")
    ledger.record("step1_subspace", SymmetricGaussianMechanism(600.0, sensitivity=121.0), delta=DELTA)
    ledger.record("step2_weights", LaplaceMechanism(5.0, sensitivity=1.0))
    ledger.record("step3_sums", GaussianMechanism(40.0, sensitivity=11.0), delta=DELTA)
    ledger.record("step3_counts", LaplaceMechanism(6.0, sensitivity=1.0))
    ledger.record("lloyd_sums", GaussianMechanism(70.0, sensitivity=11.0), compositions=3, delta=DELTA)
    ledger.record("lloyd_counts", LaplaceMechanism(8.0), compositions=3, sampling_rate=0.2)
    return ledger


def test_ledger_total_equals_hand_built_pld_composition():
    ledger = _fixed_ledger()
    hand = [
        dp_accounting.GaussianDpEvent(600.0 / 121.0),
        dp_accounting.LaplaceDpEvent(5.0),
        dp_accounting.GaussianDpEvent(40.0 / 11.0),
        dp_accounting.LaplaceDpEvent(6.0),
        dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(70.0 / 11.0), 3),
        dp_accounting.SelfComposedDpEvent(
            dp_accounting.PoissonSampledDpEvent(0.2, dp_accounting.LaplaceDpEvent(8.0)), 3
        ),
    ]
    expected = hand_pld_epsilon(hand)
    assert ledger.epsilon(DELTA) == pytest.approx(expected, rel=1e-9)
    # Per-step epsilons are each step on its own.
    for got, event in zip(ledger.step_epsilons(DELTA), hand):
        assert got == pytest.approx(hand_pld_epsilon([event]), rel=1e-9)
    # Composition is sub-additive here, and strictly more than the largest step.
    steps = ledger.step_epsilons(DELTA)
    assert max(steps) < ledger.epsilon(DELTA) < sum(steps)


def test_ledger_to_dict_is_json_and_recomputes_the_same_total():
    ledger = _fixed_ledger()
    report = ledger.to_dict(DELTA)
    assert report["level"] == "data-point"
    assert report["delta"] == DELTA
    assert [s["name"] for s in report["steps"]][:2] == ["step1_subspace", "step2_weights"]
    assert set(report["steps"][0]) >= {
        "name",
        "mechanism",
        "sensitivity",
        "noise_std",
        "epsilon",
        "delta",
        "compositions",
        "sampling_rate",
    }
    assert report["steps"][5]["sampling_rate"] == 0.2 and report["steps"][5]["compositions"] == 3
    assert report["steps"][1]["noise_std"] == pytest.approx(math.sqrt(2) * 5.0)
    report = json.loads(json.dumps(report))  # JSON as written
    assert report["steps"][5]["event"] == {
        "type": "SelfComposedDpEvent",
        "count": 3,
        "event": {
            "type": "PoissonSampledDpEvent",
            "sampling_probability": 0.2,
            "event": {"type": "LaplaceDpEvent", "noise_multiplier": 8.0},
        },
    }
    # Recompute from the plain numbers alone, as an outside reader would.
    events = []
    for step in report["steps"]:
        sensitivity, noise = step["sensitivity"], step["noise_std"]
        if step["mechanism"] == "laplace":
            base = dp_accounting.LaplaceDpEvent(noise / math.sqrt(2) / sensitivity)
        else:
            base = dp_accounting.GaussianDpEvent(noise / sensitivity)
        if step["sampling_rate"] is not None:
            base = dp_accounting.PoissonSampledDpEvent(step["sampling_rate"], base)
        events.append(dp_accounting.SelfComposedDpEvent(base, step["compositions"]))
    assert hand_pld_epsilon(events) == pytest.approx(report["epsilon"], rel=1e-6)


def test_ledger_knows_one_spelling_per_level_and_reports_zero_when_empty():
    for level in ("data-point", "client"):
        ledger = PrivacyLedger(level)
        assert ledger.epsilon(DELTA) == 0.0 and ledger.to_dict(DELTA)["steps"] == []
    for other in ("data_point", "user", "Client"):
        with pytest.raises(ValueError, match="unknown privacy level"):
            PrivacyLedger(other)


def test_event_to_dict_describes_nested_events_with_dp_accountings_fields():
    event = dp_accounting.ComposedDpEvent(
        [
            dp_accounting.GaussianDpEvent(1.5),
            dp_accounting.SelfComposedDpEvent(dp_accounting.NoOpDpEvent(), 2),
        ]
    )
    assert event_to_dict(event) == {
        "type": "ComposedDpEvent",
        "events": [
            {"type": "GaussianDpEvent", "noise_multiplier": 1.5},
            {"type": "SelfComposedDpEvent", "event": {"type": "NoOpDpEvent"}, "count": 2},
        ],
    }


# ------------------------------------------------------------------ budget


def test_calibrate_step_is_the_single_step_calibration():
    gaussian = calibrate_step(StepSpec("g", "gaussian", 1.0, sensitivity=3.0, compositions=2), 0.7, DELTA)
    assert gaussian.noise_scale == gaussian_sigma_for(0.7, DELTA, 3.0, compositions=2)
    assert gaussian.delta == DELTA and gaussian.epsilon_share == 0.7
    sampled = calibrate_step(StepSpec("s", "symmetric_gaussian", 1.0, sensitivity=2.0, sampling_rate=0.2), 1.0, DELTA)
    assert sampled.noise_scale == gaussian_sigma_for(1.0, DELTA, 2.0, sampling_rate=0.2)
    laplace = calibrate_step(StepSpec("l", "laplace", 1.0, sensitivity=5.0, compositions=3), 0.6, DELTA)
    assert laplace.noise_scale == laplace_scale_for(0.6, 5.0, compositions=3) and laplace.delta is None
    assert laplace.mechanism_instance().noise_std == pytest.approx(math.sqrt(2.0) * 25.0)
    with pytest.raises(ValueError, match="mechanism must be one of"):
        StepSpec("x", "exponential", 1.0)


def test_calibrate_to_total_meets_target_for_feddp_init_data_point():
    specs = [  # the paper's rule of thumb (App. H.1), data-point level, Δ = 11
        StepSpec("step1", "symmetric_gaussian", 0.2, sensitivity=121.0),
        StepSpec("step2", "laplace", 0.2),
        StepSpec("step3_gaussian", "gaussian", 0.45, sensitivity=11.0),
        StepSpec("step3_laplace", "laplace", 0.15),
        StepSpec("lloyd_gaussian", "gaussian", 0.3, sensitivity=11.0, compositions=2),
        StepSpec("lloyd_laplace", "laplace", 0.1, compositions=2),
    ]
    calibration = calibrate_to_total(1.0, DELTA, specs)
    assert calibration.total_epsilon <= 1.0
    assert calibration.total_epsilon == pytest.approx(1.0, rel=0.01)
    # The weights fix the relative budgets.
    shares = {step.name: step.epsilon_share for step in calibration.steps}
    assert shares["step3_gaussian"] / shares["step1"] == pytest.approx(0.45 / 0.2)
    # An independent re-accounting (ledger, finer PLD grid) agrees.
    ledger = PrivacyLedger("data-point")
    for step, rng in zip(calibration.steps, independent_generators(0, len(calibration.steps))):
        ledger.record(
            step.name, step.mechanism_instance(rng), compositions=step.compositions, sampling_rate=step.sampling_rate
        )
    assert ledger.epsilon(DELTA) == pytest.approx(1.0, rel=0.01)
    assert ledger.epsilon(DELTA) <= 1.0
    # The target total is honoured where the naive split is not: the shares sum above 1.
    assert sum(shares.values()) > 1.0
    step1 = next(step for step in calibration.steps if step.name == "step1")
    assert step1.noise_scale == pytest.approx(121.0 * analytic_gaussian_sigma(shares["step1"], DELTA), rel=1e-9)


def test_calibrate_to_total_with_poisson_sampled_clients():
    specs = [
        StepSpec("sums", "gaussian", 0.8, sensitivity=1.0, sampling_rate=0.1),
        StepSpec("counts", "laplace", 0.2, sensitivity=1.0, sampling_rate=0.1),
    ]
    calibration = calibrate_to_total(2.0, DELTA, specs)
    assert calibration.total_epsilon == pytest.approx(2.0, rel=0.01)
    assert calibration.total_epsilon <= 2.0
    hand = hand_pld_epsilon([step.event() for step in calibration.steps])
    assert hand == pytest.approx(2.0, rel=0.01)


# ------------------------------------------------------------------ clipping


def _random_rows(rng, n=2000, d=7):
    scales = 10.0 ** rng.uniform(-8, 8, size=n)
    rows = rng.normal(size=(n, d)) * scales[:, None]
    rows[::97] = 0.0
    return rows


@pytest.mark.parametrize("bound", [0.0, 1e-3, 1.0, 11.0, 1e6])
def test_clip_rows_l2_never_exceeds_bound_and_keeps_in_bound_rows(bound):
    rng = np.random.default_rng(11)
    points = _random_rows(rng)
    original = points.copy()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        clipped = clip_rows_l2(points, bound)
    np.testing.assert_array_equal(points, original)  # input untouched
    assert np.all(np.isfinite(clipped))
    norms_before = np.linalg.norm(points, axis=1)
    norms_after = np.linalg.norm(clipped, axis=1)
    assert np.all(norms_after <= bound)
    inside = norms_before <= bound
    np.testing.assert_array_equal(clipped[inside], points[inside])
    assert np.all(clipped[::97] == 0.0)
    outside = ~inside
    if bound > 0 and outside.any():
        np.testing.assert_allclose(norms_after[outside], bound, rtol=1e-12)
        cos = np.sum(clipped[outside] * points[outside], axis=1) / (norms_after[outside] * norms_before[outside])
        np.testing.assert_allclose(cos, 1.0, rtol=1e-12)


def test_clip_l2_and_l1_clip_the_whole_statistic():
    rng = np.random.default_rng(12)
    for _ in range(200):
        stat = rng.normal(size=(5, 9)) * 10.0 ** rng.uniform(-6, 6)
        bound = 10.0 ** rng.uniform(-3, 3)
        l2 = clip_l2(stat, bound)
        l1 = clip_l1(stat, bound)
        assert np.linalg.norm(l2) <= bound
        assert np.abs(l1).sum() <= bound
        if np.linalg.norm(stat) <= bound:
            np.testing.assert_array_equal(l2, stat)
        else:
            np.testing.assert_allclose(l2, stat * bound / np.linalg.norm(stat), rtol=1e-12)
        if np.abs(stat).sum() <= bound:
            np.testing.assert_array_equal(l1, stat)
    small = np.array([0.25, -0.25, 0.5])
    np.testing.assert_array_equal(clip_l1(small, 1.0), small)
    np.testing.assert_allclose(clip_l1(np.array([3.0, -1.0]), 2.0), [1.5, -0.5])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_array_equal(clip_l2(np.zeros((3, 3)), 1.0), np.zeros((3, 3)))
        np.testing.assert_array_equal(clip_l1(np.zeros(4), 0.0), np.zeros(4))


def test_scale_l2_sets_the_norm_whatever_the_scale():
    rng = np.random.default_rng(13)
    for _ in range(200):
        stat = rng.normal(size=(4, 6)) * 10.0 ** rng.uniform(-8, 8)
        bound = 10.0 ** rng.uniform(-3, 3)
        scaled = scale_l2(stat, bound)
        assert np.linalg.norm(scaled) <= bound
        np.testing.assert_allclose(np.linalg.norm(scaled), bound, rtol=1e-12)
        np.testing.assert_allclose(scaled, stat * (bound / np.linalg.norm(stat)), rtol=1e-12)  # same direction
    np.testing.assert_array_equal(scale_l2(np.zeros((2, 2)), 1.0), np.zeros((2, 2)))
    with pytest.raises(ValueError):
        scale_l2(np.array([1.0, np.nan]), 1.0)
    with pytest.raises(ValueError):
        scale_l2(np.ones(2), -1.0)


def test_clipping_rejects_bad_input():
    with pytest.raises(ValueError):
        clip_rows_l2(np.array([[1.0, np.nan]]), 1.0)
    with pytest.raises(ValueError):
        clip_l2(np.array([np.inf]), 1.0)
    with pytest.raises(ValueError):
        clip_l1(np.ones(3), -1.0)
    with pytest.raises(ValueError):
        clip_rows_l2(np.ones(3), 1.0)


def test_clipping_module_needs_only_numpy():
    root = Path(__file__).resolve().parents[2]
    code = (
        "import sys; import fedcluster.privacy.clipping; "
        "bad = [m for m in ('scipy', 'dp_accounting', 'sklearn', 'flwr') if m in sys.modules]; "
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
