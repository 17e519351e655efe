"""Linkage decisions: comparison levels, Fellegi–Sunter EM, term frequencies, one-to-one
assignment, clusters and quality estimates, each against a hand computation or a brute force."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vflink.errors import ConfigError, LinkageError
from vflink.linkage.comparison import (
    DEFAULT_LEVELS,
    FieldComparator,
    bloom_dice,
    field_levels,
    level_names,
)
from vflink.linkage.decisions import (
    decide,
    estimate_quality,
    greedy_one_to_one,
    match_clusters,
    measure,
    one_to_one_posterior,
    optimal_one_to_one,
    pr_curve,
    threshold_curve,
)
from vflink.linkage.encoding.dates import (
    bloom_dates,
    date_parts,
    date_tokens,
    looks_like_dates,
    token_dice,
)
from vflink.linkage.fellegi_sunter import (
    FSModel,
    estimate_u,
    fit_em,
    fit_em_reference,
    match_weights,
    term_frequencies,
)
from vflink.linkage.fields import auto_metric
from vflink.linkage.scoring import candidate_pairs, score, value_codes

SECRET = b"a-test-secret-of-32-bytes-......"


# --- EM ------------------------------------------------------------------------------------------


def test_one_em_step_equals_the_hand_computed_formulas() -> None:
    """One field of two levels on a 2 × 2 table, the random pairs' u taken as given (λ below
    the unmixing floor's reach), no prior: the one-to-one posterior and the M-step by hand."""
    rows, cols = np.array([0, 0, 1, 1]), np.array([0, 1, 0, 1])
    levels = np.array([[1], [0], [0], [1]], dtype=np.int8)
    u = [np.array([0.9, 0.1])]
    m0 = [np.array([0.2, 0.8])]
    lam = 0.01
    model = fit_em(levels, [2], u, rows, cols, total_pairs=4, lam=lam, m=m0, max_iter=1,
                   tol=0.0, prior_m=0.0)
    u1 = np.maximum((u[0] - lam * m0[0]) / (1 - lam), 0.1 * u[0])
    u1 = u1 / u1.sum()
    o_agree = lam / (1 - lam) * 0.8 / u1[1]
    o_differ = lam / (1 - lam) * 0.2 / u1[0]
    # each agreeing pair competes with one differing pair in its row and one in its column
    q_agree = o_agree / (1 + 2 * o_differ + o_agree)
    q_differ = o_differ / (1 + 2 * o_agree + o_differ)
    total = 2 * q_agree + 2 * q_differ
    assert model.lam == pytest.approx(total / 4)
    np.testing.assert_allclose(model.m[0], [2 * q_differ / total, 2 * q_agree / total])
    assert model.iterations == 1


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**31 - 1), st.booleans())
def test_em_equals_the_pair_by_pair_reference(seed: int, missing: bool) -> None:
    rng = np.random.default_rng(seed)
    n_levels = [3, 2, 4]
    n = 60
    rows, cols = rng.integers(0, 9, n), rng.integers(0, 11, n)
    levels = np.stack([rng.integers(-1 if missing else 0, k, size=n) for k in n_levels],
                      axis=1).astype(np.int8)
    u = [rng.dirichlet(np.ones(k)) for k in n_levels]
    m0 = [rng.dirichlet(np.ones(k)) for k in n_levels]
    fast = fit_em(levels, n_levels, u, rows, cols, total_pairs=99, lam=0.05, m=m0,
                  max_iter=7, tol=0.0)
    slow = fit_em_reference(levels, n_levels, u, rows, cols, total_pairs=99, lam=0.05, m=m0,
                            iterations=7)
    assert fast.lam == pytest.approx(slow.lam, rel=1e-9)
    for a, b in zip(fast.m, slow.m, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-8, atol=1e-12)


