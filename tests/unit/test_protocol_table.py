"""The protocol table (fedcluster/protocol.py): requests parse to typed inputs, and every
field of every declared reply, made hostile, is refused with a reason, never an exception.
Generated over the table, so a new task is covered the moment it is declared."""

from __future__ import annotations

import numpy as np
import pytest

from fedcluster import protocol
from fedcluster.device import kernels

SIZES = {
    "k": 3,
    "d": 4,
    "m": 2,
    "n": 6,
    "b": 2,
    "s": 5,
    "r": 2,
    "p": 10,
    "c": 3,
    "u": 4,
    "q": 6,
    "e": 2,
    "a": 3,
    "v": 1,
    "g": 1,
    "w": 1,
    "h": 2,
    "i": 5,
    "*": 7,
}


def valid_reply(spec: protocol.Task, config: dict) -> tuple[dict, dict]:
    arrays = {}
    for field in spec.reply:
        if field.when and config.get(field.when[0]) != field.when[1]:
            continue
        value = np.ones(tuple(SIZES[s] if isinstance(s, str) else s for s in field.shape))
        arrays[field.name] = value
    return arrays, {key: 7 for key in spec.metrics}


def reply_cases():
    for spec in protocol.TASKS.values():
        levels = {p.name: p.allowed.options for p in spec.config if p.name == "level"}
        configs = [{"level": level} for level in levels.get("level", ())] or [{}]
        for config in configs:
            yield pytest.param(spec, config, id=f"{spec.name}-{config.get('level', 'any')}")


@pytest.mark.parametrize("spec, config", list(reply_cases()))
def test_every_hostile_reply_field_is_refused_with_a_reason(spec, config):
    arrays, metrics = valid_reply(spec, config)
    assert spec.check_reply(arrays, metrics, SIZES, config) is None
    hostile_values = {
        "strings": lambda a: np.full(a.shape, "x"),
        "complex": lambda a: a.astype(np.complex128),
        "nan": lambda a: np.full(a.shape, np.nan),
        "inf": lambda a: np.full(a.shape, -np.inf),
        "wrong rank": lambda a: a[..., None],
        "wrong size": lambda a: np.ones(tuple(s + 1 for s in a.shape)),
        "not an array": lambda a: a.tolist(),
    }
    for name in arrays:
        field = next(f for f in spec.reply if f.name == name)
        cases = dict(hostile_values)
        if field.nonnegative:
            cases["negative"] = lambda a: -a
        if field.integer:
            cases["fractional"] = lambda a: a + 0.5
        for case, make in cases.items():
            bad = {**arrays, name: make(arrays[name])}
            reason = spec.check_reply(bad, metrics, SIZES, config)
            assert reason and name in reason, (spec.name, name, case, reason)
        missing = {key: value for key, value in arrays.items() if key != name}
        assert "misses array" in spec.check_reply(missing, metrics, SIZES, config)
    for bad_value in (float("nan"), -5, 2.5, "7", True, float("inf")):
        reason = spec.check_reply(arrays, {**metrics, protocol.PARTITION: bad_value}, SIZES, config)
        assert reason and protocol.PARTITION in reason, (spec.name, bad_value)
    for good_value in (-1, 0, 2**62, 3.0):
        assert spec.check_reply(arrays, {**metrics, protocol.PARTITION: good_value}, SIZES, config) is None
    for key in spec.metrics:
        for bad_value in (float("nan"), -1, "7", None, float("inf")):
            reason = spec.check_reply(arrays, {**metrics, key: bad_value}, SIZES, config)
            assert reason and key in reason, (spec.name, key, bad_value)
        assert "misses metric" in spec.check_reply(
            arrays, {k: v for k, v in metrics.items() if k != key}, SIZES, config
        )


def test_a_free_symbol_must_agree_between_the_arrays_of_one_reply():
    spec = protocol.task("local_summary")
    reason = spec.check_reply({"centers": np.ones((3, 4)), "counts": np.ones(2)}, {"num-examples": 5}, {"d": 4})
    assert reason and "counts" in reason and "c=3" in reason


@pytest.mark.parametrize("spec", list(protocol.TASKS.values()), ids=lambda s: s.name)
def test_every_declared_task_has_a_kernel_and_every_kernel_a_declaration(spec):
    assert spec.name in kernels()
    assert set(kernels()) <= set(protocol.TASKS)
    assert spec.kind in ("query", "train")


