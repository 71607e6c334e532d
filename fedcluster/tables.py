"""Tabular data files: a ``.csv`` (with or without a header) or a ``.parquet`` file read as
named columns, the numeric ones as features.

* **Features**: every numeric column, or the ones the run config's ``columns`` names. A
  column that is mostly not numbers (a name, a category, a date) is a text column: left out
  with a :class:`DataWarning` naming it, or refused by name when ``columns`` asks for it.
  A numeric column is used as it is, an id column included: name the features in
  ``columns`` to leave it out.
* **Kept columns** (``keep``): returned as they are (e.g. the label column a partitioner
  splits a file by), never features.

NumPy and the standard library only; ``.parquet`` needs pyarrow, the optional extra
``fedcluster[parquet]``, imported when such a file is read.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

__all__ = ["DataWarning", "Table", "read_table", "select_columns", "column_list"]

PARQUET_EXTRA = "pip install 'fedcluster[parquet]'"


class DataWarning(UserWarning):
    """Something of a data file was left out (a text column); the message names it."""


@dataclass
class Table:
    """A file's feature columns as float64 points (NaN where a value is missing; the
    caller validates), their names, the kept columns as they are, and the text columns
    left out."""

    points: np.ndarray
    names: list[str]
    kept: dict[str, np.ndarray] = field(default_factory=dict)
    dropped: list[str] = field(default_factory=list)


def column_list(text: str) -> tuple[str, ...]:
    """The run config's ``columns``: comma-separated names, blanks around them ignored."""
    return tuple(name.strip() for name in str(text or "").split(",") if name.strip())


def read_table(path: Path, columns: Sequence[str] = (), keep: Sequence[str] = (), error=ValueError) -> Table:
    """Read ``path`` (``.csv`` or ``.parquet``); ``error`` is the exception class raised,
    its message naming the file and the column or line."""
    if path.suffix.lower() == ".parquet":
        names, values = _parquet_columns(path, error)
    else:
        names, values = _csv_columns(path, error)
    return select_columns(path, names, values, columns, keep, error)


def select_columns(path: Path, names: list[str], values: list, columns: Sequence[str], keep: Sequence[str], error):
    """The feature columns (numeric, or those named), the kept ones, the text ones dropped:
    a :class:`Table` of columns ``values`` (CSV: (line, text) pairs; else typed arrays)."""
    columns, keep = tuple(columns), tuple(keep)
    position = {name: i for i, name in enumerate(names)}
    for name in columns + keep:
        if _index(name, position, len(names)) is None:
            raise error(f"data file {path} has no column {name!r} (its columns: {_shown(names)})")
    kept_at = {_index(name, position, len(names)) for name in keep}
    if columns:
        wanted = [_index(name, position, len(names)) for name in columns]
        for i in wanted:
            if not _is_numeric(values[i]):
                raise error(
                    f"data file {path}: column {names[i]!r} named in run-config columns is not numeric "
                    f"(e.g. {_first_text(values[i])!r})"
                )
        dropped: list[str] = []
    else:
        wanted = [i for i in range(len(names)) if i not in kept_at and _is_numeric(values[i])]
        dropped = [names[i] for i in range(len(names)) if i not in kept_at and not _is_numeric(values[i])]
        if not wanted:
            raise error(f"data file {path} has no numeric column (its columns: {_shown(names)})")
    features = [_floats(path, names[i], values[i], error) for i in wanted]
    rows = len(values[0]) if values else 0
    points = np.stack(features, axis=1) if features else np.empty((rows, 0))
    kept = {name: _labels(values[_index(name, position, len(names))]) for name in keep}
    return Table(points=points, names=[names[i] for i in wanted], kept=kept, dropped=dropped)


def _labels(column) -> np.ndarray:
    """A kept column's values as text (``"1.0"`` for a Parquet number, a CSV cell as written)."""
    if isinstance(column, np.ndarray):
        return np.asarray([str(value) for value in column])
    return np.asarray([value.strip() for _, value in column])


def _index(name: str, position: dict[str, int], width: int) -> int | None:
    """A column by its name, or by its position from 0 when no column has that name."""
    if name in position:
        return position[name]
    if name.isdigit() and int(name) < width:
        return int(name)
    return None


