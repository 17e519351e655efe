"""The faster kernels of a link against their plain references (ARCHITECTURE.md, convention 8):
FEDERAL numeric Bloom filters by prefix blocks against every value × every centre, the
standard-library erf⁻¹ against scipy's, scipy's k-d tree loaded from its own module, the Z
order of the k-d tree's queries, the refined binary IVF and the Δ estimate from row sums."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from vflink.linkage import SearchOptions, brute_euclidean, brute_hamming, recall_at_k
from vflink.linkage.encoding import bloom
from vflink.linkage.encoding.bloom import (
    BloomConfig,
    NumericRange,
    bloom_numeric,
    bloom_numeric_reference,
)
from vflink.linkage.improvement import improvement_estimates, scale_similarities
from vflink.linkage.privacy import erfinv, sigma_for_tau, tau_for_sigma
from vflink.linkage.search import search_euclidean, search_hamming, z_order
from vflink.linkage.soft import SoftLinkage

ROOT = Path(__file__).resolve().parents[3]
SECRET = b"a-secret-of-at-least-16-bytes"


@settings(max_examples=60, deadline=None)
@given(arrays(np.float64, st.tuples(st.integers(1, 200), st.integers(1, 3)),
              elements=st.floats(-2.0, 3.0)),
       st.sampled_from([8, 64, 512]), st.sampled_from([0.01, 0.05, 0.3]))
def test_bloom_numeric_equals_the_reference(values: np.ndarray, n_centres: int,
                                            threshold: float) -> None:
    d = values.shape[1]
    ranges = NumericRange(low=(0.0,) * d, high=(1.0,) * d)
    cfg = BloomConfig(n_centres=n_centres, threshold=threshold)
    np.testing.assert_array_equal(
        bloom_numeric(values, secret=SECRET, ranges=ranges, config=cfg),
        bloom_numeric_reference(values, secret=SECRET, ranges=ranges, config=cfg))


def test_bloom_numeric_on_the_boundaries() -> None:
    """Values at exactly |x − r_i| = t, and one float either side, for every centre."""
    cfg = BloomConfig(n_centres=64, threshold=0.05)
    ranges = NumericRange(low=(-3.0,), high=(7.0,))
    t = cfg.threshold * 10.0
    centres = bloom._centres(SECRET, 0, 64, -3.0 - t, 7.0 + t)
    edges = np.concatenate([centres + t, centres - t])
    values = np.concatenate([edges, np.nextafter(edges, np.inf), np.nextafter(edges, -np.inf),
                             centres, [-100.0, 100.0]])
    np.testing.assert_array_equal(
        bloom_numeric(values, secret=SECRET, ranges=ranges, config=cfg),
        bloom_numeric_reference(values, secret=SECRET, ranges=ranges, config=cfg))
    sized = BloomConfig(resolution=0.1)  # one N per dimension from the resolution
    two = NumericRange(low=(0.0, -1.0), high=(2.0, 5.0))
    x = np.random.default_rng(0).uniform(-0.5, 5.5, (300, 2))
    np.testing.assert_array_equal(
        bloom_numeric(x, secret=SECRET, ranges=two, config=sized),
        bloom_numeric_reference(x, secret=SECRET, ranges=two, config=sized))


@settings(max_examples=300, deadline=None)
@given(st.floats(-1.0, 1.0))
def test_erfinv_equals_scipys(y: float) -> None:
    from scipy.special import erfinv as reference

    want = float(reference(y))
    got = erfinv(y)
    if math.isinf(want):
        assert got == want
    else:
        assert got == pytest.approx(want, rel=4e-15, abs=1e-300)


def test_sigma_for_tau_inverts_tau_for_sigma() -> None:
    for sigma0 in (0.3, 1.0, 11.1, 400.0):
        for tau in (0.999, 0.5, 0.05, 0.01):
            try:
                sigma = sigma_for_tau(tau, sigma0)
            except Exception:  # noqa: BLE001 - τ below the floor of this σ0
                continue
            assert tau_for_sigma(sigma, sigma0) == pytest.approx(tau, rel=1e-12)


def _last_json(code: str) -> object:
    """The JSON of the last line that ``python -c code`` prints, run on this checkout's
    sources in a fresh process (what a module loads there is that process's own)."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"},
                         timeout=120, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_the_kdtree_loaded_alone_is_scipys_and_scipy_spatial_reuses_it() -> None:
    code = (
        "import json, sys\nimport numpy as np\n"
        "from vflink.linkage.search import kdtree_class\n"
        "cls = kdtree_class()\n"
        "alone = 'scipy.spatial' not in sys.modules\n"
        "x = np.random.default_rng(0).random((200, 2))\n"
        "d1, i1 = cls(x).query(x[:20], k=5)\n"
        "import scipy.spatial\n"
        "d2, i2 = scipy.spatial.cKDTree(x).query(x[:20], k=5)\n"
        "print(json.dumps([alone, cls is scipy.spatial.cKDTree, bool((d1 == d2).all()),"
        " bool((i1 == i2).all())]))")
    assert _last_json(code) == [True, True, True, True]


def test_the_kdtree_falls_back_to_the_plain_import() -> None:
    code = (
        "import json, sys\n"
        "from vflink.linkage import search\n"
        "def broken(name):\n    raise ImportError('another layout')\n"
        "search._load_extension = broken\n"
        "cls = search.kdtree_class()\n"
        "import scipy.spatial\n"
        "print(json.dumps([cls is scipy.spatial.cKDTree]))")
    assert _last_json(code) == [True]


def test_the_kdtree_loads_without_the_modules_it_stands_in_for() -> None:
    """The extension's own imports that a tree does not use are stood in for while it
    loads, then gone: imported for real when asked for, their names the stand-ins' values."""
    code = (
        "import importlib, json, sys\nimport numpy as np\n"
        "from vflink.linkage.search import _stand_ins, kdtree_class\n"
        "cls = kdtree_class()\n"
        "names = _stand_ins()\n"
        "absent = [m not in sys.modules for m in names]\n"
        "unbound = [m.rpartition('.')[2] not in vars(sys.modules[m.rpartition('.')[0]])\n"
        "           for m in names]\n"
        "x = np.random.default_rng(0).random((300, 2))\n"
        "d, i = cls(x).query(x[:30], k=7, workers=2)\n"
        "brute = np.sort(np.linalg.norm(x[:30, None] - x[None], axis=2), axis=1)[:, :7]\n"
        "sdm = cls(x[:50]).sparse_distance_matrix(cls(x[50:100]), 0.2, output_type='coo_matrix')\n"
        "import scipy.sparse\n"
        "same = [all(getattr(importlib.import_module(m), k) is v for k, v in kv.items())\n"
        "        for m, kv in names.items()]\n"
        "print(json.dumps([sorted(names), absent, unbound, bool(np.allclose(d, brute)),\n"
        "                  isinstance(sdm, scipy.sparse.coo_matrix), same,\n"
        "                  type(sys.modules['scipy.sparse']).__name__]))")
    assert _last_json(code) == [
        ["scipy._lib._util", "scipy.sparse"], [True, True], [True, True], True, True,
        [True, True], "module"]


def test_a_stand_in_read_by_another_thread_waits_for_the_real_module() -> None:
    import threading

    from vflink.linkage.search import _StandIn

    done = threading.Event()
    fake = _StandIn("json", {"kept": 1}, done)
    assert fake.kept == 1
    with pytest.raises(AttributeError):
        fake.dumps  # noqa: B018 - the loading thread: only the names given
    got: list[object] = []
    reader = threading.Thread(target=lambda: got.append(fake.dumps))
    reader.start()
    reader.join(0.2)
    assert reader.is_alive() and not got  # waits while the load goes on
    done.set()
    reader.join(10)
    import json as real

    assert got == [real.dumps]


def test_a_stand_in_the_extension_cannot_use_falls_back_to_the_plain_import() -> None:
    code = (
        "import json, sys\n"
        "from vflink.linkage import search\n"
        "search._stand_ins = lambda: {'scipy._lib._util': {}}\n"
        "cls = search.kdtree_class()\n"
        "left = type(sys.modules.get('scipy._lib._util')).__name__\n"
        "import scipy.spatial\n"
        "print(json.dumps([cls is scipy.spatial.cKDTree, left,\n"
        "                  'scipy.spatial._ckdtree' in sys.modules]))")
    assert _last_json(code) == [True, "module", True]


def test_z_ordered_queries_give_each_row_its_own_neighbours() -> None:
    rng = np.random.default_rng(1)
    centres = rng.uniform(0, 10, (30, 2))
    p = centres[rng.integers(0, 30, 6000)] + rng.normal(0, 0.1, (6000, 2))
    s = centres[rng.integers(0, 30, 900)] + rng.normal(0, 0.1, (900, 2))
    order = z_order(p)
    assert sorted(order.tolist()) == list(range(len(p)))
    got = search_euclidean(p, s, 7, options=SearchOptions(chunk_size=1000))
    want = brute_euclidean(p, s, 7)
    np.testing.assert_allclose(got.distances, want.distances, rtol=1e-12)
    same = got.distances[:, :-1] < got.distances[:, 1:]  # rows without ties: same indices
    assert (got.indices[same.all(axis=1)] == want.indices[same.all(axis=1)]).all()
    assert z_order(np.zeros((0, 2))).size == 0
    assert sorted(z_order(np.ones((5, 3))).tolist()) == [0, 1, 2, 3, 4]


def test_the_refined_binary_ivf_keeps_its_recall() -> None:
    rng = np.random.default_rng(2)
    centres = rng.uniform(0, 1, (40, 2))
    p = centres[rng.integers(0, 40, 3000)] + rng.normal(0, 0.01, (3000, 2))
    s = centres[rng.integers(0, 40, 2000)] + rng.normal(0, 0.01, (2000, 2))
    ranges = NumericRange.fit(p, s, margin=0.01)
    bp = bloom_numeric(p, secret=SECRET, ranges=ranges)
    bs = bloom_numeric(s, secret=SECRET, ranges=ranges)
    got = search_hamming(bp, bs, 20, options=SearchOptions(mode="approximate"))
    truth = brute_hamming(bp, bs, 20)
    assert not got.exact and got.recall is not None and got.recall >= 0.97
    assert recall_at_k(got.distances, truth.distances) >= 0.97
    for row in range(0, 3000, 97):  # each row sorted by (distance, index)
        pairs = list(zip(got.distances[row], got.indices[row], strict=True))
        assert pairs == sorted(pairs)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 40), st.integers(1, 8), st.integers(0, 2**32 - 1))
