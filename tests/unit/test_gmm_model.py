"""Federated GMM's math on plain arrays (fedcluster/algorithms/gmm): the E-step's sums and
the server's M-step give scikit-learn's M-step on the pooled points, whichever means the
moments are taken about; the reply checks refuse what no points in the box could give."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.mixture import GaussianMixture
from sklearn.mixture._gaussian_mixture import _estimate_gaussian_parameters, _estimate_log_gaussian_prob

from fedcluster.algorithms.gmm.device import estep_statistics, gmm_estep, log_responsibilities
from fedcluster.algorithms.gmm.model import (
    Mixture,
    bic,
    distinct_starts,
    em_survivors,
    estep_violation,
    m_step,
    n_parameters,
    stacked_request,
    starts_ranges,
    starts_violation,
    secure_ranges,
    start_count,
    topped_up_starts,
)
from fedcluster.bounds import Declared
from fedcluster.kernel import DeviceData


def data(offset: float = 0.0):
    rng = np.random.default_rng(0)
    X = np.concatenate([rng.normal(m, 1 + i, size=(60, 3)) for i, m in enumerate((0.0, 5.0, -4.0))]) + offset
    return [X[i::3] for i in range(3)]


def fitted(covariance_type: str) -> Mixture:
    X = np.concatenate(data())
    g = GaussianMixture(3, covariance_type=covariance_type, random_state=0).fit(X)
    return Mixture(g.weights_, g.means_, g.covariances_, covariance_type)


def summed(parts, mixture):
    stats = [estep_statistics(X, mixture.means, mixture.weights, mixture.precision_chol()) for X in parts]
    return {key: sum(s[key] for s in stats) for key in stats[0]}


@pytest.mark.parametrize("covariance_type", ["full", "diag", "spherical"])
def test_the_summed_e_step_and_m_step_are_scikit_learns_on_the_pooled_points(covariance_type):
    mixture = fitted(covariance_type)
    X = np.concatenate(data())
    total = summed(data(), mixture)
    second = total["outer"] if mixture.full else total["squares"]
    got = m_step(total["counts"], total["sums"], second, mixture.means, covariance_type, 1e-6)
    log_prob = _estimate_log_gaussian_prob(X, mixture.means, _sk_precisions(mixture), covariance_type)
    weighted = log_prob + np.log(mixture.weights)
    top = weighted.max(1, keepdims=True)
    resp = np.exp(weighted - top - np.log(np.exp(weighted - top).sum(1, keepdims=True)))
    nk, means, covariances = _estimate_gaussian_parameters(X, resp, 1e-6, covariance_type)
    np.testing.assert_allclose(got.means, means, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(got.covariances, covariances, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(got.weights, nk / nk.sum(), rtol=1e-9)
    expected = float(np.sum(np.log(np.exp(weighted - top).sum(1)) + top[:, 0]))
    assert total["loglik"][0] == pytest.approx(expected, rel=1e-12)


def _sk_precisions(mixture: Mixture) -> np.ndarray:
    factors = mixture.precision_chol()
    return factors[:, 0] if mixture.covariance_type == "spherical" else factors


def test_moments_about_the_current_means_make_an_offset_change_nothing():
    mixture = fitted("full")
    shifted = Mixture(mixture.weights, mixture.means + 1e9, mixture.covariances, "full")
    a, b = summed(data(), mixture), summed(data(1e9), shifted)
    np.testing.assert_allclose(b["counts"], a["counts"], rtol=1e-6)
    np.testing.assert_allclose(b["outer"], a["outer"], rtol=1e-5, atol=1e-3)
    got = m_step(b["counts"], b["sums"], b["outer"], shifted.means, "full", 1e-6)
    want = m_step(a["counts"], a["sums"], a["outer"], mixture.means, "full", 1e-6)
    np.testing.assert_allclose(got.covariances, want.covariances, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(got.means - 1e9, want.means, atol=1e-5)


def test_log_sum_exp_keeps_far_points_finite():
    mixture = fitted("diag")
    log_norm, log_resp = log_responsibilities(
        np.array([[1e4, 1e4, 1e4]]), mixture.means, mixture.weights, mixture.precision_chol()
    )
    assert np.isfinite(log_norm).all() and np.allclose(np.exp(log_resp).sum(), 1.0)


def declared_of(X: np.ndarray) -> Declared:
    return Declared(
        float(len(X)),
        X.min(0),
        X.max(0),
        moment_sum=X.sum(0),
        moment_scatter=((X - X.mean(0)) ** 2).sum(0),
    )


@pytest.mark.parametrize("covariance_type", ["full", "diag"])
def test_an_honest_reply_passes_and_each_lie_is_named(covariance_type):
    mixture = fitted(covariance_type)
    X = data()[0]
    honest = estep_statistics(X, mixture.means, mixture.weights, mixture.precision_chol())
    declared = declared_of(X)
    assert estep_violation(honest, mixture, declared) is None
    second = "outer" if mixture.full else "squares"
    lies = {
        "mean outside": {"sums": honest["sums"] + 1e3 * honest["counts"][:, None]},
        "too wide": {second: honest[second] * 50},
        "too narrow": {second: honest[second] * 1e-3},
        "other points": {"sums": honest["sums"] + np.array([[0.5, 0, 0], [0, 0, 0], [0, 0, 0]]) * 10},
        "likelihood": {"loglik": honest["loglik"] + 1e6},
    }
    for name, change in lies.items():
        assert estep_violation({**honest, **change}, mixture, declared), name


def test_bic_is_scikit_learns():
    X = np.concatenate(data())
    g = GaussianMixture(3, random_state=0).fit(X)
    assert n_parameters(3, 3, "full") == g._n_parameters()
    assert bic(float(g.score(X) * len(X)), len(X), 3, 3, "full") == pytest.approx(g.bic(X), rel=1e-12)


def two_starts(covariance_type: str) -> list[Mixture]:
    one = fitted(covariance_type)
    other = Mixture(one.weights[::-1].copy(), one.means + 0.7, one.covariances * 1.5, covariance_type)
    return [one, other]


@pytest.mark.parametrize("covariance_type", ["full", "diag"])
def test_every_start_of_one_request_gets_its_own_e_step(covariance_type):
    """Starts side by side: one request carries every start's mixture, the reply each
    start's statistics, equal to the E-step of that mixture alone."""
    X = data()[0]
    starts = two_starts(covariance_type)
    arrays, _ = gmm_estep(DeviceData(points=X), stacked_request(starts), {"full": starts[0].full, "hard": False})
    for index, mixture in enumerate(starts):
        alone = estep_statistics(X, mixture.means, mixture.weights, mixture.precision_chol())
        for name, value in alone.items():
            np.testing.assert_array_equal(arrays[name][index], value if name != "loglik" else value[0])


