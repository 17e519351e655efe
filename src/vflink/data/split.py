"""Train/validation/test split of the primary's rows (7:1:2 by default), seeded."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from vflink.errors import DataError

__all__ = ["split_rows"]


def split_rows(rows: npt.NDArray[np.int64], fractions: Sequence[float],
               rng: np.random.Generator) -> tuple[npt.NDArray[np.int64], ...]:
    """Shuffle ``rows`` and cut them by ``fractions``; each part is sorted, none is empty."""
    rows = np.asarray(rows, dtype=np.int64)
    n = len(rows)
    if n < len(fractions):
        raise DataError(f"{n} aligned primary rows cannot be split into {len(fractions)} parts")
    order = rng.permutation(rows)
    k = len(fractions)
    cuts = [int(c) for c in np.floor(np.cumsum(fractions)[:-1] * n)]
    # every part gets at least one row: cut i lies in [i + 1, n - (k - 1 - i)]
    for i in range(k - 1):
        low = cuts[i - 1] + 1 if i else 1
        cuts[i] = min(max(cuts[i], low), n - (k - 1 - i))
    parts = np.split(order, cuts)
    if any(len(p) == 0 for p in parts):
        raise DataError(f"{n} aligned primary rows are too few for the split {list(fractions)}")
    return tuple(np.sort(p) for p in parts)
