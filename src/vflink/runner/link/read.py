"""The read stage: each party's table, whole (``tables``) or in batches (``batches``, the
streamed reader), and the checks the tables must pass before anything is encoded.

``READERS`` holds both; :func:`streams` decides (before any stage runs) whether a link is
streamed: when asked, or by default when a table file has more than ``STREAM_ROWS`` rows and
nothing in the settings needs the whole tables in memory (:func:`stream_refusal`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from vflink._files import table_format
from vflink.data.given import read_table
from vflink.data.table import read_numeric_csv, read_numeric_parquet
from vflink.errors import ConfigError, DataError, LinkageError
from vflink.registry import Registry
from vflink.runner.link.batches import Batches
from vflink.runner.link.context import LinkContext, Stage
from vflink.runner.link.settings import LinkSettings

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["READERS", "STREAM_ROWS", "check_top_k", "stream_refusal", "streams",
           "table_rows"]

#: Above this many rows in either table file, a link streams when it can (``stream=None``).
STREAM_ROWS = 1_000_000
#: Rows per batch of a streamed link when neither the settings nor the engine say.
DEFAULT_CHUNK_ROWS = 100_000

READERS: Registry[Stage] = Registry("link reader")


def check_top_k(top_k: int, secondary_rows: int, secondary: str, *,
                where: str = "--top-k") -> None:
    """K against the secondary table, before any encoding or search: each primary record is
    linked to K secondary records, so K cannot exceed them."""
    if isinstance(top_k, int) and not isinstance(top_k, bool) and top_k > secondary_rows:
        raise LinkageError(f"{where} = {top_k} is larger than the secondary table {secondary} "
                           f"({secondary_rows:,} rows): each primary record is linked to K "
                           f"secondary records; give K ≤ {secondary_rows:,}")


# --- the whole tables --------------------------------------------------------------------------


def _ids(frame: pd.DataFrame, column: str | None, source: str, explicit: bool
         ) -> np.ndarray[Any, Any] | None:
    """A record-id column as text (``None`` when not asked for, or implicitly and absent)."""
    if column is None or (not explicit and column not in frame.columns):
        return None
    if column not in frame.columns:
        raise DataError(f"{source}: no record-id column {column!r}; the table has: "
                        f"{', '.join(map(str, frame.columns[:20]))}")
    return (frame[column].astype(object).where(frame[column].notna(), None)
            .map(lambda v: v if v is None else str(v)).to_numpy(dtype=object))


def _text_columns(s: LinkSettings, secondary: bool) -> list[str]:
    """The columns read as text: string identifiers and fields, blocking keys and record ids
    (``"19151111"`` stays a string and the country code ``"NA"`` is not read as missing)."""
    ids = s.secondary_id or s.id if secondary else s.id
    return [*((s.secondary_on if secondary else s.on) if s.metric == "levenshtein" else ()),
            *(c for f in s.fields if f.kind == "string"
              for c in (f.columns_s if secondary else f.on)),
            *(c for b in s.blocking for c in (b.columns_s if secondary else b.columns)),
            *((ids,) if ids else ())]


def _numeric_only(s: LinkSettings, secondary: bool) -> tuple[str, ...]:
    """The identifier columns when they are all this link needs of a table, as numbers (one
    numeric identifier, no fields, no record ids): such a Parquet, CSV or TSV table is read
    without pandas (:func:`vflink.data.table.read_numeric_parquet`,
    :func:`~vflink.data.table.read_numeric_csv`). Empty otherwise."""
    if s.metric not in ("euclidean", "haversine") or s.fields or s.blocking or (
            (s.secondary_id or s.id) if secondary else s.id):
        return ()
    return tuple(s.secondary_on if secondary else s.on)


@READERS.register("tables")
def read_tables(ctx: LinkContext) -> LinkContext:
    """Both tables into memory; their record ids; K checked against the secondary."""
    s = ctx.settings
    for side, options in ((ctx.primary, s.read[0]), (ctx.secondary, s.read[1])):
        numeric = _numeric_only(s, side is ctx.secondary)
        table = None
        if numeric and isinstance(side.table, (str, os.PathLike)):
            table = read_numeric_parquet(Path(side.table), numeric)
            if table is None:
                table = read_numeric_csv(Path(side.table), numeric, **options.as_dict())
        if table is not None:
            side.frame, side.source = table, str(side.table)
        else:
            side.frame, side.source = read_table(
                side.table, argument=side.party,
                text_columns=_text_columns(s, side is ctx.secondary), **options.as_dict())
        side.rows = len(side.frame)
    ctx.primary.ids = _ids(ctx.primary.frame, s.id, ctx.primary.source,  # type: ignore[arg-type]
                           True)
    ctx.secondary.ids = _ids(ctx.secondary.frame, s.secondary_id or s.id,  # type: ignore[arg-type]
                             ctx.secondary.source, s.secondary_id is not None)
    check_top_k(s.top_k, ctx.secondary.rows, ctx.secondary.source)
    return ctx


# --- the streamed reader -------------------------------------------------------------------------


@READERS.register("batches")
def read_batches(ctx: LinkContext) -> LinkContext:
    """Each table file as :class:`Batches` of the settings' ``chunk_rows`` (else the engine's,
    else 100,000): nothing is read until the encode stage asks for a batch."""
    s = ctx.settings
    rows = s.chunk_rows or (ctx.compute.chunk_rows if ctx.compute is not None
                            else DEFAULT_CHUNK_ROWS)
    for side, options in ((ctx.primary, s.read[0]), (ctx.secondary, s.read[1])):
        side.source = str(side.table)
        side.batches = Batches(Path(side.table), side.source, max(1, int(rows)),
                               options.as_dict())
    return ctx


def stream_refusal(*, mode: str, empty: str, ids: bool, fields: bool, search: str,
                   tables: bool = True) -> str | None:
    """Why this link cannot be streamed (``None``: it can)."""
    if fields:
        return "a multi-field link (`fields`) is not streamed"
    if not tables:
        return "tables given as DataFrames are already in memory"
    if mode == "exact":
        return "mode = \"exact\" is not streamed"
    if empty != "error":
        return "empty = \"skip\" is not streamed"
    if ids:
        return "record ids (`id`, `secondary_id`) are not streamed"
    if search == "approximate":
        return "an approximate search is one index over the whole secondary; not streamed"
    return None


def table_rows(path: Path) -> int:
    """Rows of a table file, cheaply and in flat memory: Parquet metadata, or the CSV's line
    count less its header (a quoted line break counts twice: this only picks a path)."""
    if table_format(path) == "parquet":  # from the bytes, as the readers decide
        # the footer's count (pyarrow.dataset would import pandas, 0.2 s, for the same number)
        import pyarrow.parquet as pq

        return int(pq.read_metadata(str(path)).num_rows)
    import gzip

    opener: Callable[..., Any] = gzip.open if path.suffix.lower() == ".gz" else open
    lines = 0
    with opener(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            lines += block.count(b"\n")
    return max(0, lines - 1)


def streams(settings: LinkSettings, tables: Sequence[Any]) -> bool:
    """Whether the link is streamed: ``stream`` when given (a refusal is then an error),
    else when a table file has more than ``STREAM_ROWS`` rows and the link can be."""
    s = settings
    if s.stream is False:
        return False
    paths = all(isinstance(t, (str, os.PathLike)) for t in tables)
    reason = stream_refusal(mode=s.mode, empty=s.empty, ids=bool(s.id or s.secondary_id),
                            fields=bool(s.fields), search=s.search, tables=paths) or (
        None if s.out is not None else "a streamed link needs `out` (its links go to a file)")
    if reason is not None:
        if s.stream:
            raise ConfigError(f"`stream`: {reason}")
        return False
    if s.stream is not None:
        return s.stream
    return max(table_rows(Path(t)) for t in tables) > STREAM_ROWS
