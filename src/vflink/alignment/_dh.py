"""Helpers shared by the Diffie-Hellman set protocols: record keys to group elements, secure
shuffles, and mapping final elements to positions in a sorted list."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import pandas as pd

from vflink.alignment.exact import check_keys_present, normalise_key
from vflink.alignment.groups import Elements
from vflink.errors import DataError, ProtocolError
from vflink.randomness import secret_generator

__all__ = ["as_rows", "key_bytes", "lookup", "secure_permutation", "sorted_unique", "to_hex"]


def key_bytes(frame: pd.DataFrame, key: Sequence[str], *, who: str = "table",
              offset: int = 0) -> list[bytes]:
    """Canonical bytes of each row's (possibly composite) key; empty and duplicate keys are
    refused (``offset``: the table row of ``frame``'s first row, for messages).

    The same canonical text as exact alignment (:func:`normalise_key`), so a record matches
    under every exact method alike.
    """
    if not key:
        raise DataError(f"{who}: no key column(s) to align on")
    check_keys_present(frame, key, who=who, offset=offset)
    # plain lists of the columns' values: the same values as the frame's rows, without
    # building a row object per record (ten times faster on Arrow-backed frames)
    out = [normalise_key(row).encode() for row in
           zip(*(frame[c].tolist() for c in key), strict=True)]
    dup = pd.Index(out).duplicated()
    if dup.any():
        first = int(np.flatnonzero(dup)[0]) + offset
        shown = out[first - offset][:40]
        raise DataError(f"{who}: duplicate key at row {first} ({shown!r}...); "
                        "set alignment needs unique keys")
    return out


def secure_permutation(n: int) -> npt.NDArray[np.int64]:
    """A uniformly random permutation of ``range(n)`` from the secret source.

    The shuffles of Algorithm 1 hide which received element came from which record: drawn
    from a fresh ChaCha20 stream keyed by the OS (:func:`vflink.randomness.secret_generator`),
    never reproducible, whatever the run's noise switch.
    """
    rng = secret_generator()
    return rng.permutation(n).astype(np.int64)


def as_rows(elements: Elements) -> npt.NDArray[np.void]:
    """One opaque fixed-width scalar per element, so numpy can sort, unique and search them
    in byte (lexicographic) order."""
    arr = np.ascontiguousarray(elements, dtype=np.uint8)
    return arr.view(np.dtype((np.void, arr.shape[1]))).ravel()


def sorted_unique(elements: Elements) -> Elements:
    """Elements sorted in lexicographic byte order, duplicates removed."""
    if len(elements) == 0:
        return elements
    rows = as_rows(elements)
    _, first = np.unique(rows, return_index=True)
    return np.ascontiguousarray(elements[first])


def lookup(sorted_elements: Elements, query: Elements, what: str,
           *, missing_ok: bool = False) -> npt.NDArray[np.int64]:
    """Position of each query element in ``sorted_elements`` (-1 where absent if allowed)."""
    if len(query) == 0:
        return np.empty(0, dtype=np.int64)
    ref = as_rows(sorted_elements)
    q = as_rows(query)
    pos = np.searchsorted(ref, q)
    safe = np.minimum(pos, max(len(ref) - 1, 0))
    found = (pos < len(ref)) & (ref[safe] == q) if len(ref) else np.zeros(len(q), dtype=bool)
    if not missing_ok and not found.all():
        raise ProtocolError(f"{what}: {int((~found).sum())} element(s) are not in the agreed "
                            "list (the peer deviated from the protocol)")
    return np.where(found, safe, -1).astype(np.int64)


def to_hex(elements: Elements) -> list[str]:
    return [bytes(row).hex() for row in elements]
