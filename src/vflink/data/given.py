"""Tables given to the Python API or a command: a DataFrame, or the path of a CSV/TSV/Parquet
file (read as `vflink` reads files), and column arguments ("a", "a,b" or a list)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

from vflink.errors import ConfigError

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["TableLike", "columns_arg", "read_table"]

#: A table handed to the API: a ``pandas.DataFrame``, or the path of a file ``vflink`` reads
#: (CSV, TSV, ``.csv.gz``, Parquet).
TableLike: TypeAlias = "pd.DataFrame | str | os.PathLike[str]"


def columns_arg(name: str, value: Any) -> tuple[str, ...] | None:
    """``"a"``, ``"a,b"`` or ``["a", "b"]`` as a tuple of column names (``None`` stays None)."""
    if value is None:
        return None
    if isinstance(value, str):
        out = tuple(c.strip() for c in value.split(",") if c.strip())
    elif isinstance(value, Sequence) and all(isinstance(v, str) and v for v in value):
        out = tuple(value)
    else:
        raise ConfigError(f"`{name}` must be a column name, \"a,b\" or a list of names, "
                          f"got {value!r}")
    if not out:
        raise ConfigError(f"`{name}` must name at least one column, got {value!r}")
    return out


def read_table(value: Any, *, argument: str, text_columns: Sequence[str] = (),
               delimiter: str | None = None, encoding: str | None = None,
               decimal: str | None = None) -> tuple[pd.DataFrame, str]:
    """The DataFrame behind ``value`` and the name errors call it by (the file's path, or the
    argument's name for a DataFrame). A path is read as ``vflink`` reads files:
    ``text_columns`` as text, the delimiter detected unless given."""
    import pandas as pd

    if isinstance(value, pd.DataFrame):
        return value, argument
    if isinstance(value, (str, os.PathLike)):
        from vflink.data.table import read_frame

        path = Path(value)
        return (read_frame(path, text_columns=tuple(text_columns), delimiter=delimiter,
                           encoding=encoding, decimal=decimal), str(value))
    raise ConfigError(f"`{argument}` must be a pandas DataFrame or the path of a CSV/Parquet "
                      f"file, got {type(value).__name__}")
