"""The conditions of a label-free estimate, checked: fields that do not separate matches,
swapped fields, what the blocking rules miss, a fit that cannot carry an estimate."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from vflink.linkage.diagnostics import (
    blocking_recall,
    capture_matrix,
    cross_codes,
    field_separation,
    fit_checks,
    name_fields,
    swap_check,
    uncertain_mass,
)


def test_a_field_that_agrees_as_often_among_matches_as_among_random_pairs_is_named() -> None:
    rng = np.random.default_rng(0)
    n = 4000
    good = np.where(rng.random(n) < 0.9, 2, rng.integers(0, 2, n))   # matches mostly agree
    flat = rng.integers(0, 3, n)                                      # like random pairs
    levels = np.stack([good, flat], 1).astype(np.int8)
    random_levels = np.stack([rng.integers(0, 3, n), rng.integers(0, 3, n)], 1).astype(np.int8)
    rows = field_separation(levels, random_levels, np.ones(n), [3, 3], ["name", "noise"])
    assert rows[0]["separates"] and not rows[1]["separates"]
    assert rows[1]["separation"] < 0.1 and rows[0]["agree_matches"] > 0.9


def _codes(values: list[str]) -> np.ndarray:
    return np.asarray(values, dtype=object)


def test_two_fields_paired_the_wrong_way_round_are_found_without_a_model() -> None:
    """Given names and surnames of 200 people, the secondary's columns crossed: the pairs
    agreeing on both fields crossed outnumber those agreeing as paired."""
    rng = np.random.default_rng(1)
    given = [f"g{int(i)}" for i in rng.integers(0, 60, 200)]
    sur = [f"s{int(i)}" for i in rng.integers(0, 150, 200)]
    dob = [f"d{i}" for i in range(200)]
    fields_ok = [("string", "jaro-winkler", given, given), ("string", "jaro-winkler", sur, sur)]
    fields_x = [("string", "jaro-winkler", given, sur), ("string", "jaro-winkler", sur, given)]
    exact = [(np.arange(200), np.arange(200))] * 3
    for fields, swapped in ((fields_ok, False), (fields_x, True)):
        cross = cross_codes([*fields, ("string", "date", dob, dob)],
                            ["string", "string", "date"])
        found = swap_check(cross, exact, ["field0", "field1", "field2"], n_records=200)
        assert bool(found) == swapped
        if swapped:
            assert found[0]["fields"] == ["field0", "field1"]
            assert found[0]["crossed"] >= 200 and "look swapped" in found[0]["text"]
    # the secondary's given names compared with another field's column (a nickname), and
    # the given-name field with a column of noise: found with a third field as the anchor
    junk = [f"j{int(i)}" for i in rng.integers(0, 10**6, 200)]
    nick = [f"n{int(i)}" for i in rng.integers(0, 10**6, 200)]
    one = cross_codes([("string", "jaro-winkler", given, junk),
                       ("string", "jaro-winkler", nick, given)], ["string", "string"])
    found = swap_check([*one, None], exact, ["field0", "field1", "field2"], n_records=200)
    assert [f["fields"] for f in found] == [["field0", "field1"]]
    assert "agrees better with the secondary's column of field field1" in found[0]["text"]


def test_bloom_filters_of_one_width_share_their_codes_across_fields() -> None:
    a = np.array([[1, 0], [0, 0], [3, 4]], dtype=np.uint8)
    b = np.array([[3, 4], [1, 0], [9, 9]], dtype=np.uint8)
    cross = cross_codes([("bloom", "hamming", a, b), ("bloom", "hamming", b, a),
                         ("bloom", "hamming", np.zeros((3, 4), np.uint8),
                          np.zeros((3, 4), np.uint8))], ["string", "string", "numeric"])
    (ap, as_), (bp, _) = cross[0], cross[1]  # type: ignore[misc]
    assert ap[1] == -1 and ap[0] == bp[1] == as_[1] and ap[2] == bp[0] == as_[0]
    assert cross[2] is None  # a numeric field compares with no other


def _simulated(agree: list[float], rules: list[list[int]], n: int = 20000, seed: int = 2
               ) -> tuple[np.ndarray, list[np.ndarray], float]:
    """Matches whose fields agree independently with probabilities ``agree``: the rules'
    capture of each, the fields' agreement, and the true share the rules find."""
    rng = np.random.default_rng(seed)
    e = rng.random((n, len(agree))) < np.asarray(agree)
    captured = np.stack([e[:, r].all(axis=1) for r in rules], axis=1)
    found = captured.any(axis=1)
    p = np.asarray(agree)
    truth = 0.0
    for pattern in itertools.product([0, 1], repeat=len(agree)):
        x = np.asarray(pattern, dtype=bool)
        if any(x[r].all() for r in rules):
            truth += float(np.prod(np.where(x, p, 1 - p)))
    return captured[found], [col[found] for col in e.T], truth


def test_the_rules_recall_is_estimated_where_a_rule_lets_each_field_disagree() -> None:
    rules = [[0, 1], [2], [1, 3]]
    captured, agree, truth = _simulated([0.7, 0.8, 0.6, 0.9], rules)
    got = blocking_recall(rules, captured, agree, np.ones(len(captured)))
    assert got["recall"] == pytest.approx(truth, abs=0.02)
    assert truth < 0.95  # the rules do miss matches: recall 1.0 would be wrong
    assert {e["event"] for e in got["events"]} == {"field0", "field1", "field2", "field3"}


def test_a_rule_every_candidate_needs_leaves_the_recall_unestimated_and_says_why() -> None:
    captured, agree, _ = _simulated([0.7, 0.8], [[0], [0, 1]])
    got = blocking_recall([[0], [0, 1]], captured, agree, np.ones(len(captured)))
    assert got["recall"] is None
    assert "every blocking rule requires field0 to agree" in got["reason"]
    # a rule on a column that is no field is an event of its own
    captured, agree, truth = _simulated([0.7, 0.8], [[0], [1]])
    got = blocking_recall([[0], [-1]], captured, agree, np.ones(len(captured)))
    assert got["recall"] == pytest.approx(truth, abs=0.02)
    assert blocking_recall([], np.zeros((3, 0), bool), [], np.ones(3))["recall"] == 1.0


def test_capture_matrix_is_equal_non_empty_keys() -> None:
    keys = [(np.array([0, 1, -1]), np.array([0, -1, 1]))]
    got = capture_matrix(keys, np.array([0, 1, 2, 2]), np.array([0, 1, 1, 2]))
    assert got[:, 0].tolist() == [True, False, False, False]


def test_a_fit_that_cannot_carry_an_estimate_says_why() -> None:
    assert fit_checks(converged=True, iterations=5, q=np.r_[np.ones(50), np.zeros(50)]) == []
    split = np.full(90, 1 / 3)  # three duplicates sharing one match each
    assert uncertain_mass(split) == pytest.approx(1.0)
    reasons = fit_checks(converged=False, iterations=200, q=split)
    assert any("did not converge" in r for r in reasons)
    assert any("between 0.2 and 0.8" in r for r in reasons)
    assert any("expects only" in r for r in fit_checks(converged=True, iterations=3,
                                                       q=np.full(4, 1.0)))


def test_names_replace_field_and_rule_numbers_everywhere() -> None:
    got = name_fields({"a": ["field1 and rule0", {"x": "field10"}], "n": 3},
                      {"field1": "surname", "rule0": "surname & dob", "field10": "city"})
    assert got == {"a": ["surname and surname & dob", {"x": "city"}], "n": 3}
