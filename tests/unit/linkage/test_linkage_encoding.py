"""Encoders: registry, string normalisation, shared standardisation, FEDERAL Bloom filters."""

from __future__ import annotations

import numpy as np
import pytest

from vflink.errors import ConfigError, DataError, UnknownNameError
from vflink.linkage import (
    ENCODERS,
    BloomConfig,
    BloomEncoder,
    NumericRange,
    RawEncoder,
    Standardization,
    StringEncoder,
    bloom_numeric,
    bloom_strings,
    make_encoder,
    normalize_string,
    search_hamming,
)
from vflink.linkage.distances import hamming_distances

SECRET = b"shared-by-the-data-parties-only!"
OTHER = b"a-different-secret-of-32-bytes!!"


@pytest.mark.parametrize(("raw", "expected"), [
    ("Café", "cafe"),
    ("  Hello,   World! ", "hello world"),
    ("Straße", "strasse"),
    ("ＡＢＣ１２３", "abc123"),
    ("rock'n'roll", "rock n roll"),
    ("naïve—résumé", "naive resume"),
    ("ﬁnal\tcut\n", "final cut"),
    ("C++ & Java", "c java"),
    ("", ""),
    ("$", "$"),  # only symbols: keep the case-folded form rather than an empty string
    (" !! ", "!!"),
])
def test_normalize_string(raw: str, expected: str) -> None:
    assert normalize_string(raw) == expected


def test_registry_by_name() -> None:
    assert ENCODERS.names() == ("bloom", "geo-bloom", "raw", "string")
    assert isinstance(make_encoder("string"), StringEncoder)
    assert make_encoder("bloom", secret=SECRET).metric == "hamming"
    with pytest.raises(UnknownNameError, match="bloom, raw, string"):
        make_encoder("bert")


def test_standardization_is_shared() -> None:
    a = np.array([[1.0, 10.0], [3.0, 30.0]])
    b = np.array([[2.0, 20.0]])
    st = Standardization.fit(a, b)
    enc = RawEncoder(standardization=st)
    np.testing.assert_allclose(enc.encode(a).mean(axis=0) * 2 + enc.encode(b)[0], 0, atol=1e-12)
    # the same statistics applied to both sides keep distances proportional
    assert np.allclose(enc.encode(b), (b - np.array(st.mean)) / np.array(st.scale))
    with pytest.raises(DataError, match="2 columns"):
        st.apply(np.zeros((1, 3)))
    with pytest.raises(ConfigError):
        Standardization(mean=(0.0,), scale=(0.0,))


def test_string_encoder_rejects_non_strings() -> None:
    with pytest.raises(DataError, match="row 1"):
        StringEncoder().encode(["a", None])


def test_bloom_deterministic_and_keyed() -> None:
    a = bloom_strings(["Jonathan Smith"], secret=SECRET)
    b = bloom_strings(["jonathan  smith"], secret=SECRET)  # same after normalisation
    c = bloom_strings(["Jonathan Smith"], secret=OTHER)
    assert a.dtype == np.uint8 and a.shape == (1, 128)
    np.testing.assert_array_equal(a, b)
    assert hamming_distances(a, c)[0, 0] > 20


def test_bloom_strings_similar_strings_are_close() -> None:
    f = bloom_strings(["jonathan smith", "jonathon smith", "mary o'connor"], secret=SECRET)
    d = hamming_distances(f, f)
    assert d[0, 1] < d[0, 2] / 2


