"""Distributed noise under secure aggregation: the Skellam mechanism (Agarwal, Kairouz and
Liu, "The Skellam Mechanism for Differentially Private Federated Learning", NeurIPS 2021).

Each device adds to its integer (fixed-point) arrays Skellam noise of variance v / t per
coordinate: Poisson(v / 2t) − Poisson(v / 2t). A sum of independent Skellam variables is
Skellam, so a secure sum over at least t devices holds noise of variance at least v, and the
server never sees the sum without it. Releases are accounted by Rényi DP (Corollary 3.6 of
the paper, integer orders α > 1, v the variance per coordinate, Δ1 and Δ2 the L1 and L2
sensitivities in grid units)::

    ε(α) ≤ α·Δ2²/(2v) + min(((2α − 1)·Δ2² + 6·Δ1) / (4v²), 3·Δ1/(2v))

composed by adding over releases, and turned into (ε, δ) by dp_accounting's RDP conversion.
Like the rest of this package: releases are data (:class:`SkellamRelease`), the calibration
and the report are small functions of them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from ._checks import check_delta

ORDERS = tuple(range(2, 65)) + tuple(range(72, 1025, 8))  # integer α: the bound is stated for them


@dataclass(frozen=True)
class SkellamRelease:
    """One secured step: its arrays' sum released with Skellam noise of ``variance`` per
    coordinate, ``compositions`` times; ``l1``, ``l2`` its sensitivities and ``grid`` the
    fixed-point step, all in the units of the summed integers (``grid`` converts back)."""

    name: str
    l1: float
    l2: float
    variance: float
    compositions: int = 1
    grid: float = 1.0

    def rdp(self, alpha: int) -> float:
        if self.variance == 0:
            return math.inf
        v, l1, l2 = self.variance, self.l1, self.l2
        return self.compositions * (
            alpha * l2**2 / (2 * v) + min(((2 * alpha - 1) * l2**2 + 6 * l1) / (4 * v**2), 3 * l1 / (2 * v))
        )

    @property
    def noise_std(self) -> float:
        """The noise's standard deviation per coordinate, back in the data's units."""
        return math.sqrt(self.variance) * self.grid


def epsilon(releases: Sequence[SkellamRelease], delta: float) -> float:
    """(ε at ``delta``) of all ``releases`` composed (0 for none, inf if one has no noise)."""
    from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

    if not releases:
        return 0.0
    rdp = [sum(release.rdp(alpha) for release in releases) for alpha in ORDERS]
    if not all(math.isfinite(value) for value in rdp):
        return math.inf
    return float(compute_epsilon(ORDERS, rdp, check_delta(delta))[0])


def calibrate(steps: Sequence[dict[str, Any]], target: float, delta: float) -> list[SkellamRelease]:
    """Variances for ``steps`` (dicts with name, l1, l2, compositions, grid and ``weight``,
    the step's share of the budget) so that the composition costs at most ``target`` at
    ``delta``: the Gaussian part of step s costs ρ_s ∝ weight_s (variance_s = c·T_s·Δ2_s² /
    weight_s) and c is the smallest found by bisection. ``target = inf``: no noise."""

    def releases(scale: float) -> list[SkellamRelease]:
        return [
            SkellamRelease(
                s["name"],
                s["l1"],
                s["l2"],
                scale * s["compositions"] * s["l2"] ** 2 / s["weight"],
                s["compositions"],
                s["grid"],
            )
            for s in steps
        ]

    if math.isinf(target):
        return releases(0.0)
    low, high = 1e-6, 1.0
    while epsilon(releases(high), delta) > target:
        low, high = high, high * 4
    for _ in range(60):
        middle = math.sqrt(low * high)
        if epsilon(releases(middle), delta) > target:
            low = middle
        else:
            high = middle
        if high / low < 1 + 1e-6:
            break
    return releases(high)


def noise(variance: float, size: int | tuple, rng: np.random.Generator | None = None) -> np.ndarray:
    """A device's share: Poisson(v/2) − Poisson(v/2) per coordinate (int64), from the OS's
    entropy unless ``rng`` is given (the server must not know the seed)."""
    rng = rng or np.random.default_rng()
    if variance <= 0:
        return np.zeros(size, dtype=np.int64)
    return rng.poisson(variance / 2, size).astype(np.int64) - rng.poisson(variance / 2, size).astype(np.int64)


@dataclass
class SkellamLedger:
    """The secured steps of a run as released, and their (ε, δ); ``devices``: the fewest
    devices whose noise every release holds (the secure-aggregation threshold)."""

    level: str
    devices: int = 0
    releases: list[SkellamRelease] = field(default_factory=list)

    def record(self, release: SkellamRelease) -> None:
        self.releases.append(release)

    def epsilon(self, delta: float) -> float:
        return epsilon(self.releases, delta)

    def to_dict(self, delta: float) -> dict[str, Any]:
        eps = self.epsilon(delta)
        return {
            "level": self.level,
            "delta": delta,
            "epsilon": eps if math.isfinite(eps) else None,
            "accountant": "RDP, Skellam mechanism (Agarwal et al. 2021, Corollary 3.6), integer orders 2..1024",
            "noise_added_by": "the devices",
            "min_noisy_devices": self.devices,
            "steps": [
                {
                    "name": r.name,
                    "mechanism": "skellam",
                    "l1": r.l1,
                    "l2": r.l2,
                    "variance": r.variance,
                    "grid": r.grid,
                    "noise_std": r.noise_std,
                    "compositions": r.compositions,
                    "epsilon": epsilon([r], delta),
                }
                for r in self.releases
            ],
        }