def _bipartite_sample(seed: int, n_p: int, n_s: int, n_match: int,
                      m: list[np.ndarray], u: list[np.ndarray]
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every pair of an n_P × n_S link whose first n_match records match one to one, levels
    drawn from m for the matches and from u for the rest."""
    rng = np.random.default_rng(seed)
    rows, cols = np.divmod(np.arange(n_p * n_s, dtype=np.int64), n_s)
    is_match = (rows < n_match) & (cols == rows)
    levels = np.stack([np.where(is_match, rng.choice(len(mf), len(rows), p=mf),
                                rng.choice(len(uf), len(rows), p=uf))
                       for mf, uf in zip(m, u, strict=True)], axis=1).astype(np.int8)
    return rows, cols, levels, is_match


def test_em_recovers_the_parameters_that_generated_the_pairs() -> None:
    """Pairs drawn from a known one-to-one model with discriminating fields: EM with u from
    random pairs finds λ and m back (the few matches whose levels look like non-matches'
    cannot be told apart, so λ may fall a little short), and one more step moves nothing."""
    m = [np.array([0.05, 0.15, 0.8]), np.array([0.1, 0.9]), np.array([0.1, 0.2, 0.7]),
         np.array([0.15, 0.85])]
    u = [np.array([0.99, 0.009, 0.001]), np.array([0.9, 0.1]), np.array([0.99, 0.009, 0.001]),
         np.array([0.97, 0.03])]
    n_levels = [3, 2, 3, 2]
    rows, cols, levels, is_match = _bipartite_sample(7, 300, 300, 150, m, u)
    sample = np.random.default_rng(1).choice(len(rows), 20_000, replace=False)
    u_hat = estimate_u(levels[sample], n_levels, smoothing=0.0)
    model = fit_em(levels, n_levels, u_hat, rows, cols, total_pairs=len(rows), prior_m=0.0)
    assert model.converged
    assert model.lam * len(rows) == pytest.approx(150, rel=0.08)
    for got, want in zip(model.m, m, strict=True):
        np.testing.assert_allclose(got, want, atol=0.07)
    again = fit_em(levels, n_levels, u_hat, rows, cols, total_pairs=len(rows), prior_m=0.0,
                   lam=model.lam, m=model.m, max_iter=1, tol=0.0)
    np.testing.assert_allclose(again.m[0], model.m[0], atol=1e-6)


def _two_class_em(levels: np.ndarray, u: list[np.ndarray], iterations: int = 200
                  ) -> tuple[float, list[np.ndarray]]:
    """The plain EM of a two-class mixture, each pair a match or not independently of the
    others (binary levels, u fixed): the contrast for the one-to-one EM."""
    lam, m = 0.1, [np.array([0.2, 0.8])] * levels.shape[1]
    for _ in range(iterations):
        log_odds = np.log(lam / (1 - lam)) + sum(
            np.log(m[f][levels[:, f]] / u[f][levels[:, f]]) for f in range(levels.shape[1]))
        p = 1 / (1 + np.exp(-log_odds))
        lam = float(p.mean())
        m = [np.array([(p * (levels[:, f] == lv)).sum() for lv in (0, 1)]) / p.sum()
             for f in range(levels.shape[1])]
    return lam, m


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_em_is_not_taken_by_a_large_latent_class(seed: int) -> None:
    """Restaurant-like tables: records in 8 cities, pairs in the same city agree on the city
    and half the time on the street (a tenth of all pairs), matches agree on name and phone.
    The two-class mixture makes "same city and street" its match class (m(name) ≈ 0.02, as
    measured on the Fodor's–Zagat guides); under the one-to-one constraint the matches are
    found."""
    rng = np.random.default_rng(seed)
    n_p, n_s, n_match = 200, 300, 60
    city_p, city_s = rng.integers(0, 8, n_p), rng.integers(0, 8, n_s)
    city_s[:n_match] = city_p[:n_match]
    rows, cols = np.divmod(np.arange(n_p * n_s, dtype=np.int64), n_s)
    is_match = (rows < n_match) & (cols == rows)
    same = city_p[rows] == city_s[cols]

    def draw(p_match: float, p_other: np.ndarray | float) -> np.ndarray:
        return np.where(is_match, rng.random(len(rows)) < p_match,
                        rng.random(len(rows)) < p_other)

    street = draw(0.8, np.where(same, 0.5, 0.01))
    levels = np.stack([draw(0.9, 0.002), draw(0.9, 0.001), same, street],
                      axis=1).astype(np.int8)
    u = estimate_u(levels, [2, 2, 2, 2])
    lam, m = _two_class_em(levels.astype(np.int64), list(u))
    assert lam * len(rows) > 2000 and m[0][1] < 0.1  # the plain mixture's failure
    model = fit_em(levels, [2, 2, 2, 2], u, rows, cols, total_pairs=len(rows))
    assert model.m[0][1] > 0.6 and model.lam * len(rows) < 2 * n_match
    w, _ = match_weights(model, levels)
    q = one_to_one_posterior(rows, cols, w)
    chosen = decide(rows, cols, q, w, threshold=0.5)
    assert measure(rows[chosen], cols[chosen], rows[is_match], cols[is_match])["f1"] > 0.9


def test_em_over_all_pairs_counts_the_pairs_left_out_as_non_matches() -> None:
    levels = np.array([[1], [1], [0]], dtype=np.int8)
    rows, cols = np.array([0, 1, 2]), np.array([0, 1, 0])
    model = fit_em(levels, [2], [np.array([0.99, 0.01])], rows, cols, prior_m=0.0,
                   total_pairs=1000)
    assert model.lam < 0.01  # two matches among 1,000 pairs, not among 3
    with pytest.raises(LinkageError, match="total_pairs"):
        fit_em(levels, [2], [np.array([0.5, 0.5])], rows, cols, total_pairs=2)


def test_weights_probabilities_and_term_frequencies() -> None:
    levels = np.array([[1, 0], [0, -1], [1, 1]], dtype=np.int8)
    model = FSModel(names=("a", "b"), levels=(("else", "exact"),) * 2,
                    m=(np.array([0.2, 0.8]),) * 2, u=(np.array([0.9, 0.1]),) * 2, lam=0.25)
    w, contrib = match_weights(model, levels)
    prior = math.log2(0.25 / 0.75)
    assert contrib[1, 1] == 0.0  # a missing field weighs nothing
    assert w[0] == pytest.approx(prior + math.log2(0.8 / 0.1) + math.log2(0.2 / 0.9))
    lone = np.arange(3)  # pairs that share no record: the plain posterior 2^w / (1 + 2^w)
    assert one_to_one_posterior(lone, lone, w)[2] == pytest.approx(2 ** w[2] / (1 + 2 ** w[2]))
    assert one_to_one_posterior(lone[:2], lone[:2], np.array([2000.0, -2000.0])).tolist() == \
        [1.0, 0.0]
    # term frequencies: "a" 3 times, "b" once among 4 + 2 records, "" missing
    tf_p, tf_s = term_frequencies(np.array([0, 0, 1, -1]), np.array([0, 2]))
    np.testing.assert_allclose(tf_p, [3 / 5, 3 / 5, 1 / 5, 0.0])
    np.testing.assert_allclose(tf_s, [3 / 5, 1 / 5])
    tf = np.array([0.05, 0.0, 0.5])
    w_tf, c_tf = match_weights(model, levels, tf=[tf, None])
    assert c_tf[0, 0] == pytest.approx(contrib[0, 0] + math.log2(0.1 / 0.05))  # rare: up
    assert c_tf[2, 0] == pytest.approx(contrib[2, 0] + math.log2(0.1 / 0.5))  # common: down
    assert c_tf[1, 0] == contrib[1, 0]  # no exact agreement: no adjustment


# --- levels --------------------------------------------------------------------------------------


def test_levels_and_dice_against_brute_force() -> None:
    sims = np.array([0.95, 0.7, 0.3, 1.0, 0.8])
    exact = np.array([False, False, False, True, False])
    missing = np.array([False, False, False, False, True])
    assert field_levels(sims, exact, missing, (0.8, 0.6)).tolist() == [2, 1, 0, 3, -1]
    assert level_names((0.8, 0.6)) == ("else", "≥ 0.6", "≥ 0.8", "exact")
    rng = np.random.default_rng(0)
    a = rng.integers(0, 256, size=(7, 16), dtype=np.uint8)
    b = rng.integers(0, 256, size=(5, 16), dtype=np.uint8)
    rows, cols = np.divmod(np.arange(35), 5)
    got = bloom_dice(a, b, rows, cols, chunk=4)
    bits_a, bits_b = np.unpackbits(a, axis=1), np.unpackbits(b, axis=1)
    for k, (i, j) in enumerate(zip(rows, cols, strict=True)):
        want = 2 * (bits_a[i] & bits_b[j]).sum() / (bits_a[i].sum() + bits_b[j].sum())
        assert got[k] == pytest.approx(want)
    with pytest.raises(ConfigError, match="decreasing"):
        FieldComparator(name="x", thresholds=(0.6, 0.8))


# --- dates ---------------------------------------------------------------------------------------


def test_date_tokens_make_near_misses_close() -> None:
    assert date_parts("19560614") == date_parts("1956-06-14") == date_parts("14/06/1956") \
        == ("1956", "06", "14")
    assert date_parts("1956614") is None and date_parts("") is None
    assert token_dice("19560614", "19560614") == 1.0
    assert token_dice("19560614", "19570614") == pytest.approx(4 / 6)  # year one off
    assert token_dice("19560614", "19560615") == pytest.approx(3 / 6)  # day
    assert token_dice("19560614", "19560714") == pytest.approx(2 / 6)  # month
    assert token_dice("19560612", "19561206") == pytest.approx(2 / 6)  # day/month swapped
    assert token_dice("19560614", "19831107") < DEFAULT_LEVELS["date"][0]
    assert looks_like_dates(["19560614", "", "1983-11-07"])
    assert not looks_like_dates(["4000", "2617"])


@settings(max_examples=30, deadline=None)
@given(st.dates(), st.dates())
def test_date_filters_track_the_token_dice(a: object, b: object) -> None:
    """Same date in two formats → the same filter; the filters' Dice is close to the tokens'
    (hash collisions among about 60 of 1,024 bits move it a little)."""
    iso, compact = str(a), str(a).replace("-", "")
    filters = bloom_dates([iso, compact, str(b).replace("-", ""), ""], secret=SECRET)
    np.testing.assert_array_equal(filters[0], filters[1])
    assert not filters[3].any()
    dice = bloom_dice(filters, filters, np.array([1]), np.array([2]))[0]
    assert dice == pytest.approx(token_dice(compact, str(b).replace("-", "")), abs=0.2)
    assert len(date_tokens(iso)) == 6


def test_auto_metric_reads_the_column() -> None:
    assert auto_metric(["19560614", "19831107", ""]) == "date"
    assert auto_metric(["4000", "2617"]) == "jaro-winkler"  # integer codes: strings
    assert auto_metric(["1.5", "2.25"]) == "euclidean"
    assert auto_metric(["smith", "jones"]) == "jaro-winkler"


# --- candidates ----------------------------------------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["", "a", "b", "c"]),
                          st.sampled_from(["", "x", "y"])), min_size=1, max_size=12),
       st.lists(st.tuples(st.sampled_from(["", "a", "b", "c"]),
                          st.sampled_from(["", "x", "y"])), min_size=1, max_size=12))
def test_candidate_pairs_are_the_pairs_sharing_a_rule_key(p: list[tuple[str, str]],
                                                          s: list[tuple[str, str]]) -> None:
    keys_p = [[x for x, _ in p], [y for _, y in p]]
    keys_s = [[x for x, _ in s], [y for _, y in s]]
    rows, cols, stats = candidate_pairs(keys_p, keys_s, names=["first", "second"])
    want = sorted((i, j) for i in range(len(p)) for j in range(len(s))
                  if any(keys_p[r][i] and keys_p[r][i] == keys_s[r][j] for r in (0, 1)))
    assert list(zip(rows.tolist(), cols.tolist(), strict=True)) == want
    first = sum(1 for i, j in itertools.product(range(len(p)), range(len(s)))
                if keys_p[0][i] and keys_p[0][i] == keys_s[0][j])
    assert stats[0] == {"rule": "first", "comparisons": first, "new_pairs": first}
    assert stats[0]["new_pairs"] + stats[1]["new_pairs"] == len(want)


def test_a_rule_that_keeps_too_many_pairs_is_refused_by_name() -> None:
    with pytest.raises(LinkageError, match="'state'.*combine"):
        candidate_pairs([["nsw"] * 20], [["nsw"] * 20], names=["state"], max_pairs=100)


def test_value_codes_equal_exactly_for_equal_values() -> None:
    a = np.array([[1, 2], [0, 0], [3, 4]], dtype=np.uint8)
    b = np.array([[3, 4], [1, 2], [0, 0]], dtype=np.uint8)
    cp, cs = value_codes(a, b)
    assert cp[0] == cs[1] and cp[2] == cs[0] and cp[0] != cp[2]
    assert cp[1] == -1 and cs[2] == -1
    tp, ts = value_codes(["x", "", "y"], ["y", "x"])
    assert tp[0] == ts[1] and tp[2] == ts[0] and tp[1] == -1


# --- decisions -----------------------------------------------------------------------------------


def _best_matching(rows: list[int], cols: list[int], gain: list[float]) -> float:
    best = 0.0
    for r in range(len(rows) + 1):
        for subset in itertools.combinations(range(len(rows)), r):
            if len({rows[i] for i in subset}) == r and len({cols[i] for i in subset}) == r:
                best = max(best, sum(gain[i] for i in subset))
    return best


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.integers(0, 4), st.floats(0.5, 20)),
                min_size=1, max_size=9, unique_by=lambda t: (t[0], t[1])))
def test_optimal_one_to_one_is_the_brute_force_optimum(edges: list[tuple[int, int, float]]
                                                      ) -> None:
    rows = np.array([e[0] for e in edges])
    cols = np.array([e[1] for e in edges])
    w = np.array([e[2] for e in edges])
    keep = optimal_one_to_one(rows, cols, w, floor=0.0)
    assert len(set(rows[keep])) == keep.sum() == len(set(cols[keep]))
    assert w[keep].sum() == pytest.approx(_best_matching(rows.tolist(), cols.tolist(),
                                                         w.tolist()))
    greedy = greedy_one_to_one(rows, cols, w)
    assert len(set(rows[greedy])) == greedy.sum() == len(set(cols[greedy]))
    assert w[greedy].sum() <= w[keep].sum() + 1e-9


def test_decide_threshold_then_one_to_one() -> None:
    rows, cols = np.array([0, 0, 1, 2]), np.array([0, 1, 0, 2])
    w = np.array([5.0, 4.0, 4.5, -3.0])
    p = np.array([0.9, 0.8, 0.7, 0.1])  # pair 3 is below 0.5
    assert decide(rows, cols, p, w).tolist() == [True, True, True, False]
    # optimal: 0-1 and 1-0 (8.5) beat 0-0 alone (5); greedy takes 0-0 first
    assert decide(rows, cols, p, w, one_to_one="optimal").tolist() == [False, True, True, False]
    assert decide(rows, cols, p, w, one_to_one="greedy").tolist() == [True, False, False, False]
    assert decide(rows, cols, p, w, threshold=0.75).tolist() == [True, True, False, False]
    with pytest.raises(ConfigError, match="one_to_one"):
        decide(rows, cols, p, w, one_to_one="best")
    with pytest.raises(ConfigError, match="threshold"):
        decide(rows, cols, p, w, threshold=1.0)


def test_posterior_and_label_free_estimates() -> None:
    # one record with two equally strong candidates: each is its match half the time (a
    # little less: the record may have no match at all)
    rows, cols = np.array([0, 0, 1]), np.array([0, 1, 2])
    w = np.array([20.0, 20.0, 20.0])
    q = one_to_one_posterior(rows, cols, w)
    np.testing.assert_allclose(q, [0.5, 0.5, 1.0], atol=1e-5)
    assert q[0] < 0.5  # so neither is a match at threshold 0.5
    # a lone pair: the plain posterior 2^w / (1 + 2^w)
    assert one_to_one_posterior(np.array([0]), np.array([0]), np.array([1.5]))[0] == \
        pytest.approx(2**1.5 / (1 + 2**1.5))
    chosen = np.array([True, False, True])
    est = estimate_quality(q, chosen)
    assert est["expected_matches"] == pytest.approx(2.0, abs=1e-4)
    assert est["precision"] == pytest.approx(0.75, abs=1e-4)
    assert est["recall"] == pytest.approx(0.75, abs=1e-4)
    curve = threshold_curve(rows, cols, q, thresholds=[0.4])
    assert curve["f1"][0] == pytest.approx(est["f1"], abs=1e-4)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**31 - 1))
def test_threshold_curve_equals_deciding_at_each_threshold(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = 30
    rows, cols = rng.integers(0, 8, n), rng.integers(0, 8, n)
    w = rng.normal(0, 6, n)
    q = one_to_one_posterior(rows, cols, w)
    ts = [0.1, 0.5, 0.9]
    curve = threshold_curve(rows, cols, q, thresholds=ts)
    for k, t in enumerate(ts):
        chosen = decide(rows, cols, q, q, threshold=t, one_to_one="greedy")
        assert curve["f1"][k] == pytest.approx(estimate_quality(q, chosen)["f1"])


def test_measure_pr_curve_and_clusters() -> None:
    m = measure(np.array([0, 1, 2]), np.array([0, 1, 3]), [0, 1, 2, 4], [0, 1, 2, 4])
    assert (m["precision"], m["recall"]) == (pytest.approx(2 / 3), 0.5)
    assert m["f1"] == pytest.approx(2 * 2 / 7)
    curve = pr_curve(np.array([0, 1]), np.array([0, 0]), np.array([0.9, 0.2]), [0], [0],
                     points=3)
    assert curve["precision"][0] == 1.0 and curve["recall"][-1] == 1.0
    # three parties: 0-1 matched to b's 1, b's 1 to c's 0: one cluster of three records
    clusters = match_clusters([2, 2, 1], [(0, 1, [0], [1]), (1, 2, [1], [0])])
    assert clusters[0][0] == clusters[1][1] == clusters[2][0]
    assert len({clusters[0][1], clusters[1][0], clusters[0][0]}) == 3


# --- end to end on encodings ---------------------------------------------------------------------


def test_score_separates_matches_from_non_matches_on_bloom_filters() -> None:
    """Names with typos as keyed Bloom filters and exact hashes: EM without labels puts the
    true pairs above p = 0.5 and the rest below, and its estimate of F1 is close."""
    from vflink.linkage.encoding import bloom_strings

    rng = np.random.default_rng(3)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    names = ["".join(rng.choice(letters, 7)) for _ in range(300)]
    towns = ["".join(rng.choice(letters, 5)) for _ in range(20)]
    p_names = names[:200]
    p_towns = [towns[i % 20] for i in range(200)]
    s_names = [n if rng.random() < 0.7 else n[:3] + "x" + n[4:] for n in names[100:]]
    s_towns = [towns[i % 20] for i in range(100, 300)]
    fields, codes = [], []
    for a, b in ((p_names, s_names), (p_towns, s_towns)):
        fields.append(("bloom", "hamming", bloom_strings(a, secret=SECRET),
                       bloom_strings(b, secret=SECRET)))
        codes.append(value_codes(a, b))
    comps = [FieldComparator(name=n, thresholds=(0.8, 0.6), tf=True) for n in ("n", "t")]
    rows, cols = np.divmod(np.arange(200 * 200, dtype=np.int64), 200)
    scored = score(comps, fields, codes, rows, cols, rng=np.random.default_rng(0),
                   n_random=20_000)
    truth = (rows >= 100) & (cols == rows - 100)
    chosen = decide(rows, cols, scored.probabilities, scored.weights, one_to_one="optimal")
    assert (chosen == truth).all()
    est = estimate_quality(scored.probabilities, chosen)
    assert est["f1"] == pytest.approx(1.0, abs=0.05)
    assert scored.model.lam == pytest.approx(100 / 40_000, rel=0.3)


def test_date_similarities_of_pairs_and_matrices_equal_the_per_pair_reference() -> None:
    """Dates are parsed once per record for many pairs: every pair's value equals
    ``token_dice`` of the two strings (unparsable and empty values included)."""
    from vflink.linkage.encoding.dates import token_dice
    from vflink.linkage.fields import _pair_string, _string_matrix
    from vflink.linkage.scoring import pair_similarities

    rng = np.random.default_rng(5)
    days = [f"{y}{m:02d}{d:02d}" for y, m, d in zip(rng.integers(1950, 2000, 30),
                                                    rng.integers(1, 13, 30),
                                                    rng.integers(1, 29, 30), strict=True)]
    a = days[:12] + ["", "not a date"]
    b = days[8:] + [days[0][:4] + days[0][6:] + days[0][4:6], ""]
    rows = rng.integers(0, len(a), 200)
    cols = rng.integers(0, len(b), 200)
    sim, _ = pair_similarities("string", "date", a, b, rows, cols)
    assert sim.tolist() == [token_dice(a[i], b[j]) for i, j in zip(rows, cols, strict=True)]
    matrix = _string_matrix("date", a, b, workers=1)
    want = np.asarray([[_pair_string("date", x, y) for y in b] for x in a], dtype=np.float32)
    np.testing.assert_array_equal(matrix, want)


def test_comparison_levels_are_capped_below_what_their_storage_holds() -> None:
    """Levels are int8: 127 thresholds used to overflow (the exact level is 128). The cap is
    32 thresholds; a field at the cap still compares, exact agreement on its top level."""
    from vflink.linkage.comparison import MAX_THRESHOLDS, field_levels

    at_cap = tuple(float(t) for t in np.linspace(0.99, 0.01, MAX_THRESHOLDS))
    c = FieldComparator(name="x", thresholds=at_cap)
    sim = np.array([0.0, 0.5, 0.995, 1.0])
    got = field_levels(sim, np.array([False, False, False, True]), np.zeros(4, dtype=bool),
                       c.thresholds)
    assert got.dtype == np.int8 and got.tolist() == [0, 16, MAX_THRESHOLDS, MAX_THRESHOLDS + 1]
    for n in (MAX_THRESHOLDS + 1, 127, 200):
        too_many = tuple(float(t) for t in np.linspace(0.995, 0.005, n))
        with pytest.raises(ConfigError, match=f"1 to {MAX_THRESHOLDS} similarity thresholds"):
            FieldComparator(name="x", thresholds=too_many)
        with pytest.raises(ConfigError):
            field_levels(sim, np.zeros(4, dtype=bool), np.zeros(4, dtype=bool), too_many)