def test_bloom_numeric_properties() -> None:
    rng = NumericRange(low=(39.0, 116.0), high=(41.0, 117.0))
    cfg = BloomConfig(n_centres=256, threshold=0.05)
    x = np.array([[40.0, 116.5], [40.0, 116.5], [40.001, 116.501], [40.5, 116.9]])
    f = bloom_numeric(x, secret=SECRET, ranges=rng, config=cfg)
    assert f.shape == (4, 2 * 256 // 8) and f.dtype == np.uint8
    d = hamming_distances(f, f)
    assert d[0, 1] == 0  # same secret + value → same filter
    assert d[0, 2] <= 4  # nearby numbers → small Hamming distance
    assert d[0, 3] > 10 * max(d[0, 2], 1)
    g = bloom_numeric(x[:1], secret=OTHER, ranges=rng, config=cfg)
    assert hamming_distances(f[:1], g)[0, 0] > 0  # different secret → different filter


def test_bloom_numeric_hamming_grows_with_distance() -> None:
    rng = NumericRange(low=(0.0,), high=(1.0,))
    cfg = BloomConfig(n_centres=1024, threshold=0.1)
    xs = np.array([0.5, 0.51, 0.55, 0.6, 0.65])
    f = bloom_numeric(xs, secret=SECRET, ranges=rng, config=cfg)
    d = hamming_distances(f[:1], f)[0]
    assert (np.diff(d) > 0).all()
    # expected ≈ 2N·|Δx|/(W + 2t) while |Δx| ≤ 2t (bits near x but not y, and vice versa)
    assert d[3] == pytest.approx(2 * 1024 * 0.1 / 1.2, rel=0.2)


def test_bloom_encoder_and_search_find_the_match() -> None:
    enc = BloomEncoder(secret=SECRET, kind="string")
    sec = ["acme corporation", "globex inc", "initech llc", "umbrella corp"]
    pri = ["Acme Corporation Ltd", "Initech, LLC"]
    res = search_hamming(enc.encode(pri), enc.encode(sec), 1)
    assert res.indices[:, 0].tolist() == [0, 2]
    assert "secret" not in repr(enc) or SECRET.decode() not in repr(enc)


def test_bloom_config_validation() -> None:
    with pytest.raises(ConfigError, match="multiple of 8"):
        BloomConfig(filter_bits=1001)
    with pytest.raises(ConfigError, match="`num_hashes` must be an int ≥ 1, got 0"):
        BloomConfig(num_hashes=0)
    with pytest.raises(ConfigError, match="secret"):
        BloomEncoder(secret=b"short")
    with pytest.raises(ConfigError, match="ranges"):
        BloomEncoder(secret=SECRET, kind="numeric")
    with pytest.raises(DataError, match="empty string"):
        bloom_strings(["ok", "  "], secret=SECRET)


def test_bloom_numeric_resolution_sets_bits_per_unit() -> None:
    """FEDERAL filters sized by a target resolution (App. I: 2N·δ/(W+2t) differing bits):
    a step of δ along either dimension changes about δ / resolution bits, whatever the
    dimension's width, so Hamming distance weighs both dimensions in their own unit."""
    rng = np.random.default_rng(5)
    ranges = NumericRange(low=(0.0, 0.0), high=(10.0, 100.0))
    cfg = BloomConfig(resolution=0.05, threshold=0.05)
    sizes = cfg.centres_per_dimension(ranges)
    # N = ⌈(W + 2t)/(2r)⌉ rounded up to a multiple of 8: 11 / 0.1 = 110 → 112; 1100 → 1104
    assert sizes == (112, 1104)
    base = np.column_stack([rng.uniform(2, 8, 4000), rng.uniform(20, 80, 4000)])
    secret = b"k" * 32
    for dim, step in ((0, 0.4), (1, 0.4)):
        moved = base.copy()
        moved[:, dim] += step
        a = bloom_numeric(base, secret=secret, ranges=ranges, config=cfg)
        b = bloom_numeric(moved, secret=secret, ranges=ranges, config=cfg)
        assert a.shape[1] * 8 == sum(sizes)
        bits = (np.unpackbits(a ^ b, axis=1)).sum(axis=1)
        # expected 2N·δ/(W+2t) = δ/r · N/((W+2t)/(2r)): the rounding of N up to 8 included
        expected = 2 * sizes[dim] * step / ((ranges.high[dim] - ranges.low[dim]) * 1.1)
        assert bits.mean() == pytest.approx(expected, rel=0.15)


def test_bloom_numeric_resolution_too_fine_is_a_clear_error() -> None:
    ranges = NumericRange(low=(0.0,), high=(1e6,))
    with pytest.raises(ConfigError, match=r"resolution.*at least"):
        BloomConfig(resolution=1e-3).centres_per_dimension(ranges)
    with pytest.raises(ConfigError, match="resolution"):
        BloomConfig(resolution=-1.0)
