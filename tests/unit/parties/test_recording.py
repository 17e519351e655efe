"""The recorder: bounded, row-aligned, and read back without pickle."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

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


@settings(max_examples=25)
@given(st.lists(st.integers(min_value=1, max_value=6), min_size=1, max_size=8),
       st.integers(min_value=1, max_value=20), st.integers(min_value=1, max_value=4))
def test_whole_batches_are_kept_until_the_budget(sizes: list[int], budget: int, width: int
                                                 ) -> None:
    import tempfile

    rec = Recorder(max_rows=budget)
    rng = np.random.default_rng(0)
    sent = []
    for batch_id, n in enumerate(sizes, start=1):
        values = rng.normal(size=(n, width)).astype(np.float32)
        rows = rng.integers(0, 100, size=n)
        rec.batch("embeddings", "bank", batch_id, rows, values)
        sent.append((batch_id, rows, values))
    kept, total = [], 0
    for item in sent:  # oracle: whole batches while fewer than `budget` rows are held
        if total >= budget:
            break
        kept.append(item)
        total += len(item[1])
    with tempfile.TemporaryDirectory() as tmp:
        rec.flush(Path(tmp), party="p", role="primary")
        values, ids, batch = read_recording(Path(tmp)).get("embeddings", "bank")
    assert np.array_equal(values, np.concatenate([v for _, _, v in kept]))
    assert np.array_equal(ids, np.concatenate([r for _, r, _ in kept]))
    assert batch is not None
    assert batch.tolist() == [b for b, r, _ in kept for _ in r]


def test_a_new_training_forgets_the_previous_runs_batches(tmp_path: Path) -> None:
    rec = Recorder(max_rows=3)
    rec.whole("indices", "coordinator", [0], np.array([[1]]))
    rec.batch("embeddings", "bank", 1, [1, 2, 3], np.zeros((3, 2)))
    rec.new_training()
    rec.batch("embeddings", "bank", 1, [4], np.ones((1, 2)))
    rec.flush(tmp_path, party="p", role="primary")
    back = read_recording(tmp_path)
    assert back.get("embeddings")[1].tolist() == [4]
    assert back.get("indices")[0].tolist() == [[1]]
