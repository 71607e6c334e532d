"""Additive noise mechanisms: one base class, Gaussian, symmetric Gaussian and Laplace.

Each mechanism holds its OWN random generator (get independent ones from
:func:`independent_generators`) and describes one use of itself as a ``dp_accounting``
event (``GaussianDpEvent`` / ``LaplaceDpEvent``, whose noise multiplier is scale /
sensitivity). Used by FedDP-KMeans (docs/ALGORITHMS.md §3) on the server.

Conventions: ``sensitivity`` is L2 for the Gaussian mechanisms and L1 for Laplace;
``scale`` is σ (Gaussian) or b (Laplace); ``noise_std`` is the standard deviation of one
noise coordinate, σ or √2·b.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

import dp_accounting

from ._checks import check_sensitivity

__all__ = [
    "NoiseMechanism",
    "GaussianMechanism",
    "SymmetricGaussianMechanism",
    "LaplaceMechanism",
    "MECHANISMS",
    "independent_generators",
]


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


class NoiseMechanism:
    """Adds i.i.d. noise of scale ``scale`` to every entry of a statistic of sensitivity
    ``sensitivity``.

    ``scale = 0`` adds nothing (ε = ∞) and consumes no randomness. ``rng`` is this
    mechanism's own generator; never share one between mechanisms. ``None`` seeds a fresh
    one from OS entropy. Subclasses set ``name``, ``std_per_scale``, ``_draw`` and
    ``event_class``.
    """

    name = ""
    std_per_scale = 1.0
    event_class: type = dp_accounting.DpEvent

    def __init__(self, scale: float, sensitivity: float = 1.0, rng: np.random.Generator | None = None):
        scale = float(scale)
        if not (scale >= 0.0 and math.isfinite(scale)):
            raise ValueError(f"the noise scale must be a non-negative finite number, got {scale}")
        if rng is None:
            rng = np.random.default_rng()  # fresh OS entropy
        elif not isinstance(rng, np.random.Generator):
            raise TypeError(f"rng must be a numpy.random.Generator or None, got {type(rng).__name__}")
        self.scale = scale
        self.sensitivity = check_sensitivity(sensitivity)
        self.rng = rng

    @property
    def noise_std(self) -> float:
        return self.std_per_scale * self.scale

    @property
    def noise_multiplier(self) -> float:
        return self.scale / self.sensitivity

    def _draw(self, size) -> np.ndarray:
        raise NotImplementedError

    def noise(self, shape: int | tuple[int, ...]) -> np.ndarray:
        """A fresh noise array of ``shape`` from this mechanism's stream."""
        if self.scale == 0.0:
            return np.zeros(shape)
        return self._draw(shape)

    def add(self, array: np.ndarray) -> np.ndarray:
        """Return ``array + noise`` as a new float64 array (``array`` is not modified)."""
        values = np.asarray(array, dtype=np.float64)
        return values + self.noise(values.shape)

    def event(self) -> dp_accounting.DpEvent:
        """One use of this mechanism as a ``dp_accounting`` event (noise multiplier scale / Δ)."""
        return self.event_class(noise_multiplier=self.noise_multiplier)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(scale={self.scale:.6g}, sensitivity={self.sensitivity:.6g})"


class GaussianMechanism(NoiseMechanism):
    """N(0, σ²) noise, σ = ``scale``, for a statistic of L2 (Frobenius) sensitivity Δ."""

    name = "gaussian"
    event_class = dp_accounting.GaussianDpEvent

    def _draw(self, size) -> np.ndarray:
        return self.rng.normal(0.0, self.scale, size=size)


class SymmetricGaussianMechanism(GaussianMechanism):
    """Gaussian noise for a symmetric d x d statistic (Σ XᵢᵀXᵢ in FedDP-Init step 1).

    The upper triangle including the diagonal is drawn i.i.d. N(0, σ²) and mirrored, so
    the noisy matrix stays symmetric and every entry has standard deviation σ. The
    released information is the upper triangle, whose L2 norm is at most the Frobenius
    norm of the statistic, so calibrating σ to the Frobenius sensitivity (Δ² for xxᵀ with
    ||x|| ≤ Δ) is valid (slightly conservative: off-diagonal entries count once).
    """

    name = "symmetric_gaussian"

    def noise(self, shape: int | tuple[int, ...]) -> np.ndarray:
        shape = (shape, shape) if isinstance(shape, (int, np.integer)) else tuple(shape)
        if len(shape) != 2 or shape[0] != shape[1]:
            raise ValueError(f"symmetric noise needs a square d x d shape, got {shape}")
        d = shape[0]
        noise = np.zeros((d, d))
        if self.scale == 0.0 or d == 0:
            return noise
        rows, cols = np.triu_indices(d)
        noise[rows, cols] = self._draw(rows.size)
        noise[cols, rows] = noise[rows, cols]
        return noise


class LaplaceMechanism(NoiseMechanism):
    """Laplace(0, b) noise, b = ``scale``, for a statistic of L1 sensitivity Δ: pure
    (Δ/b)-DP for one use; the noise standard deviation is √2·b."""

    name = "laplace"
    std_per_scale = math.sqrt(2.0)
    event_class = dp_accounting.LaplaceDpEvent

    def _draw(self, size) -> np.ndarray:
        return self.rng.laplace(0.0, self.scale, size=size)


MECHANISMS: dict[str, type[NoiseMechanism]] = {
    cls.name: cls for cls in (GaussianMechanism, SymmetricGaussianMechanism, LaplaceMechanism)
}
