"""White-box label attacks: what a secondary that has read vflink's code reads from the
gradients it received (docs/how-to/attacks-and-reports.md).

The label attacks of :mod:`vflink.attacks.label_leakage` and :mod:`vflink.attacks.label_clustering`
look at one batch at a time and know nothing of how the primary protects its labels. A party
that read the code knows more: which noise each mode draws, in which order, from which
generator, and every seed it was sent. Three attacks use that, each on what the attacking
secondary received and kept (its recording: the gradients, the rows each training
``Forward`` asked for in the primary's order, and the seeds of the setup messages), never on
another party's files:

* ``label-noise-subtraction`` regenerates the primary's label noise. Under ``[privacy]
  reproducible_noise`` (not private) the noise stream is :class:`vflink.randomness.NoiseSource`
  ``(seed=seed)`` (the draws of ``torch.Generator().manual_seed(seed)``) drawing ``normal(shape,
  float64)`` once per training batch (``dp``: shape (B, C), the logit noise; ``marvell``:
  (rows, d + 1) per secondary; ``max-norm``: (rows,) per secondary), as
  :class:`vflink.privacy.label_protection.LabelProtection` draws it. The seeds tried are every
  seed the secondary received (the ``SetupBottom`` spec's seed is the run seed + 1 + the
  secondary's index; union training sends the run seed), the label-noise seed the runner derives
  from a run seed (``SeedSequence([run seed, 0x1AB])``,
  :func:`vflink.runner.protections.label_noise_seed`), the seeds of the budget's later streams
  (``SeedSequence([seed, 0x1AB5, k])``), and every small integer up to ``brute_force`` as a
  ``labels_seed`` or as a run seed. A candidate is kept when its draws explain the received rows
  of the first batches (a correlation far beyond chance: the brute force screens on the first
  batch, vectorised, then confirms). With the noise known, each mode falls to a least-squares fit:

  - ``dp``: the row sent for record i is c_i·(p_i − y_i + σ·n_i)·J_i (J_i the Jacobian of its
    logit). Projected on the batch's top singular direction it is s_i ≈ c·(p_i − y_i + σ n_i);
    the slope of s on n estimates c·σ, and s/slope − n ≈ (p_i − y_i)/σ is negative for a
    positive label, positive for a negative one; over a record's epochs the fit of s/slope on
    n gives its own scale c_i/c̄ as the slope, and (p_i − y_i)/σ as intercept over slope;
  - ``marvell``: the noise is ξ₀·√(λ₁c − λ₂c)·Δ̂ + √λ₂c·ξ for class c; with ξ₀, ξ known, each
    row is explained by one of two linear models (mean, slope on ξ₀ along Δ̂, coefficient on
    ξ across), fitted by EM; the posterior of the smaller component is the score;
  - ``max-norm``: row i is g_i·(1 + ξ_i σ_i) with E‖row‖² = max_j‖g_j‖² = M; a small gradient
    (a negative) sends ‖row‖/√M ≈ |ξ_i|, a large one (a positive) ≈ 1.

  A record's scores are averaged over the epochs recorded. With the secret source (the
  default: ChaCha20 keyed by the operating system, nothing a peer received enters it) no
  candidate explains the rows and the attack reads nothing (every score 0).

* ``label-epoch-average`` (black-box, label-free): a record's rows over every recorded epoch,
  each projected on its batch's class-mean direction (the batch's top principal direction,
  signs aligned from batch to batch) and standardised, averaged per record. Fresh noise per
  batch averages out; the label's signal does not. Marvell's and max-norm's statements are per
  batch and per row and say nothing of this; label DP's ε counts every epoch.

* ``label-residual`` (black-box, label-free): each row's component perpendicular to its
  batch's class-mean direction; its (log) norm, standardised per batch. Marvell adds its
  perpendicular noise to one class only (the one of smaller variance,
  :mod:`vflink.privacy.marvell`), which this reads; ``average_epochs`` averages it per record.

Scores are oriented without labels (the minority side scores high); a leak is read either way
round (:func:`vflink.attacks.limits.leak`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt
import torch

from vflink._checks import check_choice, check_float, check_int, raise_if
from vflink.attacks.base import ATTACKS, AttackResult, AttackView
from vflink.attacks.label_leakage import _LabelAttack, explain_auc, labelled_rows
from vflink.errors import ConfigError, DataError
from vflink.metrics.attacks import grouped_auc
from vflink.metrics.functional import auc
from vflink.randomness import NoiseSource

__all__ = ["Batch", "Candidate", "Found", "LabelEpochAverageAttack", "LabelNoiseSubtraction",
           "LabelResidualAttack", "MECHANISMS", "batches_of", "brute_force_candidates",
           "derived_label_seed", "dp_parts", "dp_posterior_record_scores", "dp_record_scores",
           "dp_scores",
           "epoch_average_scores", "find_seed",
           "marvell_scores", "max_norm_scores", "received_candidates", "regenerate",
           "residual_scores", "stream_seed", "subtract_noise", "top_direction"]

#: runner/protections.py ``label_noise_seed``: SeedSequence([run seed, 0x1AB]) under
#: ``reproducible_noise`` without ``labels_seed``
LABEL_SEED_SALT = 0x1AB
#: ``LabelProtection._claim_stream``: the k-th stream (k ≥ 1) of a seed, SeedSequence([seed,
#: 0x1AB5, k]) (the budget numbers the runs on the same data)
STREAM_SALT = 0x1AB5
#: the noise mechanisms a secondary can meet (``privacy.labels``), in the order tried
MECHANISMS = ("dp", "marvell", "max-norm")
_MAX_SEED = 1 << 64

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


# --- seeds ---------------------------------------------------------------------------------

def derived_label_seed(run_seed: int) -> int:
    """The label-noise seed the runner derives from a run seed (the module docstring)."""
    seq = np.random.SeedSequence([int(run_seed), LABEL_SEED_SALT])
    return int(seq.generate_state(1, np.uint64)[0] >> 1)


def stream_seed(seed: int, k: int) -> int:
    """The seed of the budget's ``k``-th noise stream of ``seed`` (k = 0: ``seed`` itself)."""
    if k == 0:
        return int(seed)
    seq = np.random.SeedSequence([int(seed), STREAM_SALT, int(k)])
    return int(seq.generate_state(1, np.uint64)[0] >> 1)


