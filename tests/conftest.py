"""Shared test helpers."""

from __future__ import annotations

import os
import sys
from pathlib import Path

# One BLAS thread per process: on a busy 2-core machine OpenBLAS threads oversubscribe
# the cores and slow dense linear algebra down 10x. Set before NumPy loads.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402
import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def graphs_dir() -> Path | None:
    """The SNAP graphs: $FEDCLUSTER_GRAPHS or ../shared/data/graphs beside the project."""
    candidates = [os.environ.get("FEDCLUSTER_GRAPHS", ""), str(ROOT.parent / "shared" / "data" / "graphs")]
    for candidate in candidates:
        if candidate and (Path(candidate) / "email-Eu-core.txt").is_file():
            return Path(candidate).resolve()
    return None


def lloyd_step(X, C):
    """One Lloyd step written out directly, independent of fedcluster.lloyd (empty
    clusters keep their center): the oracle of several tests."""
    labels = ((X[:, None, :] - C[None]) ** 2).sum(-1).argmin(1)
    out = C.copy()
    for j in range(C.shape[0]):
        if np.any(labels == j):
            out[j] = X[labels == j].mean(0)
    return out


def write_npy_dir(directory: Path, arrays: list[np.ndarray]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for i, array in enumerate(arrays):
        np.save(directory / f"client_{i:03d}.npy", array)
    return directory


@pytest.fixture
def blobs():
    """Three well separated 2-D blobs split over 4 clients (non-IID)."""
    rng = np.random.default_rng(7)
    means = np.array([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]])
    parts = []
    for i in range(4):
        chosen = means[[i % 3, (i + 1) % 3]]
        parts.append(np.concatenate([m + rng.normal(size=(30 + 5 * i, 2)) for m in chosen]))
    return parts