def test_a_lie_in_one_start_is_named_with_its_start():
    X = data()[0]
    starts = two_starts("full")
    stats = [estep_statistics(X, m.means, m.weights, m.precision_chol()) for m in starts]
    reply = {name: np.stack([s[name] for s in stats]) for name in stats[0]}
    reply["loglik"] = reply["loglik"][:, 0]
    declared = declared_of(X)
    assert starts_violation(reply, starts, declared) is None
    reply["outer"] = reply["outer"].copy()
    reply["outer"][1] *= 50
    assert starts_violation(reply, starts, declared).startswith("start 1: ")


def test_the_secure_ranges_of_starts_side_by_side_hold_for_every_start():
    X = data()[0]
    starts = two_starts("diag")
    low, high = X.min(axis=0), X.max(axis=0)
    ranges = starts_ranges(starts, low, high, len(X))
    for mixture in starts:
        for name, value in secure_ranges(mixture, low, high, len(X)).items():
            assert ranges[name] >= value


def test_starts_at_the_same_means_run_once():
    means = np.array([[0.0, 1.0], [2.0, 3.0]])
    assert distinct_starts([means, means[::-1].copy(), means + 1e-3, means * (1 + 1e-12)]) == [0, 2]


def test_converged_starts_stop_and_after_half_of_the_rounds_only_the_leader_goes_on():
    lower = [-3.0, -1.0, -2.0]
    assert em_survivors([0, 1, 2], [False, True, False], lower, finished=False) == [0, 2]
    assert em_survivors([0, 2], [False, True, False], lower, finished=True) == []  # the leader converged
    assert em_survivors([0, 1, 2], [False, False, False], lower, finished=True) == [1]


