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

Pure functions; the stateful wrapper (noise generator, budget, calibration, ledger) is
:class:`vflink.privacy.label_protection.LabelProtection`.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import numpy.typing as npt
import torch
from torch.nn import functional as F

from vflink.types import Task

__all__ = ["LossFn", "binary_sensitivity", "logit_gradient", "per_record_gradient",
           "planned_label_releases", "sensitivity"]

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
