"""Files as people have them, from the command line: delimiter and encoding
options in link, run and party files and as flags; --empty skip names a bad cell by its row in
the file; predict asks only for the columns it needs; a [link] file's problems all at once."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from vflink.cli._errors import EXIT_USAGE
from vflink.cli.main import main
from vflink.runfiles.party import load_party_config


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    capsys.readouterr()
    code = main(args)
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return code, " ".join(err.split())


PEOPLE = [("1", "Jürgen Müller"), ("2", "Anna Smith"), ("3", "Bob Jones")]
OTHERS = [("a", "Jurgen Muller"), ("b", "Ana Smith"), ("c", "Bob Jonas")]


def write(path: Path, rows: list[tuple[str, ...]], sep: str, encoding: str) -> Path:
    path.write_bytes("".join(sep.join(r) + "\n" for r in [("id", "name"), *rows])
                     .encode(encoding))
    return path


def test_link_file_delimiter_and_encoding(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                          caplog: pytest.LogCaptureFixture) -> None:
    write(tmp_path / "a.csv", PEOPLE, ";", "latin-1")
    write(tmp_path / "b.csv", OTHERS, "|", "utf-8")
    base = ('[link]\nprimary = "a.csv"\nsecondary = "b.csv"\non = "name"\n'
            'metric = "levenshtein"\nprivacy = "off"\ntop_k = 1\nout = "l.csv"\nid = "id"\n')
    (tmp_path / "link.toml").write_text(base)
    code, err = run_cli(["link", "--config", str(tmp_path / "link.toml")], capsys)
    assert code == EXIT_USAGE
    assert "a.csv: line 2, column 'name'" in err and "latin-1" in err
    (tmp_path / "link.toml").write_text(base + 'encoding = "latin-1"\n'
                                        'secondary_encoding = "utf-8"\n')
    code, err = run_cli(["link", "--config", str(tmp_path / "link.toml")], capsys)
    assert code == 0, err
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "a.csv: read with delimiter ';' (detected" in said  # detected, and said
    assert "b.csv: read with delimiter '|' (detected" in said
    links = pd.read_csv(tmp_path / "l.csv", dtype=str)
    assert links.set_index("primary_id")["secondary_id"].to_dict() == {
        "1": "a", "2": "b", "3": "c"}


def test_link_flags_delimiter_and_encoding(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                           caplog: pytest.LogCaptureFixture) -> None:
    p = write(tmp_path / "a.csv", PEOPLE, ";", "cp1252")
    s = write(tmp_path / "b.csv", OTHERS, ";", "cp1252")
    args = ["link", "--primary", str(p), "--secondary", str(s), "--on", "name", "--metric",
            "levenshtein", "--privacy", "off", "--top-k", "1", "--out", str(tmp_path / "l.csv")]
    code, err = run_cli([*args, "--delimiter", ";", "--encoding", "cp1252"], capsys)
    assert code == 0, err
    assert not [r for r in caplog.records if "detected" in r.getMessage()]  # given
    code, err = run_cli([*args, "--encoding", "utf-9", "--delimiter", ";;", "--overwrite"],
                        capsys)
    assert code == EXIT_USAGE and "`encoding`" in err and "`delimiter`" in err


def test_link_file_problems_are_reported_together(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "link.toml").write_text(
        '[link]\nprimary = "a.csv"\nsecondary = "b.csv"\non = "name"\nmetric = "jaccard"\n'
        'top_k = 0\nout = "l.txt"\nmode = "fuzzy"\nempty = "ignore"\ndelimiter = ";;"\n'
        'colour = "blue"\n[link.geo]\ndirections = 0\n')
    code, err = run_cli(["link", "--config", str(tmp_path / "link.toml")], capsys)
    assert code == EXIT_USAGE
    assert "link.toml" in err and "8 problems" in err, err
    for text in ("`metric` must be one of", "`top_k` must be an int", "--out must end in",
                 "`mode` must be one of", "`empty` must be one of", "`delimiter`",
                 "unknown key(s) ['colour']", "[link.geo]: ", "directions"):
        assert text in err, text


def test_empty_skip_names_a_bad_cell_by_its_row_in_the_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p, s = tmp_path / "p.csv", tmp_path / "s.csv"
    # row 2 (line 4) is empty and skipped; the bad cell is in row 4, on line 6 of the file
    p.write_text("lat,lon\n10,20\n11,21\n,22\n12,23\nabc,24\n13,25\n")
    s.write_text("lat,lon\n10,20\n11,21\n12.5,22\n12,23\n")
    args = ["link", "--primary", str(p), "--secondary", str(s), "--on", "lat,lon", "--top-k",
            "2", "--out", str(tmp_path / "l.csv"), "--empty", "skip", "--seed", "0"]
    code, err = run_cli([*args, "--metric", "euclidean"], capsys)
    assert code == EXIT_USAGE and "p.csv" in err and "'lat'" in err
    assert "row 4 (line 6 of a CSV), value 'abc'" in err, err
    p.write_text("lat,lon\n10,20\n11,21\n,22\n12,23\n95,24\n13,25\n")
    code, err = run_cli([*args, "--metric", "haversine"], capsys)
    assert code == EXIT_USAGE and "p.csv" in err and "latitude" in err
    assert "row 4 (line 6 of a CSV), value 95.0" in err, err
    p.write_text("lat,lon\n10,20\n11,21\n,22\n12,23\n12,24\n13,25\n")
    code, err = run_cli([*args, "--metric", "haversine"], capsys)
    assert code == 0, err
    summary = json.loads((tmp_path / "l.csv.summary.json").read_text())
    assert summary["skipped_rows"] == {"primary": 1, "secondary": 0}


RUN = """version = 1
seed = 0
algorithm = "splitnn"
[[data.parties]]
name = "primary"
role = "primary"
path = "p.csv"
key = ["id"]
numeric = ["x"]
categorical = ["town"]
label = "y"
task = "binary"
{options}
[[data.parties]]
name = "bank"
role = "secondary"
path = "s.csv"
key = ["id"]
numeric = ["z"]
[training]
epochs = 1
"""


def test_run_file_options_and_predict_asks_only_for_needed_columns(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    n = 120
    towns = ["Köln", "Düsseldorf", "Bonn"]
    ids = [f"k{i}" for i in range(n)]
    x = [((i * 37) % 11) / 10 for i in range(n)]
    p = pd.DataFrame({"id": ids, "x": x, "town": [towns[i % 3] for i in range(n)],
                      "y": [int(v > 0.5) for v in x]})
    p.to_csv(tmp_path / "p.csv", sep=";", index=False, encoding="cp1252")
    pd.DataFrame({"id": ids, "z": [v * 2 for v in x]}).to_csv(tmp_path / "s.csv", index=False)
    config = tmp_path / "run.toml"
    config.write_text(RUN.format(options=""))
    code, err = run_cli(["train", "--config", str(config), "--out", str(tmp_path / "r")],
                        capsys)
    assert code == EXIT_USAGE and "p.csv: line 2, column 'town'" in err
    config.write_text(RUN.format(options='encoding = "cp1252"\ndelimiter = ";"'))
    code, err = run_cli(["train", "--config", str(config), "--out", str(tmp_path / "r")],
                        capsys)
    assert code == 0, err
    saved = json.loads((tmp_path / "r" / "config.json").read_text())["data"]["parties"]
    assert saved[0]["encoding"] == "cp1252" and saved[0]["delimiter"] == ";"
    assert "encoding" not in saved[1]  # not given: as the file had it
    # new records without the label and without `x`: only `x` is asked for
    new = p.drop(columns=["y", "x"]).head(5)
    new.to_csv(tmp_path / "new.csv", sep=";", index=False, encoding="cp1252")
    args = ["predict", "--run", str(tmp_path / "r"), "--input", str(tmp_path / "new.csv"),
            "--out", str(tmp_path / "pred.csv"), "--encoding", "cp1252"]
    code, err = run_cli(args, capsys)
    assert code == EXIT_USAGE and "new.csv" in err and "['x']" in err, err
    assert "this table has: id, town" in err and "'y' is optional" in err
    p.drop(columns=["y"]).head(5).to_csv(tmp_path / "new.csv", sep=";", index=False,
                                         encoding="cp1252")
    code, err = run_cli(args, capsys)
    assert code == 0, err
    assert len(pd.read_csv(tmp_path / "pred.csv")) == 5


def test_party_file_table_options(tmp_path: Path) -> None:
    (tmp_path / "bank.toml").write_text(
        'version = 1\n[party]\nname = "bank"\nrole = "secondary"\nlisten = "127.0.0.1:0"\n'
        '[peers.coordinator]\naddress = "127.0.0.1:1"\nrole = "coordinator"\n'
        '[party.table]\npath = "bank.csv"\nkey = ["id"]\nnumeric = ["z"]\n'
        'categorical = ["town"]\ndelimiter = "\\t"\nencoding = "latin-1"\n'
        '[security]\ninsecure = true\n')
    (tmp_path / "bank.csv").write_bytes("id\tz\ttown\nk1\t1.5\tKöln\n".encode("latin-1"))
    config = load_party_config(tmp_path / "bank.toml")
    assert config.table is not None
    assert (config.table.delimiter, config.table.encoding) == ("\t", "latin-1")
    from vflink.data.table import load_table

    assert load_table(config.table).frame["town"].tolist() == ["Köln"]
