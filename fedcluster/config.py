"""The run configuration, assembled: every key with its type, default, meaning and range,
in the section of the algorithm that reads it (each algorithm's package declares its own
section with its cross-key rules, :mod:`fedcluster.keys`; the shared sections are here); one
validation.

:func:`with_defaults` is called once, before the run waits for any node, and returns
typed values (a strategy never casts). ``pyproject.toml`` declares the same keys under
``[tool.flwr.app.config]`` so that ``flwr run`` and the in-process runner see identical
defaults (a test checks the two agree); the README's key table is :func:`markdown_table`.
"""

from __future__ import annotations

import difflib
import tomllib
from functools import lru_cache
from types import MappingProxyType
from typing import Any, Mapping, Sequence

import fedcluster.registry as registry
from .checks import Interval, StrOptions
from .data import GENERATED_DIM_MAX, GENERATED_VALUES_MAX, SEPARATION_MAX
from .tables import column_list
from .keys import (  # noqa: F401 (the declarations, for the callers of the assembled config)
    AGGREGATION,
    INIT_CANDIDATES,
    MANY,
    SECAGG_NEIGHBOURS,
    SECAGG_THRESHOLD,
    SECURE_AGGREGATION,
    SEED_MAX,
    SERVER_DATA,
    STANDARDIZE,
    TRIM_FRACTION,
    WRITE_LABELS,
    ConfigError,
    Key,
    Section,
    k_range,
    number_list,
)


ALGORITHMS = registry.names()
DATASETS = (
    "gaussian-mixture",
    "triebe",
    "digits",
    "dir",
    "file",
    "npy-dir",
    "edge-dir",
    "feddp-mixture",
    "da-ufl-paper",
)
PARTITIONS = ("iid", "dirichlet", "one-source", "components", "column")
# Presets: values for keys left at their default (a key given another value than both its
# default and the preset's is a conflict). "deployment" switches off the measurement rounds
# that are not part of any algorithm: in a deployment every round trip costs seconds, and
# FedDP's exact cost report is not private. k-FED's scoring round stays: it is how the
# devices choose the guarded grouping against a device that lies about its counts.
PRESETS: dict[str, dict[str, Any]] = {
    "none": {},
    "deployment": {"eval-every": 0, "evaluate-cost": False},
}
PRESET_NAMES = tuple(PRESETS)


def _data_rules(c: Mapping[str, Any]) -> None:
    if c["dataset"] in ("dir", "npy-dir", "edge-dir") and not c["data-dir"]:
        raise ConfigError(f"dataset {c['dataset']!r} needs run-config data-dir")
    if c["dataset"] == "file":
        _file_rules(c)
    elif c["partition"] == "column":
        raise ConfigError("run-config partition 'column' splits one file by a column's values: dataset='file'")
    if c["dataset"] in ("gaussian-mixture", "feddp-mixture") and c["num-points"] * c["dim"] > GENERATED_VALUES_MAX:
        raise ConfigError(
            f"run-config num-points × dim = {c['num-points']} × {c['dim']} must be at most "
            f"{GENERATED_VALUES_MAX}: every simulated device generates the whole data set"
        )


def _file_rules(c: Mapping[str, Any]) -> None:
    """dataset = 'file': the file, and the column a label partition splits it by."""
    if not c["data-file"]:
        raise ConfigError("dataset 'file' needs run-config data-file (one .npy, .csv or .parquet file to split)")
    if c["partition"] != "iid" and not c["label-column"]:
        raise ConfigError(
            f"dataset 'file' with partition {c['partition']!r} needs run-config label-column (the column the "
            f"split follows); partition='iid' needs none"
        )
    if c["label-column"] and c["label-column"] in column_list(c["columns"]):
        raise ConfigError(f"run-config label-column {c['label-column']!r} is also in columns: a label is no feature")


