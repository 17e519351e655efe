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
    from vflink.runfiles.inputs import Inputs

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


_WORDS = ("alder", "birch", "cedar", "delta", "ember", "fjord", "grove", "harbor", "iris",
          "juniper", "kestrel", "linden", "maple", "north", "oak", "pine", "quarry", "river",
          "stone", "thorn", "upland", "vale", "willow", "yew")


def places_frames(n: int = 240, *, extra: int = 40, seed: int = 0
                  ) -> tuple[pd.DataFrame, pd.DataFrame, np.ndarray]:
    """Two tables of places that share no key: a name and coordinates each (for multi-field
    linkage), a binary label at the primary whose signal lives in the secondary's features.

    The secondary holds every primary place (name words reordered or with a typo, coordinates
    moved by ~1 km) plus ``extra`` others, shuffled; returns (primary, secondary, truth) with
    ``truth[i]`` the secondary row of primary row ``i``. ``region`` is a blocking key (a
    coarse area code, the same on both sides).
    """
    rng = np.random.default_rng(seed)
    total = n + extra
    x, y = make_classification(n_samples=total, n_features=6, n_informative=4, n_redundant=0,
                               shuffle=False, class_sep=1.5, random_state=seed)
    names = [f"{_WORDS[a]} {_WORDS[b]} {int(c)}" for a, b, c in
             zip(rng.integers(0, len(_WORDS), total), rng.integers(0, len(_WORDS), total),
                 rng.integers(1, 40, total), strict=True)]
    lat = rng.uniform(45.0, 48.0, total)
    lon = rng.uniform(5.0, 10.0, total)
    region = [f"R{int(a)}{int(b)}" for a, b in zip((lat - 45) // 1.5, (lon - 5) // 2.5,
                                                   strict=True)]

    def noisy(name: str) -> str:
        words = name.split()
        if rng.random() < 0.5:
            words[0], words[1] = words[1], words[0]
        else:
            w = words[0]
            i = int(rng.integers(0, len(w)))
            words[0] = w[:i] + "x" + w[i + 1:]
        return " ".join(words)

    primary = pd.DataFrame({"name": names[:n], "lat": lat[:n], "lon": lon[:n],
                            "region": region[:n], "p0": x[:n, 4], "p1": x[:n, 5], "y": y[:n]})
    secondary = pd.DataFrame({
        "title": [noisy(v) for v in names], "lat": lat + rng.normal(0, 0.01, total),
        "lon": lon + rng.normal(0, 0.01, total), "area": region,
        **{f"s{j}": x[:, j] for j in range(4)}})
    order = rng.permutation(total)
    secondary = secondary.iloc[order].reset_index(drop=True)
    truth = np.argsort(order)[:n]
    return primary, secondary, truth
