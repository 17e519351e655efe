"""Run directories that are either complete or absent.

A run is written into a hidden ``.<name>.partial`` sibling and renamed into place only when it
has finished, so a failed or interrupted run never leaves a directory that looks complete.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from vflink.errors import RunError

__all__ = ["atomic_run_dir", "write_json"]


def write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n",
                   encoding="utf-8")
    os.replace(tmp, path)


@contextmanager
def atomic_run_dir(out_dir: Path, *, overwrite: bool = False) -> Iterator[Path]:
    """Yield a staging directory that becomes ``out_dir`` only if the block succeeds."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not overwrite:
        raise RunError(f"{out_dir}: run directory already exists; choose another --out or pass "
                       "--overwrite")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = out_dir.with_name(f".{out_dir.name}.partial")
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir()
    try:
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if out_dir.exists():
        shutil.rmtree(out_dir)
    os.replace(staging, out_dir)
