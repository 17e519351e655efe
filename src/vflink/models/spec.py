"""Public hyperparameters of a party's bottom model; they may cross the party boundary."""

from __future__ import annotations

import math
from dataclasses import dataclass

from vflink._checks import check_bool, check_choice, check_float, check_int, raise_if
from vflink.errors import ConfigError

__all__ = ["ACTIVATIONS", "BOTTOMS", "OPTIMIZERS", "BottomSpec", "bottom_parameters",
           "cnn_parameters", "image_shape"]

ACTIVATIONS = ("relu", "tanh", "gelu")
#: bottom model architectures: a multi-layer perceptron, or a CNN on image-shaped features
BOTTOMS = ("mlp", "cnn")
#: bounds on a CNN spec a peer may send (the parameter count is bounded by the party's policy)
_MAX_CNN_LAYERS, _MAX_KERNEL = 8, 15
OPTIMIZERS = ("adam", "adamw", "lamb", "sgd")


@dataclass(frozen=True, kw_only=True)
class BottomSpec:
    """How a party builds and trains its bottom (local) model.

    Attributes:
        hidden: sizes of the hidden layers (App. E chooses from {100, 200, 400}).
        out_dim: width of the cut layer, i.e. of the embedding the party sends.
        activation: hidden activation.
        dropout: dropout probability after each hidden layer.
        optimizer: optimiser name; lr and weight_decay as in App. E.
        seed: seeds the party's own parameter initialisation and dropout.
        standardize: z-score each numeric feature on the training rows before the bottom
            model; ``False`` feeds the raw values, as the FedSim authors' scripts do (they never
            call their ``scale`` option on the synthetic data, and on it the raw features train
            measurably better with LAMB: see docs/reproductions/fedsim.md).
        bottom: ``mlp`` (``hidden``) or ``cnn`` (``channels``, ``kernels``, ``image_shape``;
            :mod:`vflink.models.cnn`; ``hidden`` is then unused).
        channels, kernels: output channels and kernel size of each convolution (the
            default is VFL-AFE's two-layer CNN preset).
        image_shape: ``(channels, height, width)`` of the party's flat features, one extent
            may be -1 (inferred); empty: a square one-channel image.
    """

    hidden: tuple[int, ...] = (100,)
    out_dim: int = 16
    activation: str = "relu"
    dropout: float = 0.0
    optimizer: str = "adam"
    lr: float = 1e-3
    weight_decay: float = 1e-5
    seed: int = 0
    standardize: bool = True
    bottom: str = "mlp"
    channels: tuple[int, ...] = (32, 64)
    kernels: tuple[int, ...] = (5, 5)
    image_shape: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "hidden", tuple(self.hidden))
        object.__setattr__(self, "channels", tuple(self.channels))
        object.__setattr__(self, "kernels", tuple(self.kernels))
        object.__setattr__(self, "image_shape", tuple(self.image_shape))
        problems: list[str] = []
        for i, h in enumerate(self.hidden):
            check_int(problems, f"hidden[{i}]", h, min=1)
        check_int(problems, "out_dim", self.out_dim, min=1)
        check_choice(problems, "activation", self.activation, ACTIVATIONS)
        check_float(problems, "dropout", self.dropout, min=0.0, max=0.95)
        check_choice(problems, "optimizer", self.optimizer, OPTIMIZERS)
        check_float(problems, "lr", self.lr, min=0.0, min_exclusive=True)
        check_float(problems, "weight_decay", self.weight_decay, min=0.0)
        check_int(problems, "seed", self.seed, min=0)
        check_bool(problems, "standardize", self.standardize)
        check_choice(problems, "bottom", self.bottom, BOTTOMS)
        if not 1 <= len(self.channels) <= _MAX_CNN_LAYERS:
            problems.append(f"`channels` must list 1 to {_MAX_CNN_LAYERS} layers, got "
                            f"{list(self.channels)}")
        if len(self.kernels) != len(self.channels):
            problems.append(f"`kernels` ({list(self.kernels)}) needs one size per layer of "
                            f"`channels` ({list(self.channels)})")
        for i, c in enumerate(self.channels):
            check_int(problems, f"channels[{i}]", c, min=1)
        for i, k in enumerate(self.kernels):
            check_int(problems, f"kernels[{i}]", k, min=1)
            if isinstance(k, int) and k > _MAX_KERNEL:
                problems.append(f"`kernels[{i}]` must be ≤ {_MAX_KERNEL}, got {k}")
        if self.image_shape:
            if len(self.image_shape) not in (2, 3) or not all(
                    isinstance(s, int) and not isinstance(s, bool) and (s >= 1 or s == -1)
                    for s in self.image_shape) or list(self.image_shape).count(-1) > 1:
                problems.append(f"`image_shape` must be [height, width] or [channels, height, "
                                f"width] of ints ≥ 1 (one may be -1), got "
                                f"{list(self.image_shape)}")
        raise_if(problems, "model spec")


# --- sizes, computed without building a model (and without importing torch) ---


def image_shape(spec: BottomSpec, n_inputs: int) -> tuple[int, int, int]:
    """``(channels, height, width)`` of a party's ``n_inputs`` features under ``spec``: the
    spec's ``image_shape`` (one of its extents may be ``-1``, inferred), or a square image."""
    shape = tuple(spec.image_shape)
    if not shape:
        side = math.isqrt(n_inputs)
        if side * side != n_inputs:
            raise ConfigError(f"a CNN bottom model needs `model.image_shape` = [channels, "
                              f"height, width] for {n_inputs} features (not a square image)")
        shape = (1, side, side)
    if len(shape) == 2:
        shape = (1, *shape)
    known = math.prod(s for s in shape if s != -1)
    if list(shape).count(-1) == 1 and known > 0 and n_inputs % known == 0:
        shape = tuple(n_inputs // known if s == -1 else s for s in shape)
    c, h, w = shape
    if c * h * w != n_inputs:
        raise ConfigError(f"`model.image_shape` {list(spec.image_shape)} holds {c * h * w} "
                          f"values; the party has {n_inputs} features")
    return c, h, w


def cnn_parameters(spec: BottomSpec, n_inputs: int) -> int:
    """Weights and biases of the CNN ``spec`` builds on ``n_inputs`` features (without
    building it: a peer's request is bounded before anything is allocated)."""
    c, h, w = image_shape(spec, n_inputs)
    total, prev = 0, c
    for ch, k in zip(spec.channels, spec.kernels, strict=True):
        total += prev * ch * k * k + ch
        if min(h, w) >= 2:
            h, w = max(h // 2, 1), max(w // 2, 1)
        prev = ch
    return total + (prev * h * w + 1) * spec.out_dim


def bottom_parameters(spec: BottomSpec, n_inputs: int) -> int:
    """Number of weights and biases of the bottom model ``spec`` builds on ``n_inputs``."""
    if spec.bottom == "cnn":
        return cnn_parameters(spec, max(n_inputs, 1))
    widths = [max(n_inputs, 1), *spec.hidden, spec.out_dim]
    return sum((a + 1) * b for a, b in zip(widths[:-1], widths[1:]))
