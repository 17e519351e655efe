"""A party's data fingerprint: a hash of its loaded table, computed where the data live.

Checkpoints record it so that ``--resume`` refuses to continue on changed data (the model so
far was trained on the old rows). Only the comparison's outcome leaves the party, never the
rows and not even the hash.
"""

from __future__ import annotations

import hashlib
import json

import pandas as pd

__all__ = ["frame_fingerprint"]


#: Rows hashed at a time: a row's hash does not depend on the others, so hashing in chunks
#: gives the same digest while the temporaries stay bounded (issue 22: 10^7-row tables).
CHUNK_ROWS = 1 << 18


def frame_fingerprint(frame: pd.DataFrame) -> str:
    """SHA-256 over the column names, dtypes and every cell (row order matters)."""
    digest = hashlib.sha256()
    digest.update(json.dumps([[str(c), str(t)] for c, t in frame.dtypes.items()]).encode())
    for start in range(0, len(frame), CHUNK_ROWS):
        part = frame.iloc[start:start + CHUNK_ROWS]
        digest.update(pd.util.hash_pandas_object(part, index=False).to_numpy().tobytes())
    return digest.hexdigest()
