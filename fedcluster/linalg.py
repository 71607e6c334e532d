"""Dense linear algebra shared by every algorithm: one orthonormalization, one top-k
symmetric eigensolver, one Rayleigh-Ritz step. NumPy only (SciPy's subset eigensolver is
used when it is installed, so a device never needs SciPy).

Users: k-FED's projection onto the top right singular vectors (docs/ALGORITHMS.md §4),
FedDP-KMeans' top eigenvectors of the noisy XᵀX (§3), FedSpectral(+)'s Ritz vectors on
the server and on the device (§5).
"""

from __future__ import annotations

import numpy as np

__all__ = ["orthonormalize", "top_eigenpairs", "rayleigh_ritz"]


def orthonormalize(Q: np.ndarray) -> np.ndarray:
    """Orthonormal basis of the columns of ``Q`` by ``numpy.linalg.qr`` (reduced), with the
    signs fixed so that ``diag(R) >= 0``: the result is then a continuous, unique function
    of a full-rank ``Q`` (a federated and a central run produce the same basis, not one
    with flipped columns)."""
    Q = np.asarray(Q, dtype=np.float64)
    if Q.ndim != 2:
        raise ValueError(f"orthonormalize needs a 2-D array, got shape {Q.shape}")
    basis, R = np.linalg.qr(Q)
    signs = np.sign(np.diag(R))
    signs[signs == 0] = 1.0
    return basis * signs


def top_eigenpairs(matrix: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``count`` largest eigenpairs of the symmetric ``matrix``: ``(values, vectors)``,
    values descending, eigenvectors as contiguous columns.

    SciPy's subset solver (LAPACK ``syevr``; about twice as fast for count << size) when
    SciPy is installed, NumPy's full ``eigh`` otherwise. Raises
    ``numpy.linalg.LinAlgError`` when the eigensolver fails.
    """
    matrix = np.asarray(matrix, dtype=np.float64)
    if matrix.ndim != 2 or matrix.shape[0] != matrix.shape[1]:
        raise ValueError(f"top_eigenpairs needs a square matrix, got shape {matrix.shape}")
    size = matrix.shape[0]
    if not 1 <= count <= size:
        raise ValueError(f"count must be between 1 and {size}, got {count}")
    try:
        from scipy.linalg import eigh as scipy_eigh
    except ImportError:  # a NumPy-only device
        values, vectors = np.linalg.eigh(matrix)
    else:
        try:
            values, vectors = scipy_eigh(
                matrix, subset_by_index=[size - count, size - 1], driver="evr", check_finite=False
            )
        except Exception as exc:  # scipy.linalg.LinAlgError subclasses numpy's
            raise np.linalg.LinAlgError(str(exc)) from exc
    return values[::-1][:count].copy(), np.ascontiguousarray(vectors[:, ::-1][:, :count])


def rayleigh_ritz(Q: np.ndarray, MQ: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-``k`` Ritz pairs of a symmetric M in ``span(Q)``, from ``Q`` (orthonormal columns,
    n x b) and ``MQ = M @ Q``: eigen-decompose ``H = Qᵀ M Q`` (symmetrized) and return
    ``(values, Q @ V_k)``, values descending."""
    Q = np.asarray(Q, dtype=np.float64)
    MQ = np.asarray(MQ, dtype=np.float64)
    if Q.shape != MQ.shape or Q.ndim != 2:
        raise ValueError(f"Q {Q.shape} and MQ {MQ.shape} must be 2-D of the same shape")
    if not 1 <= k <= Q.shape[1]:
        raise ValueError(f"k must be between 1 and the block size {Q.shape[1]}, got {k}")
    H = Q.T @ MQ
    values, V = np.linalg.eigh(0.5 * (H + H.T))
    top = np.argsort(values)[::-1][:k]
    return values[top], Q @ V[:, top]
