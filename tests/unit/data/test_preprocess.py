from __future__ import annotations

import numpy as np
import pandas as pd
from hypothesis import given
from hypothesis import strategies as st

from vflink.data import PartySchema, PartyTable
from vflink.data.preprocess import Preprocessor
from vflink.data.split import split_rows

SCHEMA = PartySchema(name="p", role="secondary", numeric=("a",), categorical=("c",))


def test_statistics_come_from_training_rows_only() -> None:
    frame = pd.DataFrame({"a": [1.0, 2.0, 3.0, 1000.0, np.nan], "c": ["x", "y", "x", "z", None]})
    table = PartyTable.from_frame(SCHEMA, frame, "mem")
    train = np.array([0, 1, 2])
    out = Preprocessor(SCHEMA).fit(table.frame, train).transform(table.frame)
    # oracle: standardise with mean/std of rows 0..2 only; the NaN is imputed with their median
    mean, std = 2.0, np.std([1.0, 2.0, 3.0])
    np.testing.assert_allclose(out[:4, 0], (np.array([1, 2, 3, 1000.0]) - mean) / std, rtol=1e-5)
    np.testing.assert_allclose(out[4, 0], 0.0, atol=1e-6)
    # "z" and missing are unseen in training: all-zero one-hot
    assert out.shape[1] == 1 + 2  # a, c=x, c=y (no missing indicator: no NaN in training rows)
    np.testing.assert_array_equal(out[3, 1:], [0, 0])
    np.testing.assert_array_equal(out[0, 1:], [1, 0])


def test_missing_indicator_when_training_rows_have_nan() -> None:
    frame = pd.DataFrame({"a": [1.0, np.nan, 3.0], "c": ["x", "x", "y"]})
    table = PartyTable.from_frame(SCHEMA, frame, "mem")
    pre = Preprocessor(SCHEMA).fit(table.frame, np.arange(3))
    out = pre.transform(table.frame)
    assert pre.n_features == out.shape[1] == 4  # a, a-missing, c=x, c=y
    assert out[1, 1] > out[0, 1]


@given(n=st.integers(3, 500), seed=st.integers(0, 2**32 - 1))
def test_split_is_a_partition_with_seeded_order(n: int, seed: int) -> None:
    rows = np.arange(n, dtype=np.int64)
    parts = split_rows(rows, (0.7, 0.1, 0.2), np.random.default_rng(seed))
    assert all(len(p) > 0 for p in parts)
    np.testing.assert_array_equal(np.sort(np.concatenate(parts)), rows)
    again = split_rows(rows, (0.7, 0.1, 0.2), np.random.default_rng(seed))
    for a, b in zip(parts, again):
        np.testing.assert_array_equal(a, b)
    if n >= 100:
        assert abs(len(parts[0]) / n - 0.7) < 0.02
