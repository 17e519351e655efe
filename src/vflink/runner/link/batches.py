"""A party's table file read in batches: the streamed link's reader (memory flat in the
table's size), each batch checked as the in-memory link checks the whole table."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from vflink.data.batches import scan_frame
from vflink.data.table import bad_cells
from vflink.errors import DataError

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["Batches"]


@dataclass(frozen=True)
class Batches:
    """A party's table file read in batches of ``rows`` rows, each batch checked as the
    in-memory link checks the whole table; memory flat in the table's size."""

    path: Path
    source: str
    rows: int
    options: dict[str, Any]

    def first(self, columns: Sequence[str]) -> pd.DataFrame:
        """The first batch of ``columns``, typed as a whole read types them."""
        return next(iter(scan_frame(self.path, columns=columns, batch_rows=self.rows,
                                    **self.options))).frame

    def values(self, columns: Sequence[str], kind: str, metric: str
               ) -> Iterator[tuple[int, Any]]:
        """(first row, identifier values) of each batch: numbers finite (and coordinates in
        range), strings not blank. Strings are the columns joined with a space, as
        :func:`vflink.parties.linking.identifier_values` joins them."""
        import pandas as pd

        numeric = kind == "numeric"
        for batch in scan_frame(self.path, columns=columns,
                                text_columns=() if numeric else columns,
                                numeric_columns=columns if numeric else (),
                                batch_rows=self.rows, **self.options):
            frame, problems = batch.frame, []
            if numeric:
                values = np.empty((len(frame), len(columns)), dtype=np.float64)
                for j, col in enumerate(columns):
                    arr = pd.to_numeric(frame[col], errors="coerce").to_numpy(
                        dtype=np.float64, na_value=np.nan)
                    bad = ~np.isfinite(arr)
                    if metric == "haversine" and len(columns) == 2:
                        bad |= np.abs(arr) > (90.0, 180.0)[j]
                    if bad.any():
                        problems.append(f"identifier column {col!r} needs a finite number"
                                        + (" (latitude within ±90, longitude within ±180)"
                                           if metric == "haversine" else "") + " in every row, "
                                        + bad_cells(frame, bad, col, offset=batch.offset))
                    values[:, j] = arr
                out: Any = values
            else:
                parts = frame[list(columns)].astype(object)
                parts = parts.where(parts.notna(), "")
                out = [" ".join(str(v) for v in row).strip()
                       for row in parts.itertuples(index=False, name=None)]
                blank = np.array([not text for text in out], dtype=bool)
                if blank.any():
                    problems.append(f"identifier column {columns[0]!r} is empty, "
                                    + bad_cells(frame, blank, columns[0], offset=batch.offset))
            if problems:
                raise DataError(f"{self.source}: " + "; ".join(problems),
                                [f"{self.source}: {p}" for p in problems])
            yield batch.offset, out

    def ranges(self, columns: Sequence[str], metric: str) -> pd.DataFrame:
        """The per-column min and max (two rows): all a FEDERAL range needs of this party."""
        import pandas as pd

        lo = np.full(len(columns), np.inf)
        hi = np.full(len(columns), -np.inf)
        for _, values in self.values(columns, "numeric", metric):
            if len(values):
                lo, hi = np.minimum(lo, values.min(axis=0)), np.maximum(hi, values.max(axis=0))
        return pd.DataFrame([lo, hi], columns=list(columns))
