"""The memory-mapped feature store: the same rows as the in-memory matrix."""

from __future__ import annotations

import gc
import os
import stat
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import torch

from vflink.data.featurestore import (
    MMAP_MIN_ROWS,
    InMemoryFeatures,
    MappedFeatures,
    encode_features,
    use_mmap,
    write_features,
)
from vflink.data.preprocess import Preprocessor
from vflink.data.schema import PartySchema
from vflink.errors import ConfigError, DataError


def _table(n: int = 1000, seed: int = 0) -> tuple[PartySchema, pd.DataFrame]:
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame({"id": np.arange(n), "a": rng.normal(size=n), "b": rng.normal(size=n),
                          "c": rng.choice(["x", "y", "z"], size=n)})
    frame.loc[::7, "a"] = np.nan  # a missing indicator column too
    schema = PartySchema(name="bank", role="secondary", key=("id",), numeric=("a", "b"),
                         categorical=("c",))
    return schema, frame


def _fitted(schema: PartySchema, frame: pd.DataFrame, rows: int = 600) -> Preprocessor:
    return Preprocessor(schema).fit(frame, np.arange(rows, dtype=np.int64))


def test_mapped_rows_equal_the_in_memory_matrix(tmp_path: Path) -> None:
    schema, frame = _table()
    pre = _fitted(schema, frame)
    whole = pre.transform(frame)
    # small record batches: a batch's rows come from many of them, in any order, with repeats
    write_features(tmp_path / "f.arrow", pre, frame, chunk_rows=97)
    mapped = MappedFeatures(tmp_path / "f.arrow", n_rows=len(frame), n_features=pre.n_features)
    memory = InMemoryFeatures(torch.from_numpy(whole))
    rng = np.random.default_rng(1)
    for idx in (rng.integers(0, len(frame), 300), np.arange(len(frame))[::-1],
                np.array([5, 5, 999, 0, 5]), np.array([], dtype=np.int64)):
        got = mapped.rows(idx)
        assert got.dtype == torch.float32 and got.shape == (len(idx), pre.n_features)
        assert torch.equal(got, memory.rows(idx))
        assert np.array_equal(got.numpy(), whole[idx])
    assert np.array_equal(np.concatenate(list(mapped.chunks())), whole)
    with pytest.raises(DataError, match="outside"):
        mapped.rows(np.array([len(frame)]))
    mapped.close()


def test_file_is_private_and_states_its_format(tmp_path: Path) -> None:
    schema, frame = _table(50)
    pre = _fitted(schema, frame, 40)
    path = tmp_path / "f.arrow"
    write_features(path, pre, frame, key="k1")
    assert stat.S_IMODE(os.stat(path).st_mode) & 0o077 == 0  # the party's own data
    with pytest.raises(DataError, match="does not match"):
        MappedFeatures(path, key="k2")
    with pytest.raises(DataError, match="does not match"):
        MappedFeatures(path, n_rows=51)
    other = tmp_path / "other.arrow"
    with pa.OSFile(str(other), "wb") as fh, pa.ipc.new_file(fh, pa.schema([("x", pa.int8())])):
        pass
    with pytest.raises(DataError, match="not a vflink-features file"):
        MappedFeatures(other)
    (tmp_path / "junk.arrow").write_bytes(b"not arrow")
    with pytest.raises(DataError, match="cannot be read"):
        MappedFeatures(tmp_path / "junk.arrow")


def test_auto_maps_from_the_threshold() -> None:
    assert not use_mmap("auto", MMAP_MIN_ROWS - 1)
    assert use_mmap("auto", MMAP_MIN_ROWS)
    assert use_mmap("mmap", 1) and not use_mmap("memory", 10**9)
    with pytest.raises(ConfigError, match="feature_store"):
        use_mmap("disk", 10)


def test_encode_reuses_the_file_of_the_same_fit_and_drops_others(tmp_path: Path) -> None:
    schema, frame = _table()
    pre = _fitted(schema, frame)
    first = encode_features(pre, frame, store="mmap", directory=tmp_path, fingerprint="data1")
    assert isinstance(first, MappedFeatures)
    path = first.path
    assert path.parent == tmp_path / "features"
    inode = path.stat().st_ino
    again = encode_features(pre, frame, store="mmap", directory=tmp_path, fingerprint="data1")
    assert isinstance(again, MappedFeatures) and again.path == path
    assert path.stat().st_ino == inode  # not rewritten
    refit = encode_features(_fitted(schema, frame, 300), frame, store="mmap",
                            directory=tmp_path, fingerprint="data1")
    assert isinstance(refit, MappedFeatures) and refit.path != path
    assert not path.exists()  # the older fit's matrix is gone ...
    assert torch.equal(first.rows(np.arange(10)),  # ... but a reader that maps it still reads
                       torch.from_numpy(pre.transform(frame.iloc[:10])))
    changed = encode_features(pre, frame, store="mmap", directory=tmp_path, fingerprint="data2")
    assert isinstance(changed, MappedFeatures) and changed.path != path  # other data, new file
    for source in (first, again, refit, changed):
        source.close()


def test_memory_store_and_no_features_stay_in_memory(tmp_path: Path) -> None:
    schema, frame = _table()
    pre = _fitted(schema, frame)
    memory = encode_features(pre, frame, store="memory", directory=tmp_path)
    assert isinstance(memory, InMemoryFeatures)
    assert not (tmp_path / "features").exists()
    empty = Preprocessor(schema).fit(frame, np.array([], dtype=np.int64))
    none = encode_features(empty, frame, store="mmap", directory=tmp_path)
    assert none.rows(np.array([1, 2])).shape == (2, 0)


def test_without_a_directory_the_file_is_temporary() -> None:
    schema, frame = _table()
    source = encode_features(_fitted(schema, frame), frame, store="mmap")
    assert isinstance(source, MappedFeatures)
    folder = source.path.parent
    assert folder.is_dir()
    source.close()
    del source
    gc.collect()
    assert not folder.exists()


def test_fingerprint_in_chunks_is_the_whole_frames(monkeypatch: pytest.MonkeyPatch) -> None:
    import hashlib
    import json

    from vflink.data import fingerprint

    _, frame = _table(1000)
    whole = hashlib.sha256()  # the digest as computed before chunking (saved checkpoints)
    whole.update(json.dumps([[str(c), str(t)] for c, t in frame.dtypes.items()]).encode())
    whole.update(pd.util.hash_pandas_object(frame, index=False).to_numpy().tobytes())
    monkeypatch.setattr(fingerprint, "CHUNK_ROWS", 77)
    assert fingerprint.frame_fingerprint(frame) == whole.hexdigest()
