"""Write a dataset's tables to files, with a matching party-config snippet.

So that CLI users can start from files: each party's table becomes ``<party>.csv`` (or
``.parquet``); ``parties.toml`` is a minimal run file (``version`` plus one ``[[data.parties]]``
table per party, whose keys are the fields of :class:`~vflink.data.schema.PartySchema`, with
paths relative to the file as the run config resolves them); and the ground truth, where there
is one, goes to ``truth_<secondary>.csv`` (columns ``primary_row``, ``secondary_row``: 0-based
rows of the written files) for evaluation only.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from vflink._files import atomic_open, atomic_write_text
from vflink.config import CONFIG_VERSION
from vflink.data.schema import PartySchema
from vflink.datasets._base import VFLDataset
from vflink.errors import ConfigError, DataError

__all__ = ["EXPORT_FORMATS", "export_dataset", "party_config_toml"]

#: File formats :func:`export_dataset` writes.
EXPORT_FORMATS = ("csv", "parquet")
CONFIG_NAME = "parties.toml"


def _toml_str(value: str) -> str:
    # A JSON string with ASCII escapes is a valid TOML basic string.
    return json.dumps(value, ensure_ascii=True)


def _toml_list(values: Sequence[str]) -> str:
    return "[" + ", ".join(_toml_str(v) for v in values) + "]"


def party_config_toml(schemas: Sequence[PartySchema], paths: Sequence[str | Path],
                      header: str = "") -> str:
    """A run file with ``[[data.parties]]`` tables, one per schema, pointing at ``paths``."""
    lines = [f"# {line}" if line else "#" for line in header.splitlines()]
    lines += ["", f"version = {CONFIG_VERSION}"]
    for schema, path in zip(schemas, paths):
        lines += ["", "[[data.parties]]",
                  f"name = {_toml_str(schema.name)}",
                  f"role = {_toml_str(schema.role)}",
                  f"path = {_toml_str(str(path))}",
                  f"key = {_toml_list(schema.key)}",
                  f"identifiers = {_toml_list(schema.identifiers)}",
                  f"numeric = {_toml_list(schema.numeric)}",
                  f"categorical = {_toml_list(schema.categorical)}"]
        if schema.label is not None:
            lines.append(f"label = {_toml_str(schema.label)}")
        if schema.task is not None:
            lines.append(f"task = {_toml_str(schema.task.value)}")
    return "\n".join(lines) + "\n"


def export_dataset(dataset: VFLDataset, out_dir: str | Path, *, fmt: str = "csv",
                   overwrite: bool = False) -> dict[str, Path]:
    """Write ``dataset`` under ``out_dir`` and return what was written.

    Returns a mapping from each party name to its table file, ``"config"`` to
    ``parties.toml`` (a run file that ``vflink`` commands accept as ``--config``; add training
    sections as needed), and ``"truth:<secondary>"`` to each ground-truth file. Refuses to
    replace existing files unless ``overwrite`` is true.
    """
    if fmt not in EXPORT_FORMATS:
        raise ConfigError(f"`fmt` must be one of {', '.join(EXPORT_FORMATS)}, got {fmt!r}")
    out = Path(out_dir).resolve()
    if out.exists() and not out.is_dir():
        raise DataError(f"{out}: exists and is not a directory")
    names = [t.name for t in dataset.parties]
    if "config" in names:
        raise ConfigError("a party named 'config' clashes with the config entry of the result")
    targets: dict[str, Path] = {t.name: out / f"{t.name}.{fmt}" for t in dataset.parties}
    targets["config"] = out / CONFIG_NAME
    truth = dataset.true_secondary_index or ()
    for table, _ in zip(dataset.secondaries, truth):
        targets[f"truth:{table.name}"] = out / f"truth_{table.name}.csv"
    existing = [str(p) for p in targets.values() if p.exists()]
    if existing and not overwrite:
        raise ConfigError(f"refusing to overwrite existing file(s) {existing}; "
                          "pass overwrite=True")
    out.mkdir(parents=True, exist_ok=True)

    for t in dataset.parties:
        path = targets[t.name]
        if fmt == "parquet":
            with atomic_open(path, "wb") as fh:
                t.frame.to_parquet(fh, index=False)
        else:
            with atomic_open(path, "w", newline="") as fh:
                t.frame.to_csv(fh, index=False, lineterminator="\n")
    for table, index in zip(dataset.secondaries, truth):
        rows = np.flatnonzero(index >= 0)
        with atomic_open(targets[f"truth:{table.name}"], "w", newline="") as fh:
            pd.DataFrame({"primary_row": rows, "secondary_row": index[rows]}).to_csv(
                fh, index=False, lineterminator="\n")

    header = "\n".join([
        f"vflink party config for dataset {dataset.name!r}, written by export_dataset.",
        *dataset.description.splitlines(),
        "options: " + ", ".join(f"{k}={v!r}" for k, v in dataset.options.items()),
        "Table paths are relative to this file.",
    ])
    atomic_write_text(targets["config"], party_config_toml(
        [t.schema for t in dataset.parties], [targets[n].name for n in names], header))
    return targets
