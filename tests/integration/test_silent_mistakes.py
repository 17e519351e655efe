"""Mistakes that used to give a wrong answer without a word: the two sides naming the same
columns in another order (longitude compared with latitude), and empty keys in an alignment
(dropped with one, a "duplicate key b''" with two). Both are said: the first as a warning
naming the pairing and the fix, the second as an error naming the table, column and row."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import vflink
from tests.helpers.cli import run_cli
from vflink._checks import column_order_warning
from vflink.cli._errors import EXIT_USAGE
from vflink.errors import DataError


def test_the_warning_names_the_pairing_and_the_fix() -> None:
    text = column_order_warning(["lon", "lat"], ["lat", "lon"])
    assert text is not None
    assert "lon ↔ lat, lat ↔ lon" in text and "--secondary-on lon,lat" in text
    assert column_order_warning(["lat", "lon"], ["lat", "lon"]) is None
    assert column_order_warning(["lat", "lon"], ["latitude", "longitude"]) is None
    assert column_order_warning(["a", "b", "c"], ["a", "c", "x"]) is not None  # c moved


def _said(caplog: pytest.LogCaptureFixture) -> str:
    return " ".join(r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING)


def test_link_warns_when_coordinates_are_swapped(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str],
                                                 caplog: pytest.LogCaptureFixture) -> None:
    # places where a swapped pair is still a valid (latitude, longitude): nothing else says so
    rng = np.random.default_rng(5)
    lat, lon = rng.uniform(48, 52, 60), rng.uniform(2, 8, 60)
    pd.DataFrame({"lat": lat[:40], "lon": lon[:40]}).to_csv(tmp_path / "h.csv", index=False)
    pd.DataFrame({"lat": lat, "lon": lon}).to_csv(tmp_path / "p.csv", index=False)
    common = ["link", "--primary", str(tmp_path / "h.csv"), "--secondary", str(tmp_path / "p.csv"),
              "--metric", "haversine", "--top-k", "1", "--seed", "0", "--sigma", "0.5"]
    with caplog.at_level(logging.WARNING):
        code, _ = run_cli([*common, "--on", "lon,lat", "--secondary-on", "lat,lon", "--out",
                           str(tmp_path / "swapped.csv")], capsys)
    assert code == 0
    assert "same column(s) ['lon', 'lat'] at other positions" in _said(caplog)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        code, _ = run_cli([*common, "--on", "lat,lon", "--out", str(tmp_path / "ok.csv")],
                          capsys)
    assert code == 0 and "other positions" not in _said(caplog)


def test_align_and_runs_warn_about_reordered_keys(tmp_path: Path,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    a = pd.DataFrame({"last": ["x", "y"], "first": ["p", "q"]})
    b = pd.DataFrame({"first": ["p", "q"], "last": ["x", "y"]})
    for method in ("psu", "exact"):
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            m = vflink.align(a, b, on="last,first", secondary_on="first,last", method=method,
                             seed=0)
        assert len(m.pairs) == 0  # nothing matches: the keys were paired the other way
        assert "key columns ['last', 'first']" in _said(caplog), method


@pytest.mark.parametrize("method", ["psu", "psi", "exact"])
@pytest.mark.parametrize("missing", [[1], [0, 2]], ids=["one", "two"])
def test_an_empty_key_is_named_not_dropped(method: str, missing: list[int]) -> None:
    emails = ["a@x", "b@x", "c@x", "d@x"]
    for i in missing:
        emails[i] = np.nan  # type: ignore[call-overload]
    a = pd.DataFrame({"email": emails})
    b = pd.DataFrame({"email": ["a@x", "b@x", "c@x", "d@x"]})
    with pytest.raises(DataError) as info:
        vflink.align(a, b, on="email", method=method, seed=0)
    text = str(info.value)
    assert f"key column 'email' is empty at row {missing[0]}" in text, text
    assert "duplicate" not in text and "fill the key in" in text
    with pytest.raises(DataError, match="secondary: key column 'email' is empty at row 2"):
        vflink.align(b, a.fillna({"email": "z@x"}).assign(
            email=["a@x", "b@x", "  ", "d@x"]), on="email", method=method, seed=0)


def test_the_align_command_names_an_empty_key_by_its_row_in_the_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = [f"k{i}" for i in range(10)]
    pd.DataFrame({"id": rows}).to_csv(tmp_path / "a.csv", index=False)
    rows[7] = ""
    pd.DataFrame({"id": rows}).to_csv(tmp_path / "b.csv", index=False)
    code, err = run_cli(["align", "--primary", str(tmp_path / "a.csv"), "--secondary",
                         str(tmp_path / "b.csv"), "--on", "id", "--chunk-rows", "3",
                         "--out", str(tmp_path / "out")], capsys)
    assert code == EXIT_USAGE
    assert "b.csv: key column 'id' is empty at row 7 (line 9 of a CSV)" in err, err


def test_a_run_warns_when_a_secondary_lists_the_identifiers_in_another_order(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    rng = np.random.default_rng(0)
    pd.DataFrame({"lat": rng.uniform(48, 52, 60), "lon": rng.uniform(2, 8, 60),
                  "x": rng.normal(size=60), "y": rng.integers(0, 2, 60)}).to_csv(
        tmp_path / "p.csv", index=False)
    pd.DataFrame({"lat": rng.uniform(48, 52, 50), "lon": rng.uniform(2, 8, 50),
                  "z": rng.normal(size=50)}).to_csv(tmp_path / "s.csv", index=False)
    config = {"version": 1, "algorithm": "fedsim",
              "data": {"parties": [
                  {"name": "primary", "role": "primary", "path": str(tmp_path / "p.csv"),
                   "identifiers": ["lat", "lon"], "numeric": ["x"], "label": "y",
                   "task": "binary"},
                  {"name": "shop", "role": "secondary", "path": str(tmp_path / "s.csv"),
                   "identifiers": ["lon", "lat"], "numeric": ["z"]}]},
              "alignment": {"method": "soft", "metric": "haversine", "top_k": 2},
              "training": {"epochs": 1}}
    with caplog.at_level(logging.WARNING):
        vflink.train(config, out=tmp_path / "run")
    said = _said(caplog)
    assert "party 'shop': the primary's identifier columns ['lat', 'lon']" in said, said
    assert "the identifier list of party 'shop'" in said
