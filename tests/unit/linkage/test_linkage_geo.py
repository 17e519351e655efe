"""Keyed geographic Bloom filters (vflink.linkage.encoding.geo) against haversine oracles."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers.links import linked
from vflink.errors import DataError
from vflink.linkage import GeoBloomConfig, bloom_geo, brute_hamming, brute_haversine
from vflink.linkage.distances import hamming_distances
from vflink.runner.encoding import encoding_for

SECRET = b"geo-test-secret-0123456789"


def places(n: int, seed: int) -> np.ndarray:
    """Clustered places over the globe, with polar and antimeridian clusters."""
    centres = np.r_[np.random.default_rng(0).uniform([-60, -180], [70, 180], (40, 2)),
                    [[-89.9, 0.0], [89.5, 40.0], [10.0, 179.9], [-15.0, -179.95]]]
    rng = np.random.default_rng(seed)
    c = centres[rng.integers(0, len(centres), n)]
    pts = c + rng.normal(0.0, 0.3, (n, 2)) * rng.exponential(1.0, (n, 1))
    pts[:, 0] = np.clip(pts[:, 0], -90, 90)
    pts[:, 1] = (pts[:, 1] + 180.0) % 360.0 - 180.0
    return pts


def test_hamming_grows_with_great_circle_distance() -> None:
    rng = np.random.default_rng(0)
    base = np.c_[rng.uniform(-80, 80, 300), rng.uniform(-180, 180, 300)]
    enc0 = bloom_geo(base, secret=SECRET)
    means = []
    for km in (1, 5, 20, 100, 500):
        bearing = rng.uniform(0, 2 * np.pi, len(base))
        dlat = km / 111.2 * np.cos(bearing)
        dlon = km / (111.2 * np.cos(np.radians(base[:, 0]))) * np.sin(bearing)
        moved = np.c_[base[:, 0] + dlat, (base[:, 1] + dlon + 180) % 360 - 180]
        enc = bloom_geo(moved, secret=SECRET)
        means.append(np.mean([hamming_distances(enc0[i:i + 1], enc[i:i + 1])[0, 0]
                              for i in range(len(base))]))
    assert all(a < b for a, b in zip(means, means[1:], strict=False)), means


def test_antimeridian_and_poles_are_neighbours() -> None:
    a = np.array([[10.0, 179.99], [89.99, 0.0], [-89.99, 10.0]])
    near = np.array([[10.0, -179.99], [89.99, 180.0], [-89.99, -170.0]])   # ~2 km, ~1 km, ~2 km
    far = np.array([[10.0, 178.0], [88.0, 0.0], [-88.0, 10.0]])              # ~200 km
    ea, en, ef = (bloom_geo(x, secret=SECRET) for x in (a, near, far))
    for i in range(3):
        assert (hamming_distances(ea[i:i + 1], en[i:i + 1])[0, 0]
                < hamming_distances(ea[i:i + 1], ef[i:i + 1])[0, 0])


def test_top1_mostly_the_exact_nearest_place() -> None:
    p, s = places(400, 1), places(4000, 2)
    truth = brute_haversine(p, s, 1)
    found = brute_hamming(bloom_geo(p, secret=SECRET), bloom_geo(s, secret=SECRET), 1)
    d = brute_haversine(p, s, len(s))  # the distance of the place each filter chose
    chosen = np.array([d.distances[i][d.indices[i] == found.indices[i, 0]][0]
                       for i in range(len(p))])
    hit = np.isclose(chosen, truth.distances[:, 0]) | (chosen <= truth.distances[:, 0])
    assert hit.mean() >= 0.75
    # when it misses, the chosen place is still close to the nearest one
    assert np.median(chosen / np.maximum(truth.distances[:, 0], 1e-9)) <= 1.05


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.floats(-90, 90), st.floats(-180, 180)), min_size=1, max_size=20))
def test_shape_and_determinism(rows: list[tuple[float, float]]) -> None:
    x = np.asarray(rows, dtype=np.float64)
    cfg = GeoBloomConfig(directions=4, shifts=2, filter_bits=512)
    a = bloom_geo(x, secret=SECRET, config=cfg)
    assert a.shape == (len(x), 64) and a.dtype == np.uint8
    np.testing.assert_array_equal(a, bloom_geo(x, secret=SECRET, config=cfg))
    other = bloom_geo(x, secret=b"another-secret-0123456789", config=cfg)
    assert not np.array_equal(a, other) or len(x) == 0


def test_bad_rows_are_reported() -> None:
    with pytest.raises(DataError, match="row 1"):
        bloom_geo(np.array([[0.0, 0.0], [91.0, 0.0]]), secret=SECRET)
    with pytest.raises(DataError, match="row 0"):
        bloom_geo(np.array([[np.nan, 0.0]]), secret=SECRET)


def test_private_link_uses_no_bounding_box() -> None:
    p, s = places(200, 3), places(2000, 4)
    outcome = linked(pd.DataFrame({"lat": p[:, 0], "lon": p[:, 1]}),
                     pd.DataFrame({"lat": s[:, 0], "lon": s[:, 1]}),
                     on=("lat", "lon"), metric="haversine", top_k=5, privacy="bloom",
                     secret=SECRET, seed=0)
    assert outcome.privacy == "bloom" and outcome.search_metric == "hamming"
    truth = brute_haversine(p, s, 5)
    top1 = outcome.linkage.indices[:, 0]
    assert outcome.linkage.n_secondary == len(s)
    frames = (pd.DataFrame({"lat": p[:, 0], "lon": p[:, 1]}), ("lat", "lon"))
    spec, _ = encoding_for("haversine", bloom=True, sides=(frames, frames))
    assert spec.kind == "geo" and spec.low == () and spec.high == ()  # no bounding box
    assert np.mean([top1[i] in truth.indices[i, :3] for i in range(len(p))]) >= 0.85


def test_approximate_search_on_long_filters_measures_its_recall() -> None:
    from vflink.linkage import SearchOptions, recall_at_k, search_hamming

    p, s = places(300, 5), places(3000, 6)
    bp, bs = bloom_geo(p, secret=SECRET), bloom_geo(s, secret=SECRET)
    approx = search_hamming(bp, bs, 5, options=SearchOptions(mode="approximate", nprobe=16,
                                                             recall_sample=300))
    truth = brute_hamming(bp, bs, 5)
    measured = recall_at_k(approx.distances, truth.distances)
    assert approx.recall == pytest.approx(measured) and measured >= 0.95


def test_paired_haversine_is_the_diagonal_of_the_all_pairs_one() -> None:
    from vflink.linkage.distances import haversine_distances, haversine_paired

    rng = np.random.default_rng(3)
    a = np.column_stack([rng.uniform(-90, 90, 50), rng.uniform(-180, 180, 50)])
    b = np.column_stack([rng.uniform(-90, 90, 50), rng.uniform(-180, 180, 50)])
    np.testing.assert_allclose(haversine_paired(a, b), np.diag(haversine_distances(a, b)),
                               rtol=1e-12, atol=1e-9)
