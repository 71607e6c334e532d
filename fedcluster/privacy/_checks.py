"""The privacy modules' arguments, declared once and checked by :func:`fedcluster.checks.check`
(the one way every value of the project is checked)."""

from __future__ import annotations

from ..checks import Interval, check

EPSILON = Interval(float, 0, None, closed="right", allow_inf=True)  # inf: no privacy
DELTA = Interval(float, 0, 1, closed="neither")  # a Gaussian mechanism needs 0 < δ < 1
SENSITIVITY = Interval(float, 0, None, closed="right")
COMPOSITIONS = Interval(int, 1)
SAMPLING_RATE = Interval(float, 0, 1, closed="right")


def check_epsilon(epsilon: float) -> float:
    return check("epsilon", epsilon, float, EPSILON, hint=" (inf means no privacy)")


def check_delta(delta: float) -> float:
    return check("delta", delta, float, DELTA, hint=" (a Gaussian mechanism needs 0 < delta < 1)")


def check_sensitivity(sensitivity: float) -> float:
    return check("sensitivity", sensitivity, float, SENSITIVITY)


def check_compositions(compositions: int) -> int:
    return check("compositions", compositions, int, COMPOSITIONS)


def check_sampling_rate(sampling_rate: float | None) -> float | None:
    """None or 1 means no sampling; otherwise 0 < q < 1."""
    if sampling_rate is None:
        return None
    q = check("sampling_rate", sampling_rate, float, SAMPLING_RATE)
    return None if q == 1.0 else q
