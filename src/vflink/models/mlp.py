"""Multi-layer perceptrons used as bottom and aggregation (top) models."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import nn

from vflink.errors import ConfigError
from vflink.models.spec import BottomSpec

__all__ = ["Dropout", "build_mlp", "build_optimizer", "dropout_noise", "seeded_init"]

_ACTIVATIONS: dict[str, type[nn.Module]] = {"relu": nn.ReLU, "tanh": nn.Tanh, "gelu": nn.GELU}


@contextmanager
def seeded_init(seed: int) -> Iterator[None]:
    """Draw from torch's CPU generator seeded with ``seed`` without touching the caller's RNG.

    torch's ``nn.Linear`` draws its initial weights from the global generator; forking the RNG
    keeps the library from seeding anything globally (ARCHITECTURE.md, convention 11) while
    making each party's initialisation depend only on its own seed. Only the CPU generator is
    seeded: models are built on the CPU, and dropout draws its masks there on every device
    (:class:`Dropout`), so a run on CUDA draws what the CPU run of its seed draws.
    """
    with torch.random.fork_rng(devices=[]):
        torch.random.default_generator.manual_seed(int(seed))
        yield


def dropout_noise(like: torch.Tensor, p: float) -> torch.Tensor:
    """The noise ``nn.Dropout`` multiplies by on the CPU, drawn on the CPU for ``like`` (any
    device): ``Bernoulli(1 - p) / (1 - p)`` from the CPU's default generator, the same calls
    and layout as ATen's dropout on a CPU tensor (``empty_like``, ``bernoulli_``, ``div_``)."""
    noise = torch.empty_like(like, device="cpu").bernoulli_(1.0 - p)
    return noise.div_(1.0 - p)


class Dropout(nn.Dropout):
    """``nn.Dropout`` with the CPU's masks on every device.

    On the CPU it is ``nn.Dropout`` itself (CPU runs unchanged, bit for bit). Elsewhere the
    noise is drawn as the CPU draws it (:func:`dropout_noise`) and moved to the input's device:
    CUDA's own generator (Philox) would drop other units than the CPU run of the same seed,
    and the two runs would differ by more than float rounding.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type == "cpu" or not self.training or self.p == 0.0:
            return super().forward(x)
        noise = (torch.zeros((), dtype=x.dtype, device=x.device) if self.p == 1.0  # as ATen
                 else dropout_noise(x, self.p).to(x.device))
        return x.mul_(noise) if self.inplace else x * noise


def build_mlp(in_dim: int, hidden: Sequence[int], out_dim: int, *, activation: str = "relu",
              dropout: float = 0.0) -> nn.Sequential:
    """``in_dim → hidden... → out_dim``; no activation after the last layer."""
    if activation not in _ACTIVATIONS:
        raise ConfigError(f"`activation` must be one of {sorted(_ACTIVATIONS)}, got {activation!r}")
    layers: list[nn.Module] = []
    prev = in_dim
    for h in hidden:
        layers += [nn.Linear(prev, h), _ACTIVATIONS[activation]()]
        if dropout > 0:
            layers.append(Dropout(dropout))
        prev = h
    layers.append(nn.Linear(prev, out_dim))
    return nn.Sequential(*layers)


def build_optimizer(params: Iterable[nn.Parameter], spec: BottomSpec) -> torch.optim.Optimizer:
    params = [p for p in params if p.requires_grad]
    if spec.optimizer == "adam":
        return torch.optim.Adam(params, lr=spec.lr, weight_decay=spec.weight_decay)
    if spec.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=spec.lr, weight_decay=spec.weight_decay)
    if spec.optimizer == "lamb":  # FedSim App. E trains with LAMB
        from vflink.models.lamb import Lamb

        return Lamb(params, lr=spec.lr, weight_decay=spec.weight_decay)
    if spec.optimizer == "sgd":
        return torch.optim.SGD(params, lr=spec.lr, weight_decay=spec.weight_decay, momentum=0.9)
    raise ConfigError(f"unknown optimizer {spec.optimizer!r}")
