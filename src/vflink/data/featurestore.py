"""Where a party's encoded training features live: in memory, or in a memory-mapped Arrow file.

A party trains on its preprocessed feature matrix (``Preprocessor.transform`` of its table).
For a small table that matrix is one in-memory tensor, as it always was. For a large one
(so that a secondary with 10^7 rows trains within a fixed memory) the matrix is written
once, chunk by chunk, to an Arrow IPC file in the party's own directory, opened with
``pyarrow.memory_map`` and read per batch: a batch's rows are gathered from the mapped file
(``rows(idx)`` → float32 numpy → torch), so the process never holds the whole matrix, nor the
float64 temporaries of encoding it, in anonymous memory; the pages a batch touches are clean
file pages that the kernel can drop again.

Both sources hold the same float32 values (the encoding is row-wise, so encoding a chunk gives
the rows of encoding the whole table), hence training on either gives identical results.

The file stores one ``FixedSizeList<float32>[n_features]`` column: a row is contiguous on disk,
so a random row costs one page, not one page per feature column. Its schema metadata states
the format and version (ARCHITECTURE.md, convention 9).
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import tempfile
import weakref
from abc import ABC, abstractmethod
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd
import torch

from vflink._files import atomic_open
from vflink.data.preprocess import Preprocessor
from vflink.data.table import PartyTable
from vflink.errors import ConfigError, DataError

__all__ = ["FEATURE_STORES", "FORMAT", "FORMAT_VERSION", "MMAP_MIN_ROWS", "WRITE_CHUNK_ROWS",
           "ConstantFeatures", "FeatureSource", "InMemoryFeatures", "MappedFeatures",
           "encode_features", "use_mmap", "write_features"]

log = logging.getLogger(__name__)

#: ``training.feature_store``: ``auto`` maps the features of a table with at least
#: :data:`MMAP_MIN_ROWS` rows and keeps smaller ones in memory; ``memory`` and ``mmap`` force one.
FEATURE_STORES = ("auto", "memory", "mmap")
#: From this many rows ``auto`` reads features per batch from a mapped file: the order of
#: secretflow/psi's and FATE's buckets (about 10^6 rows), below which a table's encoded
#: features are tens of megabytes and a tensor in memory is simplest.
MMAP_MIN_ROWS = 1_000_000
#: Rows encoded and written per record batch: bounds the encoding's float64 temporaries
#: (about 30 MB for 10 features) and the per-batch gather's loop (one step per record batch).
WRITE_CHUNK_ROWS = 1 << 17

FORMAT = "vflink-features"
FORMAT_VERSION = 1
#: Where a party keeps its mapped feature files, inside its own state directory.
FEATURE_DIR = "features"


def use_mmap(store: str, n_rows: int) -> bool:
    """Whether ``store`` (``training.feature_store``) maps the features of ``n_rows`` rows."""
    if store not in FEATURE_STORES:
        raise ConfigError(f"`training.feature_store` must be one of "
                          f"{', '.join(map(repr, FEATURE_STORES))}, got {store!r}")
    return store == "mmap" or (store == "auto" and n_rows >= MMAP_MIN_ROWS)


class FeatureSource(ABC):
    """A party's encoded feature matrix, read a batch of rows at a time."""

    n_rows: int
    n_features: int

    def __len__(self) -> int:
        return self.n_rows

    @abstractmethod
    def rows(self, idx: npt.NDArray[np.int64]) -> torch.Tensor:
        """The float32 rows ``idx`` (any order, repeats allowed) as a (len(idx), d) CPU tensor."""

    @abstractmethod
    def chunks(self, chunk_rows: int = WRITE_CHUNK_ROWS) -> Iterator[npt.NDArray[np.float32]]:
        """Every row in order, a chunk at a time (e.g. to hash the matrix without holding it)."""

    def close(self) -> None:
        """Release what the source holds (a mapped file); reading afterwards is an error."""
        return None  # in-memory sources hold nothing to release


class InMemoryFeatures(FeatureSource):
    """The whole matrix as one tensor (small tables; what parties always did)."""

    def __init__(self, features: torch.Tensor) -> None:
        self.features = features
        self.n_rows, self.n_features = int(features.shape[0]), int(features.shape[1])

    def rows(self, idx: npt.NDArray[np.int64]) -> torch.Tensor:
        return self.features[torch.from_numpy(np.ascontiguousarray(idx, dtype=np.int64))]

    def chunks(self, chunk_rows: int = WRITE_CHUNK_ROWS) -> Iterator[npt.NDArray[np.float32]]:
        x = self.features.detach().contiguous().numpy()
        for start in range(0, self.n_rows, chunk_rows):
            yield x[start:start + chunk_rows]


