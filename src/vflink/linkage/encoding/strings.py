"""String identifiers with a documented normalisation.

:func:`normalize_string` applies, in order:

1. Unicode case folding (``str.casefold``: "Straße" → "strasse");
2. NFKD compatibility decomposition, then removal of combining marks ("Café" → "cafe",
   full-width "Ａ" → "a", ligature "ﬁ" → "fi");
3. every punctuation (Unicode category P*) or symbol (S*) character → a space
   ("rock'n'roll" → "rock n roll");
4. runs of whitespace collapsed to one space, and leading/trailing whitespace removed.

Both parties must normalise the same way before comparing or Bloom-encoding strings.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass

from vflink.errors import DataError

__all__ = ["StringEncoder", "normalize_string"]


def normalize_string(s: str) -> str:
    """Case fold, strip accents (NFKD), punctuation/symbols → space, collapse whitespace.

    A string made only of punctuation or symbols keeps its case-folded form instead of
    becoming empty.
    """
    folded = unicodedata.normalize("NFKD", s.casefold())
    chars = []
    for ch in folded:
        if unicodedata.combining(ch):
            continue
        cat = unicodedata.category(ch)
        chars.append(" " if cat[0] in "PS" or ch.isspace() else ch)
    out = " ".join("".join(chars).split())
    # A title made only of symbols (the film "$") would otherwise become empty and match
    # every other empty string: keep its case-folded, trimmed form instead.
    return out if out else " ".join(folded.split())


@dataclass(frozen=True, kw_only=True)
class StringEncoder:
    """Strings, normalised with :func:`normalize_string` unless ``normalize=False``; compared
    with Levenshtein distance."""

    normalize: bool = True
    metric: str = "levenshtein"

    def encode(self, values: Iterable[object]) -> list[str]:
        out = []
        for row, v in enumerate(values):
            if not isinstance(v, str):
                raise DataError(f"string identifiers expected: row {row} is {v!r} "
                                f"({type(v).__name__})")
            out.append(normalize_string(v) if self.normalize else v)
        return out
