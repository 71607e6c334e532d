"""Norm clipping: what a device does to its data or its statistic before it leaves, and
the two privacy levels ("data-point", "client": the unit whose contribution is bounded).

Differential privacy needs a bound on how much one data point (data-point-level privacy)
or one client's whole contribution (client-level privacy) can move an aggregate. The
device enforces that bound by clipping; the server then adds noise calibrated to it
(:mod:`fedcluster.privacy.mechanisms`). This module runs on devices, so it needs only
NumPy (importing it does not load the server-side privacy modules).

Three clippings:

- :func:`clip_rows_l2` clips every row (data point) to Euclidean norm ``<= bound``; used
  once on the raw points for data-point-level privacy (the bound is the paper's Δ).
- :func:`clip_l2` clips a whole statistic (any shape) to Frobenius norm ``<= bound``; used
  for Gaussian-noised statistics at client level (sums, means, XᵀX).
- :func:`clip_l1` clips a whole statistic to L1 norm ``<= bound``; used for
  Laplace-noised statistics at client level (histograms, counts).

Every function returns a new float64 array (the input is never modified), scales by
``min(1, bound / norm)`` so in-bound inputs come back unchanged, keeps all-zero rows at
zero (no 0/0), and guarantees the result's norm is ``<= bound`` even after floating-point
rounding. Non-finite input raises ``ValueError``: clipping cannot bound a NaN or an inf,
and silently passing one on would break the privacy guarantee.
"""

from __future__ import annotations

import numpy as np

__all__ = ["DATA_POINT", "CLIENT", "LEVELS", "clip_rows_l2", "clip_l2", "clip_l1"]

DATA_POINT = "data-point"
CLIENT = "client"
LEVELS = (DATA_POINT, CLIENT)

# Scaling x by bound/||x|| can land one ulp above the bound; shrinking by this factor
# afterwards (only where that happened) restores ``norm <= bound`` exactly.
_SHRINK = 1.0 - 4.0 * np.finfo(np.float64).eps


def _check_bound(bound: float) -> float:
    bound = float(bound)
    if not (bound >= 0.0):  # also rejects NaN
        raise ValueError(f"clipping bound must be a non-negative number, got {bound}")
    return bound


def _as_finite_float(array: np.ndarray, what: str) -> np.ndarray:
    result = np.array(array, dtype=np.float64, copy=True)
    if not np.all(np.isfinite(result)):
        raise ValueError(f"cannot clip {what} containing NaN or infinite values")
    return result


def _scale_factors(norms: np.ndarray, bound: float) -> np.ndarray:
    """min(1, bound / norm) elementwise, with 1 where norm is 0 (nothing to clip)."""
    factors = np.ones_like(norms)
    over = norms > bound
    factors[over] = bound / norms[over]
    return factors


def clip_rows_l2(points: np.ndarray, bound: float) -> np.ndarray:
    """Clip every row of ``points`` (n x d) to Euclidean norm at most ``bound``.

    Parameters
    ----------
    points : array of shape (n, d)
        One data point per row.
    bound : float
        The clipping radius Δ (``>= 0``; ``inf`` means no clipping).

    Returns
    -------
    numpy.ndarray of shape (n, d), float64
        ``x * min(1, bound / ||x||)`` for every row ``x``; rows already within the bound
        (including all-zero rows) are returned unchanged.
    """
    bound = _check_bound(bound)
    result = _as_finite_float(points, "points")
    if result.ndim != 2:
        raise ValueError(f"points must be a 2-D array (n x d), got shape {result.shape}")
    if result.size == 0 or np.isinf(bound):
        return result
    norms = np.linalg.norm(result, axis=1)
    result *= _scale_factors(norms, bound)[:, None]
    still_over = np.linalg.norm(result, axis=1) > bound
    if np.any(still_over):
        result[still_over] *= _SHRINK
    return result


def _clip_whole(array: np.ndarray, bound: float, order: int, what: str, scale_up: bool = False) -> np.ndarray:
    bound = _check_bound(bound)
    result = _as_finite_float(array, what)
    if result.size == 0 or np.isinf(bound):
        return result
    norm = float(np.linalg.norm(result.ravel(), ord=order))
    if norm > bound or (scale_up and norm > 0.0):
        result *= bound / norm
        if float(np.linalg.norm(result.ravel(), ord=order)) > bound:
            result *= _SHRINK
    return result


def clip_l2(array: np.ndarray, bound: float) -> np.ndarray:
    """Clip a whole statistic (any shape) to Frobenius / Euclidean norm at most ``bound``.

    The norm is taken over all entries together (a k x d matrix is one vector of k·d
    entries), which is what the sensitivity of a Gaussian mechanism on that statistic
    refers to. Returns ``array * min(1, bound / ||array||_F)`` as float64.
    """
    return _clip_whole(array, bound, 2, "a statistic")


def scale_l2(array: np.ndarray, norm: float) -> np.ndarray:
    """Scale a whole statistic to Frobenius / Euclidean norm exactly ``norm`` (a zero array
    stays zero): the sensitivity is ``norm`` whatever the data's scale.

    For a statistic the server only uses up to a positive factor per device (FedDP step 1
    keeps only the top eigenvectors of Σ XᵢᵀXᵢ), this beats clipping at any bound: every
    device contributes at the full bound, so the signal-to-noise ratio is that of a bound
    below the smallest device's norm, without choosing one from the private data.
    """
    return _clip_whole(array, norm, 2, "a statistic", scale_up=True)


def clip_l1(vector: np.ndarray, bound: float) -> np.ndarray:
    """Clip a whole statistic (any shape) to L1 norm (sum of absolute values) at most ``bound``.

    Used for Laplace-noised statistics (histograms, count vectors), whose sensitivity is
    measured in L1. Returns ``vector * min(1, bound / ||vector||_1)`` as float64.
    """
    return _clip_whole(vector, bound, 1, "a statistic")
