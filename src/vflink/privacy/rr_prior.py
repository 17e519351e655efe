"""Randomized response with a prior (Ghazi, Golowich, Kumar, Manurangsi & Zhang, "Deep
Learning with Label Differential Privacy", NeurIPS 2021, Algorithm 2, RRWithPrior).

Each training label is replaced, once, before training, by a draw that is ε-DP in the label:
given a prior p over the K classes, take the set Y_k of the k classes of highest prior mass with

    k* = argmax_k  e^ε / (e^ε + k − 1) · Σ_{c ∈ Y_k} p_c,

then output the true label with probability e^ε/(e^ε + k* − 1) and each other class of Y_k* with
1/(e^ε + k* − 1) when it lies in Y_k*, and a uniform class of Y_k* otherwise. Any two labels
change an output's probability by at most the factor e^ε (pure ε-label-DP for everything trained
on the randomised labels, no composition over epochs). With no model before training the prior
is uniform; then every k has mass k/K, the objective k·e^ε/(e^ε + k − 1) grows with k, and
RRWithPrior is K-ary randomized response (:func:`vflink.privacy.randomized_response.
keep_probability` gives its keep probability).

Pure functions; the primary applies them (:class:`vflink.privacy.label_protection.
LabelProtection`) to its training labels.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
import torch

from vflink.privacy.randomized_response import keep_probability

__all__ = ["best_top_k", "rr_with_prior", "uniform_prior"]


def uniform_prior(n: int, classes: int) -> npt.NDArray[np.float64]:
    """The prior before any model exists: every class equally likely, for ``n`` records."""
    return np.full((int(n), int(classes)), 1.0 / int(classes))


def best_top_k(prior: npt.ArrayLike, epsilon: float) -> tuple[int, npt.NDArray[np.int64]]:
    """k* and Y_k* (the classes of highest prior, ties in class order) of Algorithm 2."""
    p = np.asarray(prior, dtype=np.float64).reshape(-1)
    order = np.argsort(-p, kind="stable")
    mass = np.cumsum(p[order])
    k = np.arange(1, len(p) + 1)
    # e^ε/(e^ε + k − 1) = 1/(1 + (k − 1)e^−ε): no overflow at large ε
    value = mass / (1.0 + (k - 1) * math.exp(-epsilon))
    best = int(np.argmax(value + 1e-12 * k))  # ties: the larger set (the uniform prior: K-ary)
    return best + 1, order[:best + 1].astype(np.int64)


def rr_with_prior(labels: npt.ArrayLike, priors: npt.ArrayLike, epsilon: float,
                  generator: torch.Generator | None = None,
                  uniforms: npt.NDArray[np.float64] | None = None) -> npt.NDArray[np.int64]:
    """RRWithPrior of every label (class indices) with its own prior row, at ``epsilon``.

    ``uniforms``: two U[0, 1) draws per label, shape (n, 2) (the secure source's); otherwise
    drawn from ``generator``."""
    y = np.asarray(labels, dtype=np.int64).reshape(-1)
    p = np.asarray(priors, dtype=np.float64)
    if p.shape[0] != len(y):
        raise ValueError(f"{p.shape[0]} priors for {len(y)} labels")
    if uniforms is None:
        uniforms = torch.rand((len(y), 2), generator=generator, dtype=torch.float64).numpy()
    out = np.empty_like(y)
    cache: dict[bytes, tuple[int, npt.NDArray[np.int64]]] = {}
    for i, (label, row) in enumerate(zip(y, p, strict=True)):
        key = row.tobytes()
        if key not in cache:
            cache[key] = best_top_k(row, epsilon)
        k, top = cache[key]
        u_keep, u_pick = uniforms[i]
        if k == 1:
            out[i] = top[0]
            continue
        inside = label in top
        if inside and u_keep < keep_probability(epsilon, k):
            out[i] = label
        elif inside:  # one of the other k − 1 classes of Y_k, uniformly
            others = top[top != label]
            out[i] = others[min(int(u_pick * (k - 1)), k - 2)]
        else:
            out[i] = top[min(int(u_pick * k), k - 1)]
    return out
