"""An imbalanced binary task split across two parties (for label-leakage tests and the
label-protection measurements)."""

from __future__ import annotations

import numpy as np
import pandas as pd
from sklearn.datasets import make_classification

from vflink.data import PartySchema, PartyTable
from vflink.runfiles.inputs import Inputs


def imbalanced_inputs(n: int = 1500, *, positive: float = 0.1, seed: int = 0,
                      class_sep: float = 1.0, flip_y: float = 0.0, informative: int = 6,
                      noise_features: int = 0) -> Inputs:
    """About ``positive`` of the records are positive; the secondary holds most of the signal
    (the first ``informative`` columns of ``make_classification``, plus ``noise_features``
    uninformative ones), the primary two informative columns and the label. ``class_sep`` and
    ``flip_y`` (labels flipped at random) make the task harder; the defaults are the task the
    tests were written on."""
    x, y = make_classification(n_samples=n, n_features=informative + 4 + noise_features,
                               n_informative=informative, n_redundant=0,
                               weights=[1.0 - positive], class_sep=class_sep, flip_y=flip_y,
                               shuffle=False, random_state=seed)
    keys = np.array([f"k{i:06d}" for i in range(n)])
    primary = pd.DataFrame(x[:, informative:informative + 2], columns=["p0", "p1"])
    primary.insert(0, "id", keys)
    primary["y"] = y
    order = np.random.default_rng(seed).permutation(n)
    own = np.r_[np.arange(informative), np.arange(informative + 4, x.shape[1])]
    width = len(own)
    secondary = pd.DataFrame(x[order][:, own], columns=[f"s{i}" for i in range(width)])
    secondary.insert(0, "id", keys[order])
    p_schema = PartySchema(name="primary", role="primary", key=("id",), numeric=("p0", "p1"),
                           label="y", task="binary")
    s_schema = PartySchema(name="bank", role="secondary", key=("id",),
                           numeric=tuple(f"s{i}" for i in range(width)))
    return Inputs(PartyTable.from_frame(p_schema, primary, "mem:primary"),
                  (PartyTable.from_frame(s_schema, secondary, "mem:bank"),))
