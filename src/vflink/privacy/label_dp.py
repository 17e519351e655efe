"""Label differential privacy where the labels enter: the per-record loss gradient at the logits.

The gradient a primary sends back at step t depends on the batch's labels *and* on its
parameters θ_t, which were trained on every earlier label; noising only the cut-layer rows
would leave θ_t carrying the labels in clear into every later message. The label of record i
enters the computation at one place only, the gradient of its loss term with respect to its
logits, g_i = ∂ℓ_i/∂z_i (the logits z_i themselves depend on the features and on θ_t, not on
y_i at this step). So the primary releases

    g̃_i = g_i + N(0, (σ·Δ)² I),

Δ the L2 sensitivity of g_i to changing y_i, and back-propagates the batch mean of g̃_i through
its *whole* network: its own parameter updates and every gradient it sends to a secondary are
post-processing of the noisy g̃_i. Each training step that contains record i is one Gaussian
release of multiplier σ for its label, composed over the run with the project's PLD accountant
(:mod:`vflink.privacy.accounting`); there is no subsampling amplification (the secondaries see
which rows are in each batch, the same choice as for embeddings).

The losses are those of :meth:`vflink.data.labels.LabelCodec.loss` (batch means, no class
weights):

=============  ==================================  =====================================
task           g_i (the loss term's gradient)       Δ (L2, changing y_i)
=============  ==================================  =====================================
binary         σ(z_i) − y_i (BCE with logits)       1
multi-class    softmax(z_i) − e_{y_i} (CE)          √2 (two one-hots differ by √2)
regression     clip(2(z_i − y_i), −C, C) (MSE)      2C (the clip bounds the range)
=============  ==================================  =====================================

For a loss that is none of these (FLORIST's ``-tr`` logits shift trains on a shifted
probability, :func:`vflink.alignment.synthetic.shift_for_training`), :func:`binary_sensitivity`
measures each record's |g_i(y = 1) − g_i(y = 0)| at its own logit: it depends on z_i only, not
on y_i, so noise σ times it is the same Gaussian mechanism of multiplier σ.

**Using the releases: the posterior (``privacy.labels_denoise = "posterior"``, the default on
a classification task).** On a 0/1 label, g̃_i = σ(z_i) − y_i + σ·n_i with σ ≈ 5 at ε = 4 over
20 releases: each release alone says almost nothing, and a record's releases, used one epoch
at a time, leave the optimiser to average out noise five times its signal. But everything the
primary computes from the releases is post-processing, so it may combine them: for each
candidate label k the gradient g_i^(k) is known (it depends on z_i, not on y_i), each release's
likelihood is N(g̃_i; g_i^(k), s²I) with s = σΔ (:func:`release_log_likelihood`), and a record's
log-likelihoods add up over its releases (each with its own z and its own fresh noise). The
primary trains on the posterior mean of the gradient given every release so far,
E[g_i | releases] = Σ_k P(y_i = k | releases)·g_i^(k) (:func:`posterior_gradient`), under a
uniform prior (the soft labels of Malek et al., *Antipodes of Label Differential Privacy:
PATE and ALIBI*, NeurIPS 2021, here with Gaussian releases accumulated over the epochs). For a
binary label that is σ(z_i) − σ(L_i), L_i the record's summed log-likelihood ratio: a target
in (0, 1) that sharpens as releases accumulate, instead of a target of unbounded noise.

The prior is uniform on purpose: a prior from the model (the Bayes-optimal choice for a record
the model has not trained on) feeds the model's own belief back as evidence about records it
was fitted to, and measured no better (docs/how-to/label-protection.md). With a uniform prior the
model's fixed point is p(x) = B + q(x)(A − B) (q = P(y = 1 | x), A, B the mean posterior of a
positive and of a negative record): a monotone function of q, so the ranking (AUC) and the cut
at 1/2 are those of q, while the probabilities are drawn towards 1/2.

Pure functions; the stateful wrapper (noise generator, budget, calibration, ledger, each
record's summed log-likelihoods) is :class:`vflink.privacy.label_protection.LabelProtection`.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import numpy.typing as npt
import torch
from torch.nn import functional as F

from vflink.types import Task

__all__ = ["LossFn", "binary_sensitivity", "candidate_gradients", "logit_gradient",
           "per_record_gradient", "planned_label_releases", "posterior_gradient",
           "release_log_likelihood", "sensitivity"]

#: a batch-mean loss ``loss(logits, target)`` whose i-th term depends on the i-th logits only
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def sensitivity(task: Task, clip: float = 1.0) -> float:
    """Δ of :func:`logit_gradient` for ``task`` (see the module's table)."""
    if task is Task.BINARY:
        return 1.0
    if task is Task.MULTICLASS:
        return math.sqrt(2.0)
    return 2.0 * float(clip)


def logit_gradient(task: Task, logits: torch.Tensor, target: torch.Tensor, *,
                   clip: float = 1.0) -> torch.Tensor:
    """g_i = ∂ℓ_i/∂z_i of :meth:`LabelCodec.loss` per record, in ``logits``'s shape (regression:
    clipped to [−``clip``, ``clip``]). ``loss.backward()`` equals ``logits.backward(g / B)``
    wherever no clip applies."""
    z = logits.detach()
    if task is Task.BINARY:
        y = target.detach().to(z.dtype).reshape(z.shape)
        return torch.sigmoid(z) - y
    if task is Task.MULTICLASS:
        y = target.detach().long().reshape(-1)
        return torch.softmax(z, dim=-1) - F.one_hot(y, z.shape[-1]).to(z.dtype)
    y = target.detach().to(z.dtype).reshape(z.shape)
    return (2.0 * (z - y)).clamp(-float(clip), float(clip))


def per_record_gradient(loss: LossFn, logits: torch.Tensor, target: torch.Tensor
                        ) -> torch.Tensor:
    """B · ∇_z loss: each record's g_i for a batch-mean ``loss`` (by autograd, for losses
    without a closed form here)."""
    z = logits.detach().clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(loss(z, target) * z.shape[0], z)
    return grad.detach()


def binary_sensitivity(loss: LossFn, logits: torch.Tensor) -> torch.Tensor:
    """|g_i(y = 1) − g_i(y = 0)| per record (a column, broadcastable over ``logits``): what
    changing the binary label of record i can change its gradient by, at its own logit."""
    ones = torch.ones(logits.shape[0], dtype=logits.dtype)
    g1 = per_record_gradient(loss, logits, ones)
    g0 = per_record_gradient(loss, logits, torch.zeros_like(ones))
    diff = (g1 - g0).reshape(logits.shape[0], -1)
    return torch.linalg.vector_norm(diff, dim=1).reshape(-1, *([1] * (logits.dim() - 1)))


def planned_label_releases(n_rows: int, train_rows: npt.NDArray[np.int64], epochs: int
                           ) -> npt.NDArray[np.int64]:
    """Releases per record a run of ``epochs`` plans: one per epoch for each training record
    (it is in one batch per epoch), none for the others (evaluation sends no gradient)."""
    out = np.zeros(int(n_rows), dtype=np.int64)
    out[np.unique(np.asarray(train_rows, dtype=np.int64))] = int(epochs)
    return out


def candidate_gradients(task: Task, logits: torch.Tensor, *,
                        loss: LossFn | None = None) -> torch.Tensor:
    """g_i^(k): record i's loss gradient at its logits if its label were class k, for every
    class, shape ``(B, k, *logits.shape[1:])`` (binary: k = 2, classes 0 and 1). They depend
    on the logits only, never on a label. ``loss``: a binary loss without a closed form here
    (by autograd, as :func:`binary_sensitivity`)."""
    z = logits.detach()
    if task is Task.REGRESSION:
        raise ValueError("a regression label has no classes to weigh")
    if task is Task.BINARY:
        if loss is not None:
            ones = torch.ones(z.shape[0], dtype=z.dtype)
            return torch.stack([per_record_gradient(loss, z, torch.zeros_like(ones)),
                                per_record_gradient(loss, z, ones)], dim=1)
        p = torch.sigmoid(z)
        return torch.stack([p, p - 1.0], dim=1)
    p = torch.softmax(z, dim=-1)
    eye = torch.eye(z.shape[-1], dtype=z.dtype)
    return p[:, None, :] - eye[None, :, :]


def release_log_likelihood(noisy: torch.Tensor, candidates: torch.Tensor,
                           scale: torch.Tensor | float) -> torch.Tensor:
    """log N(g̃_i; g_i^(k), s_i²I) up to a term that does not depend on k, shape ``(B, k)``:
    how well each candidate label explains record i's release ``noisy`` (``scale``: s = σΔ,
    a float or one per record). Float64."""
    g = noisy.detach().double().reshape(noisy.shape[0], 1, -1)
    c = candidates.detach().double().reshape(candidates.shape[0], candidates.shape[1], -1)
    s = torch.as_tensor(scale, dtype=torch.float64).reshape(-1, 1)
    return -((g - c) ** 2).sum(dim=2) / (2.0 * s ** 2)


def posterior_gradient(candidates: torch.Tensor, log_likelihood: torch.Tensor) -> torch.Tensor:
    """E[g_i | releases] = Σ_k P(k | releases)·g_i^(k) under a uniform prior, where
    ``log_likelihood`` (``(B, k)``) is each record's summed :func:`release_log_likelihood`
    over its releases; in ``candidates``' dtype and in the shape of one candidate."""
    post = torch.softmax(log_likelihood.double(), dim=1)
    c = candidates.double()
    out = (post.reshape(*post.shape, *([1] * (c.dim() - 2))) * c).sum(dim=1)
    return out.to(candidates.dtype)