def _shown(names: list[str]) -> str:
    return ", ".join(names[:12]) + (" ..." if len(names) > 12 else "")


# ---------------------------------------------------------------------------------------- CSV


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _is_numeric(column) -> bool:
    """A column is numeric unless most of its values are not numbers (missing ones aside);
    in a numeric column a value that is not a number is an error naming its line."""
    if isinstance(column, np.ndarray):  # Parquet: typed
        return column.dtype.kind in "biuf"
    present = [value for _, value in column if value.strip()]
    text = sum(not _number(value) for value in present)
    return not present or 2 * text <= len(present)


def _first_text(column) -> str:
    if isinstance(column, np.ndarray):
        return str(column[0]) if column.size else ""
    return next((value for _, value in column if value.strip() and not _number(value)), "")


def _floats(path: Path, name: str, column, error) -> np.ndarray:
    """A numeric column as float64: a missing value is NaN (refused later with its row)."""
    if isinstance(column, np.ndarray):
        return column.astype(np.float64)
    out = np.empty(len(column))
    for row, (line, value) in enumerate(column):
        if not value.strip():
            out[row] = np.nan
            continue
        try:
            out[row] = float(value)
        except ValueError:
            text = f"non-numeric value {value.strip()!r} in column {name!r}"
            raise error(f"data file {path}, line {line}: {text}") from None
    return out


def _csv_columns(path: Path, error) -> tuple[list[str], list[list[tuple[int, str]]]]:
    """Column names (a header's, else 0, 1, ...) and every column's (line, text) values."""
    try:
        with open(path, newline="") as handle:
            reader = csv.reader(handle)
            rows = [(reader.line_num, row) for row in reader if any(cell.strip() for cell in row)]
    except PermissionError:
        raise error(f"data file {path} cannot be read: permission denied") from None
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise error(f"data file {path} cannot be read as CSV text: {exc}") from None
    if rows and _is_header(rows):
        names, rows = [cell.strip() for cell in rows[0][1]], rows[1:]
    else:
        names = [str(i) for i in range(len(rows[0][1]))] if rows else []
    if not rows:
        raise error(f"data file {path} is empty: it holds no data rows")
    width = len(names)
    for line, row in rows:
        if len(row) != width:
            raise error(f"data file {path}, line {line}: expected {width} comma-separated values, found {len(row)}")
    return names, [[(line, row[i]) for line, row in rows] for i in range(width)]


def _is_header(rows: list[tuple[int, list[str]]]) -> bool:
    """The first row is a header when it holds a value that is not a number where the
    next row holds one, or (a file of one row) when nothing in it is a number."""
    first = rows[0][1]
    if len(rows) == 1:
        return not any(_number(cell) for cell in first)
    second = rows[1][1]
    if not any(_number(cell) for cell in first):
        return True
    return any(not _number(a) and _number(b) for a, b in zip(first, second))


# ------------------------------------------------------------------------------------ Parquet


def _parquet_columns(path: Path, error) -> tuple[list[str], list[np.ndarray]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise error(f"data file {path} is Parquet, which needs pyarrow: {PARQUET_EXTRA}") from None
    try:
        table = pq.read_table(path)
    except PermissionError:
        raise error(f"data file {path} cannot be read: permission denied") from None
    except Exception as exc:  # pyarrow's own errors (ArrowInvalid, ...): not a readable Parquet file
        raise error(f"data file {path} is not a readable Parquet file: {' '.join(str(exc).split())[:200]}") from None
    names = [str(name) for name in table.column_names]
    if table.num_rows == 0 or not names:
        raise error(f"data file {path} is empty: it holds no data rows")
    return names, [_parquet_values(table.column(i)) for i in range(len(names))]


def _parquet_values(column) -> np.ndarray:
    """A Parquet column as NumPy: numbers as float64 with NaN for nulls, anything else as objects."""
    import pyarrow as pa

    kind = column.type
    if pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind):
        return column.cast(pa.float64()).to_numpy(zero_copy_only=False)
    return np.asarray(column.to_pylist(), dtype=object)
