"""CSV files as people have them: semicolon, tab and pipe delimiters found
and said; other encodings given as an option; a byte that does not decode named by line and
column; a byte-order mark skipped."""

from __future__ import annotations

import gzip
import logging
from pathlib import Path

import pandas as pd
import pytest

from vflink.data import PartySchema, load_table
from vflink.data.table import read_frame
from vflink.errors import ConfigError, DataError

EXPECTED = {"id": [1, 2], "name": ["Anna", "Bob"], "lat": [1.5, 2.0]}


def write(tmp_path: Path, name: str, text: str, encoding: str = "utf-8") -> Path:
    path = tmp_path / name
    data = text.encode(encoding)
    path.write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    return path


@pytest.mark.parametrize("delimiter", [";", "\t", "|", ","])
@pytest.mark.parametrize("name", ["t.csv", "t.csv.gz"])
def test_the_delimiter_is_detected_and_said(tmp_path: Path, delimiter: str, name: str,
                                            caplog: pytest.LogCaptureFixture) -> None:
    text = "".join(delimiter.join(row) + "\n" for row in
                   (("id", "name", "lat"), ("1", "Anna", "1.5"), ("2", "Bob", "2")))
    path = write(tmp_path, name, text)
    with caplog.at_level(logging.INFO, logger="vflink.data.table"):
        frame = read_frame(path)
    assert frame.to_dict("list") == EXPECTED
    said = [r for r in caplog.records if f"delimiter {delimiter!r}" in r.getMessage()]
    assert len(said) == 1 and str(path) in said[0].getMessage()
    # a delimiter other than the file type's default is worth a warning (it was a guess)
    assert said[0].levelno == (logging.INFO if delimiter == "," else logging.WARNING)


def test_commas_inside_a_semicolon_file_do_not_fool_the_detection(tmp_path: Path) -> None:
    path = write(tmp_path, "t.csv", 'id;name;note\n1;Anna;"a, b"\n2;Bob;c, d, e\n3;Carl;x\n')
    frame = read_frame(path)
    assert list(frame.columns) == ["id", "name", "note"]
    assert frame["note"].tolist() == ["a, b", "c, d, e", "x"]


def test_a_tsv_file_stays_tab_separated_and_one_column_files_work(tmp_path: Path) -> None:
    assert read_frame(write(tmp_path, "t.tsv", "a\tb\n1\t2\n")).to_dict("list") == {
        "a": [1], "b": [2]}
    assert read_frame(write(tmp_path, "one.csv", "name\nAnna\nBob\n")).to_dict("list") == {
        "name": ["Anna", "Bob"]}
    assert list(read_frame(write(tmp_path, "head.csv", "a;b;c\n")).columns) == ["a", "b", "c"]


def test_a_given_delimiter_is_used_as_given(tmp_path: Path) -> None:
    path = write(tmp_path, "t.csv", "a;b\n1;2\n")
    assert list(read_frame(path, delimiter=",").columns) == ["a;b"]  # what the user asked
    assert read_frame(path, delimiter=";").to_dict("list") == {"a": [1], "b": [2]}
    tab = write(tmp_path, "tab.csv", "a\tb\n1\t2\n")
    for spelt in ("\t", "\\t", "tab"):
        assert list(read_frame(tab, delimiter=spelt).columns) == ["a", "b"]


def test_a_missing_column_after_a_wrong_delimiter_says_which_delimiter(tmp_path: Path) -> None:
    path = write(tmp_path, "t.csv", "id;a;y\n1;2;0\n2;3;1\n")
    schema = PartySchema(name="p", role="primary", numeric=("a",), label="y", task="binary",
                         delimiter=",")
    with pytest.raises(DataError) as info:
        load_table(schema, path)
    text = str(info.value)
    assert "t.csv" in text and "['a', 'y']" in text and "delimiter = ';'" in text