def test_requests_parse_to_typed_values_and_bad_ones_name_the_key():
    spec = protocol.task("fedkmeans_train")
    arrays, config = spec.parse_request({"centers": np.ones((1, 2, 3), dtype=np.float32)}, {"batch-size": 4.0})
    assert arrays["centers"].dtype == np.float64
    assert config == {"local-epochs": 1, "batch-size": 4, "client-lr": 1.0, "seed": 0}
    assert type(config["batch-size"]) is int
    with pytest.raises(ValueError, match=r"'client-lr' must be in \(0, 1\], got 2.0"):
        spec.parse_request({"centers": np.ones((1, 2, 3))}, {"client-lr": 2.0})
    with pytest.raises(ValueError, match="'batch-size' must be an integer"):
        spec.parse_request({"centers": np.ones((1, 2, 3))}, {"batch-size": 2.5})
    with pytest.raises(ValueError, match="unknown config bogus"):
        spec.parse_request({"centers": np.ones((1, 2, 3))}, {"bogus": 1})
    with pytest.raises(ValueError, match="needs array 'centers'"):
        spec.parse_request({}, {})
    with pytest.raises(ValueError, match="'centers' contains NaN"):
        spec.parse_request({"centers": np.full((1, 2, 3), np.nan)}, {})
    with pytest.raises(ValueError, match="must hold real numbers"):
        spec.parse_request({"centers": np.full((1, 2, 3), "a")}, {})
    with pytest.raises(ValueError, match="'seeding' must be one of"):
        protocol.task("kfed_local").parse_request({}, {"k-prime": 2, "seeding": "x"})
    with pytest.raises(ValueError, match="no config 'k-prime'"):
        protocol.task("kfed_local").parse_request({}, {})


@pytest.mark.parametrize("spec, config", list(reply_cases()))
def test_every_reply_is_refused_by_its_declared_sizes_and_dtypes_before_decoding(spec, config):
    """check_layout sees only (dtype, shape) as an array's metadata states them."""
    arrays, _ = valid_reply(spec, config)
    fields = {f.name: f for f in spec.reply}
    honest = {"real": np.float64, "integer": np.int64, "byte": np.uint8}
    layouts = {name: (np.dtype(honest[fields[name].dtype]), value.shape) for name, value in arrays.items()}
    assert spec.check_layout(layouts, SIZES, config) is None
    reason = spec.check_layout({**layouts, "junk": (np.dtype(np.float64), (10**8,))}, SIZES, config)
    assert reason and "undeclared array 'junk'" in reason
    for name, (dtype, shape) in layouts.items():
        for case, bad in {
            "complex": (np.dtype(np.complex128), shape),
            "object": (np.dtype(object), shape),
            "wide": (np.dtype(np.float64) if fields[name].dtype == "byte" else np.dtype(np.longdouble), shape),
            "rank": (dtype, shape + (1,)),
            "rows": (dtype, (10**9,) + shape[1:]),
            **(
                {
                    "float32": (np.dtype(np.float32), shape),
                    "int": (np.dtype(np.int64), shape),
                    "bool": (np.dtype(bool), shape),
                }
                if fields[name].dtype == "real"
                else {}
            ),
        }.items():
            reason = spec.check_layout({**layouts, name: bad}, SIZES, config)
            assert reason and repr(name) in reason, (spec.name, name, case, reason)


def test_a_symbol_the_device_chooses_is_held_to_its_declared_limit():
    spec = protocol.task("local_summary")
    layouts = lambda c: {"centers": (np.dtype(np.float64), (c, 4)), "counts": (np.dtype(np.float64), (c,))}
    assert spec.check_layout(layouts(5), {"d": 4}, {"k": 5}) is None
    reason = spec.check_layout(layouts(6), {"d": 4}, {"k": 5})
    assert reason and "c=6" in reason and "c ≤ k" in reason
    reason = protocol.task("data_summary").check_layout(
        {"min": (np.dtype(np.float64), (protocol.FREE_MAX + 1,))}, {"d": None}
    )
    assert reason and "'min'" in reason and str(protocol.FREE_MAX) in reason


def test_the_request_binds_the_sizes_of_its_reply():
    spec = protocol.task("lloyd_stats")
    sizes = spec.request_sizes({"centers": np.ones((3, 4))}, {"d": None})
    assert sizes["k"] == 3 and sizes["d"] == 4
    assert spec.request_sizes({"centers": np.ones((3, 4))}, {"k": 2})["k"] == 2  # the server's own sizes win
