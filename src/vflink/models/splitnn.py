"""The primary party's half of SplitNN (FedSim §2 "SplitNN", Figure 2(i)).

The primary runs its own bottom model on its features, concatenates the cut-layer embeddings of
every party, and feeds them to the aggregation (top) model. Primary rows without a linked
secondary row get a learned per-party "missing" embedding instead.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from vflink.models.mlp import build_mlp
from vflink.models.spec import BottomSpec

__all__ = ["SplitNNPrimary"]


class SplitNNPrimary(nn.Module):
    """Primary bottom model + aggregation model (+ missing embeddings).

    Args:
        n_features: width of the primary's encoded features (0: no primary bottom model).
        bottom: the primary's bottom spec (its ``out_dim`` is the primary's cut width).
        secondary_dims: cut width of each secondary party, in order.
        top_hidden: hidden sizes of the aggregation model.
        out_dim: number of outputs (1, or the number of classes).
        learn_missing: keep a learned embedding for unlinked rows of each secondary.
    """

    def __init__(self, n_features: int, bottom: BottomSpec, secondary_dims: Sequence[int],
                 top_hidden: Sequence[int], out_dim: int, *, learn_missing: bool) -> None:
        super().__init__()
        self.bottom: nn.Module | None = None
        width = 0
        if n_features > 0:
            self.bottom = build_mlp(n_features, bottom.hidden, bottom.out_dim,
                                    activation=bottom.activation, dropout=bottom.dropout)
            width += bottom.out_dim
        width += sum(secondary_dims)
        if width == 0:
            width = 1  # no features anywhere: the top model learns a constant (a prior)
        self.width = width
        self.top = build_mlp(width, top_hidden, out_dim, activation=bottom.activation,
                             dropout=bottom.dropout)
        self.missing = nn.ParameterList(
            [nn.Parameter(torch.zeros(d)) for d in secondary_dims] if learn_missing else []
        )

    def fill_missing(self, party: int, n: int, present: torch.Tensor,
                     embeddings: torch.Tensor) -> torch.Tensor:
        """Rows ``present`` get ``embeddings`` (in order); other rows the learned embedding."""
        if bool(present.all()):
            return embeddings
        base = self.missing[party].unsqueeze(0).expand(n, -1)
        out = base.clone()
        out[present] = embeddings
        return out

    def forward(self, x: torch.Tensor, secondary: Sequence[torch.Tensor]) -> torch.Tensor:
        parts = []
        if self.bottom is not None:
            parts.append(self.bottom(x))
        parts.extend(secondary)
        if not parts:
            parts.append(torch.zeros(x.shape[0], 1))
        return self.top(torch.cat(parts, dim=1))