def test_a_latin1_file_names_line_column_and_the_fix(tmp_path: Path) -> None:
    text = "id,name,city\n1,Anna,Bonn\n2,Jäger,Köln\n"
    path = write(tmp_path, "people.csv", text, encoding="latin-1")
    for columns in ((), ("name",)):
        with pytest.raises(DataError) as info:
            read_frame(path, text_columns=columns)
        message = str(info.value)
        assert message.startswith(f"{path}: line 3, column 'name' (character 4): byte 0xe4 "
                                  "is not valid utf-8")
        assert 'encoding = "latin-1"' in message and "--encoding" in message
    frame = read_frame(path, encoding="latin-1")
    assert frame["name"].tolist() == ["Anna", "Jäger"] and frame["city"].tolist()[1] == "Köln"


def test_a_bad_byte_in_the_header_is_on_line_1(tmp_path: Path) -> None:
    path = write(tmp_path, "t.csv", "id;Stra\xdfe\n1;a\n", encoding="cp1252")
    with pytest.raises(DataError, match=r"line 1, column 2 \(character 8\): byte 0xdf"):
        read_frame(path)
    assert list(read_frame(path, encoding="cp1252").columns) == ["id", "Straße"]


def test_a_byte_order_mark_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_bytes(b"\xef\xbb\xbfid;name\n1;A\n")
    assert list(read_frame(path).columns) == ["id", "name"]
    assert list(read_frame(path, text_columns=("id",)).columns) == ["id", "name"]


def test_bad_options_are_named(tmp_path: Path) -> None:
    path = write(tmp_path, "t.csv", "a\n1\n")
    with pytest.raises(DataError, match=r"t\.csv: `delimiter` must be one character"):
        read_frame(path, delimiter=";;")
    with pytest.raises(DataError, match=r"`encoding` must be a text encoding .* got 'utf-9'"):
        read_frame(path, encoding="utf-9")
    with pytest.raises(ConfigError) as info:
        PartySchema(name="p", role="secondary", numeric=("a",), delimiter="ab",
                    encoding="klingon")
    assert len(info.value.problems) == 2


def test_party_schema_options_reach_the_reader(tmp_path: Path) -> None:
    frame = pd.DataFrame({"id": ["k1", "k2"], "a": [1.5, 2.5], "c": ["Müller", "Groß"]})
    path = tmp_path / "t.csv"
    frame.to_csv(path, sep="|", index=False, encoding="cp1252")
    schema = PartySchema(name="p", role="secondary", key=("id",), numeric=("a",),
                         categorical=("c",), delimiter="|", encoding="cp1252")
    table = load_table(schema, path)
    assert table.frame["c"].tolist() == ["Müller", "Groß"]
    assert table.frame["a"].tolist() == [1.5, 2.5]


def test_decimal_commas_are_read_with_the_option_and_named_without_it(tmp_path: Path) -> None:
    path = write(tmp_path, "t.csv", "id;lat;y\nk1;1,5;0\nk2;-2,25;1\n")
    schema = PartySchema(name="p", role="primary", key=("id",), numeric=("lat",), label="y",
                         task="binary")
    with pytest.raises(DataError) as info:
        load_table(schema, path)
    text = str(info.value)
    assert "column 'lat'" in text and "line 2 of a CSV" in text and 'decimal = ","' in text
    with_option = PartySchema(name="p", role="primary", key=("id",), numeric=("lat",),
                              label="y", task="binary", decimal=",")
    assert load_table(with_option, path).frame["lat"].tolist() == [1.5, -2.25]
    with pytest.raises(DataError, match="delimiter and the decimal mark are both ','"):
        read_frame(path, delimiter=",", decimal=",")
    with pytest.raises(ConfigError, match=r"`decimal` must be"):
        PartySchema(name="p", role="secondary", numeric=("a",), decimal=";")


def test_a_utf16_file_is_named_as_such(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_bytes("id,name\n1,Jäger\n".encode("utf-16"))
    with pytest.raises(DataError, match=r't\.csv: the file is UTF-16 .* encoding = "utf-16"'):
        read_frame(path)
    assert read_frame(path, encoding="utf-16")["name"].tolist() == ["Jäger"]