class ConstantFeatures(FeatureSource):
    """A party without features still answers with an embedding: one zero feature per row."""

    def __init__(self, n_rows: int) -> None:
        self.n_rows, self.n_features = int(n_rows), 1

    def rows(self, idx: npt.NDArray[np.int64]) -> torch.Tensor:
        return torch.zeros(len(idx), 1)

    def chunks(self, chunk_rows: int = WRITE_CHUNK_ROWS) -> Iterator[npt.NDArray[np.float32]]:
        for start in range(0, self.n_rows, chunk_rows):
            yield np.zeros((min(chunk_rows, self.n_rows - start), 1), dtype=np.float32)


def _schema(n_features: int, meta: dict[str, str]) -> Any:
    import pyarrow as pa

    return pa.schema([pa.field("x", pa.list_(pa.float32(), n_features), nullable=False)],
                     metadata={"vflink": json.dumps({"format": FORMAT,
                                                     "version": FORMAT_VERSION, **meta})})


def _frames(data: pd.DataFrame | PartyTable, pre: Preprocessor, chunk_rows: int
            ) -> Iterator[pd.DataFrame]:
    """``data``'s rows in order, exactly ``chunk_rows`` at a time (the last chunk fewer).

    A table read in record batches (:class:`~vflink.data.streamed.StreamedTable`) is scanned
    for the preprocessing's columns only, its batches regrouped into chunks of the file's
    size (:class:`MappedFeatures` needs equal record batches); nothing holds the whole table.
    """
    if isinstance(data, pd.DataFrame) or data.in_memory:
        frame = data if isinstance(data, pd.DataFrame) else data.frame
        for start in range(0, len(frame), chunk_rows):
            yield frame.iloc[start:start + chunk_rows]
        return
    pending: list[pd.DataFrame] = []
    held = 0
    for batch in data.batches(pre.schema.features, batch_rows=chunk_rows):
        pending.append(batch)
        held += len(batch)
        while held >= chunk_rows:
            joined = pd.concat(pending, ignore_index=True) if len(pending) > 1 else pending[0]
            yield joined.iloc[:chunk_rows]
            rest = joined.iloc[chunk_rows:]
            pending, held = ([rest], len(rest)) if len(rest) else ([], 0)
    if held:
        yield pd.concat(pending, ignore_index=True) if len(pending) > 1 else pending[0]


def write_features(path: Path, pre: Preprocessor, frame: pd.DataFrame | PartyTable, *,
                   key: str = "", chunk_rows: int = WRITE_CHUNK_ROWS) -> None:
    """Encode ``frame`` (a DataFrame, or a party's table: one read in record batches is
    never held whole) with the fitted ``pre`` a chunk at a time into an Arrow IPC file at
    ``path`` (atomically, readable by this user only: it is the party's own data)."""
    import pyarrow as pa

    d = pre.n_features
    schema = _schema(d, {"rows": str(len(frame)), "features": str(d), "key": key,
                         "chunk_rows": str(chunk_rows)})
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_open(path, "wb", perms=0o600) as fh, pa.ipc.new_file(fh, schema) as writer:
        for chunk in _frames(frame, pre, chunk_rows):
            x = pre.transform(chunk)
            values = pa.array(x.reshape(-1), type=pa.float32())
            writer.write_batch(pa.record_batch(
                [pa.FixedSizeListArray.from_arrays(values, d)], schema=schema))


