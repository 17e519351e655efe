"""The ``fields`` quantiser of ``randomized-response``: the code of a preprocessed
row against a brute-force reference (each column's digit from N(0, 1) quantiles or the
category's frequency rank), the bit shares, the preprocessing's layout, and the party-side
wrapper (what it releases at a huge ε is the reference code; the layout survives a resume)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import norm

from vflink.data.preprocess import Preprocessor
from vflink.data.schema import PartySchema
from vflink.errors import ConfigError
from vflink.privacy import randomized_response as rr
from vflink.privacy.config import PrivacyConfig
from vflink.privacy.embedding_dp import EmbeddingDP

PLAN = {"epochs": 3, "train_batches": 2, "train_chunks": 1, "validation_chunks": 1,
        "test_chunks": 1}


@given(n_fields=st.integers(1, 40), bits=st.integers(1, 12))
def test_bits_are_shared_equally_the_remainder_first(n_fields: int, bits: int) -> None:
    share = rr.field_bits(n_fields, bits)
    assert len(share) == n_fields and sum(share) == bits
    assert max(share) - min(share) <= 1
    assert list(share) == sorted(share, reverse=True)  # the remainder to the first columns


def _reference(x: np.ndarray, fields: tuple[rr.CodeField, ...], bits: int) -> list[int]:
    """Row by row, column by column: the digit of a numeric value is the number of N(0, 1)
    quantiles i/2^a (scipy's) at or below it; of a category, its rank capped at 2^a − 1."""
    share = rr.field_bits(len(fields), bits)
    out = []
    for row in x:
        code, shift = 0, 0
        for field, a in zip(fields, share, strict=True):
            if a == 0:
                continue
            levels = 2 ** a
            if field.ranks is None:
                cuts = [norm.ppf(i / levels) for i in range(1, levels)]
                digit = sum(1 for c in cuts if c <= row[field.start])
            else:
                block = row[field.start:field.start + field.width]
                hot = [j for j, v in enumerate(block) if v > 0]
                digit = min(field.ranks[hot[0]], levels - 1) if hot else levels - 1
            code += digit * 2 ** shift
            shift += a
        out.append(code)
    return out


@st.composite
def _rows(draw: st.DrawFn) -> tuple[np.ndarray, tuple[rr.CodeField, ...], int]:
    kinds = draw(st.lists(st.one_of(st.just(0), st.integers(2, 9)), min_size=1, max_size=9))
    n = draw(st.integers(1, 30))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    fields, blocks, start = [], [], 0
    for width in kinds:
        if width == 0:  # numeric: a standardised value
            fields.append(rr.CodeField(start, 1, None))
            blocks.append(rng.normal(size=(n, 1)) * 1.5)
            start += 1
            continue
        ranks = tuple(int(v) for v in rng.permutation(width))
        block = np.zeros((n, width))
        hot = rng.integers(-1, width, size=n)  # −1: an unknown category (all zeros)
        block[np.flatnonzero(hot >= 0), hot[hot >= 0]] = 1.0
        fields.append(rr.CodeField(start, width, ranks))
        blocks.append(block)
        start += width
    return np.hstack(blocks).astype(np.float32), tuple(fields), draw(st.integers(1, 12))


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(_rows())
def test_codes_match_the_brute_force_reference(case: tuple) -> None:
    x, fields, bits = case
    codes = rr.field_codes(torch.from_numpy(x), fields, bits)
    assert codes.tolist() == _reference(x.astype(np.float64), fields, bits)
    assert codes.min() >= 0 and codes.max() < 2 ** bits


def test_frequent_categories_keep_their_own_code_and_the_rest_share_the_last() -> None:
    # one categorical column of 6 categories, 2 bits: ranks 0, 1, 2 keep a code, 3-5 share 3
    ranks = (4, 0, 2, 1, 5, 3)
    field = rr.CodeField(0, 6, ranks)
    x = np.eye(6, dtype=np.float32)
    codes = rr.field_codes(x, (field,), 2).tolist()
    assert codes == [3, 0, 2, 1, 3, 3]
    assert rr.field_codes(np.zeros((1, 6), np.float32), (field,), 2).tolist() == [3]


def test_numeric_levels_are_equally_likely_for_a_normal_column() -> None:
    z = np.random.default_rng(0).normal(size=(40_000, 1)).astype(np.float32)
    codes = rr.field_codes(z, (rr.CodeField(0),), 3)
    share = np.bincount(codes, minlength=8) / len(codes)
    assert np.allclose(share, 1 / 8, atol=0.01)


def test_bad_layouts_are_refused() -> None:
    with pytest.raises(ValueError, match="ranks"):
        rr.CodeField(0, 3, (0, 0, 1))
    with pytest.raises(ValueError, match="width"):
        rr.field_codes(np.zeros((2, 2), np.float32), (rr.CodeField(1, 3, (0, 1, 2)),), 4)


def test_the_preprocessing_layout_matches_its_encoding() -> None:
    schema = PartySchema(name="p", role="secondary", key=("id",), numeric=("a", "b"),
                         categorical=("c", "d"))
    frame = pd.DataFrame({"id": range(8), "a": [1.0, 2, np.nan, 4, 5, 6, 7, 8],
                          "b": np.arange(8.0), "c": list("xxyyzzzx"),
                          "d": ["u", "v", None, "u", "u", "v", "u", "u"]})
    pre = Preprocessor(schema).fit(frame, np.arange(8))
    columns = pre.columns()
    # a, b, the missing indicator of a; then c (x, y, z) and d (<missing>, u, v)
    assert columns == [(0, 1, False), (1, 1, False), (2, 1, False), (3, 3, True),
                       (6, 3, True)]
    x = pre.transform(frame)
    assert sum(w for _, w, _ in columns) == pre.n_features == x.shape[1]
    for start, width, categorical in columns:
        if categorical:
            assert (x[:, start:start + width].sum(axis=1) == 1).all()


def _dp(fields: tuple[rr.CodeField, ...] | None, quantiser: str | None = None,
        total: float = 60.0, bits: int = 4, n: int = 50) -> EmbeddingDP:
    dp = EmbeddingDP(PrivacyConfig(embeddings="randomized-response", total_epsilon=total,
                                   delta=1e-5, code_bits=bits, quantiser=quantiser),
                     party="bank", n_rows=n, seed=1)
    dp.code_fields = fields
    dp.note_links(np.ones(n, dtype=np.int64))
    dp.set_plan(PLAN)
    return dp


def test_the_party_releases_the_reference_code_at_a_huge_epsilon() -> None:
    # ε = 60, k = 16: the true code is kept with probability 1 − 15·e^−60
    rng = np.random.default_rng(2)
    fields = (rr.CodeField(0), rr.CodeField(1, 3, (1, 0, 2)), rr.CodeField(4))
    x = np.zeros((50, 5), np.float32)
    x[:, 0], x[:, 4] = rng.normal(size=50), rng.normal(size=50)
    x[np.arange(50), 1 + rng.integers(0, 3, 50)] = 1.0
    dp = _dp(fields)
    assert dp.quantiser == "fields"  # auto: 3 columns, at most 2·4
    _, sent = dp.release(torch.zeros(50, 2), np.arange(50), torch.from_numpy(x))
    assert sent.argmax(dim=1).tolist() == _reference(x.astype(np.float64), fields, 4)
    entry = dp.report()
    assert entry["params"]["quantiser"] == "fields"
    assert "[2, 1, 1]" in entry["params"]["quantiser_detail"]
    # a resumed run keeps the layout (records released later are coded the same way)
    resumed = _dp(None)
    resumed.load_state_dict(dp.state_dict())
    assert resumed.code_fields == fields and resumed.quantiser == "fields"


def test_auto_takes_simhash_for_wide_rows_and_without_a_layout() -> None:
    assert _dp(tuple(rr.CodeField(i) for i in range(9))).quantiser == "simhash"  # 9 > 2·4
    assert _dp(tuple(rr.CodeField(i) for i in range(8))).quantiser == "fields"
    assert _dp(None).quantiser == "simhash"
    assert _dp(None, quantiser="simhash").quantiser == "simhash"
    with pytest.raises(ConfigError, match="layout"):
        _dp(None, quantiser="fields").quantise(torch.zeros(2, 3))


@pytest.mark.parametrize(("kw", "key"), [
    ({"embeddings": "vanilla", "total_epsilon": 4.0, "quantiser": "fields"}, "privacy.quantiser"),
    ({"embeddings": "randomized-response", "total_epsilon": 4.0, "quantiser": "kmeans"},
     "privacy.quantiser"),
])
def test_quantiser_config_errors_name_the_key(kw: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError, match=key):
        PrivacyConfig(**kw)  # type: ignore[arg-type]