COMMON = Section(
    "common",
    (
        Key("algorithm", "fedkmeans", "which algorithm runs", allowed=StrOptions(ALGORITHMS)),
        Key("k", 5, "number of clusters", allowed=Interval(int, 1, MANY)),
        Key(
            "num-rounds",
            20,
            "training rounds, at most (FedKMeans stops at a fixed point: full batch, every node, no set moving)",
            allowed=Interval(int, 0, MANY),
        ),
        Key("seed", 0, "seed of the server's random choices and of generated data", allowed=Interval(int, 0, SEED_MAX)),
        Key(
            "preset",
            "none",
            "deployment: the measurement phases that are not part of the algorithm are off "
            "(eval-every = 0, evaluate-cost = false; k-FED keeps its scoring round, which guards it)",
            allowed=StrOptions(PRESET_NAMES),
        ),
    ),
)
DATA = Section(
    "data",
    (
        Key("dataset", "gaussian-mixture", "where the devices' data come from", allowed=StrOptions(DATASETS)),
        Key(
            "data-dir",
            "",
            "folder of one file per device: dir (.npy, .csv or .parquet; npy-dir is its earlier name), "
            "edge-dir (.txt edge lists)",
        ),
        Key("data-file", "", "dataset=file: one .npy, .csv or .parquet file split over the devices by partition"),
        Key(
            "columns",
            "",
            "CSV/Parquet feature columns, comma-separated names (or positions from 0); empty: every numeric "
            "column, text columns left out with a warning (an id column is numeric: name the features to leave "
            "it out)",
        ),
        Key(
            "label-column",
            "",
            "dataset=file: the column partition dirichlet, one-source, components or column splits by (never a "
            "feature)",
        ),
        Key(
            "num-points",
            3000,
            f"generated points in total (num-points × dim at most {GENERATED_VALUES_MAX})",
            allowed=Interval(int, 1, GENERATED_VALUES_MAX),
        ),
        Key("dim", 4, "generated dimension", allowed=Interval(int, 1, GENERATED_DIM_MAX)),
        Key("components", 0, "generated mixture components (0 = k)", allowed=Interval(int, 0, MANY)),
        Key(
            "separation",
            8.0,
            "distance scale between generated means, in standard deviations",
            allowed=Interval(float, 0, SEPARATION_MAX),
        ),
        Key(
            "partition",
            "dirichlet",
            "how generated points (or a data-file) are split over devices: iid, dirichlet, one-source, components "
            "(over the true components, or label-column), column (dataset=file: one device per value of "
            "label-column)",
            allowed=StrOptions(PARTITIONS),
        ),
        Key(
            "dirichlet-alpha",
            0.3,
            "Dirichlet concentration (small = skewed)",
            allowed=Interval(float, 0, closed="right"),
        ),
        Key("classes-per-client", 2, "components per device (partition=components)", allowed=Interval(int, 1, MANY)),
        Key(
            "snr-db",
            30.0,
            "da-ufl-paper: every agent's SNR in dB (observation probability 1 − exp(−0.025·SNR/d))",
            allowed=Interval(float, -50, 100),
        ),
        Key(
            "class-std",
            1.0,
            "da-ufl-paper: standard deviation of every class per coordinate",
            allowed=Interval(float, 0, 1000, closed="right"),
        ),
    ),
    rules=(_data_rules,),
)
FEDERATION = Section(
    "federation",
    (
        Key("min-nodes", 0, "nodes to wait for (0 = until the count is stable)", allowed=Interval(int, 0, 10**9)),
        Key("node-wait-s", 120.0, "longest wait for nodes, seconds", allowed=Interval(float, 0, 10**7)),
        Key(
            "node-settle-s",
            3.0,
            "seconds the node count must be stable (min-nodes = 0)",
            allowed=Interval(float, 0, 10**5),
        ),
        Key(
            "round-timeout",
            600.0,
            "longest wait for the replies of one phase, seconds (at least one pause between "
            "two pulls of the replies, 0.1 s)",
            allowed=Interval(float, 0.1, 10**7),
        ),
        Key("min-replies", 1, "fewest valid replies a phase needs", allowed=Interval(int, 1, 10**9)),
        Key(
            "min-reply-fraction",
            0.5,
            "fewest valid replies a phase needs, as a share of those sent",
            allowed=Interval(float, 0, 1),
        ),
        Key(
            "max-missed-phases",
            3,
            "a node that sent no reply in this many consecutive phases leaves the run",
            allowed=Interval(int, 1, 10**6),
        ),
        Key("output-dir", "", "results folder (default outputs/<time>-<algorithm>)"),
        Key(
            "overwrite",
            False,
            "replace the run of fedcluster in output-dir: a finished one's result, or an unfinished one (its privacy "
            "ledger is kept and counted)",
        ),
        Key(
            "resume",
            False,
            "continue the unfinished run in output-dir after its SuperLink or ServerApp stopped: the rounds it "
            "completed are replayed from its journal, no device is asked again and no privacy budget is spent again "
            "(docs/security.md: the devices' noise). The run config must be the one it started with, but for "
            "round-timeout, node-wait-s, node-settle-s, write-labels and reference (they change neither the result's "
            "centers nor what is released)",
        ),
        Key("reference", True, "also compute the pooled central k-means reference (generated data)"),
    ),
)


