"""Small generated party tables for tests (independent of vflink.datasets)."""

from __future__ import annotations

import numpy as np
import pandas as pd
from sklearn.datasets import make_classification

from vflink.data import PartySchema, PartyTable


def two_party_tables(n: int = 2000, *, primary_features: int = 2, secondary_features: int = 8,
                     secondary_extra_rows: int = 100, primary_unmatched: int = 0,
                     seed: int = 0) -> tuple[PartyTable, PartyTable]:
    """A binary task whose signal lives mostly in the secondary's features.

    ``make_classification`` with ``shuffle=False`` puts the informative columns first; the
    secondary gets most of them. Keys are shared strings; the secondary's rows are shuffled and
    include ``secondary_extra_rows`` records unknown to the primary, and the primary has
    ``primary_unmatched`` records unknown to the secondary.
    """
    rng = np.random.default_rng(seed)
    n_inf = secondary_features  # all secondary features informative; primary gets noise + 1
    x, y = make_classification(n_samples=n + secondary_extra_rows,
                               n_features=primary_features + secondary_features,
                               n_informative=n_inf, n_redundant=0, shuffle=False,
                               class_sep=1.0, flip_y=0.01, random_state=seed)
    keys = np.array([f"r{i:06d}" for i in range(len(x))])
    sec_cols = [f"s{i}" for i in range(secondary_features)]
    pri_cols = [f"p{i}" for i in range(primary_features)]
    primary = pd.DataFrame(x[:n, secondary_features - 1:secondary_features - 1 + primary_features],
                           columns=pri_cols)
    primary.insert(0, "id", keys[:n])
    primary["y"] = y[:n]
    if primary_unmatched:
        primary.loc[: primary_unmatched - 1, "id"] = [f"u{i}" for i in range(primary_unmatched)]
    secondary = pd.DataFrame(x[:, :secondary_features], columns=sec_cols)
    secondary.insert(0, "id", keys)
    secondary = secondary.iloc[rng.permutation(len(secondary))].reset_index(drop=True)
    p_schema = PartySchema(name="primary", role="primary", key=("id",), numeric=tuple(pri_cols),
                           label="y", task="binary")
    s_schema = PartySchema(name="bank", role="secondary", key=("id",), numeric=tuple(sec_cols))
    return (PartyTable.from_frame(p_schema, primary, "mem:primary"),
            PartyTable.from_frame(s_schema, secondary, "mem:bank"))


def split_secondary(inputs, parts: int = 2):  # type: ignore[no-untyped-def]
    """The same records as ``inputs``, with the secondary's features split across ``parts``
    secondary parties that all keep the identifier columns (for multi-party tests)."""
    from vflink.runner.train import Inputs

    (sec,) = inputs.secondaries
    cols = list(sec.schema.numeric)
    chunks = [cols[i::parts] for i in range(parts)]
    tables = []
    for i, chunk in enumerate(chunks):
        schema = PartySchema(name=f"s{i}", role="secondary", key=sec.schema.key,
                             identifiers=sec.schema.identifiers, numeric=tuple(chunk))
        frame = sec.frame[[*sec.schema.key, *sec.schema.identifiers, *chunk]]
        tables.append(PartyTable.from_frame(schema, frame, f"split:{i}"))
    return Inputs(inputs.primary, tuple(tables), None)
