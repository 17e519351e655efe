"""The parties' tables for a run: from a built-in dataset or from files."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from vflink.data.streamed import open_table
from vflink.data.table import PartyTable, load_table, report
from vflink.datasets import load_dataset
from vflink.errors import DataError
from vflink.runfiles.config import RunConfig

__all__ = ["Inputs", "identifier_features", "load_inputs"]


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
    tables: list[PartyTable] = []
    problems: list[str] = []
    for schema in data.parties:  # every table's problems at once, not the first table's only
        try:
            # a secondary's large table is read in record batches; see open_table
            tables.append(open_table(schema, store=config.training.feature_store)
                          if schema.role == "secondary" else load_table(schema))
        except DataError as exc:
            problems.extend(exc.problems)
    if problems:
        raise report(None, problems)  # each problem already names its table
    primary = next(t for t in tables if t.schema.role == "primary")
    return Inputs(primary, tuple(t for t in tables if t.schema.role == "secondary"))


def identifier_features(inputs: Inputs) -> dict[str, list[str]]:
    """Per party, the identifier columns that are also features (``identifiers_as_features``):
    their values reach the coordinator encoded for linkage *and* leave the party inside the
    embeddings, which the run's summary and privacy ledger must say."""
    out: dict[str, list[str]] = {}
    for table in (inputs.primary, *inputs.secondaries):
        schema = table.schema
        both = [c for c in schema.identifiers if c in schema.features]
        if schema.identifiers_as_features and both:
            out[schema.name] = both
    return out
