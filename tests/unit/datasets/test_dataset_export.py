"""export_dataset: tables + a party config that reads back to the same data."""

from __future__ import annotations

import tomllib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from vflink.data import PartySchema, load_table
from vflink.datasets import export_dataset, load_dataset
from vflink.errors import ConfigError


def _schemas(config: Path) -> list[PartySchema]:
    raw = tomllib.loads(config.read_text(encoding="utf-8"))
    assert raw["version"] == 1
    return [PartySchema(**{**p, "path": config.parent / p["path"]})
            for p in raw["data"]["parties"]]


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_export_round_trips(tmp_path: Path, fmt: str) -> None:
    ds = load_dataset("sklearn-small", n_samples=300, overlap=0.8)
    paths = export_dataset(ds, tmp_path / "out", fmt=fmt)
    assert set(paths) == {"primary", "secondary", "config", "truth:secondary"}
    assert paths["primary"].name == f"primary.{fmt}"
    schemas = _schemas(paths["config"])
    assert [s.name for s in schemas] == ["primary", "secondary"]
    for schema, table in zip(schemas, ds.parties):
        assert schema.key == table.schema.key and schema.numeric == table.schema.numeric
        assert schema.label == table.schema.label and schema.task == table.schema.task
        loaded = load_table(schema)
        cols = list(table.schema.numeric)
        np.testing.assert_allclose(loaded.frame[cols].to_numpy(), table.frame[cols].to_numpy())
        assert loaded.frame["id"].tolist() == table.frame["id"].tolist()
    truth = pd.read_csv(paths["truth:secondary"])
    expected = ds.true_secondary_index[0]
    assert len(truth) == int((expected >= 0).sum())
    np.testing.assert_array_equal(expected[truth["primary_row"]], truth["secondary_row"])


def test_export_real_dataset_with_categoricals(tmp_path: Path) -> None:
    ds = load_dataset("california-housing", max_rows=100)
    paths = export_dataset(ds, tmp_path)
    assert not any(k.startswith("truth:") for k in paths)  # no ground truth to write
    airports = next(s for s in _schemas(paths["config"]) if s.name == "airports")
    assert airports.categorical == ("kind",) and airports.identifiers == ("latitude", "longitude")
    assert len(load_table(airports)) == len(ds.party("airports"))


def test_export_refuses_to_overwrite(tmp_path: Path) -> None:
    ds = load_dataset("sklearn-small", n_samples=50, n_clusters_per_class=1)
    export_dataset(ds, tmp_path)
    with pytest.raises(ConfigError, match="overwrite"):
        export_dataset(ds, tmp_path)
    export_dataset(ds, tmp_path, overwrite=True)
    with pytest.raises(ConfigError, match="`fmt` must be one of csv, parquet, got 'xlsx'"):
        export_dataset(ds, tmp_path / "x", fmt="xlsx")