def test_delta_from_row_sums_equals_the_scaled_matrix(n: int, k: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    d = np.sort(rng.integers(0, 4, (n, k)).astype(float), axis=1)  # ties and zeros
    sims = -d + rng.normal(0, 0.5, (n, k)) * rng.integers(0, 2)
    sims[rng.random(n) < 0.2] = 1.5  # flat rows
    lk = SoftLinkage(indices=np.tile(np.arange(k), (n, 1)), distances=d, similarities=sims,
                     mu0=0.0, sigma0=1.0, sigma=0.0, tau=1.0, epsilon=math.inf, delta=1e-5,
                     epsilon_valid=True, metric="euclidean", mode="soft", n_secondary=k)
    fast = improvement_estimates(lk)
    slow = improvement_estimates(lk, scaled=scale_similarities(sims))
    assert fast.keys() == slow.keys()
    for name in fast:
        assert fast[name] == pytest.approx(slow[name], rel=1e-12, abs=1e-12)


def _slow_check(a: np.ndarray, max_abs: float, allow_nan: bool) -> str | None:
    """The party guard's check by its definition (the masked path)."""
    nan = np.isnan(a)
    if (nan.any() and not allow_nan) or np.isinf(a).any():
        return "value.finite"
    if (np.abs(a[~nan]) > max_abs).any():
        return "value.range"
    return None


@settings(max_examples=200, deadline=None)
@given(arrays(np.float64, st.integers(0, 40),
              elements=st.floats(allow_nan=True, allow_infinity=True, width=64)),
       st.sampled_from([1.0, 1e6, 1e300]), st.booleans())
def test_the_guards_fast_check_refuses_what_the_definition_refuses(
        values: np.ndarray, max_abs: float, allow_nan: bool) -> None:
    from vflink.errors import ProtocolError
    from vflink.parties.guard import check_values

    want = _slow_check(values, max_abs, allow_nan)
    try:
        check_values(values, party="p", what="x", max_abs=max_abs, allow_nan=allow_nan)
        got = None
    except ProtocolError as exc:
        got = "value.finite" if "non-finite" in str(exc) else "value.range"
    assert got == want


@pytest.mark.parametrize(("tau", "sigma"), [(0.05, None), (None, 0.4), (None, None)])
def test_noise_drawn_ahead_equals_the_plain_draws(monkeypatch: pytest.MonkeyPatch,
                                                  tau: float | None,
                                                  sigma: float | None) -> None:
    """Eq. 2's noise drawn in a thread while Eq. 1 is computed: the very bits of drawing it
    after, from the same generator (a streamed link's chunks draw them so too)."""
    from vflink.linkage import soft
    from vflink.linkage.search import Neighbours

    rng = np.random.default_rng(4)
    d = np.sort(rng.gamma(3.0, 100.0, (soft.PASS_MIN // 50 + 7, 50)), axis=1)
    n = Neighbours(np.zeros(d.shape, dtype=np.int64), d, exact=True)
    ahead = soft.soft_linkage(n, metric="euclidean", n_secondary=50, tau=tau, sigma=sigma,
                              rng=11)
    monkeypatch.setattr(soft, "PASS_MIN", 1 << 60)
    plain = soft.soft_linkage(n, metric="euclidean", n_secondary=50, tau=tau, sigma=sigma,
                              rng=11)
    assert ahead.sigma == plain.sigma and (ahead.sigma > 0) == (tau is not None or
                                                                  bool(sigma))
    np.testing.assert_array_equal(ahead.similarities.view(np.int64),
                                  plain.similarities.view(np.int64))
