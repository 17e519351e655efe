"""The merge models that aggregate K soft-linked rows (FedSim §3, §4.2, §6.1)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from vflink.errors import ConfigError, DataError, UnknownNameError
from vflink.models.merge import (
    AGGREGATORS,
    AggregatorConfig,
    FedSimAggregator,
    aggregator_names,
    build_aggregator,
)

ALL = (
    "avgsim",
    "featuresim",
    "fedsim",
    "fedsim-mean-merge",
    "fedsim-mlp-merge",
    "fedsim-no-sort",
    "fedsim-no-weight",
    "top1sim",
)
# Names whose output does not depend on the order the slots arrive in.
ORDER_FREE = ("avgsim", "featuresim", "fedsim", "fedsim-mean-merge", "fedsim-mlp-merge",
              "fedsim-no-weight")
SMALL = AggregatorConfig(sim_hidden=(4,), conv_channels=2, k_conv=3, merge_hidden=(8,),
                         dropout=0.0, out_dim=5, seed=1)


def make_inputs(b: int, k: int, d: int, *, seed: int = 0,
                pad: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random rows in linkage order (row 0 most similar), trailing padding in some records."""
    gen = torch.Generator().manual_seed(seed)
    emb = torch.randn(b, k, d, generator=gen)
    sim = torch.sort(torch.randn(b, k, generator=gen), dim=1, descending=True).values
    n_valid = torch.randint(1, k + 1, (b,), generator=gen) if pad else torch.full((b,), k)
    mask = torch.arange(k).unsqueeze(0) < n_valid.unsqueeze(1)
    return emb, sim, mask


def build(name: str, k: int, d: int, config: AggregatorConfig = SMALL) -> torch.nn.Module:
    agg = build_aggregator(name, k=k, emb_dim=d, config=config)
    agg.eval()
    return agg


def expected_width(name: str, d: int, config: AggregatorConfig) -> int:
    if name == "featuresim":
        return d + 1
    if name in ("avgsim", "top1sim", "fedsim-mean-merge") or config.out_dim is None:
        return d
    return config.out_dim


def test_registry_names() -> None:
    assert aggregator_names() == ALL
    assert tuple(AGGREGATORS) == ALL


