"""LAMB against a numpy oracle of the update in You et al. (2020), Algorithm 2."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from vflink.errors import ConfigError
from vflink.models.lamb import Lamb
from vflink.models.mlp import seeded_init


def lamb_oracle(x: np.ndarray, grads: list[np.ndarray], *, lr: float, betas: tuple[float, float],
                eps: float, weight_decay: float, clamp: float | None,
                bias_correction: bool) -> list[np.ndarray]:
    """Parameters after each step, straight from the formula (float64)."""
    b1, b2 = betas
    m = np.zeros_like(x)
    v = np.zeros_like(x)
    out = []
    for t, g in enumerate(grads, start=1):
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        m_hat, v_hat = (m / (1 - b1**t), v / (1 - b2**t)) if bias_correction else (m, v)
        u = m_hat / (np.sqrt(v_hat) + eps) + weight_decay * x
        phi = float(np.linalg.norm(x))
        if clamp is not None:
            phi = min(phi, clamp)
        u_norm = np.linalg.norm(u)
        ratio = phi / u_norm if phi > 0 and u_norm > 0 else 1.0
        x = x - lr * ratio * u
        out.append(x.copy())
    return out


def run_lamb(x0: np.ndarray, grads: list[np.ndarray], **kwargs: object) -> list[np.ndarray]:
    p = torch.nn.Parameter(torch.tensor(x0, dtype=torch.float64))
    opt = Lamb([p], **kwargs)  # type: ignore[arg-type]
    out = []
    for g in grads:
        p.grad = torch.tensor(g, dtype=torch.float64)
        opt.step()
        out.append(p.detach().numpy().copy())
    return out


CASES = {
    "plain": dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0, clamp=10.0,
                  bias_correction=True),
    "weight-decay": dict(lr=3e-3, betas=(0.8, 0.99), eps=1e-8, weight_decay=1e-2, clamp=10.0,
                         bias_correction=True),
    "no-debias": dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=1e-4, clamp=10.0,
                      bias_correction=False),
    "unclamped": dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-6, weight_decay=1e-4, clamp=None,
                      bias_correction=True),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("scale", [0.5, 30.0])  # 30: ‖x‖ > 10, so φ clamps
def test_matches_formula_for_three_steps(case: str, scale: float) -> None:
    rng = np.random.default_rng(0)
    x0 = rng.normal(size=(3, 4)) * scale / np.sqrt(12)
    grads = [rng.normal(size=(3, 4)) for _ in range(3)]
    cfg = dict(CASES[case])
    clamp = cfg.pop("clamp")
    expected = lamb_oracle(x0, grads, clamp=clamp, **cfg)  # type: ignore[arg-type]
    got = run_lamb(x0, grads, clamp_value=clamp, **cfg)
    for e, g in zip(expected, got):
        np.testing.assert_allclose(g, e, rtol=1e-12, atol=1e-14)
    assert not np.allclose(got[-1], x0)


def test_zero_weights_use_trust_ratio_one() -> None:
    # A zero-initialised bias: φ(‖x‖) = 0, so the ratio falls back to 1 (an Adam step).
    x0 = np.zeros(5)
    grads = [np.array([1.0, -2.0, 0.5, 0.0, 3.0])]
    got = run_lamb(x0, grads, lr=0.1)
    expected = lamb_oracle(x0, grads, lr=0.1, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0,
                           clamp=10.0, bias_correction=True)
    np.testing.assert_allclose(got[0], expected[0], rtol=1e-12)
    # With bias correction the first Adam step is ±lr on every coordinate with a gradient.
    np.testing.assert_allclose(got[0], -0.1 * np.sign(grads[0]), atol=1e-6)


def test_zero_update_leaves_parameters_unchanged() -> None:
    x0 = np.array([1.0, 2.0])
    got = run_lamb(x0, [np.zeros(2), np.zeros(2)], lr=0.1)
    np.testing.assert_array_equal(got[-1], x0)


def test_parameter_without_gradient_is_untouched() -> None:
    a = torch.nn.Parameter(torch.ones(3))
    b = torch.nn.Parameter(torch.ones(3))
    opt = Lamb([a, b], lr=0.1)
    a.grad = torch.ones(3)
    opt.step()
    assert torch.equal(b.detach(), torch.ones(3))
    assert not torch.equal(a.detach(), torch.ones(3))


def test_closure_and_state_dict_round_trip() -> None:
    gen = torch.Generator().manual_seed(0)
    with seeded_init(0):
        model = torch.nn.Linear(3, 1)
    x, y = torch.randn(8, 3, generator=gen), torch.randn(8, 1, generator=gen)
    opt = Lamb(model.parameters(), lr=1e-2, weight_decay=1e-4)

    def closure() -> float:
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        return float(loss.detach())

    first = opt.step(closure)
    assert isinstance(first, float)
    clone = torch.nn.Linear(3, 1)
    clone.load_state_dict(model.state_dict())
    opt2 = Lamb(clone.parameters(), lr=1e-2, weight_decay=1e-4)
    opt2.load_state_dict(copy.deepcopy(opt.state_dict()))  # torch aliases state tensors
    opt.step(closure)
    opt2.zero_grad()
    torch.nn.functional.mse_loss(clone(x), y).backward()
    opt2.step()
    for p, q in zip(model.parameters(), clone.parameters()):
        assert torch.allclose(p, q)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"lr": -1.0}, "`lr` must be a finite number ≥ 0.0, got -1.0"),
    ({"betas": (0.9, 1.0)}, "`betas[1]` must be < 1"),
    ({"weight_decay": -1e-4}, "`weight_decay` must be a finite number ≥ 0.0"),
    ({"clamp_value": 0.0}, "`clamp_value` must be a finite number > 0.0"),
])
def test_invalid_settings_raise(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("[", r"\[")):
        Lamb([torch.nn.Parameter(torch.zeros(1))], **kwargs)  # type: ignore[arg-type]