@lru_cache(maxsize=None)
def sections() -> tuple[Section, ...]:
    """Every section: the shared ones and each algorithm's own (:mod:`fedcluster.registry`),
    in the reference's order."""
    return (COMMON, DATA, *registry.sections(), FEDERATION)


@lru_cache(maxsize=None)
def keys() -> Mapping[str, Key]:
    """Every key by name (its first declaration: the type and default every section shares),
    read-only: the declarations are changed where they are written, not by a caller."""
    found: dict[str, Key] = {}
    for section in sections():
        for key in section.keys:
            first = found.setdefault(key.name, key)
            if (first.default, first.kind) != (key.default, key.kind):
                raise RuntimeError(
                    f"run-config key {key.name!r} is declared with two defaults: "
                    f"{first.default!r} and {key.default!r} (section {section.name})"
                )
    return MappingProxyType(found)


def defaults() -> dict[str, Any]:
    return {name: key.default for name, key in keys().items()}


def __getattr__(name: str) -> Any:  # KEYS and DEFAULTS, built when the algorithms' modules are imported
    if name == "KEYS":
        return keys()
    if name == "DEFAULTS":
        return defaults()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class RunConfig(Mapping[str, Any]):
    """The full, validated run config, frozen (:func:`with_defaults` makes it): read a key as
    ``config["num-rounds"]`` or, typed by its declaration, ``config.num_rounds`` (a key's
    hyphens are underscores); :meth:`replace` gives a new one, checked again."""

    __slots__ = ("_values",)

    def __init__(self, values: Mapping[str, Any]) -> None:
        object.__setattr__(self, "_values", dict(values))

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def __iter__(self):
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __getattr__(self, name: str) -> Any:
        try:
            return self._values[name.replace("_", "-")]
        except KeyError:
            raise AttributeError(f"the run config has no key {name.replace('_', '-')!r}") from None

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("the run config is frozen: make a changed one with replace(...)")

    def __reduce__(self):
        return RunConfig, (self._values,)

    def __repr__(self) -> str:
        return f"RunConfig({self._values!r})"

    def replace(self, **changes: Any) -> "RunConfig":
        """A copy with ``changes`` (``min_nodes=3`` for ``min-nodes``), validated again."""
        return with_defaults({**self._values, **{name.replace("_", "-"): value for name, value in changes.items()}})


def _given(run_config: Mapping[str, Any], declared: Mapping[str, Key]) -> dict[str, Any]:
    """The keys given, each coerced to its type; an unknown key refused with the nearest known."""
    given = {}
    for name, value in run_config.items():
        if name not in declared:
            close = difflib.get_close_matches(name, declared, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"unknown run-config key {name!r}{hint}")
        given[name] = declared[name].coerce(value)
    return given


def _refuse_unread(
    given: Mapping[str, Any], reads: Mapping[str, Key], preset: Mapping[str, Any], algorithm: str
) -> None:
    """A key given another value than it would have that the algorithm does not read is
    refused, naming the algorithms that read it: it would be silently ignored."""
    declared = keys()
    for name, value in given.items():
        if name in reads or value in (declared[name].default, preset.get(name, declared[name].default)):
            continue  # read: checked with every key the algorithm reads; else at a value it would have
        _check_some_declaration(name, value)
        readers = [s.name for s in sections() if any(key.name == name for key in s.keys)]
        raise ConfigError(
            f"run-config {name} = {value!r} is not read by algorithm {algorithm!r} (a key of {', '.join(readers)}: "
            f"{declared[name].doc}); drop it"
        )


