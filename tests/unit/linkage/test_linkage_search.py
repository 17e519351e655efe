"""Top-K search: every accelerated search equals its brute-force reference (distances)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from vflink.errors import LinkageError
from vflink.linkage import (
    METRICS,
    SearchOptions,
    brute_euclidean,
    brute_hamming,
    brute_levenshtein,
    recall_at_k,
    search_euclidean,
    search_hamming,
    search_haversine,
    search_levenshtein,
)
from vflink.linkage.distances import (
    hamming_distances,
    haversine_distances,
    levenshtein_distances,
)

SETTINGS = settings(max_examples=25, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _dp_levenshtein(a: str, b: str) -> int:
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def _assert_same(fast, slow, atol: float = 1e-9) -> None:  # type: ignore[no-untyped-def]
    assert fast.indices.shape == slow.indices.shape
    np.testing.assert_allclose(fast.distances, slow.distances, rtol=1e-7, atol=atol)
    # rows sorted by distance
    assert (np.diff(fast.distances, axis=1) >= 0).all()


@pytest.fixture(scope="module")
def latlon() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    p = rng.uniform([39.7, 116.1], [40.1, 116.7], (700, 2))
    s = rng.uniform([39.7, 116.1], [40.1, 116.7], (300, 2))
    return p, s


@pytest.mark.parametrize("index", ["flat", "kdtree", "auto"])
@pytest.mark.parametrize("name", ["euclidean", "haversine"])
def test_dense_exact_equals_brute(name: str, index: str,
                                  latlon: tuple[np.ndarray, np.ndarray]) -> None:
    p, s = latlon
    m = METRICS.get(name)
    fast = m.search(p, s, 15, options=SearchOptions(chunk_size=128,
                                                     dense_index=index))  # type: ignore[arg-type]
    slow = m.brute(p, s, 15)
    _assert_same(fast, slow, atol=1e-9)
    assert fast.exact and fast.recall is None
    # continuous random data has no ties: indices agree too
    assert (fast.indices == slow.indices).all()


def test_haversine_known_city_distance() -> None:
    paris, london = (48.8566, 2.3522), (51.5074, -0.1278)
    d = haversine_distances([paris], [london])[0, 0]
    assert d == pytest.approx(343.5, abs=1.0)  # widely quoted great-circle distance ≈ 343.5 km
    res = search_haversine(np.array([paris]), np.array([london, (40.7128, -74.0060)]), 2)
    assert res.distances[0, 0] == pytest.approx(d, rel=1e-9)
    assert res.distances[0, 1] == pytest.approx(5837, abs=5)  # Paris–New York


def test_haversine_search_across_antimeridian() -> None:
    p = np.array([[0.0, 179.99]])
    s = np.array([[0.0, -179.99], [0.0, 179.0]])
    res = search_haversine(p, s, 1)
    assert res.indices[0, 0] == 0
    assert res.distances[0, 0] == pytest.approx(2.224, abs=0.01)


def test_hamming_exact_equals_brute() -> None:
    rng = np.random.default_rng(1)
    p = rng.integers(0, 256, (400, 16), dtype=np.uint8)
    s = rng.integers(0, 256, (250, 16), dtype=np.uint8)
    for k in (20, 40):  # faiss heap selection below K = 32, counting selection above
        _assert_same(search_hamming(p, s, k, options=SearchOptions(chunk_size=64)),
                     brute_hamming(p, s, k))


def test_levenshtein_exact_equals_brute_and_dp() -> None:
    p = ["kitten", "sitting", "saturday", "sunday", "flaw", "lawn", "a"]
    s = ["sitting", "kitten", "sunday", "lawn", "flaws", "b", "saturdays", "xyz"]
    fast = search_levenshtein(p, s, 3, options=SearchOptions(threads=1, chunk_size=2))
    _assert_same(fast, brute_levenshtein(p, s, 3))
    dp = np.array([[_dp_levenshtein(a, b) for b in s] for a in p], dtype=float)
    np.testing.assert_array_equal(levenshtein_distances(p, s), dp)
    assert fast.distances[0, 0] == 0 and fast.distances[0, 1] == 3  # kitten, then sitting


@SETTINGS
@given(data=st.data())
def test_property_euclidean(data: st.DataObject) -> None:
    d = data.draw(st.integers(1, 6))
    index = data.draw(st.sampled_from(["flat", "kdtree", "auto"]))
    n_s = data.draw(st.integers(1, 40))
    n_p = data.draw(st.integers(0, 40))
    k = data.draw(st.integers(1, n_s))
    elems = st.floats(-100, 100, allow_nan=False, width=32)
    s = data.draw(hnp.arrays(np.float64, (n_s, d), elements=elems))
    p = data.draw(hnp.arrays(np.float64, (n_p, d), elements=elems))
    fast = search_euclidean(p, s, k, options=SearchOptions(chunk_size=7, dense_index=index))  # type: ignore[arg-type]
    _assert_same(fast, brute_euclidean(p, s, k), atol=1e-3)


@SETTINGS
@given(data=st.data())
def test_property_haversine(data: st.DataObject) -> None:
    n_s = data.draw(st.integers(1, 30))
    n_p = data.draw(st.integers(1, 30))
    k = data.draw(st.integers(1, n_s))
    lat = st.floats(-90, 90, allow_nan=False)
    lon = st.floats(-180, 180, allow_nan=False)
    pts = st.tuples(lat, lon)
    s = np.array(data.draw(st.lists(pts, min_size=n_s, max_size=n_s)))
    p = np.array(data.draw(st.lists(pts, min_size=n_p, max_size=n_p)))
    index = data.draw(st.sampled_from(["flat", "kdtree"]))
    fast = search_haversine(p, s, k, options=SearchOptions(dense_index=index))  # type: ignore[arg-type]
    _assert_same(fast, METRICS.get("haversine").brute(p, s, k), atol=0.05)  # km; float32 pick


@SETTINGS
@given(data=st.data())
def test_property_hamming(data: st.DataObject) -> None:
    nbytes = data.draw(st.integers(1, 12))
    n_s = data.draw(st.integers(1, 30))
    n_p = data.draw(st.integers(0, 30))
    k = data.draw(st.integers(1, n_s))
    s = data.draw(hnp.arrays(np.uint8, (n_s, nbytes)))
    p = data.draw(hnp.arrays(np.uint8, (n_p, nbytes)))
    _assert_same(search_hamming(p, s, k, options=SearchOptions(chunk_size=5)),
                 brute_hamming(p, s, k))


@SETTINGS
@given(data=st.data())
def test_property_levenshtein(data: st.DataObject) -> None:
    text = st.text(alphabet="abcde é", min_size=1, max_size=12)
    s = data.draw(st.lists(text, min_size=1, max_size=25))
    p = data.draw(st.lists(text, min_size=1, max_size=15))
    k = data.draw(st.integers(1, len(s)))
    fast = search_levenshtein(p, s, k, options=SearchOptions(threads=1, chunk_size=4))
    _assert_same(fast, brute_levenshtein(p, s, k))
    # the approximate mode (bound-ordered verification, tests/unit/linkage/
    # test_linkage_string_bounds.py) returns the exact distances and says it measured so
    bounded = search_levenshtein(p, s, k, options=SearchOptions(mode="approximate"))
    assert not bounded.exact
    np.testing.assert_array_equal(bounded.distances, fast.distances)
    assert bounded.recall == recall_at_k(bounded.distances, fast.distances) == 1.0


@pytest.mark.parametrize("name", ["euclidean", "haversine"])
def test_dense_approximate_reports_recall(name: str, latlon: tuple[np.ndarray, np.ndarray]) -> None:
    p, s = latlon
    res = METRICS.get(name).search(p, s, 5, options=SearchOptions(mode="approximate", nlist=8,
                                                                   nprobe=1, recall_sample=200))
    assert not res.exact and res.recall_rows == 200
    assert res.recall is not None and 0.3 < res.recall <= 1.0
    truth = METRICS.get(name).brute(p, s, 5)
    rows = np.sort(np.random.default_rng(0).choice(len(p), 200, replace=False))
    assert res.recall == pytest.approx(recall_at_k(res.distances[rows], truth.distances[rows]))
    # never fewer than k neighbours, even when probed IVF cells are nearly empty
    assert (res.indices >= 0).all()


def test_hamming_approximate_reports_recall() -> None:
    rng = np.random.default_rng(3)
    s = rng.integers(0, 256, (2000, 8), dtype=np.uint8)
    p = s[:300] ^ (rng.random((300, 8)) < 0.02).astype(np.uint8)
    res = search_hamming(p, s, 3, options=SearchOptions(mode="approximate", nlist=16, nprobe=4))
    assert res.recall is not None and 0.0 < res.recall <= 1.0


def _geo_like_filters(n: int, seed: int) -> np.ndarray:
    """Keyed geographic Bloom filters of clustered places: the structure the binary IVF meets
    in a real link (nearby records share most bits)."""
    from vflink.linkage.encoding.geo import GeoBloomConfig, bloom_geo

    rng = np.random.default_rng(seed)
    centres = rng.uniform([-50, -170], [60, 170], (40, 2))
    pts = centres[rng.integers(0, 40, n)] + rng.normal(0, 1.0, (n, 2))
    return bloom_geo(pts, secret=b"s" * 32,
                     config=GeoBloomConfig(directions=6, shifts=2, filter_bits=512))


def test_hamming_auto_is_exact_below_the_work_threshold() -> None:
    p, s = _geo_like_filters(200, 1), _geo_like_filters(1500, 2)
    res = search_hamming(p, s, 5)  # default mode "auto"
    ref = brute_hamming(p, s, 5)
    assert res.exact and res.recall is None
    np.testing.assert_array_equal(res.distances, ref.distances)


def test_hamming_auto_goes_approximate_above_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import vflink.linkage.search as search

    p, s = _geo_like_filters(400, 3), _geo_like_filters(4000, 4)
    monkeypatch.setattr(search, "AUTO_APPROXIMATE_WORK", p.shape[0] * s.shape[0] * 8)
    res = search_hamming(p, s, 10, options=SearchOptions(recall_sample=400))
    truth = brute_hamming(p, s, 10)
    assert not res.exact and res.recall_rows == 400
    # the reported recall is the recall against brute force, and it is high
    assert res.recall == pytest.approx(recall_at_k(res.distances, truth.distances))
    assert res.recall >= 0.9
    # distances returned are the true Hamming distances of the returned rows
    rows = np.arange(len(p))[:, None]
    np.testing.assert_array_equal(
        res.distances, hamming_distances(p, s)[rows, res.indices].astype(np.float64))


def test_recall_is_tie_aware() -> None:
    truth = np.array([[1.0, 2.0, 2.0]])
    assert recall_at_k(np.array([[1.0, 2.0, 2.0]]), truth) == 1.0
    assert recall_at_k(np.array([[1.0, 2.0, 3.0]]), truth) == pytest.approx(2 / 3)


def test_k_larger_than_secondary_raises() -> None:
    with pytest.raises(LinkageError, match="larger than the secondary table"):
        search_euclidean(np.zeros((2, 2)), np.zeros((3, 2)), 4)


def test_threads_setting_is_restored() -> None:
    import faiss

    before = faiss.omp_get_max_threads()
    search_euclidean(np.zeros((3, 2)), np.ones((3, 2)), 1, options=SearchOptions(threads=1))
    assert faiss.omp_get_max_threads() == before


def test_a_float32_pick_that_cannot_tell_points_apart_is_settled_in_float64() -> None:
    """Near the antipode a chord's float32 square cannot tell points kilometres apart (4 − x²
    loses x), and far from the origin neither can a float32 Euclidean score: the flat index
    must still return what brute force returns."""
    rng = np.random.default_rng(5)
    # 60 places within ~2 km of the query's antipode; the nearest to the query is the
    # farthest from the antipode
    s = np.column_stack([rng.uniform(-0.02, 0.02, 60), rng.uniform(-0.02, 0.02, 60)])
    p = np.array([[0.0, 180.0], [0.05, -179.9]])
    for k in (1, 5):
        fast = search_haversine(p, s, k, options=SearchOptions(dense_index="flat"))
        _assert_same(fast, METRICS.get("haversine").brute(p, s, k), atol=1e-6)
        np.testing.assert_array_equal(fast.indices,
                                      METRICS.get("haversine").brute(p, s, k).indices)
    # 6-D points around 1e4 that differ in the 4th decimal: float32 keeps about 1e-3 there
    base = 1e4 + rng.integers(0, 50, (400, 6)) * 1e-4
    query = 1e4 + rng.integers(0, 50, (30, 6)) * 1e-4
    fast = search_euclidean(query, base, 7, options=SearchOptions(dense_index="flat"))
    slow = brute_euclidean(query, base, 7)
    np.testing.assert_allclose(fast.distances, slow.distances, rtol=1e-12, atol=0)