def test_the_estimators_n_init_sets_the_em_starts():
    from fedcluster import FederatedGaussianMixture

    assert FederatedGaussianMixture(3, n_init=2)._config()["em-starts"] == 2
    with pytest.raises(ValueError, match="'em-starts' -> n_init"):
        FederatedGaussianMixture(3, n_init=2, run_config={"em-starts": 3})._config()


@pytest.mark.parametrize("covariance_type", ["full", "diag"])
def test_a_feature_constant_on_a_device_far_from_a_components_mean_passes(covariance_type):
    """uci/yeast standardized: a flag is -0.099 on every point of a device and 9.7 on a few of
    another's, where a component sits. The device's sums about that mean, (c - μ) Σ r, round
    like μ's size while its box has width 0 (before: honest devices excluded as liars)."""
    rng = np.random.default_rng(3)
    failures = []
    for trial in range(40):
        X = np.column_stack([rng.normal(0, 1, 150), rng.normal(2, 0.5, 150), np.full(150, -0.0991313956989)])
        means = np.array([[0.0, 2.0, -0.0991313956989], [1.0, 2.5, 9.708268018784253], [-1.0, 1.5, 0.3]])
        means[:, :2] += rng.normal(0, 0.3, (3, 2))
        scale = rng.uniform(0.05, 2.0)
        if covariance_type == "full":
            covariances = np.stack([np.eye(3) * scale] * 3)
        else:
            covariances = np.full((3, 3), scale)
        mixture = Mixture(np.array([0.6, 0.1, 0.3]), means, covariances, covariance_type)
        honest = estep_statistics(X, mixture.means, mixture.weights, mixture.precision_chol())
        reason = estep_violation(honest, mixture, declared_of(X))
        if reason:
            failures.append((trial, reason))
    assert not failures, failures[:3]


def test_auto_em_starts_are_16_while_a_devices_statistics_fit_and_fewer_for_large_ones():
    assert start_count(0, 3, 2, "full") == 16
    assert start_count(0, 10, 100, "diag") == 16
    assert start_count(0, 10, 100, "full") == 1  # 16 starts of 10 × 100 × 100 outer products: 12.8 MB a reply
    assert start_count(0, 2, 60, "full") == 16
    assert 1 < start_count(0, 8, 60, "full") < 16
    assert start_count(5, 10, 100, "full") == 5  # asked for: kept


def test_starts_are_topped_up_with_distinct_draws_of_summary_points():
    rng = np.random.default_rng(0)
    points, weights = rng.normal(size=(20, 3)), rng.integers(1, 30, 20).astype(float)
    same = points[[0, 1]]
    starts = topped_up_starts([same, same.copy(), same[::-1]], 8, points, weights, rng)
    assert len(starts) == 8
    assert len(distinct_starts(starts)) == 8  # the three given were one set
    pool = {tuple(p) for p in points}
    assert all(tuple(row) in pool for start in starts for row in start)
    assert all(len({tuple(row) for row in start}) == 2 for start in starts)  # k distinct points each
    # a pool of k points has one set to give: no endless loop, no duplicate
    assert len(topped_up_starts([same], 8, points[:2], weights[:2], rng)) == 1
    # points of weight 0 (a device summary center that holds no point) are never drawn
    zero = weights.copy()
    zero[5:] = 0
    drawn = topped_up_starts([points[[0, 1]]], 6, points, zero, rng)
    assert all(tuple(row) in {tuple(p) for p in points[:5]} for start in drawn for row in start)
