"""fedcluster.checks: the one way a value is declared and checked (run-config keys, task
config, privacy arguments)."""

import math

import numpy as np
import pytest

from fedcluster.checks import Interval, StrOptions, check, typed, within
from fedcluster.config import KEYS, ConfigError
from fedcluster.protocol import Param


@pytest.mark.parametrize(
    "closed, inside, outside",
    [
        ("both", [0, 0.5, 1], [-1e-9, 1 + 1e-9]),
        ("left", [0, 0.999], [1, -0.1]),
        ("right", [1, 1e-12], [0, 1.5]),
        ("neither", [0.5], [0, 1]),
    ],
)
def test_interval_bounds_follow_closed(closed, inside, outside):
    allowed = Interval(float, 0, 1, closed=closed)
    assert all(v in allowed for v in inside) and not any(v in allowed for v in outside)


def test_an_interval_never_holds_nan_and_holds_inf_only_where_declared():
    assert math.nan not in Interval(float, 0) and math.inf not in Interval(float, 0)
    assert math.inf in Interval(float, 0, allow_inf=True) and -math.inf not in Interval(float, None, 0, allow_inf=True)
    assert 10**400 in Interval(int, 1) and 10**400 not in Interval(int, 1, 10)


def test_interval_text_says_the_bounds():
    assert str(Interval(int, 1, 10)) == "in [1, 10]"
    assert str(Interval(float, 0, 1, closed="neither")) == "in (0, 1)"
    assert str(Interval(float, 0, closed="right")) == "> 0"
    assert str(Interval(int, None, 5)) == "<= 5"
    assert str(StrOptions(("a", "b"))) == "one of a, b"


def test_a_bad_declaration_is_refused():
    for bad in (lambda: Interval(str, 0, 1), lambda: Interval(int), lambda: Interval(int, 0, 1, closed="open")):
        with pytest.raises(ValueError, match="bad Interval"):
            bad()


def test_typed_takes_numpy_scalars_and_whole_floats_and_nothing_else():
    assert typed("x", np.float64(0.5), float) == 0.5 and type(typed("x", np.float64(0.5), float)) is float
    assert typed("x", np.int64(3), int) == 3 and type(typed("x", 3.0, int)) is int
    assert typed("x", np.True_, bool) is True and typed("x", 2, float) == 2.0
    assert typed("x", 10**400, int) == 10**400 and typed("x", np.longdouble(0.25), float) == 0.25
    for value, kind, message in [
        (True, int, "x must be an integer"),
        (3.5, int, "x must be an integer"),
        ("3", float, "x must be a number"),
        (1, bool, "x must be true or false"),
        (3, str, "x must be a string"),
        (np.array([3]), int, "x must be an integer"),
        (math.nan, float, "x must be a finite number"),
        (math.inf, int, "x must be a finite number"),
    ]:
        with pytest.raises(ValueError, match=message):
            typed("x", value, kind)


def test_inf_only_where_the_declaration_allows_it():
    with pytest.raises(ValueError, match="finite"):
        check("x", math.inf, float, Interval(float, 0, closed="right"))
    assert check("x", math.inf, float, Interval(float, 0, closed="right", allow_inf=True)) == math.inf
    with pytest.raises(ValueError, match="x must be > 0, got -inf"):
        check("x", -math.inf, float, Interval(float, 0, closed="right", allow_inf=True))


def test_within_names_the_value_and_what_it_must_be():
    with pytest.raises(KeyError, match=r"k must be in \[1, 9\], got 0 \(hint\)"):
        within("k", 0, Interval(int, 1, 9), KeyError, " (hint)")
    assert within("s", "a", StrOptions(("a",))) == "a" and within("s", "z", None) == "z"


def test_a_run_config_key_and_a_task_param_with_one_declaration_agree():
    key = KEYS["dirichlet-alpha"]
    param = Param("dirichlet-alpha", float, allowed=key.allowed)
    for value in (0.3, 0, -1, math.inf, "x", True):
        try:
            key.check(key.coerce(value))
            key_ok = True
        except ConfigError:
            key_ok = False
        try:
            param.parse({"dirichlet-alpha": value})
            param_ok = True
        except ValueError:
            param_ok = False
        assert key_ok == param_ok == (value == 0.3), value


def test_the_privacy_arguments_are_checked_the_same_way():
    from fedcluster.privacy.calibration import analytic_gaussian_sigma as gaussian_sigma

    with pytest.raises(ValueError, match="epsilon must be > 0, got 0.0 \\(inf means no privacy\\)"):
        gaussian_sigma(0.0, 1e-5, 1.0)
    with pytest.raises(ValueError, match=r"delta must be in \(0, 1\), got 1.0"):
        gaussian_sigma(1.0, 1.0, 1.0)
    with pytest.raises(ValueError, match="sensitivity must be > 0, got -1.0"):
        gaussian_sigma(1.0, 1e-5, -1.0)
