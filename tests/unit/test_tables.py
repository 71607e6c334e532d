"""CSV and Parquet data files (fedcluster.tables through fedcluster.data.load_points): a
header, an id column, a text column, chosen columns; every bad file named."""

from __future__ import annotations

import builtins

import numpy as np
import pytest

from fedcluster import data
from fedcluster.data import DataError
from fedcluster.tables import DataWarning

POINTS = np.array([[1.5, -2.0], [3.25, 4.0], [0.0, 1e-3]])


def write_csv(path, header, rows):
    path.write_text("\n".join([",".join(header)] + [",".join(map(str, row)) for row in rows]) + "\n")
    return path


def people(tmp_path):
    """A header, a numeric id, a text column (with a quoted comma) and two features."""
    rows = [[i, f'"Doe, {name}"', *point] for i, name, point in zip((7, 8, 9), ("Ann", "Bo", "Cy"), POINTS)]
    return write_csv(tmp_path / "people.csv", ["id", "name", "x", "y"], rows)


def test_a_csv_with_a_header_an_id_and_a_text_column_keeps_the_numbers_and_names_the_text(tmp_path):
    with pytest.warns(DataWarning, match=r"people\.csv: text column\(s\) 'name' left out"):
        points = data.load_points(people(tmp_path))
    np.testing.assert_array_equal(points, np.column_stack([[7, 8, 9], POINTS]))  # the id is numeric: kept


def test_columns_choose_the_features_by_name_or_position(tmp_path):
    path = people(tmp_path)
    np.testing.assert_array_equal(data.load_points(path, ("x", "y")), POINTS)
    np.testing.assert_array_equal(data.load_points(path, ("3", "2")), POINTS[:, ::-1])


def test_a_text_column_named_in_columns_is_refused_by_name(tmp_path):
    with pytest.raises(DataError, match=r"people\.csv: column 'name' named in run-config columns is not numeric"):
        data.load_points(people(tmp_path), ("x", "name"))
    with pytest.raises(DataError, match=r"people\.csv has no column 'z' \(its columns: id, name, x, y\)"):
        data.load_points(people(tmp_path), ("z",))


def test_a_headerless_csv_with_a_text_column(tmp_path):
    path = tmp_path / "plain.csv"
    path.write_text("a,1,2\nb,3,4\n")
    with pytest.warns(DataWarning, match="'0'"):
        np.testing.assert_array_equal(data.load_points(path), [[1, 2], [3, 4]])


def test_a_stray_word_in_a_numeric_column_and_a_missing_value_are_named(tmp_path):
    path = write_csv(tmp_path / "typo.csv", ["x", "y"], [[1, 2], [3, "oops"], [5, 6]])
    with pytest.raises(DataError, match=r"typo\.csv, line 3: non-numeric value 'oops' in column 'y'"):
        data.load_points(path)
    path = write_csv(tmp_path / "gap.csv", ["x", "y"], [[1, 2], [3, ""], [5, 6]])
    with pytest.raises(DataError, match=r"gap\.csv has 1 of 3 rows with NaN.*row 1"):
        data.load_points(path)


@pytest.mark.parametrize(
    "text, match",
    [
        ("name\nAnn\nBo\n", r"no numeric column \(its columns: name\)"),
        ("x,y\n", "is empty"),
        ("", "is empty"),
        ("x,y\n1,2\n3\n", r"line 3: expected 2 comma-separated values, found 1"),
    ],
)
def test_bad_csv_files_are_named(tmp_path, text, match):
    (tmp_path / "bad.csv").write_text(text)
    with pytest.raises(DataError, match=r"bad\.csv.*" + match):
        data.load_points(tmp_path / "bad.csv")


def test_an_unreadable_csv_is_named(tmp_path):
    (tmp_path / "latin.csv").write_bytes(b"x,y\n1,\xff\n")
    with pytest.raises(DataError, match=r"latin\.csv cannot be read as CSV text"):
        data.load_points(tmp_path / "latin.csv")


def test_npy_columns_by_position(tmp_path):
    np.save(tmp_path / "a.npy", POINTS)
    np.testing.assert_array_equal(data.load_points(tmp_path / "a.npy", ("1",)), POINTS[:, 1:])
    with pytest.raises(DataError, match=r"a\.npy has no column 'x'"):
        data.load_points(tmp_path / "a.npy", ("x",))


# ------------------------------------------------------------------------------ Parquet
def test_without_pyarrow_a_parquet_file_names_the_extra(tmp_path, monkeypatch):
    (tmp_path / "a.parquet").write_bytes(b"PAR1")
    real_import = builtins.__import__

    def no_pyarrow(name, *args, **kwargs):
        if name.startswith("pyarrow"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pyarrow)
    with pytest.raises(
        DataError, match=r"a\.parquet is Parquet, which needs pyarrow: pip install 'fedcluster\[parquet\]'"
    ):
        data.load_points(tmp_path / "a.parquet")


def parquet(path, **columns):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.table(columns), path)
    return path


def test_a_parquet_file_with_a_text_column_and_ints(tmp_path):
    path = parquet(tmp_path / "a.parquet", id=[1, 2, 3], name=["a", "b", "c"], x=POINTS[:, 0], y=POINTS[:, 1])
    with pytest.warns(DataWarning, match="'name'"):
        np.testing.assert_array_equal(data.load_points(path), np.column_stack([[1, 2, 3], POINTS]))
    np.testing.assert_array_equal(data.load_points(path, ("x", "y")), POINTS)
    with pytest.raises(DataError, match=r"column 'name' named in run-config columns is not numeric"):
        data.load_points(path, ("name",))


def test_a_null_in_parquet_is_a_missing_value_named_by_row(tmp_path):
    path = parquet(tmp_path / "null.parquet", x=[1.0, None, 3.0])
    with pytest.raises(DataError, match=r"null\.parquet has 1 of 3 rows with NaN.*row 1"):
        data.load_points(path)


def test_a_broken_or_empty_parquet_file_is_named(tmp_path):
    pytest.importorskip("pyarrow")
    (tmp_path / "broken.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(DataError, match=r"broken\.parquet is not a readable Parquet file"):
        data.load_points(tmp_path / "broken.parquet")
    path = parquet(tmp_path / "empty.parquet", x=np.empty(0))
    with pytest.raises(DataError, match=r"empty\.parquet is empty"):
        data.load_points(path)
