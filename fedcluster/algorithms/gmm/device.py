"""The device kernel of the E-step (``protocol.TASKS``): NumPy only. Every quantity is taken
about the components' current means (``x − μ``), so that data far from the origin cost no
precision; the log-densities are combined by log-sum-exp."""

from __future__ import annotations

import math

import numpy as np

from fedcluster.kernel import DeviceData, device_task
from fedcluster.lloyd import nearest
from fedcluster.shared_kernels import matching_dimension
from fedcluster.task import named

from .protocol import TASKS


def log_densities(X: np.ndarray, means: np.ndarray, precision_chol: np.ndarray) -> np.ndarray:
    """(n, k) log N(x | μ_k, Σ_k) with Σ_k⁻¹ = U_k U_kᵀ: ``precision_chol`` (k, d, d) upper
    factors, or (k, d) the diagonal ones (1/σ per coordinate); log det U from |diag U|."""
    n, d = X.shape
    out = np.empty((n, means.shape[0]))
    for j, mu in enumerate(means):
        U = precision_chol[j]
        if U.ndim == 2:
            y, log_det = (X - mu) @ U, np.sum(np.log(np.abs(np.diag(U))))
        else:
            y, log_det = (X - mu) * U, np.sum(np.log(np.abs(U)))
        out[:, j] = -0.5 * (d * math.log(2 * math.pi) + np.einsum("ij,ij->i", y, y)) + log_det
    return out


def log_responsibilities(
    X: np.ndarray, means: np.ndarray, weights: np.ndarray, precision_chol: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per point its log p(x) (n,) and its log-responsibilities (n, k), by log-sum-exp."""
    with np.errstate(divide="ignore"):
        weighted = log_densities(X, means, precision_chol) + np.log(weights)
    top = np.max(weighted, axis=1, keepdims=True)
    log_norm = top[:, 0] + np.log(np.sum(np.exp(weighted - top), axis=1))
    return log_norm, weighted - log_norm[:, None]


def estep_statistics(
    X: np.ndarray, means: np.ndarray, weights: np.ndarray, precision_chol: np.ndarray, hard: bool = False
) -> dict[str, np.ndarray]:
    """The sums the M-step needs: Σ r, Σ r (x − μ), Σ r (x − μ)(x − μ)ᵀ (``outer``, full
    factors) or its diagonal (``squares``), and Σ log p(x). ``hard``: r one-hot on the
    nearest mean (Lloyd's statistics)."""
    log_norm, log_resp = log_responsibilities(X, means, weights, precision_chol)
    if hard:
        resp = np.zeros_like(log_resp)
        resp[np.arange(X.shape[0]), nearest(X, means)] = 1.0
    else:  # below the smallest normal float a responsibility is 0: subnormals would lose its sums' precision
        resp = np.exp(log_resp)
        resp[resp < np.finfo(np.float64).tiny] = 0.0
    k, d = means.shape
    full = precision_chol.ndim == 3
    sums, second = np.empty((k, d)), np.empty((k, d, d) if full else (k, d))
    for j, mu in enumerate(means):
        D = X - mu
        r = resp[:, j]
        sums[j] = r @ D
        second[j] = D.T @ (D * r[:, None]) if full else r @ (D * D)
    out = {"counts": resp.sum(axis=0), "sums": sums, "loglik": np.array([float(np.sum(log_norm))])}
    out["outer" if full else "squares"] = second
    return out


@device_task(named(TASKS, "gmm_estep"))
def gmm_estep(data: DeviceData, arrays: dict, config: dict):
    """The E-step statistics of every mixture of the request (m starts side by side), each
    start's arrays stacked on a leading axis."""
    X = data.require_points()
    means = matching_dimension(X, arrays["means"])
    factors = arrays["precision-chol"] if config["full"] else arrays["precision-chol-diag"]
    weights = arrays["weights"]
    if factors.shape[:2] != means.shape[:2] or weights.shape != means.shape[:2]:
        raise ValueError("gmm_estep: means, weights and precision factors must have one row per start and component")
    diagonal = np.diagonal(factors, axis1=-2, axis2=-1) if config["full"] else factors
    if np.any(diagonal == 0) or not np.all(np.sum(weights, axis=1) > 0):
        raise ValueError("gmm_estep: the precision factors must be invertible and no start's weights all zero")
    starts = [estep_statistics(X, means[s], weights[s], factors[s], config["hard"]) for s in range(means.shape[0])]
    stacked = {name: np.stack([start[name] for start in starts]) for name in starts[0]}
    stacked["loglik"] = stacked["loglik"][:, 0]
    return stacked, {"num-examples": int(X.shape[0])}
