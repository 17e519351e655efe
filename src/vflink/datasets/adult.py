"""UCI Adult split by attributes, with an exact shared record key.

VFL-AFE §4 ("UCI ... We split records by attributes to simulate VFL among multi-sources") and
FLORIST's PSI/PSU setting (a clean sample id, §2): parties hold different columns about the
same people and share an exact key ``id``. ``overlap`` < 1 leaves some people at one party
only, for private set union (FLORIST §2.3–2.4). There are no fuzzy identifiers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vflink._checks import check_bool, check_int, raise_if
from vflink.data.schema import PartySchema
from vflink.datasets._base import (
    VFLDataset,
    check_fraction,
    check_max_rows,
    check_seed,
    read_shipped,
    register_dataset,
    seed_streams,
    split_entities,
    table,
    truth_index,
)
from vflink.datasets.synthetic import record_ids
from vflink.types import Task

__all__ = ["AdultOptions", "load_adult"]

KEY = "id"
LABEL = "income"
# (numeric, categorical) columns of each party
_Columns = tuple[tuple[str, ...], tuple[str, ...]]
_PRIMARY: _Columns = (("age", "educational_num"),
                      ("education", "marital_status", "relationship", "race", "gender",
                       "native_country"))
_EMPLOYMENT: _Columns = (("hours_per_week",), ("workclass", "occupation"))
_FINANCE: _Columns = (("capital_gain", "capital_loss", "fnlwgt"), ())


@dataclass(frozen=True, kw_only=True)
class AdultOptions:
    """Options of "adult".

    Attributes:
        n_secondaries: 1 puts every non-primary column at one ``employment`` party; 2 splits
            them into ``employment`` (work class, occupation, hours) and ``finance`` (capital
            gain/loss, census weight).
        label_only_primary: VFL-AFE's setting (§4.1: "the active party and 2 passive
            parties"): the primary ``income`` holds only the label, and the attribute groups
            go to secondaries: ``demographics`` and (``n_secondaries`` = 2) ``work``
            (employment and finance columns), or one ``demographics`` party with every column
            (``n_secondaries`` = 1).
        overlap: fraction of people held by the primary and the secondaries alike; the rest
            is split evenly between primary-only and secondary-only people.
        max_rows: keep a random subset of this many people first (``None``: all 48,842).
        seed: seeds the subset, the record ids, the split and the shuffling.
    """

    n_secondaries: int = 1
    label_only_primary: bool = False
    overlap: float = 1.0
    max_rows: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        problems: list[str] = []
        check_int(problems, "n_secondaries", self.n_secondaries, min=1, max=2)
        check_bool(problems, "label_only_primary", self.label_only_primary)
        check_fraction(problems, "overlap", self.overlap, open_low=True)
        check_max_rows(problems, self.max_rows)
        check_seed(problems, self.seed)
        raise_if(problems, "AdultOptions")


def load_adult(options: AdultOptions) -> VFLDataset:
    """Build "adult" (see the module docstring)."""
    name = "adult"
    frame = read_shipped("adult.csv.gz", na_values=["?"])
    subset_rng, entity_rng, shuffle_rng = seed_streams(options.seed, 3)
    if options.max_rows is not None and options.max_rows < len(frame):
        keep = np.sort(subset_rng.choice(len(frame), size=options.max_rows, replace=False))
        frame = frame.iloc[keep].reset_index(drop=True)
    n = len(frame)
    frame.insert(0, KEY, record_ids(n, entity_rng))
    frame[LABEL] = (frame[LABEL].str.strip().str.rstrip(".") == ">50K").astype(np.int64)
    prim_rows, sec_rows = split_entities(n, options.overlap, entity_rng)

    primary = PartySchema(name="demographics", role="primary", key=(KEY,), label=LABEL,
                          task=Task.BINARY, numeric=_PRIMARY[0], categorical=_PRIMARY[1])
    parts: dict[str, _Columns]
    if options.label_only_primary:
        primary = PartySchema(name="income", role="primary", key=(KEY,), label=LABEL,
                              task=Task.BINARY)
        work = ((*_EMPLOYMENT[0], *_FINANCE[0]), (*_EMPLOYMENT[1], *_FINANCE[1]))
        parts = ({"demographics": _PRIMARY, "work": work} if options.n_secondaries == 2 else
                 {"demographics": ((*_PRIMARY[0], *work[0]), (*_PRIMARY[1], *work[1]))})
    elif options.n_secondaries == 1:
        parts = {"employment": ((*_EMPLOYMENT[0], *_FINANCE[0]), (*_EMPLOYMENT[1], *_FINANCE[1]))}
    else:
        parts = {"employment": _EMPLOYMENT, "finance": _FINANCE}
    secondaries = []
    truth = []
    for party, (numeric, categorical) in parts.items():
        # Each secondary lists the same people in its own random order.
        rows = sec_rows[shuffle_rng.permutation(len(sec_rows))]
        schema = PartySchema(name=party, role="secondary", key=(KEY,), numeric=numeric,
                             categorical=categorical)
        secondaries.append(table(schema, frame.iloc[rows], name))
        truth.append(truth_index(prim_rows, rows))
    description = (
        "UCI Adult census income (Becker & Kohavi 1996, CC BY 4.0; 48,842 people) split by "
        "attributes as in VFL-AFE: label (income > 50K, binary)"
        f"{'' if options.label_only_primary else ' and demographics'} at the primary "
        f"{primary.name!r}, "
        f"{' and '.join(parts)} column(s) at the secondary part{'ies' if len(parts) > 1 else 'y'}; "
        f"exact key {KEY!r}, overlap {options.overlap}."
    )
    return VFLDataset(name=name, primary=table(primary, frame.iloc[prim_rows], name),
                      secondaries=tuple(secondaries), description=description,
                      true_secondary_index=tuple(truth))


register_dataset("adult", AdultOptions, load_adult,
                 "UCI Adult (income > 50K, binary) split by attributes, exact key `id`")
