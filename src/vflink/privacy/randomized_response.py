"""Randomized response on a data-independent code (a departure from VFL-AFE).

The Gaussian mechanism on a learned embedding spends its budget on every coordinate of every
release: at a run's total ε = 8 (δ = 1e-5) one release already needs σ ≈ 0.6 times the
ball's diameter per coordinate, so the per-record signal-to-noise ratio is far too low for the
primary's head (docs/how-to/privacy.md, "Budget-first DP"). This mode spends the whole budget
on *one* discrete release per record instead:

1. a **fixed quantiser** maps the secondary's preprocessed feature row to one of k = 2^b
   codes, either
   - ``fields``: the b bits are shared out between the party's columns in their schema order
     (:func:`field_bits`); a numeric column's standardised value is cut at the quantiles of
     N(0, 1) into 2^a levels, a categorical column keeps its 2^a − 1 most frequent training
     categories and puts the others together (:func:`field_codes`). It uses the schema and the
     statistics the preprocessing already fits (means, scales, category lists; here also the
     categories' frequency order), nothing else; or
   - ``simhash`` (Charikar 2002): the signs of b projections onto seeded Gaussian directions
     (hyperplanes through the origin of the standardised features), for wide rows such as
     images, where the columns outnumber the bits. It depends on the seed and the shape only.
   Neither is fit on the records beyond the preprocessing's statistics, so the code costs no
   privacy of its own (those statistics are fit on the party's rows as for every other mode:
   the same caveat applies);
2. each record's code is released **once** with k-ary randomized response (Warner 1965; the
   k-ary form of Kairouz, Oh & Viswanath 2014/2016): the true code with probability
   p = e^ε/(e^ε + k − 1), otherwise one of the other k − 1 codes uniformly. Two inputs change
   any output's probability by at most the factor p / ((1 − p)/(k − 1)) = e^ε: pure ε-DP,
   δ = 0, for any pair of records (replace-one);
3. every later request for the record gets that same release back (post-processing: no further
   cost), so the worst-case record's ε is exactly the release's ε whatever the epochs.

The primary receives the one-hot of the released code (width k); the first layer of its head
is then the code's embedding. Pure functions here; the stateful wrapper is
:class:`vflink.privacy.embedding_dp.EmbeddingDP` (mode ``randomized-response``).

dp-accounting's parametrisation (``RandomizedResponseDpEvent``) is the *noise parameter*
q = probability of replacing the input by a uniform draw over all k codes (the input
included): keep probability p = 1 − q + q/k, so q = k / (e^ε + k − 1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np
import numpy.typing as npt
import torch

from vflink.privacy.config import MAX_CODE_BITS
from vflink.randomness import NoiseSource, as_source

__all__ = [
    "MAX_CODE_BITS",
    "CodeField",
    "code_epsilon",
    "field_bits",
    "field_codes",
    "keep_probability",
    "noise_parameter",
    "one_hot",
    "randomized_response",
    "simhash_codes",
    "simhash_planes",
]



def keep_probability(epsilon: float, k: int) -> float:
    """p = e^ε / (e^ε + k − 1): the probability that k-ary randomized response keeps the true
    code, the largest for which the mechanism is ε-DP."""
    if not (epsilon > 0 and k >= 2):
        raise ValueError(f"need ε > 0 and k ≥ 2, got ε = {epsilon}, k = {k}")
    # 1 / (1 + (k − 1) e^−ε): no overflow at large ε
    return 1.0 / (1.0 + (k - 1) * math.exp(-epsilon))


def code_epsilon(keep: float, k: int) -> float:
    """ε of k-ary randomized response with keep probability ``keep`` (closed form):
    ln((k − 1)·p / (1 − p)), the log of the largest ratio of one output's probabilities under
    two inputs (p for the true code against (1 − p)/(k − 1) for any other)."""
    if not (1.0 / k < keep < 1.0 and k >= 2):
        raise ValueError(f"need 1/k < keep < 1 and k ≥ 2, got keep = {keep}, k = {k}")
    return math.log((k - 1) * keep / (1.0 - keep))


def noise_parameter(epsilon: float, k: int) -> float:
    """dp-accounting's noise parameter q (replace by a uniform draw over all k codes) of the
    ε-DP mechanism: q = k / (e^ε + k − 1)."""
    if not (epsilon > 0 and k >= 2):
        raise ValueError(f"need ε > 0 and k ≥ 2, got ε = {epsilon}, k = {k}")
    return k / (math.exp(epsilon) + k - 1) if epsilon < 700 else k * math.exp(-epsilon)


def simhash_planes(n_features: int, bits: int, seed: int) -> torch.Tensor:
    """b seeded Gaussian directions in feature space (columns of a ``n_features × bits``
    matrix): the normals of SimHash's hyperplanes. They depend on the seed and the shape only,
    never on the data."""
    if not (1 <= bits <= MAX_CODE_BITS):
        raise ValueError(f"bits must be in [1, {MAX_CODE_BITS}], got {bits}")
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 0x51A5, n_features, bits]))
    return torch.from_numpy(rng.standard_normal((max(int(n_features), 1), bits))
                            .astype(np.float32))


def simhash_codes(x: torch.Tensor, planes: torch.Tensor) -> npt.NDArray[np.int64]:
    """The code of each row of ``x``: bit j set when the row lies on the positive side of
    hyperplane j (⟨x, w_j⟩ ≥ 0), bit 0 the least significant."""
    if x.ndim != 2 or x.shape[1] != planes.shape[0]:
        raise ValueError(f"features of shape {tuple(x.shape)} for {planes.shape[0]} inputs")
    side = (x.detach().float() @ planes) >= 0
    weights = 2 ** np.arange(planes.shape[1], dtype=np.int64)
    return np.asarray(side.numpy().astype(np.int64) @ weights, dtype=np.int64)


def _respond(codes: npt.NDArray[np.int64], k: int, keep: float,
             u: npt.NDArray[np.float64], pick: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    # ``pick`` is uniform on {0, ..., k−2}; skipping the true code makes it uniform on the
    # other k − 1 codes
    other = pick + (pick >= codes)
    return np.where(u < keep, codes, other).astype(np.int64)


def randomized_response(codes: npt.NDArray[np.int64], k: int, epsilon: float,
                        source: NoiseSource | torch.Generator) -> npt.NDArray[np.int64]:
    """k-ary randomized response at ε of each code (one independent draw per code), drawn
    from the party's noise source (:mod:`vflink.randomness`: secret unless reproducible)."""
    codes = np.asarray(codes, dtype=np.int64)
    if codes.size and (codes.min() < 0 or codes.max() >= k):
        raise ValueError(f"codes outside [0, {k})")
    n = codes.shape[0]
    draws = as_source(source)
    u = draws.uniform((n,), dtype=torch.float64).numpy()
    pick = draws.integers(k - 1, (n,)).numpy().astype(np.int64)
    return _respond(codes, k, keep_probability(epsilon, k), u, pick)


