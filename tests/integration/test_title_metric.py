"""A title linked as one [[alignment.fields]] entry: FedSim's similarities come from the edit
distance divided by the longer title's length (the FedSim authors' distance for their
title-linked "game" data), while Exact's links stay those of the plain Levenshtein metric.

This is what ``examples/experiments/imdb-titles-normalized.toml`` relies on to close the IMDb
gap between FedSim and Exact (``examples/experiments/imdb-gap.md``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from rapidfuzz.distance import Levenshtein

from vflink.data.schema import PartySchema
from vflink.linkage.encoding.strings import normalize_string
from vflink.runfiles.config import AlignmentConfig, DataConfig, RunConfig, TrainingConfig
from vflink.runfiles.inputs import load_inputs
from vflink.runner.federation import in_process
from vflink.runner.prepare import prepare
from vflink.types import MISSING

PRIMARY_TITLES = ["Heat", "Matrix, The", "Alien", "Aliens", "Up", "Star Wars", "Jaws 2",
                  "Solaris"]
SECONDARY_TITLES = ["bolt", "Heatwave", "The Matrix", "Alien", "Alien", "Aliens", "Us",
                    "Star Wars", "Star Trek", "Upside", "Jaws", "Jaws 3", "Solaris"]
K = 3


def write_config(tmp: Path, **alignment: Any) -> RunConfig:
    rng = np.random.default_rng(0)
    pd.DataFrame({"title": PRIMARY_TITLES, "p0": rng.normal(size=len(PRIMARY_TITLES)),
                  "y": rng.normal(size=len(PRIMARY_TITLES))}).to_csv(tmp / "p.csv", index=False)
    pd.DataFrame({"title": SECONDARY_TITLES, "s0": rng.normal(size=len(SECONDARY_TITLES))}
                 ).to_csv(tmp / "s.csv", index=False)
    parties = (PartySchema(name="films", role="primary", path=tmp / "p.csv",
                           identifiers=("title",), numeric=("p0",), label="y",
                           task="regression"),
               PartySchema(name="reviews", role="secondary", path=tmp / "s.csv",
                           identifiers=("title",), numeric=("s0",)))
    return RunConfig(seed=0, algorithm="fedsim", data=DataConfig(parties=parties),
                     alignment=AlignmentConfig(method="soft", top_k=K, privacy="off",
                                               **alignment),
                     training=TrainingConfig(epochs=1))


def link(tmp: Path, **alignment: Any) -> tuple[Any, Any]:
    """(the coordinator's top-K linkage, the primary's exact alignment)."""
    cfg = write_config(tmp, **alignment)
    inputs = load_inputs(cfg)
    federation = in_process(inputs, cfg)
    prepared = prepare(cfg, inputs, federation=federation, algorithms=["exact", "fedsim"])
    soft = federation.parties["coordinator"].linkage("soft", "reviews")
    return soft, prepared.alignments["exact"]["reviews"]


def oracle(scorer: Any) -> np.ndarray:
    p = [normalize_string(t) for t in PRIMARY_TITLES]
    s = [normalize_string(t) for t in SECONDARY_TITLES]
    return np.array([[float(scorer(a, b)) for b in s] for a in p])


@pytest.fixture(scope="module")
def linked(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Any, Any]]:
    raw_dir = tmp_path_factory.mktemp("raw")
    field_dir = tmp_path_factory.mktemp("field")
    return {"raw": link(raw_dir, metric="levenshtein"),
            "field": link(field_dir, fields=({"on": ["title"], "metric": "levenshtein"},))}


@pytest.mark.parametrize(("kind", "scorer"), [("raw", Levenshtein.distance),
                                              ("field", Levenshtein.normalized_distance)])
def test_links_are_the_k_nearest_titles_under_each_distance(
        linked: dict[str, tuple[Any, Any]], kind: str, scorer: Any) -> None:
    soft, _ = linked[kind]
    want = oracle(scorer)
    got = np.take_along_axis(want, soft.indices, axis=1)
    np.testing.assert_allclose(soft.distances, got, atol=1e-6)
    np.testing.assert_allclose(soft.distances, np.sort(want, axis=1)[:, :K], atol=1e-6)
    # Eq. 1 is applied to those distances, whichever they are
    rho = (-soft.distances - soft.mu0) / soft.sigma0
    np.testing.assert_allclose(soft.similarities, rho, atol=1e-9)


def test_the_normalised_distance_ranks_by_the_share_of_the_title_edited(
        linked: dict[str, tuple[Any, Any]]) -> None:
    # "heat": 3 edits to "bolt" (3/4 of the title) against 4 to "heatwave" (half of it)
    heat = PRIMARY_TITLES.index("Heat")
    assert SECONDARY_TITLES[linked["raw"][0].indices[heat, 0]] == "bolt"
    assert SECONDARY_TITLES[linked["field"][0].indices[heat, 0]] == "Heatwave"


def test_exact_links_do_not_depend_on_the_normalisation(
        linked: dict[str, tuple[Any, Any]]) -> None:
    raw = linked["raw"][1].for_primary_rows(len(PRIMARY_TITLES))[:, 0]
    field = linked["field"][1].for_primary_rows(len(PRIMARY_TITLES))[:, 0]
    np.testing.assert_array_equal(raw, field)
    s = [normalize_string(t) for t in SECONDARY_TITLES]
    for i, title in enumerate(PRIMARY_TITLES):
        if normalize_string(title) in s:
            assert s[raw[i]] == normalize_string(title)
        else:
            assert raw[i] == MISSING
    # "Matrix, The" is no exact match of "The Matrix", nor "Jaws 2" of "Jaws"
    assert [t for t, r in zip(PRIMARY_TITLES, raw) if r != MISSING] == [
        "Alien", "Aliens", "Star Wars", "Solaris"]
