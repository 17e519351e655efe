"""Lower bounds on the Levenshtein distance that block string searches (the "blocking" step).

A top-K string search only has to compute the edit distance of a pair whose *lower bound* is
below the K-th distance found so far. Verifying candidates in increasing order of a bound and
stopping once the K-th verified distance is at most the next candidate's bound therefore gives
the exact top-K distances over all secondary strings
(:func:`vflink.linkage.search.search_levenshtein`, ``mode="approximate"``). Two bounds are used:

* the **length filter** ed(s, t) ≥ ||s| − |t||, which needs no comparison at all: with the
  secondary strings sorted by length, the strings that can still beat an upper bound U of the
  K-th distance form one contiguous window (:func:`length_window`);
* the **LCS bound** ed(s, t) ≥ max(|s|, |t|) − LCS(s, t) (:func:`lcs_lower_bounds`): the
  characters an optimal edit script leaves untouched form a common subsequence, and each edit
  removes at most one character of either string from it, so LCS(s, t) ≥ |s| − ed(s, t) and
  LCS(s, t) ≥ |t| − ed(s, t). rapidfuzz computes the LCS with Hyyrö's bit-parallel algorithm
  (SIMD over several strings at once) in a third to a fifth of the time of the Levenshtein
  distance itself.

Why these, measured on the benchmark's titles (``benchmarks/linkage.py``, case c: 150 primary
titles × 100,000 secondary ones, K = 10): the share of pairs whose bound is below the true K-th
distance — pairs a bound-ordered search must verify — is 0.13 % for the LCS bound, against
10.8 % for (|s| + |t|)/2 − LCS (the Indel distance halved), 12.2 % for the bag distance
(max(|s|, |t|) minus the shared character count, which the LCS bound dominates because the
LCS is at most the shared character count), 11.3 % for the best of the bag distance and the
padded q-gram count filters (Ukkonen 1992: one edit destroys at most q of the n + q − 1 padded
q-grams; 30.6 % for q = 2, 55.8 % for q = 3 alone) and 43.4 % for the length filter alone.
Bulk rapidfuzz LCS costs a third to a fifth of the Levenshtein distance per pair (17-32
characters: 7.5 against 24 ns).

:func:`padded_qgrams` also serves the q-gram Bloom filters (:mod:`.encoding.bloom`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["lcs_lower_bounds", "length_window", "padded_qgrams"]

#: Padding character added on both sides so that the first and last characters form q-grams
#: of their own (the usual convention for q-gram blocking and q-gram Bloom filters).
PAD = "\x00"

IntArray = npt.NDArray[np.int64]


def padded_qgrams(s: str, q: int) -> list[str]:
    """The q-grams of ``s`` padded with ``q - 1`` pad characters on each side (with repeats)."""
    if q <= 1:
        return list(s)
    pad = PAD * (q - 1)
    t = f"{pad}{s}{pad}"
    return [t[i:i + q] for i in range(len(t) - q + 1)]


def lcs_lower_bounds(queries: Sequence[str], query_lengths: IntArray,
                     candidates: Sequence[str], candidate_lengths: IntArray, *,
                     workers: int = 1) -> npt.NDArray[np.signedinteger[Any]]:
    """``(len(queries), len(candidates))`` lower bounds max(|s|, |t|) − LCS(s, t) ≤ ed(s, t).

    ``workers`` is rapidfuzz's thread count (−1: all cores).
    """
    from rapidfuzz import process
    from rapidfuzz.distance import LCSseq

    longest = max(int(query_lengths.max(initial=0)), int(candidate_lengths.max(initial=0)))
    # LCS ≤ the shorter length; the bound ≤ the longer one
    dtype = np.uint8 if longest <= 255 else np.int32
    # strictly below the wider type's maximum, which callers may use as a marker
    wide = np.int16 if longest < np.iinfo(np.int16).max else np.int32
    lcs = process.cdist(queries, candidates, scorer=LCSseq.similarity, dtype=dtype,
                        workers=workers)
    bound = np.maximum(query_lengths.astype(wide)[:, None],
                       candidate_lengths.astype(wide)[None, :])
    bound -= lcs
    return bound


def length_window(sorted_lengths: IntArray, lengths: IntArray,
                  radius: IntArray) -> tuple[IntArray, IntArray]:
    """For each query length and radius, the positions ``[lo, hi)`` of ``sorted_lengths``
    within ``radius − 1`` of it: by the length filter, the only strings that can be at distance
    below ``radius`` from the query."""
    lo = np.searchsorted(sorted_lengths, lengths - radius + 1, side="left")
    hi = np.searchsorted(sorted_lengths, lengths + radius - 1, side="right")
    return lo, np.maximum(lo, hi)
