import tomllib
from pathlib import Path

import pytest

from fedcluster.config import DEFAULTS, ConfigError, parse_run_config, with_defaults

ROOT = Path(__file__).resolve().parents[2]


def test_pyproject_declares_every_key_with_the_same_default():
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    assert declared == DEFAULTS


def test_pyprojects_defaults_are_the_generated_ones():
    from fedcluster.config import PYPROJECT_END, PYPROJECT_START, pyproject_block

    text = (ROOT / "pyproject.toml").read_text()
    assert PYPROJECT_START + pyproject_block() + PYPROJECT_END in text, (
        "regenerate: python -m fedcluster.config pyproject.toml"
    )


def test_unknown_key_is_rejected_with_a_hint():
    with pytest.raises(ConfigError, match="did you mean 'num-rounds'"):
        with_defaults({"num-round": 3})


def test_wrong_type_and_range_are_named():
    with pytest.raises(ConfigError, match="run-config k must be an integer"):
        with_defaults({"k": "five"})
    with pytest.raises(ConfigError, match="fraction must be in"):
        with_defaults({"fraction": 0.0})
    with pytest.raises(ConfigError, match="algorithm must be one of"):
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


@pytest.mark.parametrize(
    "key, value",
    [
        ("min-reply-fraction", 2.0),
        ("batch-size", -5),
        ("tol", float("nan")),
        ("node-wait-s", -1),
        ("num-rounds", 1e20),
        ("epsilon", -1.0),
        ("delta", 1.0),
        ("momentum", 1.0),
        ("k", 0),
        ("round-timeout", 0.0),
        ("separation", float("inf")),
        ("noise-seed", -2),
    ],
)
def test_every_out_of_range_value_is_refused_with_its_key_named(key, value):
    with pytest.raises(ConfigError, match=f"run-config {key} must be"):
        with_defaults({key: value})


def test_every_numeric_key_has_a_range():
    from fedcluster.checks import Interval
    from fedcluster.config import KEYS

    for key in KEYS.values():
        if key.kind in (int, float):
            assert isinstance(key.allowed, Interval) and key.allowed.kind is key.kind, key.name
            assert key.allowed.low is not None and (key.allowed.high is not None or key.kind is float), key.name


def test_cross_key_rules_are_checked_before_the_run():
    feddp = {"algorithm": "feddp-kmeans", "dataset": "feddp-mixture"}  # with server data: FedDP-Init's four steps
    with pytest.raises(ConfigError, match="step-epsilons must give 4 positive values"):
        with_defaults({**feddp, "step-epsilons": "0.1,0.2"})
    with pytest.raises(ConfigError, match="step-epsilons must give 6"):
        with_defaults({**feddp, "init": "feddp", "lloyd-rounds": 2, "step-epsilons": "1,1,1,1"})
    with_defaults({**feddp, "init": "feddp", "lloyd-rounds": 2, "step-epsilons": "1,1,1,1,1,1"})
    # with Lloyd rounds at data-point level, auto starts from the histogram of server-point candidates
    with pytest.raises(ConfigError, match="must give 3 .* step2, lloyd_gaussian, lloyd_laplace"):
        with_defaults({**feddp, "lloyd-rounds": 2, "step-epsilons": "1,1,1,1"})
    with pytest.raises(ConfigError, match="must give 6"):  # client level: FedDP-Init
        with_defaults({**feddp, "privacy-level": "client", "lloyd-rounds": 2, "step-epsilons": "1,1,1,1"})
    with pytest.raises(ConfigError, match="budget-split must be four"):
        with_defaults({"algorithm": "feddp-kmeans", "budget-split": "1,2"})
    with pytest.raises(ConfigError, match="run-config init must be one of auto, local-summaries"):
        with_defaults({"algorithm": "fedkmeans", "init": "sphere-packing"})  # FedDP-KMeans' start, not FedKMeans'
    assert (
        with_defaults({"algorithm": "feddp-kmeans", "init": "sphere-packing", "lloyd-rounds": 1}).init
        == "sphere-packing"
    )
    with pytest.raises(ConfigError, match="needs run-config server-data"):
        with_defaults({"algorithm": "fedkmeans", "init": "server-kmeans++"})


def test_a_key_the_algorithm_does_not_read_is_refused_unless_at_its_default():
    with pytest.raises(
        ConfigError, match=r"run-config fraction = 0.5 is not read by algorithm 'kfed' \(a key of fedkmeans"
    ):
        with_defaults({"algorithm": "kfed", "fraction": 0.5})
    with pytest.raises(
        ConfigError, match="standardize = True is not read by algorithm 'feddp-kmeans'.*privacy guarantee"
    ):
        with_defaults({"algorithm": "feddp-kmeans", "standardize": True})
    with pytest.raises(ConfigError, match="kfed-min-devices = 2 is not read by algorithm 'da-ufl'"):
        with_defaults({"algorithm": "da-ufl", "kfed-min-devices": 2})
    assert (
        with_defaults({"algorithm": "kfed", "fraction": 1.0, "epsilon": 1}).kfed_weighting == "count"
    )  # defaults pass
    with pytest.raises(ConfigError, match="run-config epsilon must be"):  # a value out of range is named as such first
        with_defaults({"algorithm": "kfed", "epsilon": -1.0})
    # A key several algorithms read is declared in each of their sections, with one default.
    from fedcluster import config

    readers = {s.name for s in config.sections() if any(key.name == "aggregation" for key in s.keys)}
    assert readers == {"fedkmeans", "da-ufl"}
    assert with_defaults({"algorithm": "da-ufl", "aggregation": "median"}).aggregation == "median"