@dataclass(frozen=True)
class Candidate:
    """A label-noise seed to try, and where it comes from."""

    seed: int
    how: str


def received_candidates(received: Sequence[Mapping[str, Any]], *, positions: int = 4,
                        streams: int = 4) -> list[Candidate]:
    """Every seed derivable from the seeds a secondary received (``received``: ``{"seed",
    "message", "peer"}``): the seed itself and the run seeds it implies (a ``SetupBottom``
    spec's seed is the run seed + 1 + the secondary's index, for indices below
    ``positions``), each as a ``labels_seed`` and through the runner's derivation, each in the
    budget's first ``streams`` streams."""
    out: dict[int, Candidate] = {}

    def add(seed: int, how: str) -> None:
        if 0 <= seed < _MAX_SEED and seed not in out:
            out[seed] = Candidate(seed, how)

    for item in received:
        value = item.get("seed")
        if isinstance(value, bool) or not isinstance(value, int):
            continue
        where = f"{item.get('message', 'a message')} from {item.get('peer', '?')}"
        runs = [(value, f"the seed of {where}")]
        runs += [(value - 1 - j, f"run seed {value - 1 - j} (the seed of {where} − 1 − {j})")
                 for j in range(positions)]
        for run, how in runs:
            for k in range(streams):
                tail = "" if k == 0 else f", stream {k}"
                add(stream_seed(derived_label_seed(run), k) if run >= 0 else -1,
                    f"label seed derived from {how}{tail}")
                add(stream_seed(run, k) if run >= 0 else -1, f"{how} as labels_seed{tail}")
    return list(out.values())


def brute_force_candidates(n: int) -> Iterable[Candidate]:
    """Every ``labels_seed`` below ``n`` and every run seed below ``n`` (derived)."""
    for s in range(int(n)):
        yield Candidate(s, f"labels_seed = {s} (tried by brute force)")
        yield Candidate(derived_label_seed(s), f"label seed derived from run seed {s} "
                                               "(tried by brute force)")


# --- what the secondary recorded, per batch ------------------------------------------------

@dataclass(frozen=True)
class Batch:
    """One recorded training batch: the gradient rows received (one per unique row of the
    secondary, ``ids``), and for each row the primary asked for, in its order, its position
    among them (``positions``; one per (record, link) pair)."""

    key: int
    rows: FloatArray
    ids: IntArray
    positions: IntArray

    @property
    def slots(self) -> int:
        return int(len(self.positions))

    def per_row(self, values: FloatArray) -> FloatArray:
        """Values per requested slot ``(slots, ...)`` summed per unique row."""
        out = np.zeros((len(self.ids), *values.shape[1:]), dtype=np.float64)
        np.add.at(out, self.positions, values)
        return out

    def counts(self) -> FloatArray:
        return np.bincount(self.positions, minlength=len(self.ids)).astype(np.float64)


def batches_of(gradients: npt.ArrayLike, ids: npt.ArrayLike, batch: npt.ArrayLike,
               requests: Mapping[str, npt.NDArray[Any]] | None) -> list[Batch]:
    """The recording as batches in training order. Without ``requests`` (a recording from
    before they were kept) every row is taken as asked once, in the order of its ids."""
    g = np.asarray(gradients, dtype=np.float64)
    g = g.reshape(len(g), -1)
    ids_ = np.asarray(ids, dtype=np.int64)
    b = np.asarray(batch, dtype=np.int64)
    out = []
    for key in np.unique(b):
        m = b == key
        if requests is not None:
            rm = np.asarray(requests["batch"]) == key
            positions = np.asarray(requests["positions"], dtype=np.int64)[rm]
            if positions.size and (positions.min() < 0 or positions.max() >= int(m.sum())):
                raise DataError(f"recorded requests of batch {key} point outside its "
                                f"{int(m.sum())} gradient rows")
        else:
            positions = np.arange(int(m.sum()), dtype=np.int64)
        out.append(Batch(int(key), g[m], ids_[m], positions))
    return out


# --- geometry -------------------------------------------------------------------------------

def top_direction(rows: FloatArray, *, centre: bool = True) -> FloatArray:
    """The top right-singular vector of the (centred) rows: the direction of most spread."""
    x = rows - rows.mean(axis=0) if centre else rows
    if x.shape[1] == 1:
        return np.ones(1)
    _, _, vt = np.linalg.svd(x, full_matrices=False)
    return np.asarray(vt[0], dtype=np.float64)


def _corr(a: FloatArray, b: FloatArray) -> float:
    a = a - a.mean()
    b = b - b.mean()
    den = float(np.linalg.norm(a) * np.linalg.norm(b))
    return float(a @ b) / den if den > 0 else 0.0


def _z(corr: float, n: int) -> float:
    """A correlation in units of its spread under independence (≈ 1/√n)."""
    return abs(corr) * math.sqrt(max(n - 2, 1))


def _minority_high(scores: FloatArray) -> FloatArray:
    """``scores`` oriented so that the smaller of its two 1-D 2-means groups scores high
    (positives are the minority class, as for the direction attack)."""
    s = np.asarray(scores, dtype=np.float64)
    if s.size < 2 or np.allclose(s, s[0]):
        return s
    lo, hi = np.percentile(s, [25, 75])
    centres = np.array([lo, hi], dtype=np.float64)
    for _ in range(20):
        assign = np.abs(s[:, None] - centres[None, :]).argmin(axis=1)
        new = np.array([s[assign == k].mean() if (assign == k).any() else centres[k]
                        for k in range(2)])
        if np.allclose(new, centres):
            break
        centres = new
    high = int(np.argmax(centres))
    return s if int((assign == high).sum()) <= int((assign != high).sum()) else -s


# --- the mechanisms, with their noise known ------------------------------------------------

