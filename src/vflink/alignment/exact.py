"""Exact-key alignment with keyed hashes (HMAC), matched by a coordinator.

The data parties share a secret and hash their record keys with HMAC-SHA256 under it; the
coordinator receives only the digests. Without the secret the coordinator can match equal
digests but cannot recover keys, nor confirm a guess of a key by hashing it itself — which it
could with a plain, unkeyed hash of a low-entropy key such as a name or a date of birth.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from vflink.errors import ConfigError, DataError
from vflink.types import MISSING, Alignment

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["DIGEST_SIZE", "check_keys_present", "exact_alignment", "key_digests",
           "match_digests", "normalise_key"]

DIGEST_SIZE = 32  # SHA-256
_SEP = "\x1f"  # unit separator: cannot occur in ordinary key text, keeps ("a","bc") != ("ab","c")


def normalise_key(values: Sequence[object]) -> str:
    """Canonical text of a (possibly composite) key: trimmed, and ``1.0`` written as ``1``."""
    parts = []
    for v in values:
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        parts.append(str(v).strip())
    return _SEP.join(parts)


#: Empty key cells named in an error (their count is given too).
_SHOWN = 3


def check_keys_present(frame: pd.DataFrame, key: Sequence[str], *, who: str = "table",
                       offset: int = 0) -> None:
    """Refuse rows whose key is empty (missing, or blank once trimmed) in any key column.

    An empty key is no key: aligned as the text ``""`` it would match the other table's empty
    keys, or, twice in one table, read as a duplicate key ``b''``. ``offset``: the table row
    of ``frame``'s first row (a batch of a larger table)."""
    problems = []
    for col in key:
        values = frame[col]
        empty = values.isna().to_numpy() | values.astype("string").str.strip().eq("") \
            .fillna(True).to_numpy()
        rows = np.flatnonzero(empty) + offset
        if len(rows):
            shown = ", ".join(f"row {r} (line {r + 2} of a CSV)" for r in rows[:_SHOWN])
            more = f"; {len(rows)} rows in all" if len(rows) > _SHOWN else ""
            problems.append(f"key column {col!r} is empty at {shown}{more}")
    if problems:
        raise DataError(f"{who}: {'; '.join(problems)}. Every record needs a key to be "
                        "aligned: fill the key in, or remove those rows", problems)


def key_digests(frame: pd.DataFrame, key: Sequence[str], secret: bytes, *,
                who: str = "table") -> npt.NDArray[np.uint8]:
    """HMAC-SHA256 of each row's key under ``secret``; shape ``(n, 32)`` uint8. Rows with
    an empty key are refused (:func:`check_keys_present`)."""
    if not isinstance(secret, (bytes, bytearray)) or len(secret) < 16:
        raise ConfigError("the alignment secret must be at least 16 bytes")
    if not key:
        raise ConfigError("exact alignment needs key column(s) in the party schema")
    check_keys_present(frame, key, who=who)
    rows = frame[list(key)].itertuples(index=False, name=None)
    out = np.empty((len(frame), DIGEST_SIZE), dtype=np.uint8)
    for i, row in enumerate(rows):
        digest = hmac.new(secret, normalise_key(row).encode(), hashlib.sha256).digest()
        out[i] = np.frombuffer(digest, dtype=np.uint8)
    return out


def _as_index(digests: npt.NDArray[np.uint8], who: str) -> pd.Index:
    import pandas as pd

    d = np.ascontiguousarray(digests, dtype=np.uint8)
    if d.ndim != 2 or d.shape[1] != DIGEST_SIZE:
        raise DataError(f"{who}: key digests must have shape (n, {DIGEST_SIZE}), got {d.shape}")
    keys = pd.Index([bytes(r) for r in d])
    if keys.has_duplicates:
        first = int(np.flatnonzero(keys.duplicated())[0])
        raise DataError(f"{who}: duplicate keys (row {first} repeats an earlier key); "
                        "exact alignment needs unique keys")
    return keys


def match_digests(primary: npt.NDArray[np.uint8], secondary: npt.NDArray[np.uint8]
                  ) -> npt.NDArray[np.int64]:
    """For each primary row, the secondary row with the same digest, or MISSING (-1)."""
    p = _as_index(primary, "primary")
    s = _as_index(secondary, "secondary")
    return np.asarray(s.get_indexer(p), dtype=np.int64)


def exact_alignment(primary: npt.NDArray[np.uint8], secondary: npt.NDArray[np.uint8],
                    secondary_name: str) -> Alignment:
    """The exact alignment of every primary row (MISSING where a key has no match)."""
    sec = match_digests(primary, secondary)
    return Alignment(np.arange(len(sec), dtype=np.int64), sec[:, None], None, secondary_name,
                     {"matched": float(np.mean(sec != MISSING)) if len(sec) else 0.0})