class MappedFeatures(FeatureSource):
    """The matrix in an Arrow IPC file (see :func:`write_features`), memory-mapped.

    Each record batch's values are a zero-copy numpy view of the mapped file; ``rows`` gathers
    from those views (a ``ChunkedArray.take`` would first concatenate every chunk, i.e. copy
    the whole matrix into memory per batch).
    """

    def __init__(self, path: Path, *, n_rows: int | None = None,
                 n_features: int | None = None, key: str | None = None) -> None:
        import pyarrow as pa

        self.path = Path(path)
        try:
            self._map = pa.memory_map(str(self.path), "r")
            reader = pa.ipc.open_file(self._map)
            meta = json.loads((reader.schema.metadata or {}).get(b"vflink", b"{}"))
            batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
        except (OSError, ValueError, pa.ArrowException) as exc:
            raise DataError(f"{self.path}: cannot be read as a feature file: {exc}") from None
        if meta.get("format") != FORMAT or meta.get("version") != FORMAT_VERSION:
            raise DataError(f"{self.path}: not a {FORMAT} file of version {FORMAT_VERSION}")
        self.n_features = int(meta["features"])
        self.n_rows = sum(b.num_rows for b in batches)
        expected = {"rows": n_rows, "features": n_features, "key": key}
        found = {"rows": self.n_rows, "features": self.n_features, "key": meta.get("key")}
        wrong = [k for k, v in expected.items() if v is not None and found[k] != v]
        if wrong:
            raise DataError(f"{self.path}: feature file does not match ({', '.join(wrong)})")
        self._views = [b.column(0).values.to_numpy(zero_copy_only=True)
                       .reshape(-1, self.n_features) for b in batches]
        sizes = [len(v) for v in self._views]
        # every record batch but the last holds the same number of rows (write_features)
        self._chunk = sizes[0] if sizes else 1
        if any(s != self._chunk for s in sizes[:-1]):
            raise DataError(f"{self.path}: record batches of unequal size {sorted(set(sizes))}")

    def rows(self, idx: npt.NDArray[np.int64]) -> torch.Tensor:
        idx = np.asarray(idx, dtype=np.int64)
        out = np.empty((len(idx), self.n_features), dtype=np.float32)
        if idx.size:
            if idx.min() < 0 or idx.max() >= self.n_rows:
                raise DataError(f"{self.path}: rows outside [0, {self.n_rows})")
            batch, offset = np.divmod(idx, self._chunk)
            if len(self._views) == 1:
                out[:] = self._views[0][offset]
            else:
                order = np.argsort(batch, kind="stable")
                groups = np.split(order, np.flatnonzero(np.diff(batch[order])) + 1)
                for group in groups:
                    out[group] = self._views[int(batch[group[0]])][offset[group]]
        return torch.from_numpy(out)

    def chunks(self, chunk_rows: int = WRITE_CHUNK_ROWS) -> Iterator[npt.NDArray[np.float32]]:
        # the file's own record batches (chunk_rows is a hint for in-memory sources)
        yield from self._views

    def close(self) -> None:
        self._views = []
        self._map.close()


def _key(fingerprint: str, pre: Preprocessor) -> str:
    """Names the encoded matrix: the party's data and the fitted preprocessing."""
    h = hashlib.blake2b(digest_size=16, person=b"vflink-features")
    h.update(fingerprint.encode())
    h.update(json.dumps(pre.to_json(), sort_keys=True).encode())
    return h.hexdigest()


def encode_features(pre: Preprocessor, frame: pd.DataFrame | PartyTable, *,
                    store: str = "memory",
                    directory: Path | None = None, fingerprint: str = "",
                    owner: str = "party") -> FeatureSource:
    """The encoded features of ``frame`` (a DataFrame or a party's table, see
    :func:`write_features`) under ``pre``, where ``store`` says.

    Mapped: the file ``<directory>/features/<key>.arrow`` (the key names the data's
    ``fingerprint`` and the fitted preprocessing, so a resumed run or a prediction reuses the
    file); other feature files there are removed. Without a ``directory`` the file goes to a
    private temporary directory removed with the source.
    """
    if pre.n_features == 0 or not use_mmap(store, len(frame)):  # (n, 0): nothing to map
        if isinstance(frame, pd.DataFrame) or frame.in_memory:
            whole = frame if isinstance(frame, pd.DataFrame) else frame.frame
            return InMemoryFeatures(torch.from_numpy(pre.transform(whole)))
        # a table read in batches, its features wanted in memory: encoded a chunk at a time
        # (row-wise, so the same values), the table itself never held whole
        parts = [pre.transform(chunk) for chunk in _frames(frame, pre, WRITE_CHUNK_ROWS)]
        return InMemoryFeatures(torch.from_numpy(np.concatenate(parts)))
    temp: Path | None = None
    if directory is None:
        temp = Path(tempfile.mkdtemp(prefix="vflink-features-"))
        folder = temp
    else:
        folder = Path(directory) / FEATURE_DIR
    key = _key(fingerprint, pre)
    path = folder / f"{key}.arrow"
    source: MappedFeatures | None = None
    if path.is_file():
        try:
            source = MappedFeatures(path, n_rows=len(frame), n_features=pre.n_features, key=key)
            log.info("%s: reusing mapped features %s", owner, path)
        except DataError as exc:
            log.warning("%s: rewriting feature file (%s)", owner, exc)
    if source is None:
        write_features(path, pre, frame, key=key)
        source = MappedFeatures(path, n_rows=len(frame), n_features=pre.n_features, key=key)
        log.info("%s: %d rows x %d features mapped from %s", owner, len(frame),
                 pre.n_features, path)
        for old in folder.glob("*.arrow"):
            if old != path:  # an older fit's matrix; a reader that maps it keeps its pages
                try:
                    old.unlink(missing_ok=True)
                except OSError:  # e.g. still mapped on Windows: removed at the next fit
                    log.debug("%s: could not remove %s yet", owner, old)
    if temp is not None:
        weakref.finalize(source, shutil.rmtree, temp, True)
    return source
