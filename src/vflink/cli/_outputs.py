"""One rule for outputs that already exist, for every command that writes
(docs/reference/file-formats.md):
an existing output is never replaced silently; the command stops with exit 2, naming the
output and ``--overwrite``, before any work is done."""

from __future__ import annotations

from pathlib import Path

from vflink.errors import ConfigError

__all__ = ["refuse_existing"]


def refuse_existing(*paths: Path, overwrite: bool, what: str = "output") -> None:
    """Raise :class:`ConfigError` (exit 2) naming the first of ``paths`` that exists, unless
    ``overwrite``."""
    if overwrite:
        return
    for path in paths:
        if Path(path).exists():
            raise ConfigError(f"{path}: {what} already exists; choose another --out or pass "
                              "--overwrite to replace it")
