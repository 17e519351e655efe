"""Run directories that are either complete or absent.

A run is written into a hidden ``.<name>.partial`` sibling and renamed into place only when it
has finished, so a failed or interrupted run never leaves a directory that looks complete.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from vflink._files import atomic_write_json
from vflink.errors import RunError

__all__ = ["atomic_run_dir", "check_run_dir", "staging_dir", "write_json"]

log = logging.getLogger(__name__)


def write_json(path: Path, data: Any) -> None:
    atomic_write_json(path, data, indent=2, default=str)


def _make_parents(out_dir: Path) -> list[Path]:
    """Create ``out_dir``'s missing parents; return those created, deepest first."""
    missing = []
    parent = out_dir.parent
    while not parent.exists() and parent != parent.parent:
        missing.append(parent)
        parent = parent.parent
    try:
        out_dir.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        _remove_empty(missing)
        where = Path(exc.filename or out_dir.parent)
        reason = (" is a file, not a directory" if where.exists() and not where.is_dir()
                  else f": {exc.strerror or exc}")
        raise RunError(f"{out_dir}: cannot create the run directory: {where}{reason}"
                       ) from None
    return missing


def _remove_empty(directories: list[Path]) -> None:
    for d in directories:  # deepest first
        try:
            d.rmdir()
        except OSError:
            break  # not empty (or already gone): leave it and its parents


def staging_dir(out_dir: Path) -> Path:
    """Where a run is written until it is complete (a hidden sibling of ``out_dir``)."""
    return out_dir.with_name(f".{out_dir.name}.partial")


def check_run_dir(out_dir: Path, *, overwrite: bool = False, resume: bool = False) -> None:
    """Raise :class:`RunError` (exit 2) if a run may not be written to ``out_dir``: it exists
    and ``overwrite`` is not given, or ``resume`` finds no interrupted run to continue. Cheap:
    commands call it before any work, :func:`atomic_run_dir` again when it starts."""
    out_dir = Path(out_dir)
    staging = staging_dir(out_dir)
    if resume and out_dir.exists() and not staging.is_dir():
        # never advise --overwrite here: it would delete the finished run
        raise RunError(f"{out_dir}: nothing to resume: this run has finished (its directory "
                       "is complete and no interrupted run is waiting); to train again, "
                       "choose another --out")
    if out_dir.exists() and not overwrite:
        raise RunError(f"{out_dir}: run directory already exists; choose another --out or pass "
                       "--overwrite")
    if resume and not staging.is_dir():
        raise RunError(f"{out_dir}: nothing to resume (no interrupted run at {staging}); "
                       "a run that stopped before its first checkpoint (e.g. during "
                       "alignment) is started again without --resume")


@contextmanager
def atomic_run_dir(out_dir: Path, *, overwrite: bool = False, resume: bool = False,
                   keep_if: Callable[[Path], bool] | None = None) -> Iterator[Path]:
    """Yield a staging directory that becomes ``out_dir`` only if the block succeeds.

    On failure the staging directory is removed, unless ``keep_if(staging)`` says it holds
    something worth resuming from (checkpoints); ``resume`` reuses such a directory.
    """
    out_dir = Path(out_dir)
    check_run_dir(out_dir, overwrite=overwrite, resume=resume)
    staging = staging_dir(out_dir)
    if resume and staging.is_symlink():  # never write a run through a link
        raise RunError(f"{out_dir}: {staging} is a symbolic link; an interrupted run is "
                       "resumed only from a real directory")
    created = _make_parents(out_dir)
    if not resume:
        try:
            if staging.exists():
                shutil.rmtree(staging)
            staging.mkdir()
        except OSError as exc:
            _remove_empty(created)
            raise RunError(f"{out_dir}: cannot create the run directory "
                           f"({exc.strerror or exc})") from None
    try:
        yield staging
    except BaseException:
        if keep_if is not None and keep_if(staging):
            log.warning("run interrupted; its checkpoints are kept in %s: continue it with "
                        "--resume", staging)
        else:
            shutil.rmtree(staging, ignore_errors=True)
            _remove_empty(created)  # a failed run leaves no empty runs/ folder behind
        raise
    if out_dir.exists():
        shutil.rmtree(out_dir)
    os.replace(staging, out_dir)
