"""Soft linkage (FedSim §4.1): top-K neighbours → normalised (Eq. 1) and noised (Eq. 2)
similarities, with the privacy figures of §5 attached.

* Eq. 1: ρ_ij = (−dist(k_i^P, k_j^S) − μ0) / σ0, with μ0, σ0 the mean and (population) standard
  deviation of *all computed* negative distances — the n × K distances of the linkage; so ρ has
  mean 0 and standard deviation 1 before noise.
* Eq. 2: s_ij = ρ_ij + N(0, σ²), drawn from an explicit ``numpy.random.Generator``.
* σ is given directly or derived from a target greedy-attack success rate τ (Theorem 2,
  :func:`~vflink.linkage.privacy.sigma_for_tau`); the (ε, δ) reported is Theorem 1's bound for
  that σ (:func:`~vflink.linkage.privacy.dp_epsilon`).

Exact (K = 1, exact matches only, the rest MISSING) and Top1Sim (K = 1) are the same engine with
K = 1; missing entries have index −1 and NaN distance and similarity, and are left out of μ0/σ0.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from vflink._threads import PASS_MIN, in_pieces, pass_threads
from vflink.errors import ConfigError
from vflink.linkage.moments import exact_moments
from vflink.linkage.privacy import (
    dp_epsilon,
    sigma_for_tau,
    tau_for_sigma,
    tau_in_words,
    tau_min,
    theorem1_delta_limit,
)
from vflink.linkage.search import Neighbours
from vflink.randomness import SecretGenerator, secret_generator
from vflink.types import MISSING, Alignment

__all__ = ["LinkMode", "SoftLinkage", "eq1_into", "eq1_scale", "noise_scale",
           "normalize_similarities", "perturb_similarities", "soft_linkage"]

log = logging.getLogger(__name__)

LinkMode = Literal["soft", "top1", "exact"]
FloatArray = npt.NDArray[np.float64]


def normalize_similarities(distances: npt.ArrayLike, *,
                           scale: tuple[float, float] | None = None
                           ) -> tuple[FloatArray, float, float]:
    """FedSim Eq. 1 over all finite entries: returns (ρ, μ0, σ0).

    NaN entries (missing links) stay NaN and do not enter μ0/σ0. When σ0 = 0 (all distances
    equal, e.g. exact matches) ρ is 0 everywhere: the similarities carry no information.
    ``scale`` = (μ0, σ0) fixes the parameters instead of computing them, so that new records
    linked at inference time get similarities on the training linkage's scale.
    """
    d = np.asarray(distances, dtype=np.float64)
    mu0, sigma0 = eq1_scale(d, scale=scale)
    return _eq1_whole(d, mu0, sigma0), mu0, sigma0


def eq1_scale(distances: npt.ArrayLike, *, scale: tuple[float, float] | None = None
              ) -> tuple[float, float]:
    """Eq. 1's (μ0, σ0) over the finite entries of ``distances`` (``scale``: given instead;
    (0, 0) where no entry is finite), as :func:`normalize_similarities` uses them."""
    if scale is not None:
        return float(scale[0]), float(scale[1])
    d = np.asarray(distances, dtype=np.float64)
    if d.size:
        # No mask and no masked copy of the n × K distances when every link is present (the
        # usual case): the exact sum refuses a NaN or an infinity, and only then are the
        # finite entries picked. The std of −d is the std of d; both moments come from exact
        # sums, so a linkage streamed chunk by chunk gets the very same μ0 and σ0 (.moments).
        try:
            mean, sigma0 = exact_moments(d)
            return -mean, sigma0
        except ValueError:
            pass
    valid = np.isfinite(d)
    if not valid.any():
        return 0.0, 0.0
    mean, sigma0 = exact_moments(d[valid])
    return -mean, sigma0


def eq1_into(d: FloatArray, mu0: float, sigma0: float, out: FloatArray) -> None:
    """Eq. 1's ρ of the distances ``d`` into ``out``, elementwise (any stretch of rows gets the
    very bits of the whole): (−d − μ0) / σ0; where σ0 = 0, 0 for a finite distance and NaN
    for a missing one."""
    if sigma0 > 0.0:
        _rho(d, mu0, sigma0, out)
    else:
        np.copyto(out, np.where(np.isfinite(d), 0.0, np.nan))


def _eq1_whole(distances: npt.ArrayLike, mu0: float, sigma0: float) -> FloatArray:
    """Eq. 1's ρ of all the distances, a fresh float64 array (a large one in pieces, one
    thread per core: :func:`_in_parts`)."""
    d = np.ascontiguousarray(distances, dtype=np.float64)
    rho = np.empty_like(d)
    _in_parts(lambda a, out: eq1_into(a, mu0, sigma0, out), d, rho)
    return rho


def _rho(d: FloatArray, mu0: float, sigma0: float, out: FloatArray) -> None:
    """Eq. 1 into ``out``: (−d − μ0) / σ0, in this order of operations (a streamed link's
    chunks compute the very same bits). The numerator is computed as (−μ0) − d, one pass
    instead of a negation and a subtraction: the same sum of −d and −μ0, so the same bits
    (a zero included: x − x is +0 either way)."""
    np.subtract(-mu0, d, out=out)
    out /= sigma0


def _in_parts(fn: Any, x: FloatArray, out: npt.NDArray[np.floating[Any]]) -> None:
    """``fn(x, out)`` elementwise, a large array in contiguous pieces on one thread per core
    (numpy releases the GIL in its loops; each element is computed as it would be whole)."""
    threads = pass_threads(x.size)
    if threads == 1 or not (x.flags.c_contiguous and out.flags.c_contiguous):
        fn(x, out)
        return
    flat, dest = x.reshape(-1), out.reshape(-1)
    in_pieces(lambda r: fn(flat[r], dest[r]), flat.size, threads)


class _DrawAhead:
    """Standard normal draws of ``shape`` from ``rng``, made by a thread of its own (numpy
    releases the GIL while it fills an array); :meth:`result` waits for them."""

    def __init__(self, rng: np.random.Generator, shape: tuple[int, ...]) -> None:
        import threading

        self._out: FloatArray | None = None
        self._error: BaseException | None = None

        def draw() -> None:
            try:
                # a secret stream's draws may come from several secret streams at once (no
                # one can regenerate any of them); a seeded one's are its own, in order
                self._out = (rng.standard_normal_fill(shape) if isinstance(rng, SecretGenerator)
                             else rng.standard_normal(shape))
            except BaseException as exc:  # noqa: BLE001 - handed over by result()
                self._error = exc

        self._thread = threading.Thread(target=draw, name="vflink-noise", daemon=True)
        self._thread.start()

    def result(self) -> FloatArray:
        self._thread.join()
        if self._error is not None:
            raise self._error
        if self._out is None:  # pragma: no cover - the thread sets one of the two
            raise RuntimeError("no draws")
        return self._out


def _scaled_noise(z: FloatArray, sigma: float, rho: FloatArray) -> FloatArray:
    """``perturb_similarities``'s values from its standard normal draws ``z``:
    (0 + σ·z) + ρ, in that order, in place in ``z`` (a large one in pieces, one thread per
    core: :func:`_in_parts`)."""
    def scale(r: FloatArray, out: FloatArray) -> None:
        out *= sigma
        out += 0.0  # Generator.normal(0, σ) is 0 + σ·z: the same bits (−0.0 becomes +0.0 too)
        out += r

    _in_parts(scale, rho, z)
    return z


def noise_scale(tau: float | None, sigma: float | None, sigma0: float, *,
                resolution: float = 1.0) -> float:
    """σ of Eq. 2 from the target ``tau`` (Theorem 2) or the given ``sigma`` (see
    :func:`soft_linkage`), for a linkage whose Eq. 1 deviation is ``sigma0``."""
    # Theorem 2 on the distance's own step (1 bit for Hamming; a multi-field distance in
    # [0, 1] moves by far less per bit, and its σ0 is measured on that scale too).
    if tau is not None and sigma is not None and tau < 1.0 and tau <= tau_min(
            sigma0, resolution=resolution):
        # Both given: τ is the target and σ the noise where τ is out of reach (the private
        # default of the runners, DEFAULT_TAU / DEFAULT_FALLBACK_SIGMA).
        given = tau_for_sigma(float(sigma), sigma0, resolution=resolution)
        log.warning("soft linkage: the target τ = %.3g is below this linkage's floor τ_min = "
                    "%.3g (σ0 = %.3g); adding the fallback noise σ = %.3g instead, which gives "
                    "τ = %.3g: %s", tau, tau_min(sigma0, resolution=resolution), sigma0,
                    float(sigma), given, tau_in_words(given))
        return float(sigma)
    if tau is not None:
        return sigma_for_tau(tau, sigma0, resolution=resolution)
    return 0.0 if sigma is None else float(sigma)


def perturb_similarities(rho: npt.ArrayLike, sigma: float,
                         rng: np.random.Generator) -> FloatArray:
    """FedSim Eq. 2: s = ρ + N(0, σ²) with noise from ``rng`` (σ = 0: s = ρ, no draw)."""
    r = np.asarray(rho, dtype=np.float64)
    if sigma == 0.0:
        return r.copy()
    out = rng.normal(0.0, sigma, size=r.shape)
    out += r
    return out


#: What a :class:`SoftLinkage` made without noise holds for its similarities until they are
#: first asked for whole: they are Eq. 1's ρ of its distances, made a stretch of rows at a
#: time by :meth:`SoftLinkage.similarity_rows` (never seen outside this module: the
#: ``similarities`` attribute makes and keeps the whole array on first use). ``None``, which
#: a pickled or copied linkage keeps as it is.
_EQ1: Any = None


@dataclass(frozen=True, eq=False)
class SoftLinkage:
    """The result of a linkage: who is linked to whom, how similar, and at what privacy cost.

    Attributes:
        indices: ``(n, K)`` secondary rows, most similar first; −1 = missing (exact mode).
        distances: ``(n, K)`` raw distances (NaN where missing). Coordinator-side only.
        similarities: ``(n, K)`` normalised and noised similarities s (Eq. 1–2), for the primary.
            Without noise they are Eq. 1's ρ of the distances, made when first used (whole on
            this attribute, a stretch of rows with :meth:`similarity_rows`).
        mu0, sigma0: Eq. 1 scaling parameters.
        sigma: Eq. 2 noise scale.
        tau: Theorem 2 greedy-attack bound for (σ, σ0) at the distance step ``resolution``.
        epsilon, delta: Theorem 1: with noise σ no ε below ``epsilon`` is possible at this δ.
        epsilon_valid: whether δ satisfies Theorem 1's condition δ < 1/2 − e^{−3ε}/√(2πε).
        metric, mode: how the linkage was made; ``n_secondary``: rows in the secondary table.
        exact_search, recall: whether the search was exact; measured recall@K if approximate.
        resolution: the distance step r of Theorem 2 (1 for Hamming distances; the one-bit
            step of a multi-field weighted distance, see :mod:`vflink.linkage.privacy`).
        match_weights, match_probabilities, matches: a Fellegi–Sunter link's exact match
            weight and probability of each link and its decision (coordinator-side; the
            primary receives the decisions and the similarities, which are then the noised,
            normalised weights). ``model``: the trained model and its quality estimates.
    """

    indices: npt.NDArray[np.int64]
    distances: FloatArray
    similarities: FloatArray
    mu0: float
    sigma0: float
    sigma: float
    tau: float
    epsilon: float
    delta: float
    epsilon_valid: bool
    metric: str
    mode: LinkMode
    n_secondary: int
    exact_search: bool = True
    recall: float | None = None
    meta: dict[str, float] = field(default_factory=dict)
    resolution: float = 1.0
    match_weights: FloatArray | None = None
    match_probabilities: FloatArray | None = None
    matches: npt.NDArray[np.bool_] | None = None
    model: dict[str, Any] = field(default_factory=dict)
    #: seconds of its own steps (``moments``: Eq. 1's μ0 and σ0; ``noise``: ρ and Eq. 2's
    #: noise, where there is some)
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def k(self) -> int:
        return int(self.indices.shape[1])

    def __len__(self) -> int:
        return int(self.indices.shape[0])

    @property
    def matched(self) -> npt.NDArray[np.bool_]:
        return np.asarray((self.indices != MISSING).any(axis=1))

    def similarity_rows(self, lo: int, hi: int) -> FloatArray:
        """Rows ``lo`` to ``hi`` of :attr:`similarities` without making the whole array: Eq. 1's
        ρ of those rows' distances where the similarities have not been made (the very bits
        the whole array holds; a fresh array, not kept), else a view of them."""
        held = self.__dict__["similarities"]
        if held is not _EQ1:
            return np.asarray(held[lo:hi])
        d = np.asarray(self.distances[lo:hi], dtype=np.float64)
        out = np.empty(d.shape)
        eq1_into(d, self.mu0, self.sigma0, out)
        return out

    def raw_similarities(self) -> FloatArray:
        """ρ of Eq. 1 (before noise), recomputed from the distances (a model link: the match
        weights, which Eq. 1 normalised) and (μ0, σ0)."""
        score = -self.distances if self.match_weights is None else self.match_weights
        if self.sigma0 == 0.0:
            return np.where(np.isfinite(score), 0.0, np.nan)
        return (score - self.mu0) / self.sigma0

    def to_alignment(self, secondary: str = "secondary", *,
                     include_similarity: bool = True) -> Alignment:
        """The hand-off to training: primary rows 0..n−1, their K secondary rows, and (for the
        primary party only; ``include_similarity=False``: none, for a primary that reads them
        from the links instead) the noised similarities as float32."""
        meta = {"mu0": self.mu0, "sigma0": self.sigma0, "sigma": self.sigma, "tau": self.tau,
                "epsilon": self.epsilon, "delta": self.delta}
        if self.resolution != 1.0:
            meta["resolution"] = self.resolution
        if self.recall is not None:
            meta["recall"] = self.recall
        meta.update(self.model.get("released", {}))
        similarity = None
        if include_similarity:
            if self.__dict__["similarities"] is _EQ1:  # ρ made in small blocks, cast as made
                mu0, sigma0 = self.mu0, self.sigma0
                similarity = np.empty(self.distances.shape, dtype=np.float32)
                _in_parts(lambda a, out: _eq1_float32(a, mu0, sigma0, out),
                          np.ascontiguousarray(self.distances, dtype=np.float64), similarity)
            else:
                similarity = np.empty(self.similarities.shape, dtype=np.float32)
                _in_parts(lambda a, out: np.copyto(out, a, casting="same_kind"),
                          np.ascontiguousarray(self.similarities, dtype=np.float64), similarity)
        return Alignment(
            primary_index=np.arange(len(self), dtype=np.int64),
            secondary_index=self.indices,
            similarity=similarity,
            secondary=secondary,
            meta=meta,
            match=self.matches,
        )


def _similarities(self: SoftLinkage) -> FloatArray:
    held: FloatArray = self.__dict__["similarities"]
    if held is _EQ1:  # made whole on first use, and kept
        held = _eq1_whole(self.distances, self.mu0, self.sigma0)
        self.__dict__["similarities"] = held
    return held


def _hold_similarities(self: SoftLinkage, value: FloatArray) -> None:
    # the dataclass's __init__ sets the field through this (object.__setattr__); a later
    # assignment is refused by the frozen class's own __setattr__ first
    self.__dict__["similarities"] = value


# The field, read through a property: the similarities of a linkage without noise are made
# from its distances when first asked for (see _EQ1).
SoftLinkage.similarities = property(  # type: ignore[assignment]
    _similarities, _hold_similarities, doc="(n, K) similarities s (Eq. 1-2), for the primary")

#: Elements per block of :func:`_eq1_float32` (float64: 1 MB, in a core's L2 cache: 8 ms on two
#: threads for the 14 M house-scale links, against 13 ms in blocks of 2^15, Python between them).
_EQ1_BLOCK = 1 << 17


def _eq1_float32(d: FloatArray, mu0: float, sigma0: float,
                 out: npt.NDArray[np.float32]) -> None:
    """Eq. 1's ρ of the flat distances ``d`` into the float32 ``out``, a block at a time
    through one small float64 buffer: the float32 of each element of the whole float64 ρ."""
    flat_d, flat_out = d.reshape(-1), out.reshape(-1)
    buf = np.empty(min(flat_d.size, _EQ1_BLOCK))
    for start in range(0, flat_d.size, _EQ1_BLOCK):
        stop = min(flat_d.size, start + _EQ1_BLOCK)
        part = buf[:stop - start]
        eq1_into(flat_d[start:stop], mu0, sigma0, part)
        np.copyto(flat_out[start:stop], part, casting="same_kind")


def soft_linkage(
    neighbours: Neighbours,
    *,
    metric: str,
    n_secondary: int,
    mode: LinkMode = "soft",
    tau: float | None = None,
    sigma: float | None = None,
    delta: float = 1e-5,
    rng: np.random.Generator | int | Callable[[], np.random.Generator] | None = None,
    scale: tuple[float, float] | None = None,
) -> SoftLinkage:
    """Build a :class:`SoftLinkage` from top-K neighbours (FedSim §4.1, Eq. 1–2, §5).

    ``scale`` = (μ0, σ0) reuses the normalisation of an earlier (training) linkage.

    ``mode="exact"`` keeps only neighbours at distance 0 (exact matches) and marks the others
    MISSING; ``"top1"`` and ``"exact"`` need K = 1. ``tau`` sets σ by Theorem 2 (an unreachable
    τ raises :class:`~vflink.errors.LinkageError`), ``sigma`` sets it directly; given both, σ
    follows from ``tau`` where τ is reachable and is ``sigma`` where it is not (the runners'
    private default). With neither, no noise is added (σ = 0, τ = 1, ε = ∞).

    ``rng``: Eq. 2's generator, a seed, ``None`` (a fresh secret stream) or a function that
    gives the generator, called only when noise is drawn (a link without noise makes no
    stream, and a secret one's cipher is not even loaded).
    """
    if mode not in ("soft", "top1", "exact"):
        raise ConfigError(f"`mode` must be one of exact, soft, top1, got {mode!r}")
    if mode != "soft" and neighbours.k != 1:
        raise ConfigError(f"mode {mode!r} links one secondary row per primary row; `top_k` "
                          f"must be 1, got {neighbours.k}")
    if sigma is not None and not (math.isfinite(sigma) and sigma >= 0.0):
        raise ConfigError(f"`sigma` must be a finite number ≥ 0, got {sigma!r}")
    if not (0.0 < delta < 1.0):
        raise ConfigError(f"`delta` must be a number in (0, 1), got {delta!r}")

    indices = neighbours.indices
    distances = neighbours.distances
    if mode == "exact":
        indices, distances = indices.copy(), distances.copy()
        miss = distances != 0.0
        indices[miss] = MISSING
        distances[miss] = np.nan

    # None: the secret source (vflink.randomness); a seed only where the caller asked for
    # reproducible noise (not private: the seed regenerates it)
    def generator() -> np.random.Generator:
        if isinstance(rng, np.random.Generator):
            return rng
        if callable(rng):
            return rng()
        return secret_generator() if rng is None else np.random.default_rng(rng)

    # Eq. 2's noise, when there will be some, is drawn while Eq. 1 is computed: σ depends on
    # σ0, but the draws do not (Generator.normal(0, σ) is 0 + σ·z for the stream's next
    # standard normal z), so a thread of its own draws z meanwhile; the values are those of
    # perturb_similarities, and the draws stay this generator's, in order
    ahead = _DrawAhead(generator(), distances.shape) if (
        distances.size >= PASS_MIN and ((tau is not None and tau < 1.0) or bool(sigma))) \
        else None
    clock = time.perf_counter()
    mu0, sigma0 = eq1_scale(distances, scale=scale)
    seconds = {"moments": time.perf_counter() - clock}
    step = neighbours.resolution
    noise = noise_scale(tau, sigma, sigma0, resolution=step)
    achieved_tau = tau_for_sigma(noise, sigma0, resolution=step)
    n_primary = int(indices.shape[0])
    epsilon = dp_epsilon(noise, n_primary, mu0, sigma0)
    epsilon_valid = delta < theorem1_delta_limit(epsilon)
    clock = time.perf_counter()
    z = ahead.result() if ahead is not None else None
    if noise == 0.0:
        # Without noise the similarities are Eq. 1's ρ itself: made from the distances a
        # stretch of rows at a time where they are used (SoftLinkage.similarity_rows: the
        # links' file, the primary's float32 copy, Δ), not as one more n × K array (113 MB of
        # fresh memory at FedSim's house scale) unless asked for whole
        similarities = _EQ1
    else:
        rho = _eq1_whole(distances, mu0, sigma0)
        similarities = (_scaled_noise(z, noise, rho) if z is not None
                        else perturb_similarities(rho, noise, generator()))
    seconds["noise"] = time.perf_counter() - clock
    log.info("soft linkage: K=%d μ0=%.6g σ0=%.6g σ=%.6g τ=%.6g ε=%.6g", neighbours.k, mu0,
             sigma0, noise, achieved_tau, epsilon)
    return SoftLinkage(
        indices=indices,
        distances=distances,
        similarities=similarities,
        mu0=mu0,
        sigma0=sigma0,
        sigma=noise,
        tau=achieved_tau,
        epsilon=epsilon,
        delta=float(delta),
        epsilon_valid=bool(epsilon_valid),
        metric=metric,
        mode=mode,
        n_secondary=int(n_secondary),
        exact_search=neighbours.exact,
        recall=neighbours.recall,
        resolution=float(step),
        seconds=seconds,
    )
