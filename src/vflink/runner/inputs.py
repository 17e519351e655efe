"""The parties' tables for a run: from a built-in dataset or from files."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from vflink.data.table import PartyTable, load_table
from vflink.datasets import load_dataset
from vflink.runner.config import RunConfig

__all__ = ["Inputs", "load_inputs"]


@dataclass(frozen=True)
class Inputs:
    """The parties' tables, and ground truth where a dataset has it (for Combine only)."""

    primary: PartyTable
    secondaries: tuple[PartyTable, ...]
    truth: dict[str, npt.NDArray[np.int64]] | None = None
    #: (train, validation, test) primary rows fixed by the dataset (a reproduction preset)
    splits: tuple[npt.NDArray[np.int64], ...] | None = None


def load_inputs(config: RunConfig) -> Inputs:
    """The parties' tables from a built-in dataset or from files."""
    data = config.data
    if data.dataset is not None:
        options = dict(data.options)
        options.setdefault("seed", config.seed)
        ds = load_dataset(data.dataset, **options)
        truth = None
        if ds.true_secondary_index is not None:
            truth = {t.name: np.asarray(idx) for t, idx in
                     zip(ds.secondaries, ds.true_secondary_index, strict=True)}
        return Inputs(ds.primary, tuple(ds.secondaries), truth, ds.splits)
    tables = [load_table(schema) for schema in data.parties]
    primary = next(t for t in tables if t.schema.role == "primary")
    return Inputs(primary, tuple(t for t in tables if t.schema.role == "secondary"))
