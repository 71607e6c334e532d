"""Argument checks shared by the privacy modules (one message per mistake, everywhere)."""

from __future__ import annotations

import math


def check_epsilon(epsilon: float) -> float:
    epsilon = float(epsilon)
    if not epsilon > 0.0:  # rejects NaN too
        raise ValueError(f"epsilon must be > 0 (inf means no privacy), got {epsilon}")
    return epsilon


def check_delta(delta: float) -> float:
    delta = float(delta)
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must be in (0, 1) for a Gaussian mechanism, got {delta}")
    return delta


def check_sensitivity(sensitivity: float) -> float:
    sensitivity = float(sensitivity)
    if not (sensitivity > 0.0 and math.isfinite(sensitivity)):
        raise ValueError(f"sensitivity must be a positive finite number, got {sensitivity}")
    return sensitivity


def check_compositions(compositions: int) -> int:
    if int(compositions) != compositions or compositions < 1:
        raise ValueError(f"compositions must be an integer >= 1, got {compositions}")
    return int(compositions)


def check_sampling_rate(sampling_rate: float | None) -> float | None:
    """None or 1 means no sampling; otherwise 0 < q < 1."""
    if sampling_rate is None:
        return None
    q = float(sampling_rate)
    if not 0.0 < q <= 1.0:
        raise ValueError(f"sampling_rate must be in (0, 1], got {sampling_rate}")
    return None if q == 1.0 else q