def one_hot(codes: npt.NDArray[np.int64], k: int) -> torch.Tensor:
    """Rows of width k with a single 1 at each code (what the primary receives)."""
    out = torch.zeros(len(codes), k)
    if len(codes):
        out[torch.arange(len(codes)), torch.from_numpy(np.asarray(codes, dtype=np.int64))] = 1.0
    return out


# --- the ``fields`` quantiser ---------------------------------------------------------------


@dataclass(frozen=True)
class CodeField:
    """One column of the preprocessed row, as the ``fields`` quantiser sees it.

    Attributes:
        start: its first column in the preprocessed row.
        width: 1 for a numeric column (its standardised value, or a missing-value indicator);
            the one-hot block's width for a categorical column.
        ranks: categorical only: the rank of each block column by its training frequency
            (0: the most frequent), ``None`` for a numeric column.
    """

    start: int
    width: int = 1
    ranks: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.start < 0 or self.width < 1:
            raise ValueError(f"a field needs start ≥ 0 and width ≥ 1, got {self}")
        if self.ranks is not None and sorted(self.ranks) != list(range(self.width)):
            raise ValueError(f"ranks must order the field's {self.width} columns, got "
                             f"{self.ranks}")


def field_bits(n_fields: int, bits: int) -> tuple[int, ...]:
    """How ``bits`` are shared between ``n_fields`` columns: equally, the remainder to the first
    columns in schema order (a column gets none when the columns outnumber the bits)."""
    if n_fields < 1 or bits < 1:
        raise ValueError(f"need n_fields ≥ 1 and bits ≥ 1, got {n_fields}, {bits}")
    return tuple(bits // n_fields + (1 if i < bits % n_fields else 0) for i in range(n_fields))


def _normal_cuts(levels: int) -> npt.NDArray[np.float64]:
    """The levels − 1 quantiles of N(0, 1) that cut a standardised value into equally likely
    levels (for a normal column)."""
    unit = NormalDist()
    return np.array([unit.inv_cdf(i / levels) for i in range(1, levels)], dtype=np.float64)


def field_codes(x: torch.Tensor | npt.NDArray[np.floating], fields: tuple[CodeField, ...],
                bits: int) -> npt.NDArray[np.int64]:
    """The ``fields`` code of each preprocessed row of ``x`` (k = 2^bits codes).

    Field i gets a_i bits (:func:`field_bits`) and its own digits of the code, the first field
    the least significant: a numeric value z is cut at the 2^a − 1 quantiles of N(0, 1)
    (level = how many cuts lie at or below z), a categorical block gives its active column's
    frequency rank, capped at 2^a − 1 (so the 2^a − 1 most frequent categories keep a level of
    their own and the rest, and an all-zero row of unknown values, share the last).
    """
    arr = x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)
    if arr.ndim != 2:
        raise ValueError(f"features must be a matrix, got shape {arr.shape}")
    if not fields:
        raise ValueError("the fields quantiser needs at least one field")
    end = max(f.start + f.width for f in fields)
    if arr.shape[1] < end:
        raise ValueError(f"features of width {arr.shape[1]} for fields up to column {end}")
    codes = np.zeros(arr.shape[0], dtype=np.int64)
    shift = 0
    for field, a in zip(fields, field_bits(len(fields), bits), strict=True):
        if a == 0:
            continue
        top = (1 << a) - 1
        block = arr[:, field.start:field.start + field.width]
        if field.ranks is None:
            level = np.searchsorted(_normal_cuts(1 << a), block[:, 0].astype(np.float64),
                                    side="right")
        else:
            rank = np.asarray(field.ranks, dtype=np.int64)[np.argmax(block, axis=1)]
            level = np.where(block.max(axis=1) > 0, np.minimum(rank, top), top)
        codes |= np.asarray(level, dtype=np.int64) << shift
        shift += a
    return codes
