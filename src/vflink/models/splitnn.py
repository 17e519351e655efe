"""The primary party's model: SplitNN per linked pair, then an aggregator over the K pairs.

FedSim Algorithm 1: for primary record i and each of its K linked secondary records, SplitNN
runs on the pair — the primary's bottom model on x_i, each secondary's bottom model on its row,
and the aggregation (top) model on the concatenated cut-layer embeddings — giving the K × l_m
matrix o_i (lines 4-7). An aggregator then merges o_i into the prediction: FedSim's weight, sort
and merge gates (lines 8-11), or a baseline (Top1Sim: the top-1 pair; AvgSim: the mean over the
pairs; FeatureSim: the mean with the similarity as an extra feature).

With K = 1 and the ``top1sim`` aggregator this is plain SplitNN (FedSim §2, Figure 2(i)).
Linked rows that are missing get a learned per-party "missing" embedding when ``learn_missing``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from vflink.models.cnn import build_bottom
from vflink.models.merge import AggregatorConfig, build_aggregator
from vflink.models.mlp import build_mlp
from vflink.models.spec import BottomSpec

__all__ = ["SplitNNPrimary", "pair_width"]

#: Aggregators that average or pick per-pair *predictions*: their pairs output the label width.
_PREDICTION_AGGREGATORS = ("top1sim", "avgsim")


def pair_width(aggregator: str, n_outputs: int, pair_dim: int) -> int:
    """l_m, the width of each pair's SplitNN output."""
    return n_outputs if aggregator in _PREDICTION_AGGREGATORS else pair_dim


class SplitNNPrimary(nn.Module):
    """Primary bottom model + per-pair aggregation model + aggregator (+ missing embeddings).

    Args:
        n_features: width of the primary's encoded features (0: no primary bottom model).
        bottom: the primary's bottom spec (its ``out_dim`` is the primary's cut width).
        secondary_dims: cut width of each secondary party, in order.
        top_hidden: hidden sizes of the per-pair aggregation model.
        n_outputs: number of outputs (1, or the number of classes).
        learn_missing: keep a learned embedding for unlinked rows of each secondary.
        aggregator: registered aggregator name (``top1sim`` for SplitNN).
        k: linked rows per primary record.
        aggregator_config: settings of the learned merge models.
        pair_dim: l_m for the learned aggregators (Figure 10 uses 10).
    """

    def __init__(self, n_features: int, bottom: BottomSpec, secondary_dims: Sequence[int],
                 top_hidden: Sequence[int], n_outputs: int, *, learn_missing: bool,
                 aggregator: str = "top1sim", k: int = 1,
                 aggregator_config: AggregatorConfig | None = None, pair_dim: int = 10) -> None:
        super().__init__()
        self.bottom: nn.Module | None = None
        width = 0
        if n_features > 0:
            self.bottom = build_bottom(bottom, n_features)  # an MLP or a CNN (VFL-AFE §4.1)
            width += bottom.out_dim
        width += sum(secondary_dims)
        if width == 0:
            width = 1  # no features anywhere: the model learns a constant (a prior)
        self.width = width
        l_m = pair_width(aggregator, n_outputs, pair_dim)
        self.top = build_mlp(width, top_hidden, l_m, activation=bottom.activation,
                             dropout=bottom.dropout)
        config = aggregator_config or AggregatorConfig()
        if config.out_dim is None:
            config = AggregatorConfig(**{**config.__dict__, "out_dim": n_outputs})
        self.aggregator = build_aggregator(aggregator, k=k, emb_dim=l_m, config=config)
        # Aggregators whose width is fixed by l_m (mean, FeatureSim) get a linear head.
        self.head: nn.Module = (nn.Identity() if self.aggregator.out_dim == n_outputs
                                else nn.Linear(self.aggregator.out_dim, n_outputs))
        self.missing = nn.ParameterList(
            [nn.Parameter(torch.zeros(d)) for d in secondary_dims] if learn_missing else []
        )

    def forward(self, x: torch.Tensor, secondary: Sequence[torch.Tensor], sim: torch.Tensor,
                mask: torch.Tensor) -> torch.Tensor:
        """``x``: (B, F); ``secondary``: one (B, K, d_j) tensor per party; ``sim``, ``mask``:
        (B, K). Returns (B, n_outputs) logits."""
        b, k = mask.shape
        parts = []
        if self.bottom is not None:
            parts.append(self.bottom(x).unsqueeze(1).expand(b, k, -1))
        parts.extend(secondary)
        if not parts:
            parts.append(torch.zeros(b, k, 1, device=mask.device))
        pairs = self.top(torch.cat(parts, dim=-1))
        return self.head(self.aggregator(pairs, sim, mask))