def test_unknown_name_lists_valid_names() -> None:
    with pytest.raises(UnknownNameError) as info:
        build_aggregator("fedsimm", k=3, emb_dim=2, config=SMALL)
    message = str(info.value)
    assert "'fedsimm'" in message
    for name in ALL:
        assert name in message


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"k_conv": 0}, "`k_conv` must be an int ≥ 1, got 0"),
    ({"conv_channels": 1.5}, "`conv_channels` must be an int ≥ 1, got 1.5"),
    ({"dropout": 1.0}, "`dropout` must be a finite number ≥ 0.0 and ≤ 0.95, got 1.0"),
    ({"merge_hidden": (400, 0)}, "`merge_hidden[1]` must be an int ≥ 1, got 0"),
    ({"out_dim": 0}, "`out_dim` must be an int ≥ 1, got 0"),
    ({"activation": "swish"}, "`activation` must be one of gelu, relu, tanh, got 'swish'"),
])
def test_config_validation(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        AggregatorConfig(**kwargs)  # type: ignore[arg-type]
    assert message in str(info.value)


def test_config_reports_all_problems_and_freezes_lists() -> None:
    with pytest.raises(ConfigError) as info:
        AggregatorConfig(k_conv=0, seed=-1)
    assert len(info.value.problems) == 2
    cfg = AggregatorConfig(sim_hidden=[3], merge_hidden=[7, 5])  # type: ignore[arg-type]
    assert cfg.sim_hidden == (3,) and cfg.merge_hidden == (7, 5)


def test_build_rejects_bad_shapes() -> None:
    with pytest.raises(ConfigError, match="`k` must be an int ≥ 1, got 0"):
        build_aggregator("fedsim", k=0, emb_dim=3)


@pytest.mark.parametrize("name", ALL)
def test_output_shape_and_out_dim(name: str) -> None:
    emb, sim, mask = make_inputs(4, 6, 3)
    agg = build(name, 6, 3)
    out = agg(emb, sim, mask)
    assert out.shape == (4, agg.out_dim) == (4, expected_width(name, 3, SMALL))
    assert out.dtype == torch.float32
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("name", ALL)
def test_padding_does_not_influence_output(name: str) -> None:
    emb, sim, mask = make_inputs(6, 5, 3, seed=2)
    agg = build(name, 5, 3)
    base = agg(emb, sim, mask)
    noisy_emb, noisy_sim = emb.clone(), sim.clone()
    noisy_emb[~mask] = torch.tensor([1e6, float("nan"), -3.0])
    noisy_sim[~mask] = 1e3  # larger than every real similarity: must not sort first
    assert torch.equal(agg(noisy_emb, noisy_sim, mask), base)


def random_permutation(emb: torch.Tensor, sim: torch.Tensor, mask: torch.Tensor, seed: int
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    order = torch.argsort(torch.rand(sim.shape, generator=gen), dim=1)
    return (emb.gather(1, order.unsqueeze(-1).expand_as(emb)), sim.gather(1, order),
            mask.gather(1, order))


@pytest.mark.parametrize("name", ORDER_FREE)
def test_invariant_to_slot_order(name: str) -> None:
    emb, sim, mask = make_inputs(8, 5, 3, seed=3)
    agg = build(name, 5, 3)
    shuffled = random_permutation(emb, sim, mask, seed=4)
    assert not torch.equal(shuffled[1], sim)
    torch.testing.assert_close(agg(*shuffled), agg(emb, sim, mask))


@pytest.mark.parametrize("name", ["fedsim-no-sort", "top1sim"])
def test_order_matters_without_sort_gate(name: str) -> None:
    emb, sim, mask = make_inputs(8, 5, 3, seed=3, pad=False)
    agg = build(name, 5, 3)
    shuffled = random_permutation(emb, sim, mask, seed=4)
    assert not torch.allclose(agg(*shuffled), agg(emb, sim, mask))


def test_top1sim_is_row_zero() -> None:
    emb, sim, mask = make_inputs(5, 4, 3)
    out = build("top1sim", 4, 3)(emb, sim, mask)
    assert torch.equal(out, emb[:, 0, :])
    mask[0, 0] = False  # a record without its top-1 row gets zeros
    assert torch.equal(build("top1sim", 4, 3)(emb, sim, mask)[0], torch.zeros(3))


def test_avgsim_is_plain_mean_of_valid_rows() -> None:
    emb, sim, mask = make_inputs(6, 5, 3, seed=5)
    out = build("avgsim", 5, 3)(emb, sim, mask).numpy()
    e, m = emb.numpy().astype(np.float64), mask.numpy()
    for i in range(6):
        # AvgSim ignores the similarities: uniform weights 1/n over the n valid rows.
        weights = m[i] / m[i].sum()
        np.testing.assert_allclose(out[i], weights @ e[i], rtol=1e-5, atol=1e-6)


def test_featuresim_appends_similarity_then_averages() -> None:
    emb, sim, mask = make_inputs(6, 5, 3, seed=6)
    out = build("featuresim", 5, 3)(emb, sim, mask).numpy()
    for i in range(6):
        m = mask[i].numpy()
        rows = np.concatenate([emb[i].numpy(), sim[i].numpy()[:, None]], axis=1)[m]
        np.testing.assert_allclose(out[i], rows.mean(axis=0), rtol=1e-5, atol=1e-6)


def test_mean_merge_averages_weighted_rows() -> None:
    emb, sim, mask = make_inputs(6, 5, 3, seed=7)
    agg = build("fedsim-mean-merge", 5, 3)
    assert isinstance(agg, FedSimAggregator)
    out = agg(emb, sim, mask)
    with torch.no_grad():
        w = agg.weights(sim)
    assert ((w > 0) & (w < 1)).all()  # the similarity model ends in a sigmoid
    for i in range(6):
        m = mask[i]
        expected = (w[i, m].unsqueeze(-1) * emb[i, m]).mean(dim=0)
        torch.testing.assert_close(out[i], expected)


def test_no_weight_uses_similarities_as_weights() -> None:
    agg = build("fedsim-no-weight", 5, 3)
    assert isinstance(agg, FedSimAggregator)
    sim = torch.randn(4, 5)
    assert torch.equal(agg.weights(sim), sim)
    assert not any("sim_model" in n for n, _ in agg.named_parameters())


def test_cnn_merge_shapes_follow_the_paper() -> None:
    cfg = AggregatorConfig(conv_channels=8, k_conv=7, merge_hidden=(400,), out_dim=1)
    agg = build("fedsim", 50, 10, cfg)  # K = 50, l_m = 10 as in Figure 10
    conv = agg.get_submodule("merge.conv")
    assert isinstance(conv, torch.nn.Conv2d)
    assert conv.in_channels == 1 and conv.out_channels == 8
    assert conv.kernel_size == (7, 1)  # k_conv × 1: mixes rows, never features
    first = agg.get_submodule("merge.mlp.0")
    assert isinstance(first, torch.nn.Linear)
    assert first.in_features == 8 * (50 + 7 - 1) * 10
    linears = [m for m in agg.get_submodule("merge.mlp").modules()
               if isinstance(m, torch.nn.Linear)]
    assert len(linears) == 2  # an MLP with one hidden layer (§6.1)


def test_mlp_merge_has_about_the_cnn_parameter_count() -> None:
    cfg = AggregatorConfig(out_dim=1)
    cnn = build("fedsim", 50, 10, cfg)
    mlp = build("fedsim-mlp-merge", 50, 10, cfg)

    def count(m: torch.nn.Module) -> int:
        return sum(p.numel() for p in m.parameters())

    assert abs(count(mlp) - count(cnn)) / count(cnn) < 0.01
    fixed = build("fedsim-mlp-merge", 5, 2, AggregatorConfig(mlp_merge_hidden=(16, 8)))
    assert fixed.get_submodule("merge.mlp.0").in_features == 10  # type: ignore[union-attr]


def test_k_conv_larger_than_k_and_single_slot() -> None:
    emb, sim, mask = make_inputs(3, 1, 2)
    out = build("fedsim", 1, 2, AggregatorConfig(k_conv=7))(emb, sim, mask)
    assert out.shape == (3, 2)


@pytest.mark.parametrize("name", ALL)
def test_gradients_reach_valid_rows_only(name: str) -> None:
    emb, sim, mask = make_inputs(6, 5, 3, seed=8)
    emb.requires_grad_(True)
    build(name, 5, 3)(emb, sim, mask).square().sum().backward()
    assert emb.grad is not None
    assert torch.isfinite(emb.grad).all()
    assert (emb.grad[~mask] == 0).all()
    if name == "top1sim":
        assert emb.grad[:, 0].abs().sum() > 0
    else:
        assert emb.grad[mask].abs().sum() > 0


def test_similarity_model_and_merge_are_trained() -> None:
    emb, sim, mask = make_inputs(6, 5, 3, seed=9)
    agg = build("fedsim", 5, 3)
    agg(emb, sim, mask).square().sum().backward()
    for name, p in agg.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


@pytest.mark.parametrize("name", ["fedsim", "fedsim-mlp-merge"])
def test_dropout_is_reproducible_and_leaves_global_rng_alone(name: str) -> None:
    cfg = AggregatorConfig(sim_hidden=(4,), conv_channels=2, k_conv=3, merge_hidden=(8,),
                           dropout=0.5, seed=3)
    emb, sim, mask = make_inputs(4, 5, 3)
    rng_before = torch.random.get_rng_state()
    a = build_aggregator(name, k=5, emb_dim=3, config=cfg)
    b = build_aggregator(name, k=5, emb_dim=3, config=cfg)
    out_a = [a(emb, sim, mask) for _ in range(2)]
    out_b = [b(emb, sim, mask) for _ in range(2)]
    assert torch.equal(torch.random.get_rng_state(), rng_before)
    assert all(torch.equal(x, y) for x, y in zip(out_a, out_b))
    assert not torch.equal(out_a[0], out_a[1])  # fresh masks every call in training mode
    a.eval()
    assert torch.equal(a(emb, sim, mask), a(emb, sim, mask))


def test_seed_changes_initialisation() -> None:
    a = build_aggregator("fedsim", k=4, emb_dim=2, config=AggregatorConfig(seed=0))
    b = build_aggregator("fedsim", k=4, emb_dim=2, config=AggregatorConfig(seed=1))
    assert not torch.equal(a.get_submodule("merge.conv").weight,  # type: ignore[arg-type]
                           b.get_submodule("merge.conv").weight)  # type: ignore[arg-type]


def test_input_checks() -> None:
    emb, sim, mask = make_inputs(2, 4, 3)
    agg = build("fedsim", 4, 3)
    with pytest.raises(DataError, match="K = 4"):
        agg(emb[:, :3], sim[:, :3], mask[:, :3])
    with pytest.raises(DataError, match=r"\(B, K, 3\)"):
        agg(emb[..., :2], sim, mask)
    with pytest.raises(DataError, match="bool"):
        agg(emb, sim, mask.float())
    with pytest.raises(DataError, match="`sim` and `mask`"):
        agg(emb, sim[:, :2], mask)
    # models without K-shaped parameters accept any K
    assert build("avgsim", 4, 3)(emb[:, :2], sim[:, :2], mask[:, :2]).shape == (2, 3)


@given(b=st.integers(1, 4), k=st.integers(1, 6), d=st.integers(1, 4),
       name=st.sampled_from(ALL), out_dim=st.none() | st.integers(1, 3),
       k_conv=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_shapes_property(b: int, k: int, d: int, name: str, out_dim: int | None, k_conv: int,
                         seed: int) -> None:
    cfg = AggregatorConfig(sim_hidden=(3,), conv_channels=2, k_conv=k_conv, merge_hidden=(4,),
                           dropout=0.1, out_dim=out_dim)
    emb, sim, mask = make_inputs(b, k, d, seed=seed)
    mask[0] = False  # a record with no linked row at all
    agg = build_aggregator(name, k=k, emb_dim=d, config=cfg)
    out = agg(emb, sim, mask)
    assert out.shape == (b, expected_width(name, d, cfg))
    assert torch.isfinite(out).all()
