"""The cardinality of a model link: the posterior and the EM under each one against plain
references, its estimate from near-certain counterparts, the decisions within it and the
clusters of a many-to-many link."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vflink.errors import ConfigError
from vflink.linkage.decisions import greedy_within, pair_clusters, threshold_curve
from vflink.linkage.fellegi_sunter import (
    CARDINALITIES,
    estimate_cardinality,
    estimate_u,
    fit_em,
    fit_em_reference,
    initial_m,
    near_certain_counts,
    one_to_one_posterior,
    posterior,
    prior_matches,
)


def _brute_posterior(rows: list[int], cols: list[int], w: list[float], card: str) -> list[float]:
    """The formulas of the module docstring, pair by pair."""
    o = [2.0 ** x for x in w]
    out = []
    for i, (r, c) in enumerate(zip(rows, cols, strict=True)):
        row = sum(o[k] for k in range(len(o)) if rows[k] == r)
        col = sum(o[k] for k in range(len(o)) if cols[k] == c)
        denom = {"one-to-one": 1 + row + col - o[i], "many-to-one": 1 + row,
                 "one-to-many": 1 + col, "many-to-many": 1 + o[i]}[card]
        out.append(o[i] / denom)
    return out


@settings(max_examples=40, deadline=None)
@given(data=st.data(), card=st.sampled_from(CARDINALITIES))
def test_the_posterior_of_each_cardinality_is_its_formula(data: st.DataObject,
                                                           card: str) -> None:
    n = data.draw(st.integers(1, 12))
    rows = data.draw(st.lists(st.integers(0, 4), min_size=n, max_size=n))
    cols = data.draw(st.lists(st.integers(0, 4), min_size=n, max_size=n))
    w = data.draw(st.lists(st.floats(-20, 20), min_size=n, max_size=n))
    got = posterior(np.asarray(rows), np.asarray(cols), np.asarray(w), card)
    np.testing.assert_allclose(got, _brute_posterior(rows, cols, w, card), rtol=1e-9,
                               atol=1e-12)
    if card == "one-to-one":
        np.testing.assert_array_equal(got, one_to_one_posterior(np.asarray(rows),
                                                                np.asarray(cols),
                                                                np.asarray(w)))


def test_huge_weights_do_not_overflow_and_unknown_cardinalities_are_refused() -> None:
    rows, cols = np.array([0, 0, 1]), np.array([0, 1, 1])
    for card in CARDINALITIES:
        q = posterior(rows, cols, np.array([4000.0, 4000.0, -4000.0]), card)
        assert np.isfinite(q).all() and (q <= 1).all()
    with pytest.raises(ConfigError, match="`cardinality` must be one of one-to-one"):
        posterior(rows, cols, np.zeros(3), "one-to-few")


def test_duplicates_share_a_match_one_to_one_and_each_keep_theirs_many_to_one() -> None:
    """Three near-identical primary records of one secondary record: one-to-one splits its
    single match (q < 1/2 each), many-to-one gives each its own."""
    rows, cols, w = np.array([0, 1, 2]), np.array([0, 0, 0]), np.full(3, 30.0)
    assert (posterior(rows, cols, w, "one-to-one") < 0.5).all()
    assert (posterior(rows, cols, w, "many-to-one") > 0.99).all()
    assert (posterior(rows, cols, w, "one-to-many") < 0.5).all()
    assert prior_matches(3, 5, "many-to-one") == 3 and prior_matches(3, 5, "one-to-many") == 5


@pytest.mark.parametrize("card", CARDINALITIES)
def test_fit_em_equals_the_plain_reference_under_each_cardinality(card: str) -> None:
    rng = np.random.default_rng(7)
    n_levels = [3, 2, 4]
    pairs = sorted({(int(r), int(c)) for r, c in zip(rng.integers(0, 15, 80),
                                                      rng.integers(0, 12, 80), strict=True)})
    rows = np.array([p[0] for p in pairs])
    cols = np.array([p[1] for p in pairs])
    levels = np.stack([rng.integers(-1, n, len(pairs)) for n in n_levels], axis=1).astype(np.int8)
    u = estimate_u(np.stack([rng.integers(0, n, 500) for n in n_levels], 1).astype(np.int8),
                   n_levels)
    m0 = initial_m(n_levels)
    fast = fit_em(levels, n_levels, u, rows, cols, total_pairs=180.0, lam=0.05, m=m0,
                  max_iter=6, tol=0.0, cardinality=card)
    slow = fit_em_reference(levels, n_levels, u, rows, cols, total_pairs=180.0, lam=0.05,
                            m=m0, iterations=6, cardinality=card)
    assert fast.iterations == 6
    for a, b in zip(fast.m, slow.m, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-9)
    assert fast.lam == pytest.approx(slow.lam, rel=1e-9)
    assert fast.extra["cardinality"] == card


def _duplicated(n_secondary: int, copies: list[int]) -> tuple[np.ndarray, ...]:
    """Candidate pairs of a link whose primary holds copies[j] duplicates of secondary j:
    each true pair at 25 bits, every other candidate at −10."""
    rows, cols, w = [], [], []
    r = 0
    for j, k in enumerate(copies):
        for _ in range(k):
            for c in range(n_secondary):
                rows.append(r)
                cols.append(c)
                w.append(25.0 if c == j else -10.0)
            r += 1
    return np.asarray(rows), np.asarray(cols), np.asarray(w)


def test_the_cardinality_is_told_from_near_certain_counterparts() -> None:
    rows, cols, w = _duplicated(30, [1 + (j % 3) for j in range(30)])
    card, why, counts = estimate_cardinality(rows, cols, w)
    assert card == "many-to-one" and "the primary holds duplicates" in why
    assert counts["secondary_with_several"] == 20 and counts["primary_with_several"] == 0
    card, why, _ = estimate_cardinality(cols, rows, w)  # the same link the other way round
    assert card == "one-to-many" and "the secondary holds duplicates" in why
    card, _, _ = estimate_cardinality(*_duplicated(30, [1] * 30))
    assert card == "one-to-one"
    # a few coincidences (below DUPLICATES_MIN) do not make a table "duplicated"
    assert estimate_cardinality(*_duplicated(300, [2] * 3 + [1] * 297))[0] == "one-to-one"
    # nor do look-alikes under DUPLICATES_SHARE (a hotel's restaurants at one address and
    # telephone: 5 of the 114 Fodor's records with a near-certain Zagat counterpart, 4.4 %)
    assert estimate_cardinality(*_duplicated(114, [2] * 5 + [1] * 109))[0] == "one-to-one"
    assert estimate_cardinality(*_duplicated(100, [2] * 6 + [1] * 94))[0] == "many-to-one"
    both = np.concatenate([rows, cols + 100]), np.concatenate([cols, rows + 100])
    card, _, _ = estimate_cardinality(*both, np.concatenate([w, w]))
    assert card == "many-to-many"
    assert near_certain_counts(rows, cols, w - 40.0)["primary_with_one"] == 0


@settings(max_examples=40, deadline=None)
@given(data=st.data(), card=st.sampled_from(CARDINALITIES))
def test_greedy_within_keeps_the_constraint_and_matches_a_brute_force(
        data: st.DataObject, card: str) -> None:
    n = data.draw(st.integers(0, 10))
    rows = np.asarray(data.draw(st.lists(st.integers(0, 3), min_size=n, max_size=n)), np.int64)
    cols = np.asarray(data.draw(st.lists(st.integers(0, 3), min_size=n, max_size=n)), np.int64)
    w = np.asarray(data.draw(st.lists(st.floats(-5, 5), min_size=n, max_size=n)))
    keep = greedy_within(rows, cols, w, card)
    by_rows = card in ("one-to-one", "many-to-one")
    by_cols = card in ("one-to-one", "one-to-many")
    # brute force: by decreasing weight (ties: first pair), take a pair when its records
    # the cardinality constrains are still free
    used_r: set[int] = set()
    used_c: set[int] = set()
    want = np.zeros(n, dtype=bool)
    for i in sorted(range(n), key=lambda i: (-w[i], i)):
        if (by_rows and rows[i] in used_r) or (by_cols and cols[i] in used_c):
            continue
        want[i] = True
        used_r.add(int(rows[i]))
        used_c.add(int(cols[i]))
    np.testing.assert_array_equal(keep, want)


def test_the_threshold_curve_follows_the_cardinality() -> None:
    rows, cols, w = _duplicated(10, [3] * 10)
    q = posterior(rows, cols, w, "many-to-one")
    curve = threshold_curve(rows, cols, q, [0.5], cardinality="many-to-one")
    assert curve["chosen"] == [30.0] and curve["f1"][0] == pytest.approx(1.0, abs=1e-6)
    one = threshold_curve(rows, cols, q, [0.5])  # one-to-one: one of each three kept
    assert one["chosen"] == [10.0]


def test_clusters_are_the_connected_components_at_the_threshold() -> None:
    rows = np.array([0, 1, 1, 2, 3])
    cols = np.array([0, 0, 1, 2, 3])
    q = np.array([0.9, 0.8, 0.7, 0.2, 0.95])
    ids_p, ids_s = pair_clusters(rows, cols, q, 5, 4, threshold=0.5)
    # brute force: union-find over the kept pairs
    parent = list(range(9))

    def find(x: int) -> int:
        while parent[x] != x:
            x = parent[x]
        return x

    for r, c, p in zip(rows, cols, q, strict=True):
        if p >= 0.5:
            parent[find(int(r))] = find(5 + int(c))
    labels = [find(x) for x in range(9)]
    got = np.concatenate([ids_p, ids_s])
    for a, b in itertools.combinations(range(9), 2):
        assert (labels[a] == labels[b]) == (got[a] == got[b])
    assert got[0] == 0 and sorted(set(got.tolist())) == list(range(len(set(labels))))
