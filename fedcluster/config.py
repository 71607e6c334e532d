"""Run configuration: every key, its default, and validation.

This is the single source of truth for the run-config keys. ``pyproject.toml`` declares
the same keys under ``[tool.flwr.app.config]`` (a test checks the two agree) so that
``flwr run`` and the in-process runner see identical defaults.
"""

from __future__ import annotations

import tomllib
from typing import Any

ALGORITHMS = ("fedkmeans", "kfed", "feddp-kmeans", "fedspectral", "fedspectral-plus", "da-ufl")

DEFAULTS: dict[str, Any] = {
    # what to run
    "algorithm": "fedkmeans",
    "k": 5,
    "num-rounds": 20,
    "seed": 0,
    # data
    "dataset": "gaussian-mixture",
    "data-dir": "",
    "num-points": 3000,
    "dim": 4,
    "components": 0,
    "separation": 8.0,
    "partition": "dirichlet",
    "dirichlet-alpha": 0.3,
    "classes-per-client": 2,
    "server-data": "",
    # FedKMeans
    "fraction": 1.0,
    "local-epochs": 1,
    "batch-size": 0,
    "client-lr": 1.0,
    "server-lr": 1.0,
    "momentum": 0.0,
    "reassign-threshold": 0.01,
    "reassign-patience": 20,
    "init": "auto",
    "init-candidates": 10,
    "init-min-count": 2,
    "eval-every": 1,
    "tol": 0.0,
    # federation mechanics
    "min-nodes": 0,
    "node-wait-s": 120.0,
    "node-settle-s": 3.0,
    "round-timeout": 600.0,
    "min-replies": 1,
    "min-reply-fraction": 0.5,
    # results
    "output-dir": "",
    "reference": True,
}

DATASETS = ("gaussian-mixture", "triebe", "digits", "npy-dir", "edge-dir")
PARTITIONS = ("iid", "dirichlet", "one-source", "components")


class ConfigError(ValueError):
    """A run-config value is missing, of the wrong type, or out of range."""


def with_defaults(run_config: dict[str, Any] | None) -> dict[str, Any]:
    """Return the full run config: DEFAULTS overridden by ``run_config``, validated."""
    merged = dict(DEFAULTS)
    for key, value in (run_config or {}).items():
        if key not in DEFAULTS:
            import difflib

            close = difflib.get_close_matches(key, DEFAULTS, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"unknown run-config key {key!r}{hint}")
        if key in DEFAULTS and isinstance(DEFAULTS[key], bool) and not isinstance(value, bool):
            raise ConfigError(f"run-config {key!r} must be true or false, got {value!r}")
        if key in DEFAULTS and isinstance(DEFAULTS[key], float) and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if key in DEFAULTS and isinstance(DEFAULTS[key], int) and not isinstance(DEFAULTS[key], bool):
            if isinstance(value, float) and value.is_integer():
                value = int(value)
        if key in DEFAULTS and type(value) is not type(DEFAULTS[key]):
            raise ConfigError(
                f"run-config {key!r} must be of type {type(DEFAULTS[key]).__name__}, "
                f"got {value!r}"
            )
        merged[key] = value
    validate(merged)
    return merged


def validate(config: dict[str, Any]) -> None:
    if config["algorithm"] not in ALGORITHMS:
        raise ConfigError(
            f"unknown algorithm {config['algorithm']!r}; choose one of {', '.join(ALGORITHMS)}"
        )
    if config["k"] < 1:
        raise ConfigError(f"k must be >= 1, got {config['k']}")
    if config["num-rounds"] < 0:
        raise ConfigError(f"num-rounds must be >= 0, got {config['num-rounds']}")
    if config["dataset"] not in DATASETS:
        raise ConfigError(
            f"unknown dataset {config['dataset']!r}; choose one of {', '.join(DATASETS)}"
        )
    if config["partition"] not in PARTITIONS:
        raise ConfigError(
            f"unknown partition {config['partition']!r}; choose one of {', '.join(PARTITIONS)}"
        )
    if not 0 < config["fraction"] <= 1:
        raise ConfigError(f"fraction must be in (0, 1], got {config['fraction']}")
    if config["local-epochs"] < 1:
        raise ConfigError(f"local-epochs must be >= 1, got {config['local-epochs']}")
    if not 0 < config["client-lr"] <= 1:
        raise ConfigError(f"client-lr must be in (0, 1], got {config['client-lr']}")
    if not 0 < config["server-lr"] <= 2:
        raise ConfigError(f"server-lr must be in (0, 2], got {config['server-lr']}")
    if not 0 <= config["momentum"] < 1:
        raise ConfigError(f"momentum must be in [0, 1), got {config['momentum']}")
    if config["dataset"] in ("npy-dir", "edge-dir") and not config["data-dir"]:
        raise ConfigError(f"dataset {config['dataset']!r} needs run-config data-dir")
    if config["round-timeout"] <= 0:
        raise ConfigError("round-timeout must be > 0 seconds")


def parse_run_config(text: str) -> dict[str, Any]:
    """Parse Flower's ``--run-config`` syntax: ``"k=5 dataset='npy-dir' tol=1e-6"``.

    Each whitespace-separated ``key=value`` pair is read as one TOML assignment, so
    strings need quotes and numbers/booleans do not.
    """
    out: dict[str, Any] = {}
    for item in _split_outside_quotes(text):
        if "=" not in item:
            raise ConfigError(f"run-config item {item!r} is not of the form key=value")
        key, value = item.split("=", 1)
        try:
            out[key.strip()] = tomllib.loads(f"v = {value}")["v"]
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(
                f"run-config value for {key!r} is not valid TOML ({value!r}): strings need quotes"
            ) from exc
    return out


def _split_outside_quotes(text: str) -> list[str]:
    """Split on whitespace that is not inside single or double quotes."""
    items, current, quote = [], [], None
    for char in text:
        if quote:
            current.append(char)
            if char == quote:
                quote = None
        elif char in "'\"":
            quote = char
            current.append(char)
        elif char.isspace():
            if current:
                items.append("".join(current))
                current = []
        else:
            current.append(char)
    if quote:
        raise ConfigError(f"run-config has an unterminated {quote} quote: {text!r}")
    if current:
        items.append("".join(current))
    return items
