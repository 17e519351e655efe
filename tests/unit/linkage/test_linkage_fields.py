"""Multi-field linkage (vflink.linkage.fields) against the per-pair brute-force reference."""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers.links import linked
from vflink.errors import ConfigError
from vflink.linkage import (
    BloomConfig,
    NumericRange,
    bloom_geo,
    bloom_numeric,
    bloom_strings,
    normalize_string,
    soft_linkage,
)
from vflink.linkage.fields import Blocking, FieldSpec, FieldValues, brute_fields, search_fields

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


@pytest.mark.parametrize("cap", [1, 7, 40])
def test_skewed_blocks_split_into_packages_give_the_same_links(
        cap: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """A block larger than BLOCK_COMPARISONS pairs is searched in packages, each keeping its
    rows' top-K: the links equal brute force (every pair of every block kept)."""
    import vflink.linkage.fields as fields_module

    p, s = people(40, 2), people(60, 3)
    s.loc[:45, "last"] = "smith"  # one skewed block
    p.loc[:30, "last"] = "smith"
    keys = [Blocking(on="last"), Blocking(on="first", prefix=2)]
    pv, sv = values(p, SPECS, keys), values(s, SPECS, keys)
    slow = brute_fields(SPECS, pv, sv, 3, blocking=keys)
    calls: list[int] = []
    real = fields_module._combined

    def counting(*args: object, **kwargs: object) -> np.ndarray:
        out = real(*args, **kwargs)  # type: ignore[arg-type]
        calls.append(out.size)
        return out

    monkeypatch.setattr(fields_module, "BLOCK_COMPARISONS", cap)
    monkeypatch.setattr(fields_module, "_combined", counting)
    fast = search_fields(SPECS, pv, sv, 3, blocking=keys)
    np.testing.assert_allclose(fast.distances, slow.distances, rtol=1e-5, atol=1e-6)
    same = (fast.indices == slow.indices) | np.isclose(fast.distances, slow.distances, atol=1e-6)
    assert same.all()
    biggest_block = 46  # secondary rows in the "smith" block
    assert max(calls) <= max(cap, biggest_block)  # one row against a block at the least


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
    single = linked(p, s, on=("all",), metric="levenshtein", top_k=1, seed=0, sigma=0.5)
    multi = linked(p, s, top_k=1, seed=0, sigma=0.5, fields=[
        FieldSpec(on=("first", "last"), metric="levenshtein"),
        FieldSpec(on=("street",), metric="token-set")])
    r_single = float((single.linkage.indices[:, 0] == truth).mean())
    r_multi = float((multi.linkage.indices[:, 0] == truth).mean())
    assert r_multi >= r_single and r_multi >= 0.95


# --- a multi-field link runs as parties: the same result as the pure functions -------------------


def reference_field_linkage(p: pd.DataFrame, s: pd.DataFrame, specs: list[FieldSpec],
                            keys: list[Blocking], *, top_k: int, sigma: float, seed: int,
                            secret: bytes | None) -> Any:
    """The multi-field linkage computed directly, both tables in hand: per-field values (Bloom
    filters with ``secret``: q-grams, geographic, FEDERAL on the range of both tables with a
    1 % margin), then search_fields and Eq. 1-2 with the coordinator's noise stream."""
    sides = []
    for frame, theirs in ((p, False), (s, True)):
        fields: list[Any] = []
        for spec in specs:
            cols = list(spec.columns_s if theirs else spec.on)
            if spec.kind == "string":
                text = [normalize_string(" ".join(map(str, r)).strip()) if any(map(str, r))
                        else "" for r in frame[cols].fillna("").itertuples(index=False)]
                fields.append(text)
            else:
                fields.append(frame[cols].to_numpy(dtype=np.float64))
        blocks = []
        for b in keys:
            col = frame[(b.secondary_on or b.on) if theirs else b.on].astype(str)
            blocks.append([normalize_string(v)[:b.prefix or None] if v.strip() else ""
                           for v in col])
        sides.append([fields, blocks])
    out_specs = list(specs)
    if secret is not None:
        for f, spec in enumerate(specs):
            a, b = sides[0][0][f], sides[1][0][f]
            if spec.kind == "string":
                enc = []
                for text in (a, b):
                    x = np.zeros((len(text), BloomConfig().filter_bits // 8), dtype=np.uint8)
                    full = [i for i, v in enumerate(text) if v]
                    x[full] = bloom_strings([text[i] for i in full], secret=secret)
                    enc.append(x)
            elif spec.metric == "haversine":
                enc = [bloom_geo(a, secret=secret), bloom_geo(b, secret=secret)]
            else:
                ranges = NumericRange.fit(a, b, margin=0.01)
                enc = [bloom_numeric(x, secret=secret, ranges=ranges) for x in (a, b)]
            sides[0][0][f], sides[1][0][f] = enc
            out_specs[f] = FieldSpec(on=spec.on, metric="hamming", weight=spec.weight)
    pv, sv = (FieldValues(tuple(f), tuple(k)) for f, k in sides)
    neighbours = search_fields(out_specs, pv, sv, top_k, blocking=keys)
    return soft_linkage(neighbours, metric="fields", n_secondary=len(sv), sigma=sigma,
                        rng=np.random.default_rng([seed, zlib.crc32(b"link")]))


@pytest.mark.parametrize("privacy", ["bloom", "off"])
def test_a_field_link_through_the_parties_equals_the_direct_computation(
        privacy: str) -> None:
    p, s = people(40, 6), people(70, 7)
    p.loc[3, "street"] = ""  # a missing value: left out of that record's mean
    s = s.rename(columns={"last": "surname"})
    specs = [FieldSpec(on=("first", "last"), secondary_on=("first", "surname"),
                       metric="jaro-winkler"),
             FieldSpec(on=("street",), metric="token-set", weight=0.5),
             FieldSpec(on=("lat", "lon"), metric="haversine", weight=2.0),
             FieldSpec(on=("lon",), metric="euclidean", weight=0.25)]
    keys = [Blocking(on="last", secondary_on="surname", prefix=1), Blocking(on="first")]
    got = linked(p, s, fields=specs, blocking=keys, top_k=3, sigma=0.1, seed=2, secret=SECRET,
                 privacy=privacy)
    want = reference_field_linkage(p, s, specs, keys, top_k=3, sigma=0.1, seed=2,
                                   secret=SECRET if privacy == "bloom" else None)
    lk = got.linkage
    np.testing.assert_array_equal(lk.indices, want.indices)
    np.testing.assert_allclose(lk.distances, want.distances, rtol=1e-6)
    np.testing.assert_allclose(lk.similarities, want.similarities, rtol=1e-6)
    assert (lk.mu0, lk.sigma0, lk.sigma) == pytest.approx((want.mu0, want.sigma0, want.sigma))
    assert got.privacy == privacy and got.encoding == ("bloom" if privacy == "bloom" else "raw")
    assert got.communication["primary->coordinator"]["bytes"] > 0
