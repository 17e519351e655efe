"""`vflink link` on real files: text identifiers, empty identifiers, record ids, errors that
name the file; identifiers that are also features in run files."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from vflink.cli.main import main
from vflink.errors import ConfigError
from vflink.linkage import brute_levenshtein, normalize_string
from vflink.runfiles.config import parse_config

PRIMARY = "name,code,cc\nAnna Smith,0019151111,NA\nBob Jones,2,US\n,3,DE\nCarl Berg,4,FR\n"
SECONDARY = "name,code\nAnna Smyth,a1\nBob Jone,b2\nKarl Berg,c3\n"


def files(tmp_path: Path) -> tuple[Path, Path]:
    p, s = tmp_path / "people.csv", tmp_path / "others.csv"
    p.write_text(PRIMARY)
    s.write_text(SECONDARY)
    return p, s


def link(p: Path, s: Path, out: Path, *extra: str) -> int:
    return main(["link", "--primary", str(p), "--secondary", str(s), "--on", "name",
                 "--metric", "levenshtein", "--top-k", "2", "--out", str(out),
                 "--privacy", "off", *extra])  # raw distances, checked against brute force


def test_empty_identifier_fails_naming_file_column_and_row(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p, s = files(tmp_path)
    out = tmp_path / "links.csv"
    assert link(p, s, out) != 0
    err = " ".join(capsys.readouterr().err.split())
    assert "people.csv" in err and "'name'" in err and "row 2" in err and "skip" in err
    assert "second" not in err and not out.exists()


@pytest.mark.parametrize("ext", ["csv", "parquet"])
def test_skip_links_the_rest_and_counts_the_skipped_row(tmp_path: Path, ext: str) -> None:
    p, s = files(tmp_path)
    out = tmp_path / f"links.{ext}"
    assert link(p, s, out, "--empty", "skip", "--id", "code") == 0
    table = pd.read_csv(out, dtype={"primary_id": str, "secondary_id": str}) \
        if ext == "csv" else pd.read_parquet(out)
    summary = json.loads(Path(f"{out}.summary.json").read_text())
    assert summary["skipped_rows"] == {"primary": 1, "secondary": 0}
    # the skipped row keeps its position (2) and has no link; the others match brute force
    assert sorted(set(table["primary_index"])) == [0, 1, 3]
    names = pd.read_csv(p, keep_default_na=False)["name"].tolist()
    others = pd.read_csv(s)["name"].tolist()
    for row in (0, 1, 3):
        truth = brute_levenshtein([normalize_string(names[row])],
                                  [normalize_string(x) for x in others], 2)
        got = table[table["primary_index"] == row].sort_values("rank")
        assert got["distance"].tolist() == truth.distances[0].tolist()
    # record ids are carried as text: leading zeros kept, no float conversion
    first = table[(table["primary_index"] == 0) & (table["rank"] == 0)].iloc[0]
    assert first["primary_id"] == "0019151111" and first["secondary_id"] == "a1"


def test_text_identifiers_keep_na_and_digits(tmp_path: Path) -> None:
    p = tmp_path / "countries.csv"
    p.write_text("cc,n\nNA,1\n19151111,2\nUS,3\n")
    s = tmp_path / "other.csv"
    s.write_text("cc,m\nNA,1\nUS,2\n19151112,3\n")
    out = tmp_path / "links.csv"
    assert main(["link", "--primary", str(p), "--secondary", str(s), "--on", "cc",
                 "--metric", "levenshtein", "--top-k", "1", "--out", str(out),
                 "--privacy", "off"]) == 0
    table = pd.read_csv(out)
    # "NA" is Namibia, not a missing value; "19151111" is one edit from "19151112", not a float
    assert table.set_index("primary_index").loc[0, "distance"] == 0
    assert table.set_index("primary_index").loc[1, "distance"] == 1


PARTY = {"name": "p", "role": "primary", "path": "p.csv", "identifiers": ["lat", "lon"],
         "numeric": ["lat"], "label": "y", "task": "binary"}


def test_identifier_as_feature_needs_the_flag_and_reports_one_problem() -> None:
    raw = {"version": 1, "algorithm": "fedsim",
           "data": {"parties": [PARTY, {"name": "s", "role": "secondary", "path": "s.csv",
                                        "identifiers": ["lat", "lon"], "numeric": ["z"]}]},
           "alignment": {"method": "soft", "metric": "euclidean"}}
    with pytest.raises(ConfigError) as info:
        parse_config(raw)
    assert len(info.value.problems) == 1
    assert "identifiers_as_features" in str(info.value)
    raw["data"]["parties"][0] = {**PARTY, "identifiers_as_features": True}
    config = parse_config(raw)
    assert config.data.parties[0].identifiers_as_features is True


def test_link_file_with_fields_and_blocking(tmp_path: Path) -> None:
    p, s = tmp_path / "a.csv", tmp_path / "b.csv"
    p.write_text("first,last,zip\nanna,smith,2000\nbob,jones,3000\ncarl,berg,2000\n")
    s.write_text("given,family,zip\nana,smith,2000\nbob,jonas,3000\nkarl,berg,2000\n"
                 "anna,smyth,9999\n")
    (tmp_path / "link.toml").write_text(
        'version = 1\n[link]\nprimary = "a.csv"\nsecondary = "b.csv"\ntop_k = 2\n'
        'out = "links.csv"\nseed = 0\n'
        '[[link.fields]]\non = ["first"]\nsecondary_on = ["given"]\nmetric = "jaro-winkler"\n'
        '[[link.fields]]\non = ["last"]\nsecondary_on = ["family"]\nmetric = "levenshtein"\n'
        'weight = 2.0\n[[link.blocking]]\non = "zip"\n')
    assert main(["link", "--config", str(tmp_path / "link.toml")]) == 0
    table = pd.read_csv(tmp_path / "links.csv")
    top = table[table["rank"] == 0].set_index("primary_index")["secondary_index"]
    assert top.to_dict() == {0: 0, 1: 1, 2: 2}
    # blocking on zip: "anna smyth" (zip 9999) is never a candidate, and bob has one candidate
    assert 3 not in set(table["secondary_index"])
    assert (table["primary_index"] == 1).sum() == 1
    summary = json.loads((tmp_path / "links.csv.summary.json").read_text())
    assert summary["metric"] == "fields" and summary["skipped_rows"]["primary"] == 0


def test_link_file_field_problems_reported_together(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "link.toml").write_text(
        '[link]\nprimary = "a.csv"\nsecondary = "b.csv"\ntop_k = 2\nout = "l.csv"\n'
        '[[link.fields]]\non = ["x"]\nmetric = "cosine"\n'
        '[[link.fields]]\non = ["y"]\nmetric = "levenshtein"\nweight = -1\n')
    assert main(["link", "--config", str(tmp_path / "link.toml")]) != 0
    err = " ".join(capsys.readouterr().err.split())
    assert "fields #1" in err and "fields #2" in err


def test_identifier_that_is_also_a_feature_is_noted_in_the_run(tmp_path: Path) -> None:
    import numpy as np

    from vflink.runfiles.config import load_config
    from vflink.runner.train import run_training

    rng = np.random.default_rng(0)
    n = 120
    x = rng.uniform(0, 10, n)
    pd.DataFrame({"pos": x, "f": rng.normal(size=n), "y": (x > 5).astype(int)}).to_csv(
        tmp_path / "p.csv", index=False)
    pd.DataFrame({"pos": x + rng.normal(0, 0.01, n), "g": x * 2}).to_csv(
        tmp_path / "s.csv", index=False)
    (tmp_path / "run.toml").write_text(
        'version = 1\nalgorithm = "top1sim"\n[data]\n'
        '[[data.parties]]\nname = "p"\nrole = "primary"\npath = "p.csv"\n'
        'identifiers = ["pos"]\nnumeric = ["pos", "f"]\nlabel = "y"\ntask = "binary"\n'
        'identifiers_as_features = true\n'
        '[[data.parties]]\nname = "s"\nrole = "secondary"\npath = "s.csv"\n'
        'identifiers = ["pos"]\nnumeric = ["g"]\n'
        '[alignment]\nmethod = "soft"\nmetric = "euclidean"\nprivacy = "off"\ntop_k = 1\n'
        '[training]\nepochs = 1\n')
    result = run_training(load_config(tmp_path / "run.toml"))
    assert result.extra["alignment"]["identifiers_as_features"] == {"p": ["pos"]}


def test_link_file_geo_parameters(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pd.DataFrame({"lat": [10.0, -89.9, 51.5], "lon": [179.99, 0.0, -0.1]}).to_csv(
        tmp_path / "a.csv", index=False)
    pd.DataFrame({"lat": [10.0, -85.0, 51.6, 40.0], "lon": [-179.99, 10.0, -0.2, 3.0]}).to_csv(
        tmp_path / "b.csv", index=False)
    base = ('[link]\nprimary = "a.csv"\nsecondary = "b.csv"\ntop_k = 1\nout = "l.csv"\n'
            'on = "lat,lon"\nmetric = "haversine"\nbloom = true\nseed = 0\n')
    (tmp_path / "link.toml").write_text(base + "[link.geo]\ndirections = 8\nfilter_bits = 1024\n")
    assert main(["link", "--config", str(tmp_path / "link.toml")]) == 0
    table = pd.read_csv(tmp_path / "l.csv")
    # across the antimeridian, at the pole and in London the nearest place is found
    assert table.sort_values("primary_index")["secondary_index"].tolist() == [0, 1, 2]
    (tmp_path / "link.toml").write_text(base + "[link.geo]\ndirections = 0\n")
    assert main(["link", "--config", str(tmp_path / "link.toml"), "--overwrite"]) != 0
    assert "directions" in capsys.readouterr().err
