"""Multi-layer perceptrons used as bottom and aggregation (top) models."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import nn

from vflink.errors import ConfigError
from vflink.models.spec import BottomSpec

__all__ = ["build_mlp", "build_optimizer", "seeded_init"]

_ACTIVATIONS: dict[str, type[nn.Module]] = {"relu": nn.ReLU, "tanh": nn.Tanh, "gelu": nn.GELU}


@contextmanager
def seeded_init(seed: int, device: torch.device | None = None) -> Iterator[None]:
    """Draw from torch's RNG seeded with ``seed`` without touching the caller's RNG state.

    torch's ``nn.Linear`` draws its initial weights from the global generator; forking the RNG
    keeps the library from seeding anything globally (ARCHITECTURE.md, convention 11) while
    making each party's initialisation depend only on its own seed. With a CUDA ``device``
    (dropout drawn there) that device's generator is forked too: ``manual_seed`` seeds it.
    """
    devices = [] if device is None or device.type != "cuda" else [
        device.index if device.index is not None else torch.cuda.current_device()]
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


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
            layers.append(nn.Dropout(dropout))
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
