"""The write stage: the links file (``.parquet`` or ``.csv``), atomically, never half-written,
streamed to the file as the links are made.

``WRITERS``:

* ``file``: the links of a link held in memory, a stretch of primary records at a time
  (:meth:`~vflink.runner.link.outcome.LinkColumns.chunks`: views of the linkage's arrays),
  each compressed and written beside the making of the next (:func:`write_links`);
* ``stream``: links as the decide stage makes them, chunk by chunk;
* ``none``: no ``out``, nothing written (the Python API's result holds the links).

Both go through :class:`~vflink.data.sink.ColumnSink`, so a link held in memory and a
streamed one write the very same file. A Parquet file says whose view it is and who holds
each column (its metadata).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy.typing as npt

from vflink.data.parts import PART_ROWS
from vflink.data.sink import ROW_GROUP_ROWS, ColumnSink
from vflink.registry import Registry
from vflink.runner.link.context import LinkContext, Stage
from vflink.runner.link.outcome import LinkColumns, links_metadata

__all__ = ["WRITERS", "write_links"]

WRITERS: Registry[Stage] = Registry("link writer")


def write_links(columns: Mapping[str, npt.NDArray[Any]], out: Path, *,
                parts: bool | None = None, view: str = "operator") -> None:
    """Write the links (``.parquet`` or ``.csv``) atomically: never a half-written output.

    ``columns``: a :class:`~vflink.runner.link.outcome.LinkColumns` (streamed to the file a
    stretch of records at a time) or whole numpy columns. ``parts``: write a ``.parquet``
    output as a partitioned dataset (a directory of parts, :mod:`vflink.data.parts`);
    ``None``: only above ``AUTO_PARTS_ROWS`` links.

    Parquet goes straight from the numpy columns through pyarrow (no DataFrame: building one
    stacks the 14 M house-scale links into blocks first, measured at 1.6 s), LZ4-compressed
    without dictionaries (:func:`vflink.data.parts.parquet_options`), each part or row group
    written by another thread while the next is cut.
    """
    names = list(columns)
    rows = (columns.rows if isinstance(columns, LinkColumns)
            else len(next(iter(columns.values()))) if names else 0)
    with ColumnSink(out, rows=rows, parts=parts,
                    metadata=links_metadata(names, view)) as sink:
        if isinstance(columns, LinkColumns):
            for chunk in columns.chunks(PART_ROWS if sink.parts else ROW_GROUP_ROWS):
                sink.write(chunk)
        else:
            sink.write(dict(columns))


@WRITERS.register("file")
def write_file(ctx: LinkContext) -> LinkContext:
    s = ctx.settings
    if s.out is not None:
        write_links(ctx.columns, s.out, parts=s.parts, view=s.view)
    return ctx


@WRITERS.register("stream")
def write_stream(ctx: LinkContext) -> LinkContext:
    s = ctx.settings
    if s.out is None:  # pragma: no cover - a streamed link needs `out` (the read stage's)
        raise RuntimeError("a streamed link needs `out`")
    # the primary's view leaves out the coordinator's exact distance, as in memory
    names = tuple(c for c in ("primary_index", "secondary_index", "rank", "distance",
                              "similarity") if s.view == "operator" or c != "distance")
    with ColumnSink(s.out, rows=ctx.rows, parts=s.parts,
                    metadata=links_metadata(names, s.view)) as sink:
        for columns in ctx.chunks:
            sink.write(columns)
    return ctx


@WRITERS.register("none")
def write_none(ctx: LinkContext) -> LinkContext:
    return ctx
