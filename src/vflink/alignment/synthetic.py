"""Synthetic labels and features for records a party does not hold (FLORIST §2.4, §3, App. H),
logits-shift calibration (App. E-G), and the named strategies of the paper's experiments.

Training runs over the union U of both parties' records. For a UID the active party (labels)
lacks it feeds a synthetic label; for a UID the passive party lacks it feeds synthetic
features (raw features through its bottom model, or a synthetic cut-layer embedding). These
are pure functions of arrays/tensors and an explicit generator; the parties call them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch

from vflink.randomness import NoiseSource, as_source
from vflink.registry import Registry

__all__ = [
    "FEATURE_STRATEGIES",
    "LABEL_STRATEGIES",
    "STRATEGIES",
    "Calibration",
    "EmbeddingStats",
    "FeatureStrategy",
    "LabelContext",
    "Strategy",
    "assigned_rows",
    "gaussian_embeddings",
    "get_strategy",
    "knn_labels",
    "moving_average_embeddings",
    "sampled_rows",
    "shift_for_test",
    "shift_for_training",
]


# --- synthetic labels (active party, §3.1 and App. H) -----------------------------------------


@dataclass(frozen=True)
class LabelContext:
    """What the active party knows when it fills labels for the rows of a batch it lacks.

    ``positive_rate`` is the rate of positives among its own labels; ``probabilities`` the
    model's current predicted P(y = 1) for each missing row (label-random-pred);
    ``embeddings`` the received cut-layer embeddings of the missing rows and ``real_embeddings``
    / ``real_labels`` those of the batch's real rows (label-neighbors).
    """

    n: int
    positive_rate: float
    #: the active party's noise source (secret unless the run asked for reproducible noise:
    #: vflink.randomness); a seeded ``torch.Generator`` is a reproducible one
    generator: NoiseSource | torch.Generator
    probabilities: torch.Tensor | None = None
    embeddings: torch.Tensor | None = None
    real_embeddings: torch.Tensor | None = None
    real_labels: torch.Tensor | None = None
    samples: int = 1


LabelFn = Callable[[LabelContext], torch.Tensor]
LABEL_STRATEGIES: Registry[LabelFn] = Registry("synthetic label strategy")


def _majority(ctx: LabelContext) -> torch.Tensor:
    # §3.1: imbalanced data, so the majority class (0 for the usual minority-positive case)
    return torch.full((ctx.n,), 0.0 if ctx.positive_rate <= 0.5 else 1.0)


def _minority(ctx: LabelContext) -> torch.Tensor:
    return 1.0 - _majority(ctx)


def _random_pos(ctx: LabelContext) -> torch.Tensor:
    # §3.1 (2): Bernoulli with the positive rate of the active party's own labels
    return (as_source(ctx.generator).uniform((ctx.n,)) < ctx.positive_rate).float()


def _random_pred(ctx: LabelContext) -> torch.Tensor:
    # App. H: y ~ p(·|x) from the current model; with several sample times the label is the
    # mean of the draws, which averages their gradients (Table 5's utility/privacy trade-off)
    if ctx.probabilities is None:
        raise ValueError("label-random-pred needs the model's predicted probabilities")
    p = ctx.probabilities.detach().reshape(-1).clamp(0.0, 1.0)
    draws = as_source(ctx.generator).uniform((max(1, ctx.samples), ctx.n)) < p
    return draws.float().mean(dim=0)


def knn_labels(query: torch.Tensor, reference: torch.Tensor, labels: torch.Tensor, *,
               k: int = 3) -> torch.Tensor:
    """Majority label of the ``k`` most cosine-similar reference rows (label-neighbors)."""
    if len(reference) == 0:
        return torch.zeros(len(query))
    q = torch.nn.functional.normalize(query.detach().float(), dim=1)
    r = torch.nn.functional.normalize(reference.detach().float(), dim=1)
    top = (q @ r.T).topk(min(k, len(reference)), dim=1).indices
    return (labels.float()[top].mean(dim=1) > 0.5).float()


def _neighbors(ctx: LabelContext) -> torch.Tensor:
    # §3.1 (4): k = 3 nearest real rows of the batch by cosine similarity of cut-layer
    # embeddings
    if ctx.embeddings is None or ctx.real_embeddings is None or ctx.real_labels is None:
        raise ValueError("label-neighbors needs the cut-layer embeddings of the batch")
    return knn_labels(ctx.embeddings, ctx.real_embeddings, ctx.real_labels, k=3)


for _name, _fn in (("label-majority", _majority), ("label-minority", _minority),
                   ("label-random-pos", _random_pos), ("label-random-pred", _random_pred),
                   ("label-neighbors", _neighbors)):
    LABEL_STRATEGIES.add(_name, _fn)


# --- synthetic features (passive party, §2.4 and §3.2) ----------------------------------------


@dataclass(frozen=True)
class FeatureStrategy:
    """How the passive party fills rows it lacks.

    ``raw = True``: synthetic *raw* features go through the bottom model like real ones
    (fea-sampling). Otherwise synthetic *cut-layer embeddings* are drawn (fea-gaussian,
    fea-random) and get no gradient.
    """

    name: str
    raw: bool


FEATURE_STRATEGIES: Registry[FeatureStrategy] = Registry("synthetic feature strategy")
for _fs in (FeatureStrategy("fea-sampling", True), FeatureStrategy("fea-gaussian", False),
            FeatureStrategy("fea-random", False)):
    FEATURE_STRATEGIES.add(_fs.name, _fs)


def sampled_rows(own_rows: npt.NDArray[np.int64], n: int, rng: np.random.Generator
                 ) -> npt.NDArray[np.int64]:
    """fea-sampling (§2.4): a random real record of our own for each missing row, the
    empirical marginal that Theorem 2 shows minimises KL(D || D')."""
    return own_rows[rng.integers(0, len(own_rows), size=n)]


def assigned_rows(own_rows: npt.NDArray[np.int64], n: int, key: bytes | np.random.Generator
                  ) -> npt.NDArray[np.int64]:
    """fea-sampling with a fixed keyed assignment: a real record of our own for each
    of ``n`` missing rows, drawn once per session from ``key`` instead of afresh on every call.

    Each missing row still gets a uniformly random own record, the empirical marginal of §2.4
    (Theorem 2), but always the same one: asked twice, it answers as that record does, so
    repeated questions cannot tell it from a real row. The draws are balanced (a keyed
    permutation of ``own_rows``, repeated as often as needed): every record stands in for
    ⌊n/|own|⌋ or ⌈n/|own|⌉ missing rows, which keeps groups of identical embeddings as even in
    size as they can be (their sizes are what duplicates still reveal:
    docs/how-to/private-set-union.md).

    ``key``: a generator keyed by the party's secret (:func:`vflink.randomness.keyed_generator`),
    or bytes seeding numpy's default generator (reproducible noise only).
    """
    if n == 0:
        return np.empty(0, dtype=np.int64)
    if len(own_rows) == 0:
        raise ValueError("fea-sampling needs at least one own record")
    rng = key if isinstance(key, np.random.Generator) else \
        np.random.default_rng(int.from_bytes(key, "little"))
    reps = -(-n // len(own_rows))
    pool = np.concatenate([rng.permutation(own_rows) for _ in range(reps)])
    return pool[:n].astype(np.int64)


def gaussian_embeddings(real: torch.Tensor, n: int, generator: NoiseSource | torch.Generator,
                        *, s: float = 1.0) -> torch.Tensor:
    """fea-gaussian (§3.2 (1)): N(0, (s/d)·max_i ||f(x_i)||² I) over the batch's real rows."""
    d = real.shape[1]
    scale = float(real.detach().norm(dim=1).max()) if len(real) else 1.0
    std = math.sqrt(s / d) * scale
    return as_source(generator).normal((n, d)) * std


@dataclass
class EmbeddingStats:
    """Moving averages of the real embeddings' per-dimension mean and std (fea-random)."""

    momentum: float = 0.9
    mean: torch.Tensor | None = None
    std: torch.Tensor | None = None

    def update(self, real: torch.Tensor) -> None:
        if len(real) < 2:
            return
        m, s = real.detach().mean(dim=0), real.detach().std(dim=0)
        if self.mean is None or self.std is None:
            self.mean, self.std = m, s
        else:
            self.mean = self.momentum * self.mean + (1 - self.momentum) * m
            self.std = self.momentum * self.std + (1 - self.momentum) * s


def moving_average_embeddings(stats: EmbeddingStats, n: int, d: int,
                              generator: NoiseSource | torch.Generator) -> torch.Tensor:
    """fea-random (§3.2 (2)): N(μ, σ²) with the moving averages of the real embeddings."""
    mean = stats.mean if stats.mean is not None else torch.zeros(d)
    std = stats.std if stats.std is not None else torch.ones(d)
    return mean + std * as_source(generator).normal((n, d))


# --- logits-shift calibration (App. E-G) -------------------------------------------------------


@dataclass(frozen=True)
class Calibration:
    """The distortion D'(y=1|x) = a·D(y=1|x) + b of the training distribution (App. E-G).

    label-majority only (Eq. 1): a = p_a, b = 0. fea-sampling only (Eq. 2): a = p_p,
    b = (1 - p_p)·π. Both (Eq. 3): a = p_a·p_p, b = p_a·(1 - p_p)·π. p_a and p_p are the
    fractions of the union held by the active and the passive party (public after PSU:
    |I_a|, |I_p|, |U|), π = D(y = 1) estimated from the active party's own labels.
    """

    a: float = 1.0
    b: float = 0.0

    @classmethod
    def for_synthetic(cls, *, labels: bool, features: bool, p_a: float, p_p: float,
                      positive_rate: float) -> Calibration:
        if labels and features:
            return cls(p_a * p_p, p_a * (1 - p_p) * positive_rate)
        if labels:
            return cls(p_a, 0.0)
        if features:
            return cls(p_p, (1 - p_p) * positive_rate)
        return cls()


def shift_for_training(p: torch.Tensor, c: Calibration) -> torch.Tensor:
    """``-tr``: the model outputs D; the loss is computed on D' = a·D + b (App. E)."""
    return (c.a * p + c.b).clamp(1e-7, 1 - 1e-7)


def shift_for_test(p: npt.NDArray[np.floating], c: Calibration) -> npt.NDArray[np.float64]:
    """``-te``: the model outputs D'; at test time D = (D' - b) / a, clipped to [0, 1]."""
    return np.clip((np.asarray(p, dtype=np.float64) - c.b) / c.a, 0.0, 1.0)


# --- the named strategies of FLORIST §3 ------------------------------------------------------


# The named configurations live in a light module, so `vflink --help` (which lists every
# algorithm) does not import numpy and torch.
from vflink.alignment.strategies import STRATEGIES, Strategy, get_strategy  # noqa: E402