def with_defaults(run_config: Mapping[str, Any] | None, algorithms: Sequence[str] | None = None) -> RunConfig:
    """The full, validated run config: the declared defaults overridden by ``run_config``.

    Every value has its key's type (ints are ints, floats floats); every key the algorithm
    reads lies in its range (the algorithm's own declaration of it) and passes the cross-key
    rules of the sections the algorithm reads; a key the algorithm does not read keeps its
    default (another value is refused: it would be silently ignored). ``algorithms``: the
    names that have a strategy (the server passes its registry; a name without a strategy
    is refused here, before any node is waited for)."""
    declared = keys()
    given = _given(run_config or {}, declared)
    merged = {**defaults(), **given}
    algorithm = merged["algorithm"]
    declared["algorithm"].check(algorithm)
    if algorithms is not None and algorithm not in algorithms:
        raise ConfigError(
            f"run-config algorithm {algorithm!r} has no strategy in this version; available: {', '.join(algorithms)}"
        )
    declared["preset"].check(merged["preset"])
    preset = PRESETS[merged["preset"]]
    read = [section for section in sections() if section.read_by(algorithm)]
    reads = {key.name: key for section in read for key in section.keys}
    _refuse_unread(given, reads, preset, algorithm)
    for name, value in preset.items():
        if merged[name] not in (declared[name].default, value):
            raise ConfigError(
                f"run-config {name} = {merged[name]!r} conflicts with preset {merged['preset']!r}, which sets "
                f"{name} = {value!r}: drop one of the two"
            )
        merged[name] = value
    for name, key in reads.items():
        key.check(merged[name])
    for section in read:
        for rule in section.rules:
            rule(merged)
    return RunConfig(merged)


def _check_some_declaration(name: str, value: Any) -> None:
    """``value`` (of a key the chosen algorithm does not read) within the range of some
    algorithm's declaration of ``name`` (else the first declaration's error)."""
    declarations = [key for section in sections() for key in section.keys if key.name == name]
    for key in declarations:
        try:
            return key.check(value)
        except ConfigError:
            pass
    declarations[0].check(value)


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
        if key.strip() in out:
            raise ConfigError(f"run-config key {key.strip()!r} is given twice: give it once")
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


def markdown_table() -> str:
    """The reference's run-config table, generated from :func:`sections`."""
    lines = ["| key | default | range | meaning |", "|---|---|---|---|"]
    for section in sections():
        readers = f" ({', '.join(section.algorithms)})" if len(section.algorithms) > 1 else ""
        lines.append(f"| **{section.name}**{readers} | | | |")
        for key in section.keys:
            if isinstance(key.allowed, StrOptions):
                allowed = " / ".join(key.allowed.options)
            elif key.allowed is not None:
                allowed = str(key.allowed)
            else:
                allowed = key.kind.__name__
            default = (
                str(key.default).lower()
                if isinstance(key.default, bool)
                else repr(key.default)
                if isinstance(key.default, str)
                else key.default
            )
            lines.append(f"| `{key.name}` | {default} | {allowed} | {key.doc} |")
    return "\n".join(lines)


def write_generated_block(path: str, name: str, table: str) -> None:
    """Replace the block ``<!-- generated: python -m fedcluster.NAME -->`` ... ``<!-- end
    generated -->`` of the file at ``path`` (the README) with ``table``."""
    from pathlib import Path

    text = Path(path).read_text()
    start = f"<!-- generated: python -m fedcluster.{name} -->\n"
    head, found, rest = text.partition(start)
    if not found:
        raise SystemExit(f"{path} has no line {start.strip()!r}")
    _, end, tail = rest.partition("<!-- end generated -->")
    Path(path).write_text(head + start + table + "\n" + end + tail)


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return repr(value)


PYPROJECT_START = "# generated: python -m fedcluster.config pyproject.toml\n"
PYPROJECT_END = "# end generated\n"


def pyproject_block() -> str:
    """The ``[tool.flwr.app.config]`` entries ``flwr run`` reads: every key with its
    default, by section, as the declarations give them."""
    lines, seen = [], set()
    for section in sections():
        fresh = [key for key in section.keys if key.name not in seen]
        if fresh:
            lines.append(f"# --- {section.name}")
            lines += [f"{key.name} = {_toml(key.default)}" for key in fresh]
            seen |= {key.name for key in fresh}
    return "\n".join(lines) + "\n"


def write_pyproject(path: str) -> None:
    """Replace the generated block of ``[tool.flwr.app.config]`` in ``path``."""
    from pathlib import Path

    text = Path(path).read_text()
    head, found, rest = text.partition(PYPROJECT_START)
    if not found:
        raise SystemExit(f"{path} has no line {PYPROJECT_START.strip()!r}")
    _, end, tail = rest.partition(PYPROJECT_END)
    Path(path).write_text(head + PYPROJECT_START + pyproject_block() + end + tail)


if __name__ == "__main__":  # python -m fedcluster.config [docs/reference.md | pyproject.toml]: print or rewrite
    import sys

    if len(sys.argv) > 1 and sys.argv[1].endswith(".toml"):
        write_pyproject(sys.argv[1])
    elif len(sys.argv) > 1:
        write_generated_block(sys.argv[1], "config", markdown_table())
    else:
        print(markdown_table())