def test_a_key_read_only_under_another_key_is_refused_without_it():
    # FedKMeans' k-FED start reads k-FED's keys; its server-kmeans++ start reads server-data.
    assert (
        with_defaults(
            {"algorithm": "fedkmeans", "init": "kfed", "k-prime": 3, "kfed-weighting": "capped-count"}
        ).k_prime
        == 3
    )
    with pytest.raises(ConfigError, match="k-prime is read by FedKMeans only with init='kfed', not init='auto'"):
        with_defaults({"algorithm": "fedkmeans", "k-prime": 3})
    with pytest.raises(ConfigError, match=r"server-data is read by FedKMeans only with init='server-kmeans\+\+'"):
        with_defaults({"algorithm": "fedkmeans", "server-data": "server.npy"})
    with pytest.raises(ConfigError, match="server-data = 'server.npy' is not read by algorithm 'kfed'"):
        with_defaults({"algorithm": "kfed", "server-data": "server.npy"})
    # The two graph algorithms read different keys.
    with pytest.raises(ConfigError, match="coassociation = 'all-clients' is not read by algorithm 'fedspectral-plus'"):
        with_defaults({"algorithm": "fedspectral-plus", "num-nodes": 10, "coassociation": "all-clients"})
    with pytest.raises(ConfigError, match="mode = 'paper' is not read by algorithm 'fedspectral'"):
        with_defaults({"algorithm": "fedspectral", "num-nodes": 10, "mode": "paper"})
    # A value another algorithm allows is refused as not read, not as out of range.
    with pytest.raises(ConfigError, match="init = 'feddp' is not read by algorithm 'kfed'"):
        with_defaults({"algorithm": "kfed", "init": "feddp"})


def test_one_key_declared_with_two_defaults_is_a_declaration_error(monkeypatch):
    from fedcluster import config

    twice = config.Section("twice", (config.Key("k", 6, "another default"),))
    monkeypatch.setattr(config, "sections", lambda: (config.COMMON, twice))
    config.keys.cache_clear()
    try:
        with pytest.raises(RuntimeError, match="run-config key 'k' is declared with two defaults: 5 and 6"):
            config.keys()
    finally:
        config.keys.cache_clear()


def test_values_arrive_typed():
    config = with_defaults({"algorithm": "feddp-kmeans", "k": 7.0, "epsilon": 2, "num-rounds": 3})
    assert type(config["k"]) is int and type(config["epsilon"]) is float and type(config["num-rounds"]) is int


def test_numpy_scalars_are_taken_as_the_numbers_they_hold():
    import numpy as np

    config = with_defaults(
        {
            "algorithm": "feddp-kmeans",
            "delta": np.float64(1e-5),
            "k": np.int64(3),
            "evaluate-cost": np.False_,
            "epsilon": np.float32(2.0),
        }
    )
    assert (config["delta"], config["k"], config["evaluate-cost"], config["epsilon"]) == (1e-5, 3, False, 2.0)
    assert type(config["delta"]) is float and type(config["k"]) is int and type(config["evaluate-cost"]) is bool
    with pytest.raises(ConfigError, match="run-config k must be an integer"):
        with_defaults({"k": np.array([3])})  # an array is not a number
    with pytest.raises(ConfigError, match="k must be"):
        with_defaults({"k": np.int64(0)})


def test_algorithm_without_a_strategy_is_refused_before_any_node_is_waited_for(monkeypatch):
    from fedcluster.server import algorithms
    from fedcluster.server.app import run_algorithm

    # every registered algorithm has one: take one away from what the server may run
    names = algorithms.registry.names()
    monkeypatch.setattr(algorithms.registry, "names", lambda: tuple(n for n in names if n != "da-ufl"))

    class NoGrid:
        def get_node_ids(self):
            raise AssertionError("the run waited for nodes before validating its config")

    with pytest.raises(ConfigError, match="'da-ufl' has no strategy"):
        run_algorithm(NoGrid(), {"algorithm": "da-ufl"})
    with pytest.raises(ConfigError, match="run-config batch-size must be"):
        run_algorithm(NoGrid(), {"batch-size": -5})


def test_readme_config_table_is_generated_from_the_declarations():
    from fedcluster.config import markdown_table

    block = f"<!-- generated: python -m fedcluster.config -->\n{markdown_table()}\n<!-- end generated -->"
    assert block in (ROOT / "docs" / "reference.md").read_text(), (
        "regenerate: python -m fedcluster.config docs/reference.md"
    )


@pytest.mark.parametrize(
    "overrides,message",
    [
        ({"k-range": "2-10"}, "two integers"),
        ({"k-range": "5:3"}, "2 <= a < b"),
        ({"k-range": "1:4"}, "2 <= a < b"),
        ({"k-range": "2:8", "algorithm": "kfed"}, "is not read by algorithm .kfed. \\(a key of fedkmeans"),
    ],
)
def test_bad_k_range_is_refused(overrides, message):
    from fedcluster.config import ConfigError, with_defaults

    with pytest.raises(ConfigError, match=message):
        with_defaults(overrides)


def test_the_run_config_is_frozen_and_read_typed_by_attribute():
    import pickle

    config = with_defaults({"k": 7, "num-rounds": 3})
    assert config.k == 7 and config.num_rounds == 3 == config["num-rounds"] and isinstance(config.fraction, float)
    with pytest.raises(TypeError):
        config["k"] = 8
    with pytest.raises(AttributeError, match="frozen"):
        config.k = 8
    with pytest.raises(AttributeError, match="no key 'no-such-key'"):
        config.no_such_key
    changed = config.replace(num_rounds=5)
    assert changed.num_rounds == 5 and config.num_rounds == 3
    with pytest.raises(ConfigError, match="run-config k must be in"):
        config.replace(k=0)
    assert pickle.loads(pickle.dumps(config)) == config and dict(config)["k"] == 7
