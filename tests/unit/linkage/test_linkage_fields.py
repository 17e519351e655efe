"""Multi-field linkage (vflink.linkage.fields) against the per-pair brute-force reference."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vflink.errors import ConfigError
from vflink.linkage import bloom_strings
from vflink.linkage.fields import Blocking, FieldSpec, FieldValues, brute_fields, search_fields
from vflink.runner.link import run_field_linkage, run_linkage

SECRET = b"fields-test-secret-0123456789"
FIRST = ["anna", "bob", "carl", "dora", "emil", "fay", "gus", "hana", "ivan", "jo"]
LAST = ["smith", "jones", "berg", "kahn", "lee", "moss", "nash", "orr"]


def people(n: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({
        "first": [FIRST[i] for i in rng.integers(0, len(FIRST), n)],
        "last": [LAST[i] for i in rng.integers(0, len(LAST), n)],
        "street": [f"{int(rng.integers(1, 99))} {LAST[int(rng.integers(0, 8))]} street"
                   for _ in range(n)],
        "lat": rng.uniform(-60, 60, n), "lon": rng.uniform(-180, 180, n),
    })


def values(frame: pd.DataFrame, specs: list[FieldSpec], keys: list[Blocking]) -> FieldValues:
    fields = []
    for s in specs:
        if s.kind == "string":
            fields.append([" ".join(r) for r in frame[list(s.on)].itertuples(index=False)])
        else:
            fields.append(frame[list(s.on)].to_numpy(dtype=np.float64))
    return FieldValues(tuple(fields), tuple(frame[b.on].str[:b.prefix or None].tolist()
                                            for b in keys))


SPECS = [FieldSpec(on=("first",), metric="jaro-winkler"),
         FieldSpec(on=("last",), metric="levenshtein", weight=2.0),
         FieldSpec(on=("street",), metric="token-set", weight=0.5),
         FieldSpec(on=("lat", "lon"), metric="haversine", weight=1.5, scale=100.0),
         FieldSpec(on=("first",), metric="exact", weight=0.25)]


@pytest.mark.parametrize("blocked", [False, True])
def test_search_equals_brute_force(blocked: bool) -> None:
    p, s = people(30, 0), people(50, 1)
    keys = [Blocking(on="last", prefix=1), Blocking(on="first")] if blocked else []
    pv, sv = values(p, SPECS, keys), values(s, SPECS, keys)
    fast = search_fields(SPECS, pv, sv, 4, blocking=keys)
    slow = brute_fields(SPECS, pv, sv, 4, blocking=keys)
    np.testing.assert_allclose(fast.distances, slow.distances, rtol=1e-5, atol=1e-6)
    same = (fast.indices == slow.indices) | np.isclose(fast.distances, slow.distances, atol=1e-6)
    assert same.all()
    if blocked:  # a row never links to a record outside its blocks
        for i in range(len(p)):
            for j in fast.indices[i][fast.indices[i] >= 0]:
                assert p["last"][i][0] == s["last"][j][0] or p["first"][i] == s["first"][j]


@settings(max_examples=20, deadline=None)
@given(st.lists(st.text("abc ", max_size=6), min_size=1, max_size=8),
       st.lists(st.text("abc ", max_size=6), min_size=2, max_size=8))
def test_strings_with_missing_values_match_brute_force(a: list[str], b: list[str]) -> None:
    specs = [FieldSpec(on=("x",), metric="levenshtein"), FieldSpec(on=("y",), metric="token-set")]
    pv = FieldValues((a, a[::-1]))
    sv = FieldValues((b, b[::-1]))
    fast = search_fields(specs, pv, sv, 2)
    slow = brute_fields(specs, pv, sv, 2)
    np.testing.assert_allclose(fast.distances, slow.distances, rtol=1e-5, atol=1e-6)


def test_bloom_dice_field_matches_brute_force() -> None:
    p, s = people(20, 2), people(40, 3)
    enc = [bloom_strings([f"{a} {b}" for a, b in zip(x["first"], x["last"], strict=True)],
                         secret=SECRET) for x in (p, s)]
    specs = [FieldSpec(on=("name",), metric="hamming")]
    fast = search_fields(specs, FieldValues((enc[0],)), FieldValues((enc[1],)), 3)
    slow = brute_fields(specs, FieldValues((enc[0],)), FieldValues((enc[1],)), 3)
    np.testing.assert_allclose(fast.distances, slow.distances, rtol=1e-5, atol=1e-6)


def test_field_spec_validation_lists_every_problem() -> None:
    with pytest.raises(ConfigError) as info:
        FieldSpec(on=(), metric="cosine", weight=0)
    assert len(info.value.problems) == 3


def test_weighted_fields_beat_one_concatenated_string() -> None:
    """Names with typos plus an address: the true partner is nearest on the weighted fields at
    least as often as on one Levenshtein distance over the concatenation."""
    rng = np.random.default_rng(5)
    s = people(300, 4)
    s["street"] = [f"{i} {w} road" for i, w in enumerate(s["street"])]
    truth = rng.choice(len(s), 150, replace=False)
    p = s.iloc[truth].reset_index(drop=True).copy()

    def typo(x: str) -> str:
        i = int(rng.integers(0, len(x)))
        return x[:i] + "xq"[int(rng.integers(0, 2))] + x[i + 1:]

    p["first"] = [typo(x) for x in p["first"]]
    p["street"] = [" ".join(reversed(x.split())) for x in p["street"]]  # word order differs
    for frame in (p, s):
        frame["all"] = frame["first"] + " " + frame["last"] + " " + frame["street"]
    single = run_linkage(p, s, on=("all",), metric="levenshtein", top_k=1, seed=0)
    multi = run_field_linkage(p, s, top_k=1, seed=0, fields=[
        FieldSpec(on=("first", "last"), metric="levenshtein"),
        FieldSpec(on=("street",), metric="token-set")])
    r_single = float((single.linkage.indices[:, 0] == truth).mean())
    r_multi = float((multi.linkage.indices[:, 0] == truth).mean())
    assert r_multi >= r_single and r_multi >= 0.95
