"""An imbalanced binary task split across two parties (for label-leakage tests)."""

from __future__ import annotations

import numpy as np
import pandas as pd
from sklearn.datasets import make_classification

from vflink.data import PartySchema, PartyTable
from vflink.runfiles.inputs import Inputs


def imbalanced_inputs(n: int = 1500, *, positive: float = 0.1, seed: int = 0) -> Inputs:
    """About ``positive`` of the records are positive; the secondary holds most of the signal."""
    x, y = make_classification(n_samples=n, n_features=10, n_informative=6, n_redundant=0,
                               weights=[1.0 - positive], class_sep=1.0, flip_y=0.0, shuffle=False,
                               random_state=seed)
    keys = np.array([f"k{i:06d}" for i in range(n)])
    primary = pd.DataFrame(x[:, 6:8], columns=["p0", "p1"])
    primary.insert(0, "id", keys)
    primary["y"] = y
    order = np.random.default_rng(seed).permutation(n)
    secondary = pd.DataFrame(x[order][:, :6], columns=[f"s{i}" for i in range(6)])
    secondary.insert(0, "id", keys[order])
    p_schema = PartySchema(name="primary", role="primary", key=("id",), numeric=("p0", "p1"),
                           label="y", task="binary")
    s_schema = PartySchema(name="bank", role="secondary", key=("id",),
                           numeric=tuple(f"s{i}" for i in range(6)))
    return Inputs(PartyTable.from_frame(p_schema, primary, "mem:primary"),
                  (PartyTable.from_frame(s_schema, secondary, "mem:bank"),))
