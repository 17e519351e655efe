"""A convolutional bottom model for image-shaped features (VFL-AFE §4.1).

VFL-AFE's image parties use "a two-layer convolution neural network" as the bottom model f
(§4.1, Models architectures; no sizes given). :data:`PAPER_CNN` is the usual two-layer MNIST
CNN: conv 5×5 → 32 channels, 2×2 max-pool, conv 5×5 → 64, 2×2 max-pool, flatten, one linear
layer to the cut width. A party's features arrive flat (one row per record, in the table's
column order); the first layer views them as ``(channels, height, width)``.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from vflink.errors import ConfigError
from vflink.models.device import PreciseConv2d
from vflink.models.spec import BottomSpec, bottom_parameters, cnn_parameters, image_shape

__all__ = ["PAPER_CNN", "build_bottom", "build_cnn", "bottom_parameters", "cnn_parameters",
           "image_shape"]

#: channels and kernel sizes of the paper's two-layer CNN (the preset of ``model.bottom``)
PAPER_CNN: dict[str, tuple[int, ...]] = {"channels": (32, 64), "kernels": (5, 5)}


def build_cnn(shape: tuple[int, int, int], channels: Sequence[int], kernels: Sequence[int],
              out_dim: int, *, activation: str = "relu", dropout: float = 0.0
              ) -> nn.Sequential:
    """Flat features → (C, H, W) → [conv k×k ('same' padding), activation, 2×2 max-pool
    (while the image is ≥ 2 pixels)]... → flatten → linear to ``out_dim``."""
    from vflink.models.mlp import _ACTIVATIONS, Dropout

    if activation not in _ACTIVATIONS:
        raise ConfigError(f"`activation` must be one of {sorted(_ACTIVATIONS)}, "
                          f"got {activation!r}")
    c, h, w = shape
    layers: list[nn.Module] = [nn.Unflatten(1, (c, h, w))]
    prev = c
    for ch, k in zip(channels, kernels, strict=True):
        layers += [PreciseConv2d(prev, ch, k, padding=k // 2), _ACTIVATIONS[activation]()]
        if min(h, w) >= 2:
            layers.append(nn.MaxPool2d(2))
            h, w = max(h // 2, 1), max(w // 2, 1)
        if dropout > 0:
            layers.append(Dropout(dropout))
        prev = ch
    layers += [nn.Flatten(), nn.Linear(prev * h * w, out_dim)]
    return nn.Sequential(*layers)


def build_bottom(spec: BottomSpec, n_inputs: int) -> nn.Sequential:
    """The bottom model ``spec`` names (``mlp`` or ``cnn``) on ``n_inputs`` flat features."""
    from vflink.models.mlp import build_mlp

    if spec.bottom == "cnn":
        return build_cnn(image_shape(spec, n_inputs), spec.channels, spec.kernels,
                         spec.out_dim, activation=spec.activation, dropout=spec.dropout)
    return build_mlp(n_inputs, spec.hidden, spec.out_dim, activation=spec.activation,
                     dropout=spec.dropout)
