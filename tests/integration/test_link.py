"""Soft linkage through a coordinator: the boundary contract and the ``vflink link`` command."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.helpers.links import linked
from vflink.cli.main import main
from vflink.linkage import brute_haversine, brute_levenshtein
from vflink.protocol import AlignmentView, IdentifierEncodings
from vflink.transport import Transcript


def places(n: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"lat": rng.uniform(37.0, 38.0, n), "lon": rng.uniform(-122.5, -121.5, n),
                         "price": rng.normal(size=n)})


@pytest.mark.parametrize("bloom", [False, True])
def test_only_encodings_reach_the_coordinator(bloom: bool) -> None:
    p, s = places(300, 0), places(120, 1)
    transcript = Transcript()
    out = linked(p, s, on=("lat", "lon"), metric="haversine", top_k=5,
                 privacy="bloom" if bloom else "off", tau=0.9, seed=3, transcript=transcript)
    to_coord = [r for r in transcript.records if r.receiver == "coordinator"]
    assert {r.message.kind for r in to_coord} <= {"identifier_encodings", "soft_link",
                                                  "fetch_alignment", "key_tag",
                                                  "fetch_key_tags"}
    raw_values = set(np.round(p[["lat", "lon"]].to_numpy().ravel(), 9))
    for r in to_coord:
        if isinstance(r.message, IdentifierEncodings):
            values = np.asarray(r.message.values)
            if bloom:  # keyed Bloom filters only: packed bits, no coordinate value
                assert values.dtype == np.uint8
                assert not (set(np.round(values.astype(float).ravel(), 9)) & raw_values)
            else:  # privacy off was asked for: raw coordinates travel
                assert values.dtype == np.float64
    views = [r for r in transcript.records if isinstance(r.message, AlignmentView)]
    assert views and all(v.receiver == "secondary" and v.message.similarity is None
                         for v in views)
    assert out.alignment.similarity is not None and out.alignment.k == 5
    assert out.privacy == ("bloom" if bloom else "off")


def test_exact_search_through_parties_equals_brute_force() -> None:
    p, s = places(200, 4), places(90, 5)
    out = linked(p, s, on=("lat", "lon"), metric="haversine", top_k=7, seed=0, privacy="off")
    truth = brute_haversine(p[["lat", "lon"]].to_numpy(), s[["lat", "lon"]].to_numpy(), 7).distances
    np.testing.assert_allclose(out.linkage.distances, truth, rtol=1e-6, atol=1e-6)
    # Eq. 1 before noise: mean 0, standard deviation 1
    rho = out.linkage.raw_similarities()
    assert abs(rho.mean()) < 1e-9 and abs(rho.std() - 1) < 1e-9


def test_titles_by_levenshtein() -> None:
    p = pd.DataFrame({"title": ["The Matrix", "Alien", "Heat", "Up"]})
    s = pd.DataFrame({"name": ["Matrix, The", "Aliens", "Heat!", "Up", "Jaws", "Ran"]})
    out = linked(p, s, on=("title",), secondary_on=("name",), metric="levenshtein", top_k=2,
                 seed=0, privacy="off")
    assert out.linkage.indices[2, 0] == 2 and out.linkage.indices[3, 0] == 3
    from vflink.linkage import normalize_string

    truth = brute_levenshtein([normalize_string(t) for t in p["title"]],
                              [normalize_string(t) for t in s["name"]], 2).distances
    np.testing.assert_allclose(out.linkage.distances, truth)


def write(tmp_path: Path, p: pd.DataFrame, s: pd.DataFrame) -> tuple[Path, Path]:
    pp, sp = tmp_path / "p.csv", tmp_path / "s.parquet"
    p.to_csv(pp, index=False)
    s.to_parquet(sp)
    return pp, sp


@pytest.mark.parametrize("ext", ["csv", "parquet"])
def test_link_command_writes_table_summary_and_plot(tmp_path: Path, ext: str) -> None:
    pp, sp = write(tmp_path, places(150, 0), places(60, 1))
    out = tmp_path / f"links.{ext}"
    code = main(["link", "--primary", str(pp), "--secondary", str(sp), "--on", "lat,lon",
                 "--metric", "haversine", "--top-k", "4", "--tau", "0.95", "--bloom",
                 "--seed", "1", "--out", str(out), "--charts"])
    assert code == 0
    table = pd.read_csv(out) if ext == "csv" else pd.read_parquet(out)
    assert list(table.columns) == ["primary_index", "secondary_index", "rank", "distance",
                                   "similarity"]
    assert len(table) == 150 * 4
    assert table["rank"].between(0, 3).all() and table["primary_index"].max() == 149
    assert table["secondary_index"].between(0, 59).all()
    summary = json.loads((tmp_path / f"links.{ext}.summary.json").read_text())
    assert summary["tau"] == pytest.approx(0.95) and summary["privacy"] == "bloom"
    assert set(summary["improvement_delta"]) == {"exact", "top1sim", "avgsim"}
    assert (tmp_path / f"links.{ext}.similarity.png").stat().st_size > 1000


BAD = {
    "mismatched dims": (["--on", "lat,lon", "--secondary-on", "lat", "--metric", "euclidean"],
                        "--secondary-on"),
    "nan coordinate": (["--on", "lat,lon", "--metric", "haversine"],
                       "s.parquet: identifier column 'lat' is empty at row 7"),
    "latitude out of range": (["--on", "lat,lon", "--metric", "haversine"], "latitude outside"),
    "k too large": (["--on", "lat,lon", "--metric", "euclidean", "--top-k", "999"],
                    "larger than the secondary table"),
    "empty string": (["--on", "name", "--metric", "levenshtein"],
                     "s.parquet: identifier column 'name' is empty at row 2"),
    "unknown column": (["--on", "lat,height", "--metric", "euclidean"], "height"),
    "secondary lacks a column": (
        ["--on", "lat,lon", "--secondary-on", "lat,height", "--metric", "hamming"],
        "s.parquet: identifier column(s) ['height'] expected but missing from the table; "
        "this table has: lat, lon, price, name"),
    "unreachable tau": (["--on", "lat,lon", "--metric", "euclidean", "--tau", "0.0001"],
                        "smallest achievable"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_link_bad_input_leaves_no_output(tmp_path: Path, case: str,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    p, s = places(50, 0), places(30, 1)
    p["name"], s["name"] = "a", "b"
    if case == "nan coordinate":
        s.loc[7, "lat"] = np.nan
    if case == "latitude out of range":
        p.loc[3, "lat"] = 123.0
    if case == "empty string":
        s.loc[2, "name"] = "  "
    pp, sp = write(tmp_path, p, s)
    args, needle = BAD[case]
    if "--top-k" not in args:
        args = [*args, "--top-k", "3"]
    out = tmp_path / "links.csv"
    code = main(["link", "--primary", str(pp), "--secondary", str(sp), *args, "--out", str(out)])
    err = " ".join(capsys.readouterr().err.split())
    assert code != 0
    assert needle in err, err
    assert not out.exists() and not list(tmp_path.glob(".links*"))
