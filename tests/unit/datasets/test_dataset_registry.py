"""load_dataset, the registry and the VFLDataset container."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from vflink.data import PartySchema, PartyTable
from vflink.datasets import DATASETS, VFLDataset, dataset_names, load_dataset
from vflink.errors import ConfigError, DataError, UnknownNameError


def _tables() -> tuple[PartyTable, PartyTable]:
    p = PartySchema(name="p", role="primary", key=("id",), numeric=("a",), label="y",
                    task="binary")
    s = PartySchema(name="s", role="secondary", key=("id",), numeric=("b",))
    primary = PartyTable.from_frame(p, pd.DataFrame({"id": ["x", "y", "z"], "a": [1.0, 2, 3],
                                                     "y": [0, 1, 0]}), "t")
    secondary = PartyTable.from_frame(s, pd.DataFrame({"id": ["z", "x"], "b": [1.0, 2]}), "t")
    return primary, secondary


def test_unknown_name_lists_the_valid_names() -> None:
    with pytest.raises(UnknownNameError) as info:
        load_dataset("sklearn-huge")
    message = str(info.value)
    assert "unknown dataset 'sklearn-huge'" in message
    for name in dataset_names():
        assert name in message


def test_unknown_option_lists_the_valid_options() -> None:
    with pytest.raises(ConfigError, match=r"unknown option\(s\) \['noise'\].*sigma_cf"):
        load_dataset("sklearn-small", noise=0.1)


def test_specs_expose_defaults_and_summaries() -> None:
    for name in dataset_names():
        spec = DATASETS.get(name)
        assert spec.summary and "seed" in spec.option_names()
        assert set(spec.default_options()) == set(spec.option_names())
    assert DATASETS.get("sklearn-small").default_options()["n_samples"] == 6_000


def test_container_validates_ground_truth() -> None:
    primary, secondary = _tables()
    ds = VFLDataset(name="t", primary=primary, secondaries=(secondary,),
                    true_secondary_index=(np.array([1, -1, 0]),))
    alignment = ds.true_alignment("s")
    assert alignment.secondary == "s" and alignment.matched.tolist() == [True, False, True]
    assert ds.party("s") is secondary and ds.secondary is secondary
    with pytest.raises(ValueError):
        ds.true_secondary_index[0][0] = 5  # read-only ground truth
    with pytest.raises(DataError, match="shape"):
        VFLDataset(name="t", primary=primary, secondaries=(secondary,),
                   true_secondary_index=(np.array([0, 1]),))
    with pytest.raises(DataError, match="outside"):
        VFLDataset(name="t", primary=primary, secondaries=(secondary,),
                   true_secondary_index=(np.array([0, 1, 2]),))
    with pytest.raises(DataError, match="at least one secondary"):
        VFLDataset(name="t", primary=primary, secondaries=())
    with pytest.raises(DataError, match="not primary"):
        VFLDataset(name="t", primary=secondary, secondaries=(secondary,))
    with pytest.raises(ConfigError, match="no party 'q'"):
        ds.party("q")
    with pytest.raises(ConfigError, match="no secondary party 'p'"):
        ds.true_alignment("p")
    with pytest.raises(ConfigError, match=r"`secondary` must be an int in \[0, 1\), got 1"):
        ds.true_alignment(1)
