from __future__ import annotations

import hashlib
import hmac

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from vflink.alignment import exact_alignment, key_digests, match_digests
from vflink.errors import ConfigError, DataError
from vflink.types import MISSING

SECRET = b"0123456789abcdef-shared"


def test_digest_is_hmac_sha256_of_the_key() -> None:
    frame = pd.DataFrame({"id": ["alice", "bob"]})
    d = key_digests(frame, ("id",), SECRET)
    assert d.shape == (2, 32) and d.dtype == np.uint8
    assert bytes(d[0]) == hmac.new(SECRET, b"alice", hashlib.sha256).digest()
    # an unkeyed hash (which a coordinator could compute from a guess) is not what is sent
    assert bytes(d[0]) != hashlib.sha256(b"alice").digest()


def test_different_secret_gives_different_digests() -> None:
    frame = pd.DataFrame({"id": ["alice"]})
    a = key_digests(frame, ("id",), SECRET)
    b = key_digests(frame, ("id",), b"another-secret-of-16+")
    assert not np.array_equal(a, b)


def test_composite_keys_do_not_collide_by_concatenation() -> None:
    f1 = pd.DataFrame({"a": ["x"], "b": ["yz"]})
    f2 = pd.DataFrame({"a": ["xy"], "b": ["z"]})
    assert not np.array_equal(key_digests(f1, ("a", "b"), SECRET),
                              key_digests(f2, ("a", "b"), SECRET))


def test_short_secret_is_refused() -> None:
    with pytest.raises(ConfigError, match="16 bytes"):
        key_digests(pd.DataFrame({"id": [1]}), ("id",), b"short")


@given(
    primary=st.lists(st.integers(0, 200), unique=True, max_size=60),
    secondary=st.lists(st.integers(0, 200), unique=True, max_size=60),
)
def test_matching_equals_a_plaintext_join(primary: list[int], secondary: list[int]) -> None:
    p = key_digests(pd.DataFrame({"k": primary}), ("k",), SECRET)
    s = key_digests(pd.DataFrame({"k": secondary}), ("k",), SECRET)
    got = match_digests(p.reshape(-1, 32), s.reshape(-1, 32))
    where = {k: i for i, k in enumerate(secondary)}  # oracle: a plaintext dictionary join
    expected = [where.get(k, MISSING) for k in primary]
    np.testing.assert_array_equal(got, np.array(expected, dtype=np.int64))
    alignment = exact_alignment(p.reshape(-1, 32), s.reshape(-1, 32), "s")
    assert alignment.k == 1 and len(alignment) == len(primary)


def test_duplicate_digests_are_refused() -> None:
    d = key_digests(pd.DataFrame({"k": ["a", "b", "a"]}), ("k",), SECRET)
    with pytest.raises(DataError, match="duplicate"):
        match_digests(d, d[:1])
