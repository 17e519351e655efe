"""A party's data fingerprint: a hash of its loaded table, computed where the data live.

Checkpoints record it so that ``--resume`` refuses to continue on changed data (the model so
far was trained on the old rows). Only the comparison's outcome leaves the party, never the
rows and not even the hash.
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd


__all__ = ["FingerprintBuilder", "frame_fingerprint"]


#: Rows hashed at a time: a row's hash does not depend on the others, so hashing in chunks
#: gives the same digest while the temporaries stay bounded, also for 10^7-row tables.
CHUNK_ROWS = 1 << 18


class FingerprintBuilder:
    """:func:`frame_fingerprint` fed a table's rows in consecutive parts (record batches of a
    table read in batches): the digest equals that of the whole frame, because the header is
    the column names and dtypes (taken from the first part) and each row hashes alone."""

    def __init__(self) -> None:
        self._digest = hashlib.sha256()
        self._started = False

    def update(self, frame: pd.DataFrame) -> None:
        import pandas as pd

        if not self._started:
            self._digest.update(json.dumps([[str(c), str(t)]
                                            for c, t in frame.dtypes.items()]).encode())
            self._started = True
        for start in range(0, len(frame), CHUNK_ROWS):
            part = frame.iloc[start:start + CHUNK_ROWS]
            self._digest.update(pd.util.hash_pandas_object(part, index=False).to_numpy()
                                .tobytes())

    def hexdigest(self) -> str:
        return self._digest.hexdigest()


def frame_fingerprint(frame: pd.DataFrame) -> str:
    """SHA-256 over the column names, dtypes and every cell (row order matters)."""
    builder = FingerprintBuilder()
    builder.update(frame)
    return builder.hexdigest()
