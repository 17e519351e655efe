"""LAMB optimiser (You et al., "Large Batch Optimization for Deep Learning", ICLR 2020).

FedSim trains every model with LAMB (§6.1 "Training", App. E). For each parameter tensor x with
gradient g at step t (LAMB paper, Algorithm 2)::

    m_t = β1 m_{t-1} + (1 - β1) g_t
    v_t = β2 v_{t-1} + (1 - β2) g_t²
    m̂_t = m_t / (1 - β1^t),  v̂_t = v_t / (1 - β2^t)          (bias correction, optional)
    r_t = m̂_t / (√v̂_t + ε)
    u_t = r_t + λ x_t                                        (weight decay inside the update)
    x_{t+1} = x_t - η · φ(‖x_t‖) / ‖u_t‖ · u_t               (layer-wise trust ratio)

with φ(z) = min(z, γ_u) (``clamp_value``, 10 in the common implementations; γ_l = 0) and the trust
ratio taken as 1 when ‖x_t‖ or ‖u_t‖ is zero (a freshly zero-initialised bias, or no gradient
signal), as in the reference implementations.

Why hand-written: the PyPI packages that ship LAMB for torch were checked. ``torch-optimizer``
(the one FedSim's authors used) last released in Oct 2021, is marked alpha and pulls in
``pytorch-ranger``; ``pytorch-lamb`` last released in 2019 and pulls in torchvision and
tensorboardX. ``pytorch-optimizer`` is maintained, but it would add a 100-optimiser dependency for
some 40 lines of arithmetic, and its ``Lamb`` departs from Algorithm 2 by default: it decouples
the weight decay from the trust ratio and divides the step by (1 - β1^t) *after* the trust ratio
(so early steps are up to 10x longer than lr·φ(‖x‖)). With ``weight_decouple=False,
adam_debias=True`` it agrees with ``Lamb(bias_correction=False)`` here to about 1e-8 (its ratio
adds ε to ‖u‖); that was checked once by hand, not in the test suite, to keep the dependency out.
The update below follows the paper line by line and is tested against a numpy oracle.

``bias_correction=False`` reproduces the optimiser of FedSim's authors' code (torch-optimizer's
``Lamb``, which follows the paper's v3 and skips debiasing); the default follows Algorithm 2.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch.optim.optimizer import ParamsT

from vflink._checks import check_float, raise_if
from vflink.errors import ConfigError

__all__ = ["Lamb"]


class Lamb(torch.optim.Optimizer):
    """Layer-wise Adaptive Moments for Batch training (LAMB).

    Args:
        params: parameters or parameter groups.
        lr: learning rate η (App. E chooses from {3e-4, 1e-3, 3e-3, 1e-2}).
        betas: (β1, β2), the moment decay rates.
        eps: ε added to √v̂ (1e-6 as in the reference implementations).
        weight_decay: λ, added to the Adam step before the trust ratio (App. E: {1e-5, 1e-4}).
        clamp_value: upper bound γ_u of φ(‖x‖); ``None`` leaves the weight norm unclamped.
        bias_correction: debias the moments (Algorithm 2); ``False`` as in torch-optimizer.
    """

    def __init__(self, params: ParamsT, lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-6,
                 weight_decay: float = 0.0, *, clamp_value: float | None = 10.0,
                 bias_correction: bool = True) -> None:
        problems: list[str] = []
        check_float(problems, "lr", lr, min=0.0)
        if not (isinstance(betas, (tuple, list)) and len(betas) == 2):
            problems.append(f"`betas` must be a pair of numbers in [0, 1), got {betas!r}")
        else:
            for i, beta in enumerate(betas):
                check_float(problems, f"betas[{i}]", beta, min=0.0, max=1.0)
                if beta == 1.0:
                    problems.append(f"`betas[{i}]` must be < 1, got {beta!r}")
        check_float(problems, "eps", eps, min=0.0)
        check_float(problems, "weight_decay", weight_decay, min=0.0)
        check_float(problems, "clamp_value", clamp_value, min=0.0, min_exclusive=True,
                    allow_none=True)
        raise_if(problems, "LAMB settings")
        defaults = {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay,
                    "clamp_value": clamp_value, "bias_correction": bias_correction}
        super().__init__(params, defaults)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop (or zero) every gradient; a plain loop, without the generic version's
        per-call dispatch and profiling wrappers (called once per training step)."""
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if set_to_none:
                    p.grad = None
                else:
                    if p.grad.grad_fn is not None:
                        p.grad.detach_()
                    else:
                        p.grad.requires_grad_(False)
                    p.grad.zero_()

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        """One LAMB update of every parameter that has a gradient.

        The arithmetic is that of Algorithm 2 tensor by tensor, but issued as ``torch._foreach_*``
        calls over all parameters of a group at once: a FedSim step updates about 20 small
        tensors, and one Python-level op per tensor per line cost more than the maths
        (profiled with benchmarks/training.py). Every element sees the same operations in the
        same order as a per-tensor loop, so the result is bit for bit the same.
        """
        loss: float | None = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            grads = [p.grad for p in params]
            if any(g.is_sparse for g in grads):
                raise ConfigError("LAMB does not support sparse gradients")
            beta1, beta2 = group["betas"]
            lr: float = group["lr"]
            eps: float = group["eps"]
            weight_decay: float = group["weight_decay"]
            clamp_value: float | None = group["clamp_value"]
            states = [self.state[p] for p in params]
            for p, state in zip(params, states):
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
            exp_avgs = [st["exp_avg"] for st in states]
            exp_avg_sqs = [st["exp_avg_sq"] for st in states]
            # Moments (Algorithm 2): m_t and v_t.
            torch._foreach_mul_(exp_avgs, beta1)
            torch._foreach_add_(exp_avgs, grads, alpha=1.0 - beta1)
            torch._foreach_mul_(exp_avg_sqs, beta2)
            torch._foreach_addcmul_(exp_avg_sqs, grads, grads, value=1.0 - beta2)
            m_hat: Sequence[torch.Tensor]
            v_hat: Sequence[torch.Tensor]
            if group["bias_correction"]:
                m_hat = torch._foreach_div(exp_avgs, [1.0 - beta1 ** st["step"] for st in states])
                v_hat = torch._foreach_div(exp_avg_sqs,
                                           [1.0 - beta2 ** st["step"] for st in states])
            else:
                m_hat, v_hat = exp_avgs, exp_avg_sqs
            # u_t = r_t + λ x_t: the weight decay is part of the update the trust ratio scales.
            denom = torch._foreach_sqrt(v_hat)
            torch._foreach_add_(denom, eps)
            updates = torch._foreach_div(m_hat, denom)
            if weight_decay != 0.0:
                torch._foreach_add_(updates, params, alpha=weight_decay)
            # Trust ratio φ(‖x‖) / ‖u‖, 1 where either norm is zero.
            weight_norm = torch.stack(torch._foreach_norm(params))
            if clamp_value is not None:
                weight_norm = weight_norm.clamp(max=clamp_value)
            update_norm = torch.stack(torch._foreach_norm(updates))
            one = torch.ones((), dtype=weight_norm.dtype, device=weight_norm.device)
            trust_ratio = torch.where((weight_norm > 0) & (update_norm > 0),
                                      weight_norm / update_norm, one)
            for state, ratio in zip(states, trust_ratio.unbind()):
                state["trust_ratio"] = ratio
            torch._foreach_mul_(updates, list((lr * trust_ratio).unbind()))
            torch._foreach_sub_(params, updates)
        return loss
