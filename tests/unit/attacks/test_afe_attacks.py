"""§4.3 attacks on synthetic data with oracles: membership inference is a coin flip when members
and non-members are alike and wins on an overfit model; inversion recovers a linear embedding
exactly and nothing through overwhelming noise."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from vflink.attacks import ATTACKS, AttackView, DecoderInversion, ShadowMembershipInference
from vflink.attacks._shadow import (
    CodeBottom,
    Release,
    released_embeddings,
    released_posteriors,
    train_split_model,
)
from vflink.attacks.base import Attack
from vflink.attacks.inversion import inversion_grid_png
from vflink.privacy import randomized_response as rr
from vflink.privacy.config import PrivacyConfig
from vflink.privacy.embedding_dp import EmbeddingDP

P, C = 20, 4


def _data(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    # random labels: only memorisation can predict them (the overfit oracle)
    return rng.normal(size=(n, P)).astype(np.float32), rng.integers(0, C, size=n)


def _mi_view(members_trained: bool, release: Release, *, posteriors: bool = True
             ) -> tuple[AttackView, np.ndarray]:
    x, y = _data(800, 0)
    train_x, train_y = x[:100], y[:100]
    victim = train_split_model(train_x, train_y, classes=C, release=release, cut_dim=8,
                               epochs=150, seed=7)
    # candidates: 100 members and 100 records the victim never saw
    if members_trained:
        cand = np.r_[np.arange(100), np.arange(100, 200)]
    else:  # "members" drawn from the same distribution but not trained on: no signal
        cand = np.r_[np.arange(200, 300), np.arange(100, 200)]
    emb = released_embeddings(victim, x[cand], release, torch.Generator().manual_seed(1))
    post = released_posteriors(victim, x[cand], release, torch.Generator().manual_seed(1))
    view = AttackView(party="primary", role="primary", embeddings=emb,
                      extra={"labels": y[cand], **({"posteriors": post} if posteriors else {}),
                             "shadow_features": x[300:700],
                             "shadow_labels": y[300:700], "classes": C,
                             "mechanism": {"clip": release.clip,
                                           "noise_std": release.noise_std}})
    return view, np.r_[np.ones(100), np.zeros(100)]


def test_attacks_are_registered_and_follow_the_contract() -> None:
    for name, cls in (("membership-shadow", ShadowMembershipInference),
                      ("inversion-decoder", DecoderInversion)):
        assert ATTACKS.get(name) is cls
        assert isinstance(cls(), Attack)
        assert cls.needs <= {"embeddings", "extra"} and cls.role == "primary"


def test_membership_inference_wins_on_an_overfit_model() -> None:
    view, truth = _mi_view(True, Release())
    result = ShadowMembershipInference(shadow_models=2, cut_dim=8, epochs=150,
                                       seed=1).evaluate(view, {"membership": truth})
    assert result.metrics["accuracy"] > 0.7 and result.metrics["auc"] > 0.75


def test_raw_embeddings_do_not_transfer_between_models() -> None:
    # why the attack works on the model's posteriors: each model's embedding space differs
    view, truth = _mi_view(True, Release(), posteriors=False)
    result = ShadowMembershipInference(shadow_models=2, cut_dim=8, epochs=150,
                                       seed=1).evaluate(view, {"membership": truth})
    assert result.metrics["accuracy"] < 0.65


def test_membership_inference_is_a_coin_flip_on_identically_distributed_records() -> None:
    view, truth = _mi_view(False, Release())
    result = ShadowMembershipInference(shadow_models=2, cut_dim=8, epochs=150,
                                       seed=1).evaluate(view, {"membership": truth})
    assert abs(result.metrics["accuracy"] - 0.5) < 0.1


def test_membership_inference_is_defeated_by_heavy_noise() -> None:
    release = Release(clip=0.1, noise_std=5.0)
    view, truth = _mi_view(True, release)
    result = ShadowMembershipInference(shadow_models=1, cut_dim=8, epochs=40,
                                       seed=1).evaluate(view, {"membership": truth})
    assert abs(result.metrics["accuracy"] - 0.5) < 0.12


def _inversion_view(noise: float) -> tuple[AttackView, np.ndarray]:
    rng = np.random.default_rng(3)
    w = rng.normal(size=(P, 2 * P)).astype(np.float32)  # injective linear f
    aux = rng.normal(size=(2000, P)).astype(np.float32)
    target = rng.normal(size=(200, P)).astype(np.float32)

    def f(x: np.ndarray) -> np.ndarray:
        return x @ w + noise * rng.normal(size=(len(x), 2 * P)).astype(np.float32)

    view = AttackView(party="primary", role="primary", embeddings=f(target),
                      extra={"aux_features": aux, "aux_embeddings": f(aux)})
    return view, target


def test_inversion_recovers_a_linear_embedding() -> None:
    view, target = _inversion_view(0.0)
    result = DecoderInversion(hidden=(64,), epochs=40).evaluate(view, {"features": target})
    assert result.metrics["baseline_mse"] == pytest.approx(1.0, rel=0.15)  # unit variance
    assert result.metrics["mse_ratio"] < 0.1


def test_inversion_learns_nothing_through_overwhelming_noise() -> None:
    view, target = _inversion_view(100.0)
    result = DecoderInversion(hidden=(64,), epochs=20).evaluate(view, {"features": target})
    assert result.metrics["mse_ratio"] > 0.9


def test_inversion_grid_png(tmp_path: Path) -> None:
    images = np.random.default_rng(0).random((10, 28 * 14))
    path = inversion_grid_png([("truth", images), ("unprotected", images)], (28, 14),
                              tmp_path / "grid.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_response_release_keeps_codes_at_the_formula_rate() -> None:
    # randomized-response: what a shadow's release does to a one-hot code
    k, eps, n = 16, 3.0, 20_000
    codes = np.random.default_rng(0).integers(0, k, n)
    release = Release.from_extra({"mechanism": {"response_k": k, "response_epsilon": eps}})
    out = release(rr.one_hot(codes, k), torch.Generator().manual_seed(1))
    assert out.shape == (n, k) and torch.equal(out.sum(dim=1), torch.ones(n))
    kept = float((out.argmax(dim=1).numpy() == codes).mean())
    p = rr.keep_probability(eps, k)
    assert abs(kept - p) < 5 * math.sqrt(p * (1 - p) / n)


def test_the_attackers_simulation_is_the_victims_release() -> None:
    # at a huge ε the shadow's fixed bottom + release give exactly what the victim sent
    dp = EmbeddingDP(PrivacyConfig(embeddings="randomized-response", total_epsilon=60.0,
                                   delta=1e-5, code_bits=4), party="v", n_rows=40, seed=2)
    dp.note_links(np.ones(40, dtype=np.int64))
    dp.set_plan({"epochs": 1, "train_batches": 1, "train_chunks": 1, "validation_chunks": 1,
                 "test_chunks": 1})
    x = torch.randn(40, 6, generator=torch.Generator().manual_seed(3))
    _, sent = dp.release(torch.zeros(40, 2), np.arange(40), x)
    bottom = CodeBottom(dp.quantise, dp.config.codes)
    release = Release(response_k=16, response_epsilon=60.0)
    simulated = release(bottom(x), torch.Generator().manual_seed(0))
    assert torch.equal(simulated, sent)