def dp_parts(batch: Batch, noise: FloatArray, per_record: int = 1
             ) -> tuple[float, FloatArray, FloatArray]:
    """``dp`` with the batch's logit noise known (``noise``: (B, 1), one per record of the
    primary's batch): (z of the fit, u = s/slope per unique row, its noise n). The row sent for
    record i projects to s_i ≈ c_i·(p_i − y_i + σ·n_i); the slope of s on n is c̄·σ, so
    u_i = (c_i/c̄)·((p_i − y_i)/σ + n_i)."""
    n_slot = np.repeat(np.asarray(noise, dtype=np.float64)[:, 0], per_record)[:batch.slots]
    counts = np.maximum(batch.counts(), 1.0)
    n = batch.per_row(n_slot) / counts
    s = batch.rows @ top_direction(batch.rows, centre=False)
    corr = _corr(s, n)
    design = np.stack([np.ones_like(n), n], axis=1)
    coef = np.linalg.lstsq(design, s, rcond=None)[0]
    slope = float(coef[1])
    if slope == 0.0:
        return 0.0, np.zeros(len(s)), n
    return _z(corr, len(s)), s / slope, n


def dp_scores(batch: Batch, noise: FloatArray, per_record: int = 1) -> tuple[float, FloatArray]:
    """``dp`` per row (:func:`dp_parts`): (z of the fit, −(u − n) ≈ (y − p)/σ: high =
    positive)."""
    z, u, n = dp_parts(batch, noise, per_record)
    return z, -(u - n)


#: a record's own scale is fitted from this many rows (epochs) on; fewer read the mean
_FIT_ROWS = 5


def dp_record_scores(batches: Sequence[Batch], draws: Sequence[FloatArray],
                     per_record: int = 1) -> tuple[IntArray, FloatArray, IntArray]:
    """``dp`` per record over its epochs: u = κ·((p − y)/σ + n) with κ = c_i/c̄ the record's
    own scale, nearly the same in every epoch, so the fit of u on n over the record's rows
    has slope κ and intercept κ·(p − y)/σ; their ratio is read (the mean of u − n where fewer
    than ``_FIT_ROWS`` rows or a flat slope leave no fit: with three epochs, the fit of three
    points read one canary of 346 wrong where the mean read none)."""
    us: dict[int, list[float]] = {}
    ns: dict[int, list[float]] = {}
    for batch, draw in zip(batches, draws, strict=True):
        _, u, n = dp_parts(batch, draw, per_record)
        for row, ui, ni in zip(batch.ids.tolist(), u.tolist(), n.tolist(), strict=True):
            us.setdefault(row, []).append(ui)
            ns.setdefault(row, []).append(ni)
    ids = np.asarray(sorted(us), dtype=np.int64)
    scores = np.zeros(len(ids))
    counts = np.zeros(len(ids), dtype=np.int64)
    for k, row in enumerate(ids.tolist()):
        u, n = np.asarray(us[row]), np.asarray(ns[row])
        counts[k] = len(u)
        fallback = -float(np.mean(u - n))
        if len(u) >= _FIT_ROWS and float(np.var(n)) > 0:
            slope, intercept = np.polyfit(n, u, 1)
            scores[k] = -float(intercept / slope) if slope > 0.2 else fallback
        else:
            scores[k] = fallback
    return ids, scores, counts


def _em_two_lines(p: FloatArray, z0: FloatArray, t: FloatArray, iters: int = 30) -> FloatArray:
    """Posterior of the component whose mean along the direction is the larger, of two
    components each explaining a row by p = a + b·z0 + N(0, τ²) and t = m + N(0, κ²)
    (Marvell: along Δ̂ a class mean plus its noise, across it the coefficient on the known
    perpendicular draw)."""
    n = len(p)
    lo, hi = np.percentile(t, [25, 75])
    centres = np.array([lo, hi])
    for _ in range(10):
        a = np.abs(t[:, None] - centres[None, :]).argmin(axis=1)
        centres = np.array([t[a == k].mean() if (a == k).any() else centres[k]
                            for k in range(2)])
    resp = np.stack([a == 0, a == 1], axis=1).astype(np.float64) * 0.8 + 0.1
    design = np.stack([np.ones(n), z0], axis=1)
    means = np.zeros(2)
    for _ in range(iters):
        ll = np.zeros((n, 2))
        for k in range(2):
            w = resp[:, k]
            total = float(w.sum()) + 1e-12
            xtw = design.T * w
            coef = np.linalg.solve(xtw @ design + 1e-9 * np.eye(2), xtw @ p)
            means[k] = coef[0]
            res = p - design @ coef
            tau2 = max(float((w * res ** 2).sum()) / total, 1e-30)
            mt = float((w * t).sum()) / total
            kap2 = max(float((w * (t - mt) ** 2).sum()) / total, 1e-30)
            ll[:, k] = (math.log(total / n) - 0.5 * math.log(tau2) - res ** 2 / (2 * tau2)
                        - 0.5 * math.log(kap2) - (t - mt) ** 2 / (2 * kap2))
        ll -= ll.max(axis=1, keepdims=True)
        resp = np.exp(ll)
        resp /= resp.sum(axis=1, keepdims=True)
    return np.asarray(resp[:, int(np.argmax(means))], dtype=np.float64)


def marvell_scores(batch: Batch, normal: FloatArray, ref: FloatArray | None = None, *,
                   z_only: bool = False) -> tuple[float, FloatArray]:
    """``marvell`` with the batch's draws known (``normal``: (slots, d + 1), ξ₀ then ξ):
    (z of the fit, the logit of each row's posterior of the component further along the
    batch's class-mean direction, that direction's sign taken from ``ref`` so that every
    batch names the same class)."""
    z = batch.per_row(np.asarray(normal, dtype=np.float64))
    if z.shape[1] != batch.rows.shape[1] + 1:
        return 0.0, np.zeros(len(batch.ids))
    centred = batch.rows - batch.rows.mean(axis=0)
    v = top_direction(batch.rows)
    if ref is not None and float(v @ ref) < 0:
        v = -v
    p = centred @ v
    z0 = z[:, 0]
    corr = _corr(p, z0)
    if z_only:  # checking a seed: the fit's strength, not the scores
        return _z(corr, len(p)), np.zeros(len(p))
    perp = centred - np.outer(p, v)
    zp = z[:, 1:] - np.outer(z[:, 1:] @ v, v)
    den = np.einsum("ij,ij->i", zp, zp)
    t = np.where(den > 0, np.einsum("ij,ij->i", perp, zp) / np.where(den > 0, den, 1.0), 0.0)
    if len(p) < 4:
        return _z(corr, len(p)), np.zeros(len(p))
    post = np.clip(_em_two_lines(p, z0, t), 1e-6, 1 - 1e-6)
    return _z(corr, len(p)), np.log(post / (1 - post))


