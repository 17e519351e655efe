"""What the §4.3 attacks share: the public release mechanism and a small trainable split model.

An attacker who mimics a secondary (shadow models, Shokri et al. 2017) needs the release the
secondary applies: clip to t (or, ``normalized``, scale onto the sphere of radius t),
optionally rescale (VFL-AFE §3.2), add N(0, std²); or, ``randomized-response`` (a departure
from the paper, docs/how-to/privacy.md), k-ary randomized response at ε on the code whose
one-hot the shadow's bottom gives (its bottom is then the victim's fixed quantiser, see
:class:`CodeBottom`). These settings are public (the privacy ledger states them), so the
attacker may use them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from torch import nn

from vflink.models.mlp import build_mlp, seeded_init
from vflink.privacy import afe
from vflink.privacy import randomized_response as rr

__all__ = ["CodeBottom", "Release", "ShadowSplitModel", "released_embeddings",
           "released_posteriors", "train_split_model"]


@dataclass(frozen=True)
class Release:
    """The secondary's public release mechanism (identity when ``noise_std`` is 0 and no clip)."""

    clip: float | None = None
    noise_std: float = 0.0
    rescale: bool = False
    #: scale onto the sphere of radius ``clip`` instead of clipping (``normalized``)
    normalize: bool = False
    #: ``randomized-response``: k (0: off) and ε of the response on the one-hot's code
    response_k: int = 0
    response_epsilon: float = 0.0

    @classmethod
    def from_extra(cls, extra: Mapping[str, Any]) -> Release:
        m = extra.get("mechanism") or {}
        return cls(clip=m.get("clip"), noise_std=float(m.get("noise_std", 0.0)),
                   rescale=bool(m.get("rescale", False)),
                   normalize=bool(m.get("normalize", False)),
                   response_k=int(m.get("response_k", 0)),
                   response_epsilon=float(m.get("response_epsilon", 0.0)))

    def __call__(self, h: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        if self.response_k:  # h: one-hot codes (a CodeBottom's output)
            codes = h.detach().argmax(dim=1).numpy().astype(np.int64)
            return rr.one_hot(rr.randomized_response(codes, self.response_k,
                                                     self.response_epsilon, generator),
                              self.response_k)
        if self.clip is not None and self.normalize:
            h = afe.normalize_to_sphere(h, self.clip)
        elif self.clip is not None:
            h = afe.clip_norm(h, self.clip)
            if self.rescale:
                d = afe.pairwise_distances(h.detach(), generator=generator)
                h = afe.rescale(h, self.clip, afe.sensitivity_estimate(d))
        if self.noise_std > 0:
            h = h + afe.gaussian_noise(tuple(h.shape), self.noise_std, generator)
        return h


class CodeBottom(nn.Module):
    """A fixed bottom model: the one-hot of a quantiser's code (``randomized-response``'s
    secondary trains nothing; its code is a public function of the row)."""

    def __init__(self, quantise: Callable[[torch.Tensor], npt.NDArray[np.int64]], k: int
                 ) -> None:
        super().__init__()
        self.quantise, self.k = quantise, int(k)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rr.one_hot(self.quantise(x), self.k)


class ShadowSplitModel(nn.Module):
    """Bottom model → release → linear head: a one-secondary stand-in for the VFL model."""

    def __init__(self, in_dim: int, hidden: tuple[int, ...], cut_dim: int, classes: int,
                 bottom: CodeBottom | None = None) -> None:
        super().__init__()
        self.bottom: nn.Module = bottom if bottom is not None else build_mlp(in_dim, hidden,
                                                                             cut_dim)
        self.head = nn.Linear(bottom.k if bottom is not None else cut_dim, classes)


def train_split_model(x: npt.NDArray[np.floating[Any]], y: npt.NDArray[np.int64], *,
                      classes: int, release: Release, hidden: tuple[int, ...] = (128,),
                      cut_dim: int = 16, epochs: int = 30, lr: float = 1e-3,
                      batch_size: int = 64, seed: int = 0,
                      bottom: CodeBottom | None = None) -> ShadowSplitModel:
    """Train bottom + head on (x, y) with ``release`` at the cut layer (as the victim trains;
    a fixed ``bottom`` stays as it is and only the head learns)."""
    gen = torch.Generator().manual_seed(seed)
    with seeded_init(seed):
        model = ShadowSplitModel(x.shape[1], hidden, cut_dim, classes, bottom)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    xt = torch.as_tensor(np.asarray(x, dtype=np.float32))
    yt = torch.as_tensor(np.asarray(y, dtype=np.int64))
    loss_fn = nn.CrossEntropyLoss()
    for _ in range(epochs):
        order = torch.randperm(len(xt), generator=gen)
        for start in range(0, len(xt), batch_size):
            idx = order[start:start + batch_size]
            logits = model.head(release(model.bottom(xt[idx]), gen))
            loss = loss_fn(logits, yt[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    return model


def released_embeddings(model: ShadowSplitModel, x: npt.NDArray[np.floating[Any]],
                        release: Release, generator: torch.Generator
                        ) -> npt.NDArray[np.float64]:
    """What the shadow's secondary would release for ``x`` (evaluation mode, with noise)."""
    with torch.no_grad():
        h = model.bottom(torch.as_tensor(np.asarray(x, dtype=np.float32)))
        out = [release(h[i:i + 512], generator) for i in range(0, len(h), 512)]
    return torch.cat(out).double().numpy() if out else np.zeros((0, 0))


def released_posteriors(model: ShadowSplitModel, x: npt.NDArray[np.floating[Any]],
                        release: Release, generator: torch.Generator
                        ) -> npt.NDArray[np.float64]:
    """Class probabilities of the shadow's head on its released embeddings of ``x``."""
    emb = released_embeddings(model, x, release, generator)
    with torch.no_grad():
        return torch.softmax(model.head(torch.as_tensor(emb, dtype=torch.float32)), dim=1
                             ).double().numpy()
