"""Approximate string search: Levenshtein lower bounds and the bound-ordered verification.

Oracles: dynamic-programming LCS and Levenshtein distances, and ``brute_levenshtein`` (every
pair). The approximate mode claims the exact top-K distances, so it is compared for equality,
and its internal paths (verification one query at a time, bulk verification of dense rows,
rows searched over all pairs, a sample smaller than the secondary table) are forced one by one.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import vflink.linkage.search as search_module
from vflink.linkage import SearchOptions, brute_levenshtein, search_levenshtein
from vflink.linkage.blocking import lcs_lower_bounds, length_window
from vflink.linkage.distances import levenshtein_distances

SETTINGS = settings(max_examples=40, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
TEXT = st.text(alphabet="abcde é€😀", min_size=0, max_size=14)


def _lcs(a: str, b: str) -> int:
    prev = [0] * (len(b) + 1)
    for ca in a:
        cur = [0]
        for j, cb in enumerate(b, 1):
            cur.append(prev[j - 1] + 1 if ca == cb else max(prev[j], cur[j - 1]))
        prev = cur
    return prev[-1]


def _lengths(xs: list[str]) -> np.ndarray:
    return np.array([len(x) for x in xs], dtype=np.int64)


# Forced paths of the bounded search: (share of sample survivors above which a row is searched
# over all pairs, relative cost of single-query verification, sample size bounds, first batch)
PATHS = {
    "one-query-at-a-time": (2.0, 0.0, 4096, 1024, 64),
    "bulk-dense-rows": (2.0, 1e9, 4096, 1024, 64),
    "all-pairs-rows": (-1.0, 0.0, 4096, 1024, 64),
    "small-sample-small-batches": (2.0, 0.0, 3, 1, 1),
    "defaults": (search_module._ALL_PAIRS_SHARE, search_module._SINGLE_COST,
                 search_module._BOUND_SAMPLE, search_module._MIN_SAMPLE,
                 search_module._VERIFY_BATCH),
}


@contextmanager
def _path(name: str) -> Iterator[None]:
    share, cost, most, least, batch = PATHS[name]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(search_module, "_ALL_PAIRS_SHARE", share)
        mp.setattr(search_module, "_SINGLE_COST", cost)
        mp.setattr(search_module, "_BOUND_SAMPLE", most)
        mp.setattr(search_module, "_MIN_SAMPLE", least)
        mp.setattr(search_module, "_VERIFY_BATCH", batch)
        yield


def _assert_exact(p: list[str], s: list[str], k: int, res: search_module.Neighbours) -> None:
    """Distances equal brute force's, rows are sorted by (distance, index), every index is a
    distinct secondary row at the stated distance."""
    truth = brute_levenshtein(p, s, k)
    np.testing.assert_array_equal(res.distances, truth.distances)
    full = levenshtein_distances(p, s)
    for r in range(len(p)):
        assert len(set(res.indices[r].tolist())) == k
        np.testing.assert_array_equal(full[r, res.indices[r]], res.distances[r])
        order = np.lexsort((res.indices[r], res.distances[r]))
        np.testing.assert_array_equal(order, np.arange(k))
    assert not res.exact


@SETTINGS
@given(a=st.lists(TEXT, min_size=1, max_size=12), b=st.lists(TEXT, min_size=1, max_size=12))
def test_lcs_bound_is_max_length_minus_lcs_and_below_levenshtein(a: list[str],
                                                                  b: list[str]) -> None:
    lb = lcs_lower_bounds(a, _lengths(a), b, _lengths(b))
    expected = np.array([[max(len(x), len(y)) - _lcs(x, y) for y in b] for x in a])
    np.testing.assert_array_equal(lb, expected)
    assert (lb <= levenshtein_distances(a, b)).all()
    assert (lb >= np.abs(_lengths(a)[:, None] - _lengths(b)[None, :])).all()


def test_lcs_bound_on_long_strings_uses_wide_integers() -> None:
    a = ["ab" * 200, "x" * 70]
    b = ["ba" * 200, "x" * 300, ""]
    lb = lcs_lower_bounds(a, _lengths(a), b, _lengths(b))
    assert lb.dtype == np.int16
    np.testing.assert_array_equal(lb, [[1, 400, 400], [400, 230, 70]])


@SETTINGS
@given(lengths=st.lists(st.integers(0, 30), min_size=1, max_size=40),
       query=st.integers(0, 30), radius=st.integers(0, 12))
def test_length_window_holds_exactly_the_lengths_within_radius(lengths: list[int], query: int,
                                                               radius: int) -> None:
    sorted_lengths = np.sort(np.array(lengths, dtype=np.int64))
    lo, hi = length_window(sorted_lengths, np.array([query]), np.array([radius]))
    inside = np.abs(sorted_lengths - query) < radius
    assert hi[0] - lo[0] == inside.sum()
    assert inside[lo[0]:hi[0]].all()


@SETTINGS
@given(data=st.data(), path=st.sampled_from(sorted(PATHS)))
def test_property_bounded_search_equals_brute_force(data: st.DataObject, path: str) -> None:
    s = data.draw(st.lists(TEXT, min_size=1, max_size=40))
    p = data.draw(st.lists(TEXT, min_size=1, max_size=15))
    k = data.draw(st.integers(1, len(s)))
    chunk = data.draw(st.integers(1, 8))
    with _path(path):
        res = search_levenshtein(p, s, k, options=SearchOptions(mode="approximate",
                                                                chunk_size=chunk, threads=1))
    _assert_exact(p, s, k, res)
    assert res.recall == 1.0 and res.recall_rows == len(p)


def _typo_titles(n_s: int, n_p: int, seed: int) -> tuple[list[str], list[str]]:
    """Titles of 1-5 words from a small vocabulary; primary ones are secondary ones with 1-2
    typos, or new titles: the structure the bounds exploit (nearest strings of similar length
    sharing long subsequences) and many ties."""
    rng = np.random.default_rng(seed)
    words = ["star", "war", "dark", "soul", "king", "dom", "quest", "land", "of", "the", "ka",
             "lo", "mira", "tendor", "vinsha", "quabel", "mor"]

    def title() -> str:
        return " ".join(rng.choice(words, int(rng.integers(1, 6))))

    def typo(t: str) -> str:
        chars = list(t)
        for _ in range(int(rng.integers(1, 3))):
            i = int(rng.integers(0, max(1, len(chars))))
            if rng.random() < 0.5 and chars:
                chars[i] = "xyz"[int(rng.integers(0, 3))]
            else:
                chars.insert(i, "q")
        return "".join(chars)

    s = [title() for _ in range(n_s)]
    p = [typo(s[int(j)]) for j in rng.integers(0, n_s, n_p // 2)]
    return p + [title() for _ in range(n_p - len(p))], s


@pytest.mark.parametrize("path", sorted(PATHS))
def test_bounded_search_on_titles_equals_brute_force(path: str) -> None:
    p, s = _typo_titles(1500, 120, seed=3)
    with _path(path):
        res = search_levenshtein(p, s, 10, options=SearchOptions(mode="approximate",
                                                                 chunk_size=32, threads=1))
    _assert_exact(p, s, 10, res)
    assert res.recall == 1.0


def test_bounds_prune_most_pairs_on_titles() -> None:
    p, s = _typo_titles(3000, 200, seed=4)
    with _path("small-sample-small-batches"):
        dist, idx, stats = search_module._bounded_levenshtein(
            p, s, 5, SearchOptions(mode="approximate", threads=1))
    np.testing.assert_array_equal(dist, brute_levenshtein(p, s, 5).distances)
    # Levenshtein distances for a small share of the pairs only, and no row needed all pairs
    assert stats["verified"] < 0.2
    assert stats["bounded"] < 1.0
    assert stats["all_pairs_rows"] == 0


def test_rows_the_bounds_cannot_prune_are_searched_over_all_pairs() -> None:
    # random strings of one length: LCS bounds far below the distances, no length filter
    rng = np.random.default_rng(0)
    letters = list("abcdefghijklmnopqrstuvwxyz")
    s = ["".join(rng.choice(letters, 16)) for _ in range(2000)]
    p = ["".join(rng.choice(letters, 16)) for _ in range(20)]
    dist, idx, stats = search_module._bounded_levenshtein(
        p, s, 5, SearchOptions(mode="approximate", threads=1))
    assert stats["all_pairs_rows"] >= 10
    np.testing.assert_array_equal(dist, brute_levenshtein(p, s, 5).distances)


def test_window_chunks_cover_every_row_within_its_hull() -> None:
    rng = np.random.default_rng(1)
    n = 200
    lengths = rng.integers(1, 80, n)
    lo = rng.integers(0, 500, n)
    hi = lo + rng.integers(0, 60, n)
    lo2 = hi + rng.integers(0, 5, n)
    hi2 = lo2 + rng.integers(0, 3, n)
    rows = np.lexsort((hi - lo, lengths))
    seen: list[int] = []
    for chunk, hulls in search_module._window_chunks(rows, lengths, [(lo, hi), (lo2, hi2)], 7):
        assert 1 <= chunk.size <= 7
        seen.extend(chunk.tolist())
        for (h_lo, h_hi), (a, b) in zip(hulls, [(lo, hi), (lo2, hi2)]):
            own = b[chunk] > a[chunk]
            assert (a[chunk][own] >= h_lo).all() and (b[chunk][own] <= h_hi).all()
    assert seen == rows.tolist()
