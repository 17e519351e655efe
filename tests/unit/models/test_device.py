"""A party's models on any device: every tensor made for a model lands on the model's device,
and dropout draws the CPU's masks wherever the model runs.

No GPU is needed: torch's ``meta`` device refuses to mix with CPU tensors as CUDA does ("Tensor
on device cpu is not on the expected device meta"), so a model moved there and run on meta
inputs fails wherever a CPU tensor is made for it. The masks are checked value for value on
the CPU: the path a CUDA input takes draws its noise there, by the same calls."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from vflink.models.cnn import build_bottom
from vflink.models.device import module_device
from vflink.models.merge import (
    AggregatorConfig,
    FedSimAggregator,
    GeneratorDropout,
    _DropoutRng,
    aggregator_names,
    build_aggregator,
    weight_curve,
)
from vflink.models.mlp import Dropout, build_mlp, dropout_noise, seeded_init
from vflink.models.spec import BottomSpec
from vflink.models.splitnn import SplitNNPrimary

META = torch.device("meta")


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
@pytest.mark.parametrize("transpose", [False, True])
def test_cpu_drawn_noise_is_cpu_dropout_bit_for_bit(p: float, transpose: bool) -> None:
    x = torch.randn(64, 37, generator=torch.Generator().manual_seed(0))
    if transpose:  # a non-contiguous input: the noise follows its layout, as ATen's does
        x = x.T
    with seeded_init(11):
        want = F.dropout(x, p, training=True)
    with seeded_init(11):
        got = x * dropout_noise(x, p).to(x.device)  # what Dropout does off the CPU
    assert torch.equal(got, want)
    with seeded_init(11):
        assert torch.equal(Dropout(p)(x), want)  # on the CPU: nn.Dropout itself


def test_dropout_off_the_cpu_draws_from_the_cpu_generator() -> None:
    layer = Dropout(0.3)
    x = torch.ones(5, 8, device=META)
    with seeded_init(3):
        before = torch.random.get_rng_state()
        out = layer(x)
        after = torch.random.get_rng_state()
    assert out.device == META and not torch.equal(before, after)  # the CPU stream advanced
    with seeded_init(3):
        layer(torch.ones(5, 8))
        assert torch.equal(torch.random.get_rng_state(), after)  # by as much as on the CPU
    layer.eval()
    assert layer(x) is x


def test_generator_dropout_masks_are_the_cpus_on_every_device() -> None:
    cpu, meta = GeneratorDropout(0.2, _DropoutRng(7)), GeneratorDropout(0.2, _DropoutRng(7))
    y = cpu(torch.ones(6, 9))
    assert meta(torch.ones(6, 9, device=META)).device == META
    assert torch.equal(cpu.get_extra_state()["cpu"], meta.get_extra_state()["cpu"])
    assert set(meta.get_extra_state()) == {"cpu"}
    # the saved position resumes the stream: the next masks equal an uninterrupted run's
    resumed = GeneratorDropout(0.2, _DropoutRng(7))
    resumed.set_extra_state(cpu.get_extra_state())
    assert torch.equal(resumed(torch.ones(6, 9)), cpu(torch.ones(6, 9)))
    assert not torch.equal(y, cpu(torch.ones(6, 9)))


CONFIG = AggregatorConfig(sim_hidden=(4,), conv_channels=2, k_conv=2, merge_hidden=(8,),
                          dropout=0.2, out_dim=5, seed=1)
SPECS = {"mlp": BottomSpec(hidden=(6,), out_dim=4, dropout=0.2),
         "cnn": BottomSpec(bottom="cnn", out_dim=4, channels=(2,), kernels=(3,),
                           image_shape=(1, 1, -1), dropout=0.2)}


def _meta_inputs(b: int, k: int, widths: list[int]) -> tuple[list[torch.Tensor], torch.Tensor,
                                                             torch.Tensor]:
    sec = [torch.ones(b, k, w, device=META) for w in widths]
    return sec, torch.ones(b, k, device=META), torch.ones(b, k, dtype=torch.bool, device=META)


@pytest.mark.parametrize("aggregator", aggregator_names())
@pytest.mark.parametrize("bottom", sorted(SPECS))
@pytest.mark.parametrize("learn_missing", [False, True])
def test_primary_model_runs_wholly_on_its_device(aggregator: str, bottom: str,
                                                 learn_missing: bool) -> None:
    k = 1 if aggregator == "top1sim" else 3
    with seeded_init(0):  # built on the CPU, then moved, as the parties do
        model = SplitNNPrimary(6, SPECS[bottom], [4, 3], (8,), 2, learn_missing=learn_missing,
                               aggregator=aggregator, k=k, aggregator_config=CONFIG)
    model.to(META)
    assert module_device(model) == META
    for train in (True, False):
        model.train(train)
        with seeded_init(1):
            out = model(torch.ones(5, 6, device=META), *_meta_inputs(5, k, [4, 3]))
        assert out.device == META and out.shape[0] == 5


def test_a_model_without_features_learns_its_prior_on_its_device() -> None:
    with seeded_init(0):
        model = SplitNNPrimary(0, SPECS["mlp"], [], (8,), 1, learn_missing=False).to(META)
    out = model(torch.ones(5, 0, device=META), *_meta_inputs(5, 1, []))
    assert out.device == META


@pytest.mark.parametrize("bottom", sorted(SPECS))
def test_secondary_bottom_runs_on_its_device(bottom: str) -> None:
    with seeded_init(0):
        model = build_bottom(SPECS[bottom], 7).to(META)
    with seeded_init(1):
        assert model(torch.ones(4, 7, device=META)).device == META


def test_weight_gate_curve_is_computed_on_the_aggregators_device() -> None:
    """The evaluation's similarity → weight curve (FedSim Figure 10) feeds the gate on its
    device: a CPU grid for a CUDA model raised "Expected all tensors to be on the same
    device"."""
    agg = build_aggregator("fedsim", k=3, emb_dim=4, config=CONFIG)
    assert isinstance(agg, FedSimAggregator) and agg.sim_model is not None
    grid = np.linspace(-1.0, 1.0, 7)
    on_cpu = weight_curve(agg, grid)
    assert on_cpu.shape == (7,) and np.all((on_cpu > 0) & (on_cpu < 1))
    seen: list[torch.device] = []
    agg.to(META)
    # meta tensors hold no values: watch what the gate receives, answer with the CPU's values
    agg.sim_model.register_forward_pre_hook(lambda _m, args: seen.append(args[0].device))
    agg.sim_model.register_forward_hook(
        lambda _m, _args, _out: torch.logit(torch.from_numpy(on_cpu).float()).reshape(1, 7, 1))
    np.testing.assert_allclose(weight_curve(agg, grid), on_cpu, rtol=1e-6)
    assert seen == [META]


