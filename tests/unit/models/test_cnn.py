"""The CNN bottom model (VFL-AFE §4.1): its size as the guard computes it equals the built
model's, a peer cannot ask for one over the party's limit, and shapes are checked."""

from __future__ import annotations

import pytest
import torch

from vflink.errors import ConfigError, PolicyViolation
from vflink.models.cnn import PAPER_CNN, bottom_parameters, build_bottom, image_shape
from vflink.models.spec import BottomSpec
from vflink.parties.guard import check_bottom_spec
from vflink.parties.policy import PartyPolicy


@pytest.mark.parametrize(("n", "extra"), [
    (392, {"image_shape": (28, -1)}),                     # a Fashion-MNIST half
    (784, {}),                                            # a square image, inferred
    (10, {"image_shape": (1, 1, -1), "channels": (3,), "kernels": (3,)}),
    (48, {"image_shape": (3, 4, 4), "channels": (2, 2, 2), "kernels": (1, 3, 5)}),
])
def test_counted_parameters_equal_the_built_model(n: int, extra: dict) -> None:
    spec = BottomSpec(bottom="cnn", out_dim=7, **extra)
    model = build_bottom(spec, n)
    assert bottom_parameters(spec, n) == sum(p.numel() for p in model.parameters())
    assert model(torch.randn(5, n)).shape == (5, 7)
    assert any(isinstance(m, torch.nn.Conv2d) for m in model.modules())


def test_the_preset_is_the_papers_two_layer_cnn() -> None:
    spec = BottomSpec(bottom="cnn", out_dim=16, image_shape=(28, 14))
    assert (spec.channels, spec.kernels) == (PAPER_CNN["channels"], PAPER_CNN["kernels"])
    convs = [m for m in build_bottom(spec, 392).modules() if isinstance(m, torch.nn.Conv2d)]
    assert [(c.out_channels, c.kernel_size) for c in convs] == [(32, (5, 5)), (64, (5, 5))]


def test_the_guard_bounds_a_cnn_before_building_it() -> None:
    policy = PartyPolicy(max_model_parameters=50_000)
    small = BottomSpec(bottom="cnn", out_dim=16, channels=(8, 8), kernels=(3, 3),
                       image_shape=(28, -1))
    check_bottom_spec(small, 392, party="right", policy=policy)
    big = BottomSpec(bottom="cnn", out_dim=16, channels=(256, 256), kernels=(15, 15),
                     image_shape=(28, -1))
    with pytest.raises(PolicyViolation, match="max_model_parameters"):
        check_bottom_spec(big, 392, party="right", policy=policy)
    wrong = BottomSpec(bottom="cnn", out_dim=16, image_shape=(3, 28, 28))
    with pytest.raises(ConfigError, match="image shape"):
        check_bottom_spec(wrong, 392, party="right", policy=policy)


def test_specs_are_validated() -> None:
    with pytest.raises(ConfigError, match="one size per layer"):
        BottomSpec(bottom="cnn", channels=(4, 4), kernels=(3,))
    with pytest.raises(ConfigError, match="bottom"):
        BottomSpec(bottom="transformer")
    with pytest.raises(ConfigError, match="image_shape"):
        BottomSpec(bottom="cnn", image_shape=(-1, -1))
    with pytest.raises(ConfigError, match="image_shape"):
        image_shape(BottomSpec(bottom="cnn"), 392)  # not square, no shape given
