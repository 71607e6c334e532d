"""One way to declare and check a value, everywhere: run-config keys (:mod:`fedcluster.config`),
the config of a task's request (:mod:`fedcluster.protocol`) and the arguments of the privacy
modules (:mod:`fedcluster.privacy`). scikit-learn's ``Interval`` / ``StrOptions`` are the model.

A value is declared with a type (``int``, ``float``, ``str``, ``bool``) and what is allowed
(:class:`Interval`, :class:`StrOptions` or ``None``: any value of the type), and checked
once by :func:`check`, which names the value and what it must be in its message.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

CLOSED = ("both", "left", "right", "neither")


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() and abs(value) < 1e15 else f"{value:g}"


@dataclass(frozen=True)
class Interval:
    """Numbers between ``low`` and ``high`` (``None``: unbounded on that side); ``closed``
    says which bounds are allowed values (``both``, ``left``, ``right``, ``neither``).
    ``allow_inf``: ``inf`` is allowed too (``epsilon = inf`` means no privacy)."""

    kind: type
    low: float | None = None
    high: float | None = None
    closed: str = "both"
    allow_inf: bool = False

    def __post_init__(self) -> None:
        if self.kind not in (int, float) or self.closed not in CLOSED or (self.low is None and self.high is None):
            raise ValueError(f"bad Interval declaration: {self!r}")

    def __contains__(self, value: Any) -> bool:
        if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
            return self.allow_inf and value == math.inf
        low_open, high_open = self.closed in ("right", "neither"), self.closed in ("left", "neither")
        low_bad = self.low is not None and (value <= self.low if low_open else value < self.low)
        high_bad = self.high is not None and (value >= self.high if high_open else value > self.high)
        return not (low_bad or high_bad)

    def __str__(self) -> str:
        low_open, high_open = self.closed in ("right", "neither"), self.closed in ("left", "neither")
        if self.low is not None and self.high is not None:
            text = f"in {'(' if low_open else '['}{_num(self.low)}, {_num(self.high)}{')' if high_open else ']'}"
            return text + " or inf" if self.allow_inf else text
        if self.low is not None:
            return f"{'>' if low_open else '>='} {_num(self.low)}"
        return f"{'<' if high_open else '<='} {_num(self.high)}"


@dataclass(frozen=True)
class StrOptions:
    """One of the strings ``options``."""

    options: tuple[str, ...]

    def __contains__(self, value: Any) -> bool:
        return value in self.options

    def __str__(self) -> str:
        return f"one of {', '.join(self.options)}"


KIND_TEXT = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}


def typed(
    label: str,
    value: Any,
    kind: type,
    allowed: Interval | StrOptions | None = None,
    error: type[Exception] = ValueError,
) -> Any:
    """``value`` as a ``kind`` (a NumPy scalar as the number it holds, an int as a float, a
    whole float as an int), or ``error`` saying what ``label`` must be. Numbers must be finite
    unless ``allowed`` allows ``inf``."""
    if type(value).__module__ == "numpy" and getattr(value, "ndim", None) == 0:
        value = value.item()  # np.float64(1e-5), np.int64(3), np.True_
        if type(value).__module__ == "numpy":  # np.longdouble has no Python counterpart
            value = float(value)
    if kind in (bool, str):
        if not isinstance(value, kind):
            raise error(f"{label} must be {KIND_TEXT[kind]}, got {value!r}")
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise error(f"{label} must be {KIND_TEXT[kind]}, got {value!r}")
    if isinstance(value, float) and (
        math.isnan(value) or (math.isinf(value) and not (isinstance(allowed, Interval) and allowed.allow_inf))
    ):
        raise error(f"{label} must be a finite number, got {value!r}")
    if kind is float:
        try:
            return float(value)
        except OverflowError:  # an integer beyond float64
            raise error(f"{label} must be a finite number, got an integer of {len(str(abs(value)))} digits") from None
    if isinstance(value, float) and not value.is_integer():
        raise error(f"{label} must be an integer, got {value!r}")
    return int(value)


def within(
    label: str, value: Any, allowed: Interval | StrOptions | None, error: type[Exception] = ValueError, hint: str = ""
) -> Any:
    """``value`` if ``allowed`` allows it, else ``error`` saying what ``label`` must be."""
    if allowed is not None and value not in allowed:
        raise error(f"{label} must be {allowed}, got {value!r}{hint}")
    return value


def check(
    label: str,
    value: Any,
    kind: type,
    allowed: Interval | StrOptions | None = None,
    error: type[Exception] = ValueError,
    hint: str = "",
) -> Any:
    """:func:`typed`, then :func:`within`: the value checked once, as its declaration says."""
    return within(label, typed(label, value, kind, allowed, error), allowed, error, hint)
