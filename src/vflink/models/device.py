"""Which device a party's own models run on (``training.device``; docs/how-to/scale-out.md).

Each party picks its own: ``"cpu"``, ``"cuda"`` (an error where CUDA is missing, naming the
party) or ``"auto"`` (CUDA where ``torch.cuda.is_available()``, else the CPU). Only the party's
own models and tensors live there; what crosses the party boundary stays CPU tensors / numpy,
as before, so a peer never learns (or needs) another party's device.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from vflink.errors import ConfigError

__all__ = ["DEFAULT_DEVICE", "DEVICES", "PreciseConv2d", "module_device", "resolve_device"]

log = logging.getLogger(__name__)

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
        log.info("party %r: models on CUDA (%s; training.device = %r)", party,
                 torch.cuda.get_device_name(0), name)
        return torch.device("cuda")
    if name == "auto":
        log.info("party %r: models on the CPU (training.device = \"auto\" and "
                 "torch.cuda.is_available() is False)", party)
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


class PreciseConv2d(nn.Conv2d):
    """``nn.Conv2d`` at float32's own precision on every device.

    cuDNN runs float32 convolutions in TF32 by default on Ampere and later GPUs
    (``torch.backends.cudnn.allow_tf32``, PyTorch's "TensorFloat-32 (TF32) on Ampere devices"
    note): it keeps 10 bits of each input's mantissa, so a CUDA run would drift from the CPU
    run of its seed by about 10⁻³ per layer instead of by float32 rounding. Where cuDNN would
    run it, the convolution is done in float64 and rounded back, which no TF32 setting touches
    (at float64's cost on the GPU, which ``benchmarks/training.py --device cuda`` includes:
    FedSim's default merge is this convolution). Elsewhere (the CPU; CUDA without cuDNN,
    whose convolutions go through cuBLAS at full float32) it is ``nn.Conv2d`` itself, so CPU runs
    are unchanged bit for bit. Matrix products are full float32 on CUDA by default
    (``torch.get_float32_matmul_precision() == "highest"``); a user who lowers that chooses TF32.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_cuda and x.dtype == torch.float32 and torch.backends.cudnn.is_available():
            return float64_conv(self, x)
        return super().forward(x)


def float64_conv(conv: nn.Conv2d, x: torch.Tensor) -> torch.Tensor:
    """``conv(x)`` computed in float64 and rounded to ``x``'s dtype (differentiable)."""
    bias = conv.bias.double() if conv.bias is not None else None
    return conv._conv_forward(x.double(), conv.weight.double(), bias).to(x.dtype)
