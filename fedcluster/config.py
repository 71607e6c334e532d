"""Run configuration: every key, its default, and validation.

This is the single source of truth for the run-config keys. ``pyproject.toml`` declares
the same keys under ``[tool.flwr.app.config]`` (a test checks the two agree) so that
``flwr run`` and the in-process runner see identical defaults.
"""

from __future__ import annotations

import tomllib
from typing import Any

ALGORITHMS = ("fedkmeans", "kfed", "feddp-kmeans", "fedspectral", "fedspectral-plus", "da-ufl")

COMMON: dict[str, Any] = {
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
}

# FedKMeans (ALGORITHMS.md section 1); `init` is shared by every center-based algorithm.
FEDKMEANS: dict[str, Any] = {
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
}

# k-FED (ALGORITHMS.md section 4; server_app/kfed.py documents every key)
KFED: dict[str, Any] = {
    "k-prime": 0,  # local clusters per device (0 = the paper's rule ceil(sqrt(k)))
    "kfed-weighting": "count",  # "count" or "uniform" weighting of device centers
    "kfed-to-convergence": True,  # server Lloyd to convergence (false = one round, the paper)
    "kfed-server-starts": 20,  # farthest-point / k-means++ starts scored on the server (1 = paper)
    "kfed-device-restarts": 10,  # local k'-means restarts on each device (1 = paper)
    "kfed-evaluate": True,  # one extra round measuring the federated cost of the result
}

# FedDP-KMeans (ALGORITHMS.md section 3; server_app/feddp_kmeans.py documents every key)
FEDDP: dict[str, Any] = {
    "privacy-level": "data-point",
    "epsilon": 1.0,
    "delta": 1e-6,
    "step-epsilons": "",
    "budget-split": "",
    "lloyd-rounds": 0,
    "lloyd-fraction": 0.25,
    "clip-norm": 0.0,
    "client-max-points": 50,
    "clip-outer": 0.0,
    "clip-histogram": 0.0,
    "clip-means": 0.0,
    "clip-nonempty": 0.0,
    "clip-sums": 0.0,
    "clip-counts": 0.0,
    "client-sampling-rate": 1.0,
    "margin": 1.0,
    "min-server-weight": 5.0,
    "server-n-init": 10,
    "noise-seed": -1,
    "evaluate-cost": True,
}

# FedSpectral / FedSpectral+ (ALGORITHMS.md section 5; server_app/fedspectral.py documents
# every key)
SPECTRAL: dict[str, Any] = {
    "num-nodes": 0,  # global number of graph nodes (ids 0 .. n-1); required by both algorithms
    "mode": "exact",  # FedSpectral+: "exact" (summed global products) or "paper"
    "iters": 1,  # paper mode: local power steps per round (exact mode: always one product)
    "oversample": -1,  # exact mode: block of k + oversample columns (-1 = max(k, 10))
    "acceleration": "krylov",  # exact mode: "krylov" (block Krylov + Rayleigh-Ritz) or "none"
    "max-basis": 0,  # krylov: columns kept on the server before a thick restart (0 = auto)
    "residual-tol": 0.0,  # exact mode: stop when every top-k Ritz residual <= this (0 = never)
    "edge-copies": 1,  # r, the number of clients holding every edge (edge weight 1/r)
    "coassociation": "both-present",  # FedSpectral: "both-present" or "all-clients"
}

