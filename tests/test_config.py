import tomllib
from pathlib import Path

import pytest

from fedcluster.config import DEFAULTS, ConfigError, parse_run_config, with_defaults

ROOT = Path(__file__).resolve().parents[1]


def test_pyproject_declares_every_key_with_the_same_default():
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    assert declared == DEFAULTS


def test_unknown_key_is_rejected_with_a_hint():
    with pytest.raises(ConfigError, match="did you mean 'num-rounds'"):
        with_defaults({"num-round": 3})


def test_wrong_type_and_range_are_named():
    with pytest.raises(ConfigError, match="'k' must be of type int"):
        with_defaults({"k": "five"})
    with pytest.raises(ConfigError, match="fraction must be in"):
        with_defaults({"fraction": 0.0})
    with pytest.raises(ConfigError, match="unknown algorithm"):
        with_defaults({"algorithm": "dbscan"})
    with pytest.raises(ConfigError, match="needs run-config data-dir"):
        with_defaults({"dataset": "npy-dir"})


def test_parse_run_config_reads_flower_syntax():
    parsed = parse_run_config("k=8 dataset='npy-dir' data-dir=\"/tmp/a b\" tol=1e-6 reference=false")
    assert parsed == {"k": 8, "dataset": "npy-dir", "data-dir": "/tmp/a b", "tol": 1e-6, "reference": False}
    with pytest.raises(ConfigError, match="strings need quotes"):
        parse_run_config("dataset=npy-dir")


def test_every_config_file_is_valid():
    files = sorted((ROOT / "configs").glob("*.toml"))
    assert files
    for path in files:
        with_defaults(parse_run_config(str(path)))


def test_missing_config_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match="nope.toml does not exist"):
        parse_run_config(str(tmp_path / "nope.toml"))
