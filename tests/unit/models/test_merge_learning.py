"""A toy where only the second most similar linked row carries the label (FedSim §3 motivation).

Top1Sim sees the most similar row only and stays at chance; FedSim sees all K rows, restores their
order with the sort gate (the rows arrive shuffled here) and learns the label. Trained with LAMB,
the optimiser FedSim uses (§6.1).
"""

from __future__ import annotations

import torch
from torch import nn

from vflink.models.lamb import Lamb
from vflink.models.merge import AggregatorConfig, build_aggregator
from vflink.models.mlp import seeded_init

K, D = 5, 4


def toy(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 2, (n,), generator=gen).float()
    emb = torch.randn(n, K, D, generator=gen)
    emb[:, 1, 0] = 2.0 * (2.0 * y - 1.0) + 0.3 * torch.randn(n, generator=gen)  # row 1 only
    sim = torch.sort(torch.randn(n, K, generator=gen), dim=1, descending=True).values
    return emb, sim, torch.ones(n, K, dtype=torch.bool), y


def shuffle(emb: torch.Tensor, sim: torch.Tensor, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    order = torch.argsort(torch.rand(sim.shape, generator=gen), dim=1)
    return emb.gather(1, order.unsqueeze(-1).expand_as(emb)), sim.gather(1, order)


def train_accuracy(name: str, *, shuffled: bool, steps: int = 300) -> float:
    cfg = AggregatorConfig(sim_hidden=(8,), conv_channels=4, k_conv=3, merge_hidden=(32,),
                           dropout=0.0, out_dim=8, seed=0)
    agg = build_aggregator(name, k=K, emb_dim=D, config=cfg)
    with seeded_init(1):
        head = nn.Linear(agg.out_dim, 1)
    model = nn.ModuleDict({"agg": agg, "head": head})
    opt = Lamb(model.parameters(), lr=2e-2, weight_decay=1e-5)
    emb, sim, mask, y = toy(1024, seed=0)
    if shuffled:
        emb, sim = shuffle(emb, sim, seed=1)
    gen = torch.Generator().manual_seed(2)
    for _ in range(steps):
        idx = torch.randint(0, emb.shape[0], (64,), generator=gen)
        logit = head(agg(emb[idx], sim[idx], mask[idx])).squeeze(-1)
        loss = nn.functional.binary_cross_entropy_with_logits(logit, y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    emb_t, sim_t, mask_t, y_t = toy(1024, seed=10)
    if shuffled:
        emb_t, sim_t = shuffle(emb_t, sim_t, seed=11)
    with torch.no_grad():
        pred = head(agg(emb_t, sim_t, mask_t)).squeeze(-1) > 0
    return float((pred == y_t.bool()).float().mean())


def test_fedsim_uses_the_second_most_similar_row() -> None:
    assert train_accuracy("fedsim", shuffled=True) > 0.9


def test_top1sim_cannot_see_it() -> None:
    assert train_accuracy("top1sim", shuffled=False) < 0.6