def max_norm_scores(batch: Batch, normal: FloatArray) -> tuple[float, FloatArray]:
    """``max-norm`` with the batch's ξ known (``normal``: (slots,)): (z of the fit,
    |ρ − |ξ|| − |ρ − 1| per row, ρ = ‖row‖/√mean‖row‖²: high = a large gradient)."""
    counts = np.maximum(batch.counts(), 1.0)
    xi = np.abs(batch.per_row(np.asarray(normal, dtype=np.float64).reshape(-1)) / counts)
    norms = np.linalg.norm(batch.rows, axis=1)
    m = float(np.mean(norms ** 2))
    if m <= 0:
        return 0.0, np.zeros(len(norms))
    rho = norms / math.sqrt(m)
    return _z(_corr(rho, xi), len(rho)), np.abs(rho - xi) - np.abs(rho - 1.0)


def _shapes(mechanism: str, batch: Batch, per_record: int, secondaries: int
            ) -> list[tuple[int, ...]]:
    """The draws one training batch takes from the primary's label-noise stream."""
    if mechanism == "dp":
        return [(max(batch.slots // per_record, 1), 1)]
    width = batch.rows.shape[1]
    shape: tuple[int, ...] = ((batch.slots, width + 1) if mechanism == "marvell"
                              else (batch.slots,))
    return [shape] * secondaries  # the other secondaries' draws taken as the same size


def _fit(mechanism: str, batch: Batch, draw: FloatArray, per_record: int,
         ref: FloatArray | None = None, *, z_only: bool = False) -> tuple[float, FloatArray]:
    if mechanism == "dp":
        return dp_scores(batch, draw, per_record)
    if mechanism == "marvell":
        return marvell_scores(batch, draw, ref, z_only=z_only)
    return max_norm_scores(batch, draw)


@dataclass(frozen=True)
class Found:
    """A seed that regenerates the noise: the mechanism, this secondary's position among the
    primary's secondaries, how many it has, and the fit on the batches checked."""

    candidate: Candidate
    mechanism: str
    position: int
    secondaries: int
    per_record: int
    z: float


def regenerate(seed: int, mechanism: str, batches: Sequence[Batch], *, position: int,
               secondaries: int, per_record: int) -> list[FloatArray]:
    """The draws for this secondary in each batch, as the primary's reproducible source
    (:class:`~vflink.randomness.NoiseSource` of ``seed``) made them."""
    source = NoiseSource(seed=int(seed))
    out = []
    for batch in batches:
        draws = [source.normal(shape, dtype=torch.float64).numpy()
                 for shape in _shapes(mechanism, batch, per_record, secondaries)]
        out.append(draws[0] if mechanism == "dp" else draws[position])
    return out


def _screen(candidates: Iterable[Candidate], first: Batch, mechanisms: Sequence[str],
            positions: int, per_record: Sequence[int], z_min: float
            ) -> list[tuple[Candidate, str, int, int, float]]:
    """Candidates whose first-batch draws explain the first batch: (candidate, mechanism,
    position, records' slots, z). Vectorised: draws in chunks, one product per chunk."""
    hits: list[tuple[Candidate, str, int, int, float]] = []
    chunk = 1024
    pending: list[Candidate] = []
    dp_proj = first.rows @ top_direction(first.rows, centre=False)
    centred = first.rows - first.rows.mean(axis=0)
    p_proj = centred @ top_direction(first.rows)
    norms = np.linalg.norm(first.rows, axis=1)
    rho = norms / math.sqrt(max(float(np.mean(norms ** 2)), 1e-300))
    counts = np.maximum(first.counts(), 1.0)
    # slot → unique row, as a dense (slots, rows) averaging matrix (a batch is small)
    agg = np.zeros((first.slots, len(first.ids)))
    agg[np.arange(first.slots), first.positions] = 1.0
    width = first.rows.shape[1]

    def unit(v: FloatArray) -> FloatArray:
        v = v - v.mean()
        nrm = float(np.linalg.norm(v))
        return v / nrm if nrm > 0 else v

    targets = {"dp": unit(dp_proj), "marvell": unit(p_proj), "max-norm": unit(rho)}
    n = len(first.ids)

    def corr_z(per_row: FloatArray, mech: str) -> FloatArray:
        """|corr| × √n of each (candidate, position) row of ``per_row`` with the target."""
        per_row = per_row - per_row.mean(axis=-1, keepdims=True)
        nrm = np.linalg.norm(per_row, axis=-1)
        corr = np.where(nrm > 0, (per_row @ targets[mech]) / np.where(nrm > 0, nrm, 1), 0.0)
        return np.asarray(np.abs(corr) * math.sqrt(max(n - 2, 1)))

    def record(z: FloatArray, mech: str, k: int) -> None:
        for i, j in zip(*np.nonzero(z >= z_min), strict=True):
            hits.append((pending[i], mech, int(j), k, float(z[i, j])))

    def flush() -> None:
        # NoiseSource(seed=s)'s draws are torch.Generator().manual_seed(s)'s (vflink.randomness):
        # one generator reseeded per candidate, drawn into preallocated rows, screens faster
        gen = torch.Generator()
        m = len(pending)
        # one draw per record (dp) or per slot (max-norm): the same values where the sizes
        # agree, so drawn once; Marvell's (slots, d + 1) per position
        wanted = {max(first.slots // k, 1) for k in per_record} if "dp" in mechanisms else set()
        if "max-norm" in mechanisms:
            wanted.add(first.slots)
        sizes = sorted(wanted)
        flat = {size: torch.empty((m, size), dtype=torch.float64) for size in sizes}
        extra = torch.empty((m, max(positions - 1, 0), first.slots), dtype=torch.float64)
        marv = (torch.empty((m, positions, first.slots, width + 1), dtype=torch.float64)
                if "marvell" in mechanisms else None)
        for i, cand in enumerate(pending):
            for size, buf in flat.items():
                gen.manual_seed(cand.seed)
                torch.randn((size,), generator=gen, dtype=torch.float64, out=buf[i])
                if size == first.slots and "max-norm" in mechanisms:
                    for j in range(positions - 1):  # the next secondaries' draws
                        torch.randn((size,), generator=gen, dtype=torch.float64,
                                    out=extra[i, j])
            if marv is not None:
                gen.manual_seed(cand.seed)
                for j in range(positions):
                    torch.randn((first.slots, width + 1), generator=gen, dtype=torch.float64,
                                out=marv[i, j])
        if "dp" in mechanisms:
            for k in per_record:
                b = max(first.slots // k, 1)
                d = np.repeat(flat[b].numpy(), k, axis=1)[:, :first.slots]
                record(corr_z(((d @ agg) / counts)[:, None, :], "dp"), "dp", k)
        if "max-norm" in mechanisms:
            xi = np.abs(np.concatenate([flat[first.slots].numpy()[:, None, :],
                                        extra.numpy()], axis=1))
            record(corr_z((xi @ agg) / counts, "max-norm"), "max-norm", 1)
        if marv is not None:
            record(corr_z(marv.numpy()[..., 0] @ agg, "marvell"), "marvell", 1)
        pending.clear()

    for cand in candidates:
        pending.append(cand)
        if len(pending) >= chunk:
            flush()
    if pending:
        flush()
    return hits


#: a candidate is kept when its draws explain the first few batches this well on average (a
#: correlation in units of its spread under independence: about 0.8 for a wrong seed)
Z_CONFIRM = 3.0
_CHECKED = 4


def _quality(seed: int, mechanism: str, batches: Sequence[Batch], *, position: int,
             secondaries: int, per_record: int) -> float:
    """The mean z of the fit over the first few batches with these draws."""
    head = list(batches[:_CHECKED])
    draws = regenerate(seed, mechanism, head, position=position, secondaries=secondaries,
                       per_record=per_record)
    return float(np.mean([_fit(mechanism, b, d, per_record, z_only=True)[0]
                          for b, d in zip(head, draws, strict=True)]))


def _layouts(mechanism: str, positions: int, per_record: Sequence[int],
             position: int | None = None) -> list[tuple[int, int, int]]:
    """(position, secondaries, records' slots) to try: dp draws once per batch whatever the
    secondaries; Marvell and max-norm once per secondary (the others taken as the same
    size)."""
    if mechanism == "dp":
        return [(0, 1, k) for k in per_record]
    pos = range(positions) if position is None else (position,)
    return [(j, s, 1) for j in pos for s in range(j + 1, max(positions, j + 1) + 1)]


def find_seed(batches: Sequence[Batch], candidates: Iterable[Candidate], *,
              mechanisms: Sequence[str] = MECHANISMS, positions: int = 4,
              per_record: Sequence[int] = (1,), z_min: float = 4.0,
              thorough: bool = False) -> Found | None:
    """The candidate whose draws explain the recorded batches best, or ``None``.

    ``thorough`` (a few candidates: the seeds received): every candidate, mechanism and
    layout is regenerated over the first batches and kept when its mean z reaches
    ``Z_CONFIRM``. Otherwise (many candidates: brute force) the first batch screens them,
    vectorised, at z ≥ ``z_min``, and a hit is confirmed the same way."""
    usable = [b for b in batches if len(b.ids) >= 8]
    if not batches or not usable or usable[0] is not batches[0]:
        return None
    best: Found | None = None
    if thorough:
        for cand in candidates:
            for mech in mechanisms:
                for pos, count, k in _layouts(mech, positions, per_record):
                    q = _quality(cand.seed, mech, batches, position=pos, secondaries=count,
                                 per_record=k)
                    if q >= Z_CONFIRM and (best is None or q > best.z):
                        best = Found(cand, mech, pos, count, k, q)
        return best
    hits = _screen(candidates, batches[0], mechanisms, positions, per_record, z_min)
    for cand, _, pos, k, _ in sorted(hits, key=lambda h: -h[4]):
        for mech2 in mechanisms:  # the draws may fit another mechanism's model better
            for p2, count, k2 in _layouts(mech2, positions, (k,),
                                          position=None if mech2 == "dp" else pos):
                q = _quality(cand.seed, mech2, batches, position=p2, secondaries=count,
                             per_record=k2)
                if q >= Z_CONFIRM and (best is None or q > best.z):
                    best = Found(cand, mech2, p2, count, k2, q)
        if best is not None:
            return best
    return None


def subtract_noise(batches: Sequence[Batch], found: Found) -> list[FloatArray]:
    """Each batch's scores (one per unique row; high = positive) with the found noise."""
    draws = regenerate(found.candidate.seed, found.mechanism, batches, position=found.position,
                       secondaries=found.secondaries, per_record=found.per_record)
    out = []
    ref: FloatArray | None = None
    for batch, draw in zip(batches, draws, strict=True):
        _, scores = _fit(found.mechanism, batch, draw, found.per_record, ref)
        if len(batch.ids) >= 3:  # the class-mean direction, its sign kept batch to batch
            v = top_direction(batch.rows)
            v = v if ref is None or float(v @ ref) >= 0 else -v
            ref = v if ref is None else _unit(0.8 * ref + 0.2 * v)
        out.append(scores)
    if found.mechanism == "dp":
        return out  # oriented by the fit: (p − y) < 0 is a positive label
    pooled = np.concatenate(out) if out else np.zeros(0)
    flip = not np.array_equal(_minority_high(pooled), pooled) if pooled.size else False
    return [-s if flip else s for s in out]


#: σ (the release's noise multiplier) tried by the posterior reading; the best fit is kept
POSTERIOR_SIGMAS = (0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 11.0, 16.0)


def _release_fit(batches: Sequence[Batch], draws: Sequence[FloatArray], per_record: int
                 ) -> float:
    """How well each release explains its batch under ``dp`` used as drawn: the mean over
    batches of corr(s, n)², s the rows' projection and n their noise (:func:`dp_parts`)."""
    out = []
    for batch, draw in zip(batches, draws, strict=True):
        if len(batch.ids) < 8:
            continue
        n_slot = np.repeat(np.asarray(draw, dtype=np.float64)[:, 0], per_record)[:batch.slots]
        n = batch.per_row(n_slot) / np.maximum(batch.counts(), 1.0)
        out.append(_corr(batch.rows @ top_direction(batch.rows, centre=False), n) ** 2)
    return float(np.mean(out)) if out else 0.0


def dp_posterior_record_scores(batches: Sequence[Batch], draws: Sequence[FloatArray],
                               per_record: int = 1, sigmas: Sequence[float] = POSTERIOR_SIGMAS
                               ) -> tuple[IntArray, FloatArray, IntArray, float, float]:
    """``dp`` with the posterior (``labels_denoise = "posterior"``, the default on a binary
    task) and its noise known: (record ids, scores, rows per record, fit, σ).

    The primary sends c·(p_i − σ(L_i)), L_i = m(2y_i − 1)/(2σ²) − N_i/σ after m releases
    whose draws sum to N_i (:mod:`vflink.privacy.label_dp`). With the draws regenerated, the
    label-free part π⁰_i = σ(−N_i/σ) is known for a trial σ: within a batch s ≈ c·(p − π⁰) −
    c·(label shift), so the slope of s on π⁰ is −c and r_i = −s_i/c − π⁰_i ≈ (the label's
    shift of the posterior, ±) − p_i. r averaged over a record's rows is its score; the σ whose
    π⁰ explains the batches best (mean corr(s, π⁰)²) is kept. The model's own prediction p_i
    (unknown to the secondary, and drawn towards the label by training) stays in the score:
    the reading is weaker than against the releases used as drawn."""
    best: tuple[IntArray, FloatArray, IntArray, float, float] | None = None
    for sigma in sigmas:
        cum: dict[int, float] = {}
        sums: dict[int, float] = {}
        rows: dict[int, int] = {}
        fits = []
        for batch, draw in zip(batches, draws, strict=True):
            n_slot = np.repeat(np.asarray(draw, dtype=np.float64)[:, 0],
                               per_record)[:batch.slots]
            n = batch.per_row(n_slot) / np.maximum(batch.counts(), 1.0)
            ids = batch.ids.tolist()
            for row, v in zip(ids, n.tolist(), strict=True):
                cum[row] = cum.get(row, 0.0) + v
            pi0 = 1.0 / (1.0 + np.exp(np.asarray([cum[r] for r in ids]) / float(sigma)))
            sproj = batch.rows @ top_direction(batch.rows, centre=False)
            if len(ids) < 8 or float(np.var(pi0)) == 0.0:
                continue
            corr = _corr(sproj, pi0)
            fits.append(corr ** 2)
            slope = float(np.polyfit(pi0, sproj, 1)[0])
            if slope == 0.0:
                continue
            r = sproj / slope - pi0  # −s/c − π⁰ with c = −slope
            for row, v in zip(ids, r.tolist(), strict=True):
                sums[row] = sums.get(row, 0.0) + v
                rows[row] = rows.get(row, 0) + 1
        fit = float(np.mean(fits)) if fits else 0.0
        if best is None or fit > best[3]:
            ids_ = np.asarray(sorted(sums), dtype=np.int64)
            scores = np.asarray([sums[r] / rows[r] for r in ids_.tolist()], dtype=np.float64)
            counts = np.asarray([rows[r] for r in ids_.tolist()], dtype=np.int64)
            best = (ids_, scores, counts, fit, float(sigma))
    if best is None:
        return (np.zeros(0, np.int64), np.zeros(0), np.zeros(0, np.int64), 0.0, math.nan)
    return best


# --- black-box, label-free: over epochs, and across the class-mean direction ----------------

def epoch_average_scores(batches: Sequence[Batch]) -> tuple[IntArray, FloatArray, IntArray]:
    """Per record (unique id): the mean over its recorded rows of the row's standardised
    projection on its batch's top principal direction, signs aligned batch to batch; and how
    many rows each mean averages. Oriented so that the minority scores high."""
    ref: FloatArray | None = None
    sums: dict[int, float] = {}
    counts: dict[int, int] = {}
    for batch in batches:
        if len(batch.ids) < 3:
            continue
        v = top_direction(batch.rows)
        if ref is not None and float(v @ ref) < 0:
            v = -v
        ref = v if ref is None else _unit(0.8 * ref + 0.2 * v)
        p = (batch.rows - batch.rows.mean(axis=0)) @ v
        sd = float(p.std())
        if sd == 0:
            continue
        p = (p - p.mean()) / sd
        for row, value in zip(batch.ids.tolist(), p.tolist(), strict=True):
            sums[row] = sums.get(row, 0.0) + value
            counts[row] = counts.get(row, 0) + 1
    ids = np.asarray(sorted(sums), dtype=np.int64)
    n = np.asarray([counts[i] for i in ids.tolist()], dtype=np.int64)
    scores = np.asarray([sums[i] for i in ids.tolist()], dtype=np.float64) / np.maximum(n, 1)
    return ids, _minority_high(scores), n


def _unit(v: FloatArray) -> FloatArray:
    nrm = float(np.linalg.norm(v))
    return v / nrm if nrm > 0 else v


def residual_scores(batches: Sequence[Batch]) -> list[FloatArray]:
    """Per batch, each row's log norm across its batch's top principal direction,
    standardised within the batch; one orientation for every batch (the minority side of
    all of them high)."""
    out = []
    for batch in batches:
        centred = batch.rows - batch.rows.mean(axis=0)
        v = top_direction(batch.rows)
        perp = centred - np.outer(centred @ v, v)
        r = np.log(np.linalg.norm(perp, axis=1) + 1e-300)
        sd = float(r.std())
        out.append((r - r.mean()) / sd if sd > 0 else np.zeros(len(r)))
    pooled = np.concatenate(out) if out else np.zeros(0)
    flip = pooled.size > 0 and not np.array_equal(_minority_high(pooled), pooled)
    return [-s if flip else s for s in out]


def _per_record(batches: Sequence[Batch], scores: Sequence[FloatArray]
                ) -> tuple[IntArray, FloatArray, IntArray]:
    ids = np.concatenate([b.ids for b in batches]) if batches else np.zeros(0, np.int64)
    s = np.concatenate(list(scores)) if scores else np.zeros(0)
    uniq, inv = np.unique(ids, return_inverse=True)
    total = np.bincount(inv, weights=s, minlength=len(uniq))
    n = np.bincount(inv, minlength=len(uniq)).astype(np.int64)
    return uniq.astype(np.int64), total / np.maximum(n, 1), n


# --- the attacks ---------------------------------------------------------------------------

class _RecordAttack(_LabelAttack):
    """A label attack whose scores pool each record's rows over the recorded epochs: the
    headline AUC is per record (every recorded row of a record counts), with the per-batch
    AUC beside it where rows have scores of their own."""

    reference: ClassVar[str] = "docs/how-to/attacks-and-reports.md (white-box attacks)"

    def _batches(self, view: AttackView) -> list[Batch]:
        view.require(self.needs, self.name)
        requests = view.extra.get("requests")
        return batches_of(np.asarray(view.gradients), np.asarray(view.ids),
                          self._batch(view), requests)

    def _read(self, view: AttackView
              ) -> tuple[list[Batch], list[FloatArray] | None,
                         tuple[IntArray, FloatArray, IntArray], dict[str, Any]]:
        """(batches, per-batch row scores or None, (record ids, scores, rows per record),
        details)."""
        raise NotImplementedError

    def record_scores(self, view: AttackView
                      ) -> tuple[IntArray, FloatArray, IntArray, dict[str, Any]]:
        """(record ids, pooled score per record (high = positive), rows per record, what the
        attack found): the attack's reading of every record in the recording."""
        _, _, (ids, scores, n), details = self._read(view)
        return ids, scores, n, details

    def infer(self, view: AttackView) -> FloatArray:
        """One score per recorded row: its record's pooled score (high = positive)."""
        _, _, (ids, scores, _), _ = self._read(view)
        rows = np.asarray(view.ids, dtype=np.int64)
        pos = np.minimum(np.searchsorted(ids, rows), max(len(ids) - 1, 0))
        hit = (ids[pos] == rows) if len(ids) else np.zeros(len(rows), bool)
        return np.where(hit, scores[pos] if len(ids) else 0.0, 0.0)

    def evaluate(self, view: AttackView, truth: Mapping[str, Any]) -> AttackResult:
        view.require(self.needs, self.name)
        known_rows, y_rows = labelled_rows(truth, np.asarray(view.ids, dtype=np.int64),
                                           self.name)
        if np.unique(y_rows).size > 2:
            raise ConfigError(f"attack {self.name!r} reads binary labels; this task has "
                              f"{np.unique(y_rows).size} classes (the clustering attacks read "
                              "multi-class labels)")
        batches, row_scores, (ids, scores, n_rows), details = self._read(view)
        known, y = labelled_rows(truth, ids, self.name)
        pooled = auc(y, scores[known])
        metrics = {"auc": pooled, "records": float(known.sum()),
                   "rows": float(known_rows.sum()),
                   "mean_rows_per_record": float(n_rows[known].mean()) if known.any()
                   else math.nan,
                   "positive_rate": float(np.mean(y == 1)) if len(y) else math.nan}
        if row_scores is not None:
            s = np.concatenate(row_scores) if row_scores else np.zeros(0)
            b = np.concatenate([np.full(len(x.ids), x.key) for x in batches]) if batches \
                else np.zeros(0, np.int64)
            rid = np.concatenate([x.ids for x in batches]) if batches else np.zeros(0, np.int64)
            k2, y2 = labelled_rows(truth, rid, self.name)
            metrics["auc_per_batch"] = grouped_auc(y2, s[k2], b[k2])[0]
        who = f"The secondary party {view.party!r}"
        return AttackResult(
            attack=self.name, party=view.party, metrics=metrics,
            explanation=explain_auc(pooled, who, self._what()),
            params=self._params(),
            details={"reference": self.reference,
                     "scoring": "AUC per record, each record's rows pooled over every recorded "
                                "epoch" + ("; auc_per_batch: per-batch AUC, size-weighted mean"
                                           if row_scores is not None else ""),
                     **details})

    def _what(self) -> str:
        return "the primary's positive labels from the gradients it received"


@ATTACKS.register("label-noise-subtraction")
@dataclass(frozen=True, kw_only=True)
class LabelNoiseSubtraction(_RecordAttack):
    """Regenerate the primary's label noise from every seed received (and small seeds tried by
    brute force), subtract it, read the labels (module docstring)."""

    name: ClassVar[str] = "label-noise-subtraction"
    summary: ClassVar[str] = ("a secondary regenerates the primary's label noise from every "
                              "seed it received (and small seeds tried), subtracts it and "
                              "reads the labels (white-box)")
    #: ``labels_seed`` and run seeds below this are tried too (0: only the received ones)
    brute_force: int = 100_000
    #: "auto" tries every mechanism; or one of MECHANISMS
    mode: str = "auto"
    #: this secondary's index among the primary's secondaries is tried below this
    positions: int = 4
    #: the budget's noise streams tried per seed (0 is a data set's first run)
    streams: int = 4
    #: brute force: a candidate must explain the first batch with a correlation this many
    #: times its spread (then the first batches, on average, ``Z_CONFIRM`` times)
    z_min: float = 4.0

    def __post_init__(self) -> None:
        problems: list[str] = []
        check_int(problems, "brute_force", self.brute_force, min=0, max=10_000_000)
        check_choice(problems, "mode", self.mode, ("auto", *MECHANISMS))
        check_int(problems, "positions", self.positions, min=1, max=64)
        check_int(problems, "streams", self.streams, min=1, max=64)
        check_float(problems, "z_min", self.z_min, min=3.0)
        raise_if(problems, f"{self.name} parameters")

    def _params(self) -> dict[str, Any]:
        return {"brute_force": self.brute_force, "mode": self.mode,
                "positions": self.positions, "streams": self.streams, "z_min": self.z_min}

    def _read(self, view: AttackView
              ) -> tuple[list[Batch], list[FloatArray] | None,
                         tuple[IntArray, FloatArray, IntArray], dict[str, Any]]:
        batches = self._batches(view)
        received = list(view.extra.get("received_seeds") or [])
        candidates = received_candidates(received, positions=self.positions,
                                         streams=self.streams)
        mechanisms = MECHANISMS if self.mode == "auto" else (self.mode,)
        links = int(view.extra.get("links", 1) or 1)
        per_record = (1,) if links <= 1 else (1, links)
        found = find_seed(batches, candidates, mechanisms=mechanisms, positions=self.positions,
                          per_record=per_record, z_min=self.z_min, thorough=True)
        tried = len(candidates)
        if found is None and self.brute_force > 0:
            found = find_seed(batches, brute_force_candidates(self.brute_force),
                              mechanisms=mechanisms, positions=1, per_record=per_record,
                              z_min=self.z_min)
            tried += 2 * self.brute_force
        details: dict[str, Any] = {
            "received_seeds": received, "candidates_tried": tried,
            "requests_recorded": view.extra.get("requests") is not None}
        if found is None:
            details["found"] = None
            zeros = [np.zeros(len(b.ids)) for b in batches]
            return batches, zeros, _per_record(batches, zeros), details
        details["found"] = {"seed": str(found.candidate.seed), "how": found.candidate.how,
                            "mechanism": found.mechanism, "position": found.position,
                            "secondaries": found.secondaries, "z": found.z}
        scores = subtract_noise(batches, found)
        if found.mechanism == "dp":  # per record: each record's own scale fitted over epochs
            draws = regenerate(found.candidate.seed, "dp", batches, position=found.position,
                               secondaries=found.secondaries, per_record=found.per_record)
            # which use of the releases explains the rows better: each as drawn, or the
            # posterior of all of a record's releases so far (the default on a binary task)
            release = _release_fit(batches, draws, found.per_record)
            ids, post, counts, fit, sigma = dp_posterior_record_scores(
                batches, draws, found.per_record)
            details["found"]["release_fit"] = release
            details["found"]["posterior_fit"] = fit
            if fit > release:
                details["found"]["reading"] = "posterior"
                details["found"]["sigma"] = sigma
                return batches, None, (ids, post, counts), details
            details["found"]["reading"] = "release"
            return batches, scores, dp_record_scores(batches, draws, found.per_record), details
        return batches, scores, _per_record(batches, scores), details

    def evaluate(self, view: AttackView, truth: Mapping[str, Any]) -> AttackResult:
        result = super().evaluate(view, truth)
        found = result.details.get("found")
        how = ("it regenerated the noise from " + found["how"] + f" ({found['mechanism']})"
               if found else "no seed it holds or tried regenerates the noise: it reads nothing")
        return AttackResult(result.attack, result.party, result.metrics,
                            f"{result.explanation}; {how}", result.params, result.details)


@ATTACKS.register("label-epoch-average")
@dataclass(frozen=True, kw_only=True)
class LabelEpochAverageAttack(_RecordAttack):
    """Each record's rows averaged over every recorded epoch, projected on the class-mean
    direction (label-free): fresh noise per batch averages out."""

    name: ClassVar[str] = "label-epoch-average"
    summary: ClassVar[str] = ("a secondary averages each record's gradient rows over every "
                              "epoch on the class-mean direction: fresh noise averages out")

    def _read(self, view: AttackView
              ) -> tuple[list[Batch], list[FloatArray] | None,
                         tuple[IntArray, FloatArray, IntArray], dict[str, Any]]:
        batches = self._batches(view)
        ids, scores, n = epoch_average_scores(batches)
        return batches, None, (ids, scores, n), {
            "epochs_recorded_max": int(n.max(initial=0))}


@ATTACKS.register("label-residual")
@dataclass(frozen=True, kw_only=True)
class LabelResidualAttack(_RecordAttack):
    """Each row's norm across the class-mean direction (Marvell adds noise there to one class
    only), per batch or (``average_epochs``) averaged per record."""

    name: ClassVar[str] = "label-residual"
    summary: ClassVar[str] = ("a secondary reads the labels from each gradient row's part "
                              "perpendicular to the class-mean direction")
    average_epochs: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.average_epochs, bool):
            raise_if([f"`average_epochs` must be true or false, got {self.average_epochs!r}"],
                     f"{self.name} parameters")

    def _params(self) -> dict[str, Any]:
        return {"average_epochs": self.average_epochs}

    def _read(self, view: AttackView
              ) -> tuple[list[Batch], list[FloatArray] | None,
                         tuple[IntArray, FloatArray, IntArray], dict[str, Any]]:
        batches = self._batches(view)
        scores = residual_scores(batches)
        return batches, scores, _per_record(batches, scores), {}

    def evaluate(self, view: AttackView, truth: Mapping[str, Any]) -> AttackResult:
        result = super().evaluate(view, truth)
        if self.average_epochs or "auc_per_batch" not in result.metrics:
            return result
        # one row per batch: the statement Marvell makes is per batch and per row
        m = dict(result.metrics)
        m["auc_per_record"], m["auc"] = m["auc"], m["auc_per_batch"]
        who = f"The secondary party {view.party!r}"
        return AttackResult(result.attack, result.party, m,
                            explain_auc(m["auc"], who, self._what()), result.params,
                            {**result.details, "scoring": "per-batch AUC of each row's "
                             "residual (size-weighted mean); auc_per_record: averaged per "
                             "record over the recorded epochs"})
