"""Dates as keyed Bloom filters of date tokens, so that near-misses compare as close.

A date compared as a string of digits (q-grams of ``19560614``) treats a swapped day and month,
or a year one off, like any other two-character edit. Record-linkage practice (Splink's date
comparisons, Christen's *Data Matching* §5.6) counts these as likely the same date. Here a date
becomes the set of six tokens

    y:YYYY  m:MM  d:DD  s:min(DD,MM)-max(DD,MM)  ym:YYYYMM  md:MMDD

and the Dice similarity of two token sets is 1 for the same date, 4/6 when only the year
differs, 3/6 when only the day differs, 2/6 when only the month differs or when day and month
are swapped, and about 0.03 for two unrelated dates: one threshold (1/3) separates the
one-component errors from different dates. The tokens are hashed into a Bloom filter exactly as
q-grams are (HMAC-SHA256 under the data parties' secret, double hashing, :mod:`.bloom`), with
their own domain label, so a date token never collides with a string q-gram by construction.

Parsing (:func:`date_parts`) needs no valid calendar date: a corrupted ``19561314`` still gives
its year, month and day digits, which is what a typo-tolerant comparison wants. Accepted:
``YYYYMMDD``, ``YYYY-MM-DD`` and ``DD-MM-YYYY`` (any of ``-``, ``/``, ``.``, space between the
parts), with or without a time after the date.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from vflink._cancel import checkpoint
from vflink.errors import DataError
from vflink.linkage.encoding.bloom import BloomConfig, _check_secret, _prf

__all__ = ["DATE_LEVEL", "DateBloomEncoder", "bloom_dates", "date_parts", "date_tokens",
           "looks_like_dates", "set_dice", "token_dice", "token_sets"]

#: Token-Dice similarity at and above which two dates are "close" (one component differs,
#: or day and month are swapped; see the module docstring).
DATE_LEVEL = 1.0 / 3.0 - 1e-9

_YMD = re.compile(r"^(\d{4})[-/. ](\d{1,2})[-/. ](\d{1,2})(?:[ T].*)?$")
_DMY = re.compile(r"^(\d{1,2})[-/. ](\d{1,2})[-/. ](\d{4})(?:[ T].*)?$")


def date_parts(value: str) -> tuple[str, str, str] | None:
    """(year, month, day) as zero-padded digit strings, or None when ``value`` is no date."""
    text = str(value).strip()
    if not text:
        return None
    if text.isdigit():
        return (text[:4], text[4:6], text[6:]) if len(text) == 8 else None
    m = _YMD.match(text)
    if m:
        y, mo, d = m.groups()
        return y, mo.zfill(2), d.zfill(2)
    m = _DMY.match(text)
    if m:
        d, mo, y = m.groups()
        return y, mo.zfill(2), d.zfill(2)
    return None


def date_tokens(value: str) -> list[str]:
    """The six tokens of a date (module docstring); ``[]`` for an empty or unparsable value."""
    parts = date_parts(value)
    if parts is None:
        return []
    y, mo, d = parts
    lo, hi = sorted((mo, d))
    return [f"y:{y}", f"m:{mo}", f"d:{d}", f"s:{lo}-{hi}", f"ym:{y}{mo}", f"md:{mo}{d}"]


def token_sets(values: Iterable[str]) -> list[frozenset[str]]:
    """Each value's date tokens as a set (empty for a value that is not a date): parsed once
    per record, where :func:`set_dice` then compares many pairs."""
    return [frozenset(date_tokens(v)) for v in values]


def set_dice(ta: frozenset[str], tb: frozenset[str]) -> float:
    """The Dice similarity of two token sets (0 if either is empty)."""
    if not ta or not tb:
        return 0.0
    return 2.0 * len(ta & tb) / (len(ta) + len(tb))


def token_dice(a: str, b: str) -> float:
    """The Dice similarity of two dates' token sets (the plaintext reference; 0 if either is
    not a date)."""
    return set_dice(frozenset(date_tokens(a)), frozenset(date_tokens(b)))


def looks_like_dates(values: Iterable[object], *, share: float = 0.9) -> bool:
    """Whether at least ``share`` of the non-empty values parse as dates (and some do)."""
    present = parsed = 0
    for v in values:
        if v is None or (isinstance(v, float) and v != v):
            continue
        text = str(v).strip()
        if not text:
            continue
        present += 1
        parsed += date_parts(text) is not None
    return present > 0 and parsed >= share * present


def bloom_dates(values: Sequence[str], *, secret: bytes, config: BloomConfig | None = None
                ) -> npt.NDArray[np.uint8]:
    """Packed keyed Bloom filters of the dates' tokens (``filter_bits`` bits; ``num_hashes``
    bits per token by double hashing, as :func:`~vflink.linkage.encoding.bloom_strings`).
    An empty value gets an all-zero filter (a missing value); a non-empty value that is no
    date is an error naming its row."""
    cfg = config or BloomConfig()
    _check_secret(secret)
    length = cfg.filter_bits
    out = np.zeros((len(values), length // 8), dtype=np.uint8)
    cache: dict[str, npt.NDArray[np.int64]] = {}
    bits = np.zeros(length, dtype=bool)
    for r, v in enumerate(values):
        if r % 4096 == 0:
            checkpoint()
        text = "" if v is None else str(v).strip()
        if not text:
            continue
        tokens = date_tokens(text)
        if not tokens:
            raise DataError(f"cannot read row {r} ({v!r}) as a date; expected YYYYMMDD, "
                            "YYYY-MM-DD or DD-MM-YYYY")
        bits[:] = False
        for t in tokens:
            pos = cache.get(t)
            if pos is None:
                digest = _prf(secret, b"date|" + t.encode("ascii"))
                a = int.from_bytes(digest[:8], "big") % length
                b = int.from_bytes(digest[8:16], "big") % length
                pos = cache[t] = (a + np.arange(cfg.num_hashes, dtype=np.int64) * b) % length
            bits[pos] = True
        out[r] = np.packbits(bits)
    return out


@dataclass(frozen=True, kw_only=True)
class DateBloomEncoder:
    """Encodes dates into packed keyed Bloom filters of their tokens (:func:`bloom_dates`)."""

    secret: bytes = field(repr=False)
    config: BloomConfig = field(default_factory=BloomConfig)
    metric: str = "hamming"

    def __post_init__(self) -> None:
        _check_secret(self.secret)

    def encode(self, values: Sequence[str]) -> npt.NDArray[np.uint8]:
        return bloom_dates(values, secret=self.secret, config=self.config)
