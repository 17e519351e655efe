"""Soft linkage: Eq. 1 normalisation, Eq. 2 noise, Exact/Top1Sim modes, the Alignment hand-off."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from vflink.errors import ConfigError, LinkageError
from vflink.linkage import (
    SearchOptions,
    link,
    normalize_similarities,
    perturb_similarities,
    sigma_for_tau,
    tau_for_sigma,
    tau_min,
)
from vflink.types import MISSING, Alignment


@pytest.fixture(scope="module")
def points() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return 100 * rng.normal(size=(300, 2)), 100 * rng.normal(size=(120, 2))


def test_eq1_mean_zero_std_one(points: tuple[np.ndarray, np.ndarray]) -> None:
    res = link(*points, metric="euclidean", top_k=7, rng=0)
    rho = res.raw_similarities()
    assert rho.mean() == pytest.approx(0.0, abs=1e-12)
    assert rho.std() == pytest.approx(1.0, abs=1e-12)
    assert res.mu0 == pytest.approx((-res.distances).mean())
    assert res.sigma0 == pytest.approx((-res.distances).std())
    np.testing.assert_array_equal(res.similarities, rho)  # no noise requested
    assert res.sigma == 0.0 and res.tau == 1.0 and res.epsilon == np.inf
    # nearest first ⇔ most similar first
    assert (np.diff(rho, axis=1) <= 1e-12).all()


def test_normalize_ignores_missing() -> None:
    rho, mu0, sigma0 = normalize_similarities(np.array([[1.0, np.nan], [3.0, 5.0]]))
    assert mu0 == pytest.approx(-3.0) and sigma0 == pytest.approx(np.std([1, 3, 5]))
    assert np.isnan(rho[0, 1])


def test_eq2_noise_is_gaussian_and_seeded() -> None:
    rho = np.zeros((400, 50))
    a = perturb_similarities(rho, 0.5, np.random.default_rng(7))
    b = perturb_similarities(rho, 0.5, np.random.default_rng(7))
    np.testing.assert_array_equal(a, b)
    assert a.std() == pytest.approx(0.5, rel=0.02)
    assert a.mean() == pytest.approx(0.0, abs=0.01)


def test_tau_sets_sigma(points: tuple[np.ndarray, np.ndarray]) -> None:
    res = link(*points, metric="euclidean", top_k=5, tau=0.5, rng=np.random.default_rng(1))
    assert res.tau == pytest.approx(0.5)
    assert res.sigma > 0 and tau_for_sigma(res.sigma, res.sigma0) == pytest.approx(0.5)
    assert np.std(res.similarities - res.raw_similarities()) == pytest.approx(res.sigma, rel=0.1)
    assert res.epsilon > 0 and res.delta == 1e-5


def test_unreachable_tau_raises_with_minimum(points: tuple[np.ndarray, np.ndarray]) -> None:
    base = link(*points, metric="euclidean", top_k=5)
    floor = tau_min(base.sigma0)
    with pytest.raises(LinkageError, match=f"{floor:.6g}"):
        link(*points, metric="euclidean", top_k=5, tau=floor / 2)


def test_sigma_given_directly(points: tuple[np.ndarray, np.ndarray]) -> None:
    res = link(*points, metric="euclidean", top_k=3, sigma=0.25, rng=3)
    assert res.sigma == 0.25
    assert res.tau == pytest.approx(tau_for_sigma(0.25, res.sigma0))



def test_tau_with_a_fallback_sigma(points: tuple[np.ndarray, np.ndarray]) -> None:
    """Given both (the runners' private default), σ follows from τ where τ is reachable and
    is the given σ where it is not."""
    base = link(*points, metric="euclidean", top_k=3)
    floor = tau_min(base.sigma0)
    reachable = min(0.999, floor * 3)
    res = link(*points, metric="euclidean", top_k=3, sigma=0.25, tau=reachable, rng=3)
    assert res.sigma == pytest.approx(sigma_for_tau(reachable, base.sigma0))
    assert res.tau == pytest.approx(reachable)
    low = link(*points, metric="euclidean", top_k=3, sigma=0.25, tau=floor / 2, rng=3)
    assert low.sigma == 0.25
    assert low.tau == pytest.approx(tau_for_sigma(0.25, base.sigma0))


def test_top1_and_exact_modes() -> None:
    p = ["apple", "banana", "cherry", "kiwi"]
    s = ["banana", "apple", "grape"]
    top1 = link(p, s, metric="levenshtein", top_k=1, mode="top1")
    assert top1.k == 1 and (top1.indices >= 0).all()
    exact = link(p, s, metric="levenshtein", top_k=1, mode="exact")
    assert exact.indices[:, 0].tolist() == [1, 0, MISSING, MISSING]
    assert np.isnan(exact.similarities[2:, 0]).all()
    with pytest.raises(ConfigError, match="`top_k` must be 1"):
        link(p, s, metric="levenshtein", top_k=2, mode="top1")


def test_to_alignment(points: tuple[np.ndarray, np.ndarray]) -> None:
    res = link(*points, metric="euclidean", top_k=4, sigma=0.1, rng=0,
               search=SearchOptions(mode="approximate", nlist=4, nprobe=4))
    al = res.to_alignment("bank")
    assert isinstance(al, Alignment)
    assert al.secondary == "bank" and al.k == 4 and len(al) == 300
    assert al.similarity is not None and al.similarity.dtype == np.float32
    np.testing.assert_array_equal(al.secondary_index, res.indices)
    assert al.meta["sigma"] == 0.1 and "recall" in al.meta
    assert al.without_similarity().similarity is None
    assert res.to_alignment(include_similarity=False).similarity is None


def test_a_generator_given_as_a_function_is_asked_for_only_when_noise_is_drawn(
        points: tuple[np.ndarray, np.ndarray]) -> None:
    from vflink.linkage import search_euclidean, soft_linkage

    neighbours = search_euclidean(*points, 7)
    asked: list[int] = []

    def rng() -> np.random.Generator:
        asked.append(1)
        return np.random.default_rng(5)

    plain = soft_linkage(neighbours, metric="euclidean", n_secondary=120, rng=rng)
    assert asked == [] and plain.sigma == 0.0  # no noise: no generator made
    noisy = soft_linkage(neighbours, metric="euclidean", n_secondary=120, sigma=0.5, rng=rng)
    seeded = soft_linkage(neighbours, metric="euclidean", n_secondary=120, sigma=0.5,
                          rng=np.random.default_rng(5))
    assert asked == [1]
    np.testing.assert_array_equal(noisy.similarities, seeded.similarities)


def test_the_coordinators_unseeded_noise_is_one_secret_stream() -> None:
    from vflink.parties.coordinator import CoordinatorParty
    from vflink.randomness import SecretGenerator

    coordinator = CoordinatorParty()
    first = coordinator._noise_rng("a")
    assert isinstance(first, SecretGenerator)
    assert coordinator._noise_rng("b") is first  # made once, on the first noise drawn
    seeded = CoordinatorParty(seed=3)._noise_rng("a")
    assert not isinstance(seeded, SecretGenerator)


@pytest.mark.parametrize("case", ["links", "missing", "all-equal"])
def test_similarities_without_noise_are_made_from_the_distances_when_used(case: str) -> None:
    """Without noise the similarities are Eq. 1's ρ of the distances, made where they are
    used: a stretch of rows (similarity_rows), the primary's float32 copy (in blocks) or the
    whole attribute (made once, kept), each the very bits of normalize_similarities'."""
    from vflink.linkage.search import Neighbours
    from vflink.linkage.soft import _EQ1, soft_linkage

    rng = np.random.default_rng(3)
    d = np.sort(rng.random((400, 9)), axis=1)
    idx = rng.integers(0, 50, d.shape)
    if case == "missing":
        d[rng.random(d.shape) < 0.2] = np.nan
    if case == "all-equal":
        d[:] = 0.25
    lk = soft_linkage(Neighbours(idx, d, exact=True), metric="euclidean", n_secondary=50)
    rho, mu0, sigma0 = normalize_similarities(d)
    assert (lk.mu0, lk.sigma0) == (mu0, sigma0)
    assert lk.__dict__["similarities"] is _EQ1  # nothing made yet
    for lo, hi in ((0, 400), (17, 18), (100, 333), (400, 400)):
        np.testing.assert_array_equal(lk.similarity_rows(lo, hi), rho[lo:hi])
    np.testing.assert_array_equal(lk.to_alignment().similarity, rho.astype(np.float32))
    assert lk.__dict__["similarities"] is _EQ1  # still nothing kept
    np.testing.assert_array_equal(lk.similarities, rho)
    assert lk.similarities is lk.similarities  # made once, then kept
    np.testing.assert_array_equal(lk.similarity_rows(5, 9), rho[5:9])
    with pytest.raises(AttributeError):  # still a frozen dataclass
        lk.similarities = rho  # type: ignore[misc]


def test_a_linkage_whose_similarities_are_not_made_yet_survives_pickling() -> None:
    import copy
    import dataclasses
    import pickle

    from vflink.linkage.search import Neighbours
    from vflink.linkage.soft import soft_linkage

    rng = np.random.default_rng(5)
    d = np.sort(rng.random((30, 4)), axis=1)
    lk = soft_linkage(Neighbours(rng.integers(0, 9, d.shape), d, exact=True),
                      metric="euclidean", n_secondary=9)
    rho, _, _ = normalize_similarities(d)
    for other in (pickle.loads(pickle.dumps(lk)), copy.deepcopy(lk), copy.copy(lk),
                  dataclasses.replace(lk, recall=1.0)):
        np.testing.assert_array_equal(other.similarity_rows(3, 11), rho[3:11])
        np.testing.assert_array_equal(other.similarities, rho)


def test_a_link_without_noise_never_makes_its_similarities_whole(tmp_path: Path) -> None:
    """`vflink link --privacy off`'s path: the file's similarity column, Δ and the primary's
    float32 copy each made from the distances a stretch of rows at a time; the file holds
    Eq. 1's ρ to the bit."""
    import pandas as pd
    import pyarrow.parquet as pq

    import vflink
    from vflink.linkage.improvement import improvement_estimates
    from vflink.linkage.soft import _EQ1

    rng = np.random.default_rng(4)
    p, s = tmp_path / "p.parquet", tmp_path / "s.parquet"
    pd.DataFrame({"x": rng.random(300), "y": rng.random(300)}).to_parquet(p)
    pd.DataFrame({"x": rng.random(90), "y": rng.random(90)}).to_parquet(s)
    links = vflink.link(p, s, on="x,y", metric="euclidean", top_k=6, privacy="off",
                        out=tmp_path / "links.parquet")
    lk = links.outcome.linkage
    assert lk.sigma == 0.0 and lk.__dict__["similarities"] is _EQ1
    rho, _, _ = normalize_similarities(lk.distances)
    written = pq.read_table(tmp_path / "links.parquet").column("similarity").to_numpy()
    np.testing.assert_array_equal(written, rho.reshape(-1))
    np.testing.assert_array_equal(links.outcome.alignment.similarity, rho.astype(np.float32))
    assert links.summary["improvement_delta"] == improvement_estimates(lk)
