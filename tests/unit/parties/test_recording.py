"""The recorder: bounded, row-aligned, and read back without pickle."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from vflink.errors import ConfigError, DataError
from vflink.parties.recording import Recorder, read_recording


def test_round_trip_and_row_budget(tmp_path: Path) -> None:
    rec = Recorder(max_rows=5)
    rec.forward_rows(1, [3, 7, 9])
    rec.gradients("primary", 1, torch.ones(3, 2))
    rec.forward_rows(2, [1, 2, 4])
    rec.gradients("primary", 2, torch.full((3, 2), 2.0))
    rec.forward_rows(3, [5])  # over the budget: counted, not kept
    rec.gradients("primary", 3, torch.zeros(1, 2))
    rec.whole("indices", "coordinator", [0, 1], np.array([[3], [7]]))
    rec.flush(tmp_path, party="bank", role="secondary")
    back = read_recording(tmp_path)
    values, ids, batch = back.get("gradients")
    assert values.shape == (6, 2) and ids.tolist() == [3, 7, 9, 1, 2, 4]
    assert batch is not None and batch.tolist() == [1, 1, 1, 2, 2, 2]
    assert back.manifest["rows_seen"]["gradients"] == 7
    assert back.get("indices")[0].tolist() == [[3], [7]]
    with np.load(tmp_path / "evaluation" / "received.npz", allow_pickle=False) as data:
        assert all(data[k].dtype != object for k in data.files)


def test_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        Recorder(max_rows=0)
    with pytest.raises(DataError, match="record = true"):
        read_recording(tmp_path)
    rec = Recorder()
    with pytest.raises(DataError):
        rec.batch("embeddings", "bank", 1, [1, 2], np.zeros((3, 2)))
    rec.whole("indices", "c", [0], np.zeros((1, 1)))
    rec.flush(tmp_path, party="p", role="primary")
    with pytest.raises(DataError, match="no gradients"):
        read_recording(tmp_path).get("gradients")