# federation mechanics and results
MECHANICS: dict[str, Any] = {
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

DEFAULTS: dict[str, Any] = {**COMMON, **FEDKMEANS, **KFED, **FEDDP, **SPECTRAL, **MECHANICS}

DATASETS = ("gaussian-mixture", "triebe", "digits", "npy-dir", "edge-dir", "feddp-mixture")
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
    _validate_kfed(config)
    _validate_feddp(config)
    _validate_spectral(config)


def _validate_kfed(config: dict[str, Any]) -> None:
    if config["k-prime"] < 0:
        raise ConfigError(f"k-prime must be >= 0 (0 = ceil(sqrt(k))), got {config['k-prime']}")
    if config["kfed-weighting"] not in ("count", "uniform"):
        raise ConfigError(f"kfed-weighting must be 'count' or 'uniform', got {config['kfed-weighting']!r}")
    if config["kfed-server-starts"] < 1 or config["kfed-device-restarts"] < 1:
        raise ConfigError("kfed-server-starts and kfed-device-restarts must be >= 1")


def _validate_feddp(config: dict[str, Any]) -> None:
    """FedDP-KMeans keys (range checks only; the strategy checks how they combine)."""
    if config["privacy-level"] not in ("data-point", "client"):
        raise ConfigError(f"privacy-level must be 'data-point' or 'client', got {config['privacy-level']!r}")
    if not config["epsilon"] > 0:  # inf is allowed and means: no noise (not private)
        raise ConfigError(f"epsilon must be > 0 (inf = no noise), got {config['epsilon']}")
    if not 0 < config["delta"] < 1:
        raise ConfigError(f"delta must be in (0, 1), got {config['delta']}")
    if config["lloyd-rounds"] < 0:
        raise ConfigError(f"lloyd-rounds must be >= 0, got {config['lloyd-rounds']}")
    if not 0 <= config["lloyd-fraction"] < 1:
        raise ConfigError(f"lloyd-fraction must be in [0, 1), got {config['lloyd-fraction']}")
    for key in ("clip-norm", "clip-outer", "clip-histogram", "clip-means", "clip-nonempty", "clip-sums", "clip-counts"):
        if not 0 <= config[key] < float("inf"):
            raise ConfigError(f"{key} must be >= 0 and finite (0 = derived), got {config[key]}")
    if config["client-max-points"] < 1:
        raise ConfigError(f"client-max-points must be >= 1, got {config['client-max-points']}")
    if not 0 < config["client-sampling-rate"] <= 1:
        raise ConfigError(f"client-sampling-rate must be in (0, 1], got {config['client-sampling-rate']}")
    if config["client-sampling-rate"] < 1 and config["privacy-level"] != "client":
        raise ConfigError("client-sampling-rate < 1 is only accounted at privacy-level = 'client'")
    if not config["margin"] > 0:
        raise ConfigError(f"margin must be > 0 (1 = no margin filter), got {config['margin']}")
    if config["min-server-weight"] < 0:
        raise ConfigError(f"min-server-weight must be >= 0, got {config['min-server-weight']}")
    if config["server-n-init"] < 1:
        raise ConfigError(f"server-n-init must be >= 1, got {config['server-n-init']}")


def _validate_spectral(config: dict[str, Any]) -> None:
    """FedSpectral / FedSpectral+ keys."""
    if config["num-nodes"] < 0:
        raise ConfigError(f"num-nodes must be >= 0, got {config['num-nodes']}")
    if config["algorithm"] in ("fedspectral", "fedspectral-plus"):
        if config["num-nodes"] < 1:
            raise ConfigError(
                f"algorithm {config['algorithm']!r} needs run-config num-nodes: the global number of "
                "graph nodes (node ids are 0 .. num-nodes-1), e.g. num-nodes=1005 for email-Eu-core"
            )
        if config["k"] > config["num-nodes"]:
            raise ConfigError(f"k={config['k']} is larger than num-nodes={config['num-nodes']}")
        if config["num-rounds"] < 1:
            raise ConfigError(f"{config['algorithm']} needs num-rounds >= 1, got {config['num-rounds']}")
    if config["mode"] not in ("exact", "paper"):
        raise ConfigError(f"mode must be 'exact' or 'paper', got {config['mode']!r}")
    if config["iters"] < 1:
        raise ConfigError(f"iters must be >= 1, got {config['iters']}")
    if config["oversample"] < -1:
        raise ConfigError(f"oversample must be >= 0 (-1 = max(k, 10)), got {config['oversample']}")
    if config["acceleration"] not in ("krylov", "none"):
        raise ConfigError(f"acceleration must be 'krylov' or 'none', got {config['acceleration']!r}")
    if config["max-basis"] < 0:
        raise ConfigError(f"max-basis must be >= 0 (0 = auto), got {config['max-basis']}")
    if not 0 <= config["residual-tol"] < float("inf"):
        raise ConfigError(f"residual-tol must be >= 0 and finite (0 = run num-rounds), got {config['residual-tol']}")
    if config["edge-copies"] < 1:
        raise ConfigError(f"edge-copies must be >= 1, got {config['edge-copies']}")
    if config["coassociation"] not in ("both-present", "all-clients"):
        raise ConfigError(f"coassociation must be 'both-present' or 'all-clients', got {config['coassociation']!r}")


def parse_run_config(text: str) -> dict[str, Any]:
    """Parse Flower's ``--run-config`` syntax: ``"k=5 dataset='npy-dir' tol=1e-6"``, or
    the path of a TOML file of such keys (as ``flwr run --run-config FILE.toml``).

    Each whitespace-separated ``key=value`` pair is read as one TOML assignment, so
    strings need quotes and numbers/booleans do not.
    """
    stripped = text.strip()
    if stripped.endswith(".toml") and "=" not in stripped:
        from pathlib import Path

        path = Path(stripped).expanduser()
        if not path.is_file():
            raise ConfigError(f"run-config file {path} does not exist")
        try:
            return tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"run-config file {path} is not valid TOML: {exc}") from exc
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
