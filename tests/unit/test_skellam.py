"""The devices' noise under secure aggregation (fedcluster/privacy/skellam.py): the Skellam
bound's leading term is the Gaussian's (checked against dp_accounting's own RDP accountant
for a Gaussian of the same variance, which it must exceed and approach as the variance
grows), the calibration meets its target, and a device's share has the variance asked."""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest

from fedcluster.privacy import skellam


def gaussian_rdp_epsilon(sigma: float, compositions: int, delta: float) -> float:
    accountant = dp_accounting.rdp.RdpAccountant(list(skellam.ORDERS))
    accountant.compose(dp_accounting.GaussianDpEvent(noise_multiplier=sigma), compositions)
    return accountant.get_epsilon(delta)


@pytest.mark.parametrize("scale", [1e1, 1e3, 1e6])
def test_the_skellam_bound_exceeds_and_approaches_the_gaussian_of_the_same_variance(scale):
    sigma = 3.0  # noise multiplier: the std over the L2 sensitivity
    l2 = scale  # sensitivity in grid units; variance (sigma·l2)²
    release = skellam.SkellamRelease("x", l1=l2, l2=l2, variance=(sigma * l2) ** 2, compositions=4)
    ours, gaussian = skellam.epsilon([release], 1e-6), gaussian_rdp_epsilon(sigma, 4, 1e-6)
    assert ours >= gaussian
    assert ours <= gaussian * (1 + (0.2 if scale == 1e1 else 1e-3))


def test_the_calibration_meets_its_target_and_shares_it_by_weight():
    steps = [
        {"name": "counts", "l1": 2**20 + 4, "l2": 2**20 + 2, "grid": 2**-20, "weight": 0.1, "compositions": 1},
        {"name": "sums", "l1": 3e6, "l2": 2**20 + 4, "grid": 1e-6, "weight": 0.9, "compositions": 5},
    ]
    releases = skellam.calibrate(steps, 0.5, 1e-6)
    assert 0.5 * (1 - 1e-4) <= skellam.epsilon(releases, 1e-6) <= 0.5
    rho = {r.name: r.compositions * r.l2**2 / r.variance for r in releases}  # the Gaussian parts' costs
    assert rho["sums"] / rho["counts"] == pytest.approx(9.0)
    assert all(r.variance == 0 for r in skellam.calibrate(steps, math.inf, 1e-6))
    assert skellam.epsilon(skellam.calibrate(steps, math.inf, 1e-6), 1e-6) == math.inf


def test_a_devices_share_has_the_variance_asked_and_is_integer():
    rng = np.random.default_rng(0)
    share = skellam.noise(1e12, 20000, rng)
    assert share.dtype == np.int64 and abs(share.mean()) < 5 * 1e6 / math.sqrt(20000)
    assert share.var() == pytest.approx(1e12, rel=0.05)
    assert not skellam.noise(0.0, 5).any()
