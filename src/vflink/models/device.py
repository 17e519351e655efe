"""Which device a party's own models run on (``training.device``; docs/how-to/scale-out.md).

Each party picks its own: ``"cpu"``, ``"cuda"`` (an error where CUDA is missing, naming the
party) or ``"auto"`` (CUDA where ``torch.cuda.is_available()``, else the CPU). Only the party's
own models and tensors live there; what crosses the party boundary stays CPU tensors / numpy,
as before, so a peer never learns (or needs) another party's device.
"""

from __future__ import annotations

import torch

from vflink.errors import ConfigError

__all__ = ["DEFAULT_DEVICE", "DEVICES", "module_device", "resolve_device"]

#: ``training.device`` values.
DEVICES = ("auto", "cpu", "cuda")
#: The default: the CPU. CUDA kernels are not bitwise deterministic (e.g. the scatter-adds of
#: a gather's backward pass) and this project's models are small, so a GPU is opt-in.
DEFAULT_DEVICE = "cpu"


def resolve_device(name: str, *, party: str) -> torch.device:
    """The torch device ``name`` stands for on this machine, for ``party``'s models."""
    if not isinstance(name, str) or name not in DEVICES:
        raise ConfigError(f"party {party!r}: `training.device` must be one of "
                          f"{', '.join(map(repr, DEVICES))}, got {name!r}")
    if name == "cpu":
        return torch.device("cpu")
    if torch.cuda.is_available():
        return torch.device("cuda")
    if name == "auto":
        return torch.device("cpu")
    raise ConfigError(f"party {party!r}: `training.device = \"cuda\"` but CUDA is not available "
                      "on this machine (torch.cuda.is_available() is False); use \"auto\" "
                      "(CUDA where there is one) or \"cpu\"")


def module_device(module: torch.nn.Module) -> torch.device:
    """Where ``module``'s parameters (else buffers) live: the device a tensor made for it must
    be on. The CPU for a module that holds neither."""
    first: torch.Tensor | None = next(module.parameters(), None)
    if first is None:
        first = next(module.buffers(), None)
    return first.device if first is not None else torch.device("cpu")
