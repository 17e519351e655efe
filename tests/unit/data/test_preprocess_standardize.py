"""``standardize = false``: numeric features reach the bottom model unscaled, as the FedSim
authors' code does."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from vflink.data.preprocess import Preprocessor
from vflink.data.schema import PartySchema
from vflink.errors import ConfigError
from vflink.models.spec import BottomSpec
from vflink.runfiles.config import ModelConfig

SCHEMA = PartySchema(name="p", role="secondary", key=("id",), numeric=("a", "b"))


def _frame() -> pd.DataFrame:
    rng = np.random.default_rng(0)
    return pd.DataFrame({"id": [f"r{i}" for i in range(20)], "a": rng.normal(3, 2, 20),
                         "b": rng.normal(-1, 5, 20)})


def test_raw_features_pass_through_and_default_standardises() -> None:
    frame = _frame()
    rows = np.arange(15)
    raw = Preprocessor(SCHEMA, standardize=False).fit(frame, rows).transform(frame)
    np.testing.assert_allclose(raw, frame[["a", "b"]].to_numpy(np.float32))
    std = Preprocessor(SCHEMA).fit(frame, rows).transform(frame)
    np.testing.assert_allclose(std[rows].mean(0), 0.0, atol=1e-6)
    np.testing.assert_allclose(std[rows].std(0), 1.0, atol=1e-5)


def test_standardize_must_be_a_bool() -> None:
    with pytest.raises(ConfigError, match="standardize"):
        BottomSpec(standardize="no")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="standardize"):
        ModelConfig(standardize=1)  # type: ignore[arg-type]


def test_setup_bottom_carries_standardize_over_the_wire() -> None:
    from vflink.protocol.messages import SetupBottom
    from vflink.transport.grpc.serde import message_from_proto, message_to_proto

    message = SetupBottom(spec=BottomSpec(standardize=False))
    back = message_from_proto(message_to_proto(message, sender="primary"))
    assert isinstance(back, SetupBottom) and back.spec.standardize is False
