"""What the §4.3 attacks share: the public release mechanism and a small trainable split model.

An attacker who mimics a secondary (shadow models, Shokri et al. 2017) needs the release the
secondary applies: clip to t, optionally rescale (VFL-AFE §3.2), add N(0, std²). These settings
are public (the privacy ledger states them), so the attacker may use them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from torch import nn

from vflink.models.mlp import build_mlp, seeded_init
from vflink.privacy import afe

__all__ = ["Release", "ShadowSplitModel", "released_embeddings", "released_posteriors",
           "train_split_model"]


@dataclass(frozen=True)
class Release:
    """The secondary's public release mechanism (identity when ``noise_std`` is 0 and no clip)."""

    clip: float | None = None
    noise_std: float = 0.0
    rescale: bool = False

    @classmethod
    def from_extra(cls, extra: Mapping[str, Any]) -> Release:
        m = extra.get("mechanism") or {}
        return cls(clip=m.get("clip"), noise_std=float(m.get("noise_std", 0.0)),
                   rescale=bool(m.get("rescale", False)))

    def __call__(self, h: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        if self.clip is not None:
            h = afe.clip_norm(h, self.clip)
            if self.rescale:
                d = afe.pairwise_distances(h.detach(), generator=generator)
                h = afe.rescale(h, self.clip, afe.sensitivity_estimate(d))
        if self.noise_std > 0:
            h = h + afe.gaussian_noise(tuple(h.shape), self.noise_std, generator)
        return h


class ShadowSplitModel(nn.Module):
    """Bottom model → release → linear head: a one-secondary stand-in for the VFL model."""

    def __init__(self, in_dim: int, hidden: tuple[int, ...], cut_dim: int, classes: int) -> None:
        super().__init__()
        self.bottom = build_mlp(in_dim, hidden, cut_dim)
        self.head = nn.Linear(cut_dim, classes)


def train_split_model(x: npt.NDArray[np.floating[Any]], y: npt.NDArray[np.int64], *,
                      classes: int, release: Release, hidden: tuple[int, ...] = (128,),
                      cut_dim: int = 16, epochs: int = 30, lr: float = 1e-3,
                      batch_size: int = 64, seed: int = 0) -> ShadowSplitModel:
    """Train bottom + head on (x, y) with ``release`` at the cut layer (as the victim trains)."""
    gen = torch.Generator().manual_seed(seed)
    with seeded_init(seed):
        model = ShadowSplitModel(x.shape[1], hidden, cut_dim, classes)
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
