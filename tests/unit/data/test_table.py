from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from vflink.data import PartySchema, load_table
from vflink.errors import ConfigError, DataError

PRIMARY = PartySchema(name="primary", role="primary", key=("id",), numeric=("a", "b"),
                      categorical=("c",), label="y", task="binary")
SECONDARY = PartySchema(name="bank", role="secondary", key=("id",), numeric=("a",))


def write(tmp_path: Path, frame: pd.DataFrame, name: str = "t.csv") -> Path:
    path = tmp_path / name
    if name.endswith(".parquet"):
        frame.to_parquet(path)
    else:
        frame.to_csv(path, index=False)
    return path


def good() -> pd.DataFrame:
    return pd.DataFrame({"id": ["a", "b", "c"], "a": [1.0, 2.0, np.nan], "b": [0, 1, 2],
                         "c": ["x", "y", None], "y": [0, 1, 0]})


@pytest.mark.parametrize("name", ["t.csv", "t.parquet"])
def test_loads_csv_and_parquet(tmp_path: Path, name: str) -> None:
    table = load_table(PRIMARY, write(tmp_path, good(), name))
    assert len(table) == 3
    assert table.frame["a"].dtype == np.float64
    assert np.isnan(table.frame["a"].iloc[2])


def test_missing_file_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"nope\.csv: file not found"):
        load_table(PRIMARY, tmp_path / "nope.csv")


def test_unknown_column(tmp_path: Path) -> None:
    with pytest.raises(DataError,
                       match=r"t\.csv.*'c'.*missing from the table; this table has: id, a, b, y$"):
        load_table(PRIMARY, write(tmp_path, good().drop(columns=["c"])))


def test_non_numeric_value_names_column_and_row(tmp_path: Path) -> None:
    frame = good().astype({"a": object})
    frame.loc[1, "a"] = "twelve"
    with pytest.raises(DataError, match=r"t\.csv.*column 'a'.*non-numeric.*row 1.*'twelve'"):
        load_table(PRIMARY, write(tmp_path, frame))


def test_nan_label(tmp_path: Path) -> None:
    frame = good().astype({"y": float})
    frame.loc[2, "y"] = np.nan
    with pytest.raises(DataError, match=r"t\.csv.*label column 'y'.*missing.*row 2"):
        load_table(PRIMARY, write(tmp_path, frame))


def test_duplicate_keys(tmp_path: Path) -> None:
    frame = good()
    frame.loc[2, "id"] = "a"
    with pytest.raises(DataError, match=r"t\.csv.*duplicate key \('a',\).*rows \[0, 2\]"):
        load_table(PRIMARY, write(tmp_path, frame))


def test_empty_table(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"t\.csv.*empty"):
        load_table(PRIMARY, write(tmp_path, good().iloc[:0]))
    (tmp_path / "blank.csv").write_text("")
    with pytest.raises(DataError, match=r"blank\.csv.*empty"):
        load_table(PRIMARY, tmp_path / "blank.csv")


def test_label_on_secondary(tmp_path: Path) -> None:
    schema = PartySchema(name="bank", role="secondary", key=("id",), numeric=("a",), label="y")
    with pytest.raises(DataError, match=r"t\.csv.*'y'.*secondary.*only the primary"):
        load_table(schema, write(tmp_path, good()))


def test_regression_label_must_be_numeric(tmp_path: Path) -> None:
    schema = PartySchema(name="p", role="primary", numeric=("a",), label="c", task="regression")
    with pytest.raises(DataError, match=r"regression label 'c'"):
        load_table(schema, write(tmp_path, good().fillna({"c": "z"})))


def test_binary_label_with_three_classes(tmp_path: Path) -> None:
    frame = good()
    frame["y"] = [0, 1, 2]
    with pytest.raises(DataError, match=r"binary.*3 classes"):
        load_table(PRIMARY, write(tmp_path, frame))


def test_schema_reports_every_problem_at_once() -> None:
    with pytest.raises(ConfigError) as info:
        PartySchema(name="bad name", role="boss", numeric=("a", "a"))
    problems = info.value.problems
    assert any("`name`" in p for p in problems)
    assert any("`role`" in p for p in problems)
    assert any("listed twice" in p for p in problems)


def test_primary_needs_label_and_task() -> None:
    with pytest.raises(ConfigError, match="label"):
        PartySchema(name="p", role="primary", numeric=("a",))
    with pytest.raises(ConfigError, match="task"):
        PartySchema(name="p", role="primary", numeric=("a",), label="y", task="ranking")


def test_every_problem_of_a_table_at_once(tmp_path: Path) -> None:
    """Three wrong column names and three bad columns: one error lists them all."""
    schema = PartySchema(name="primary", role="primary", key=("id",),
                         numeric=("a", "b", "weight", "height"), categorical=("c", "colour"),
                         label="y", task="binary")
    frame = good().astype({"a": object})
    frame.loc[0, "a"], frame.loc[2, "a"] = "twelve", "?"
    frame["b"] = [0.0, np.inf, -np.inf]
    frame.loc[1, "id"] = None
    with pytest.raises(DataError) as info:
        load_table(schema, write(tmp_path, frame))
    err = info.value
    text = str(err)
    assert len(err.problems) == 4 and "4 problems" in text
    assert all("t.csv (party 'primary')" in p for p in err.problems)
    assert "['weight', 'height', 'colour'] expected but missing from the table; this table " \
           "has: id, a, b, c, y" in text
    assert "column 'a' is numeric but holds non-numeric values, first at row 0 (line 2 of a " \
           "CSV), value 'twelve'; row 2 (line 4 of a CSV), value '?'" in text
    assert "column 'b' holds infinite values, first at row 1 (line 3 of a CSV), value inf; " \
           "row 2 (line 4 of a CSV), value -inf" in text
    assert "key column 'id' has missing values, first at row 1" in text
    assert "np." not in text  # numbers print as numbers


def test_many_bad_cells_show_the_first_few_and_the_count(tmp_path: Path) -> None:
    frame = pd.concat([good()] * 4, ignore_index=True)
    frame["id"] = [f"k{i}" for i in range(len(frame))]
    frame["a"] = ["x"] * len(frame)
    with pytest.raises(DataError, match=r"row 2 \(line 4 of a CSV\), value 'x' \(12 rows in all\)"
                       ) as info:
        load_table(PRIMARY, write(tmp_path, frame))
    assert "row 3 " not in str(info.value)


def test_every_table_of_a_run_is_checked_before_reporting(tmp_path: Path) -> None:
    from vflink.runfiles.config import DataConfig, RunConfig
    from vflink.runfiles.inputs import load_inputs

    p = write(tmp_path, good(), "p.csv")
    s = write(tmp_path, good().rename(columns={"a": "amount"}), "s.csv")
    config = RunConfig(data=DataConfig(parties=(
        PartySchema(name="primary", role="primary", key=("id",), numeric=("a", "nope"),
                    label="y", task="binary", path=p),
        PartySchema(name="bank", role="secondary", key=("id",), numeric=("a",), path=s))))
    with pytest.raises(DataError) as info:
        load_inputs(config)
    problems = info.value.problems
    assert len(problems) == 2
    assert "p.csv (party 'primary')" in problems[0] and "['nope']" in problems[0]
    assert "s.csv (party 'bank')" in problems[1] and "['a']" in problems[1]
    assert "this table has: id, amount, b, c, y" in problems[1]  # the bank's own columns
