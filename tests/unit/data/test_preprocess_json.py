"""The preprocessor's numpy transform equals scikit-learn's, and survives a JSON round trip."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.compose import ColumnTransformer
from sklearn.impute import SimpleImputer
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import OneHotEncoder, StandardScaler

from vflink.data import PartySchema, PartyTable
from vflink.data.preprocess import MISSING_CATEGORY, Preprocessor
from vflink.errors import DataError

SCHEMA = PartySchema(name="p", role="secondary", numeric=("a", "b"), categorical=("c", "d"))


def sklearn_oracle(frame: pd.DataFrame, rows: np.ndarray, max_categories: int) -> np.ndarray:
    """The scikit-learn pipeline the preprocessor's statistics come from, applied directly."""
    numeric = Pipeline([("impute", SimpleImputer(strategy="median", add_indicator=True,
                                                 keep_empty_features=True)),
                        ("scale", StandardScaler())])
    onehot = OneHotEncoder(handle_unknown="infrequent_if_exist", max_categories=max_categories,
                           sparse_output=False, dtype=np.float32)
    ct = ColumnTransformer([("numeric", numeric, ["a", "b"]), ("categorical", onehot, ["c", "d"])],
                           sparse_threshold=0.0)

    def inputs(f: pd.DataFrame) -> pd.DataFrame:
        cats = f[["c", "d"]].astype(object)
        cats = cats.where(cats.notna(), MISSING_CATEGORY).astype(str)
        return pd.concat([f[["a", "b"]].astype(np.float64), cats], axis=1)

    ct.fit(inputs(frame.iloc[rows]))
    return np.asarray(ct.transform(inputs(frame)), dtype=np.float32)


def random_frame(seed: int, n: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    a = rng.normal(size=n)
    a[rng.random(n) < 0.2] = np.nan
    b = rng.normal(size=n) * 100
    c = rng.choice([f"k{i}" for i in range(12)], size=n).astype(object)
    c[rng.random(n) < 0.1] = None
    d = rng.choice(["x", "y", "z"], size=n)
    return pd.DataFrame({"a": a, "b": b, "c": c, "d": d})


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(8, 200), max_categories=st.sampled_from([3, 64]))
def test_transform_equals_sklearn_and_round_trips(seed: int, n: int, max_categories: int) -> None:
    frame = PartyTable.from_frame(SCHEMA, random_frame(seed, n), "mem").frame
    rows = np.arange(n // 2)  # unseen categories and values in the other half
    pre = Preprocessor(SCHEMA, max_categories=max_categories).fit(frame, rows)
    out = pre.transform(frame)
    np.testing.assert_array_equal(out, sklearn_oracle(frame, rows, max_categories))
    assert pre.n_features == out.shape[1]
    again = Preprocessor.from_json(json.loads(json.dumps(pre.to_json())), SCHEMA)
    np.testing.assert_array_equal(again.transform(frame), out)
    assert again.n_features == pre.n_features


def test_unfitted_and_featureless_round_trip() -> None:
    schema = PartySchema(name="p", role="secondary")
    pre = Preprocessor(schema).fit(pd.DataFrame({"x": [1, 2]}), np.arange(2))
    again = Preprocessor.from_json(pre.to_json(), schema)
    assert again.transform(pd.DataFrame({"x": [1, 2, 3]})).shape == (3, 0)


def test_other_version_or_columns_are_refused() -> None:
    frame = PartyTable.from_frame(SCHEMA, random_frame(0, 20), "mem").frame
    data = Preprocessor(SCHEMA).fit(frame, np.arange(20)).to_json()
    with pytest.raises(DataError, match="format version 99"):
        Preprocessor.from_json({**data, "version": 99}, SCHEMA, source="x.json")
    other = PartySchema(name="p", role="secondary", numeric=("a",), categorical=("c", "d"))
    with pytest.raises(DataError, match="was fitted on numeric"):
        Preprocessor.from_json(data, other, source="x.json")
    with pytest.raises(DataError, match="malformed"):
        Preprocessor.from_json({**data, "fitted": {"medians": [1.0]}}, SCHEMA)
