"""The server's helpers on point data: the federation's dimension by vote, its bounding box,
how far centers moved, and centers that coincide."""

from __future__ import annotations

from typing import Sequence

import numpy as np


def majority_value(values: Sequence[int]) -> int:
    """The value most entries have (ties: the smaller)."""
    if len(values) == 0:
        raise ValueError("no values to vote on")
    unique, counts = np.unique(np.asarray(values, dtype=np.int64), return_counts=True)
    return int(unique[np.argmax(counts)])


def bounding_box(lows: Sequence[np.ndarray], highs: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The federation's bounding box from the devices' per-coordinate minima and maxima."""
    return np.min(lows, axis=0), np.max(highs, axis=0)


def duplicate_warning(centers: np.ndarray) -> str | None:
    """What to say when some of the centers a run returns are the same point (the devices'
    points hold fewer distinct values than k: at 1e150 a spread of 1e134 is one value), or
    None when every center is its own."""
    k = centers.shape[0]
    duplicates = k - np.unique(centers, axis=0).shape[0]
    if not duplicates:
        return None
    return (
        f"{duplicates} of the k={k} centers coincide with another one: the devices' points hold fewer distinct "
        f"values than k (centers.npy keeps the duplicates; k={k - duplicates} describes these data as well)"
    )


def center_shift(new: np.ndarray, old: np.ndarray) -> float:
    """How far a round moved the centers: the Frobenius norm of ``new - old``."""
    return float(np.sqrt(np.sum((new - old) ** 2)))