def test_module_device() -> None:
    assert module_device(torch.nn.ReLU()) == torch.device("cpu")  # nothing to hold
    assert module_device(build_mlp(2, (3,), 1).to(META)) == META
    norm = torch.nn.BatchNorm1d(2, affine=False).to(META)  # buffers only
    assert module_device(norm) == META


def test_precise_conv_is_nn_conv_on_the_cpu() -> None:
    from vflink.models.device import PreciseConv2d

    with seeded_init(2):
        ours = PreciseConv2d(2, 3, (3, 1), padding=(2, 0))
    with seeded_init(2):
        plain = torch.nn.Conv2d(2, 3, (3, 1), padding=(2, 0))
    x = torch.randn(4, 2, 5, 6, generator=torch.Generator().manual_seed(1))
    assert torch.equal(ours(x), plain(x))  # the same initial weights and the same kernel
    assert ours.state_dict().keys() == plain.state_dict().keys()


@pytest.mark.parametrize("kernel,padding", [((3, 1), (2, 0)), ((5, 5), (2, 2)), ((1, 1), (0, 0))])
def test_float64_conv_is_the_exact_convolution_rounded_once(kernel: tuple[int, int],
                                                            padding: tuple[int, int]) -> None:
    """The path a CUDA input with cuDNN takes: float64 throughout, one rounding at the end, so
    it is within float32 rounding of the CPU's float32 convolution, gradients included."""
    from vflink.models.device import float64_conv

    gen = torch.Generator().manual_seed(3)
    with seeded_init(0):
        conv = torch.nn.Conv2d(3, 4, kernel, padding=padding)
    x = torch.randn(2, 3, 7, 6, generator=gen, requires_grad=True)
    got = float64_conv(conv, x)
    exact = torch.nn.functional.conv2d(x.detach().double(), conv.weight.detach().double(),
                                       conv.bias.detach().double(), padding=padding)
    assert got.dtype == torch.float32 and torch.equal(got.detach(), exact.float())
    want = conv(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    upstream = torch.randn(want.shape, generator=gen)
    grads = torch.autograd.grad((got * upstream).sum(), [x, conv.weight, conv.bias])
    expected = torch.autograd.grad((want * upstream).sum(), [x, conv.weight, conv.bias])
    for g, e in zip(grads, expected, strict=True):
        assert g.dtype == torch.float32
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)
