"""FedSim's "average" merge gate: the authors' linear merge on their synthetic data."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vflink.errors import ConfigError
from vflink.models.merge import AggregatorConfig, FedSimAggregator, build_aggregator


def test_average_is_the_normalised_weighted_sum() -> None:
    agg = build_aggregator("fedsim", k=4, emb_dim=2, config=AggregatorConfig(merge="average"))
    assert isinstance(agg, FedSimAggregator) and agg.out_dim == 2
    gen = torch.Generator().manual_seed(0)
    emb = torch.randn(5, 4, 2, generator=gen)
    sim = torch.randn(5, 4, generator=gen)
    mask = torch.ones(5, 4, dtype=torch.bool)
    mask[1, 2:] = False
    with torch.no_grad():
        out = agg(emb, sim, mask)
        for i in range(5):
            valid = mask[i]
            w = agg.weights(sim[i][valid]) + 1e-7  # oracle: the formula, row by row
            expect = (emb[i][valid] * w[:, None]).sum(0) / w.sum()
            torch.testing.assert_close(out[i], expect)


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 6), st.integers(0, 2**16))
def test_average_accepts_any_k_and_stays_in_the_hull(k: int, seed: int) -> None:
    agg = build_aggregator("fedsim", k=3, emb_dim=1, config=AggregatorConfig(merge="average"))
    gen = torch.Generator().manual_seed(seed)
    emb = torch.randn(4, k, 1, generator=gen)
    with torch.no_grad():
        out = agg(emb, torch.randn(4, k, generator=gen), torch.ones(4, k, dtype=torch.bool))
    assert (out[:, 0] <= emb[:, :, 0].max(1).values + 1e-5).all()
    assert (out[:, 0] >= emb[:, :, 0].min(1).values - 1e-5).all()


def test_ablations_keep_their_own_merge_and_bad_names_fail() -> None:
    agg = build_aggregator("fedsim-mlp-merge", k=3, emb_dim=2,
                           config=AggregatorConfig(merge="average"))
    assert isinstance(agg, FedSimAggregator) and agg.merge_kind == "mlp"
    with pytest.raises(ConfigError, match="merge"):
        AggregatorConfig(merge="median")
