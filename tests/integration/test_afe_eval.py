"""train_and_attack: train in-process, then membership inference and inversion on a secondary."""

from __future__ import annotations

import math

import pytest

from vflink.experiments.afe import train_and_attack
from vflink.runfiles.config import DataConfig, PrivacyConfig, RunConfig, TrainingConfig
from vflink.runfiles.inputs import load_inputs

PRIVACY = {
    "off": PrivacyConfig(embeddings="off"),
    "afe": PrivacyConfig(embeddings="afe", epsilon=4.0),
    # budget first (total ε): the attack's two queries after training are kept in reserve
    "normalized": PrivacyConfig(embeddings="normalized", total_epsilon=8.0, delta=1e-5,
                                reserve_releases=2),
    "randomized-response": PrivacyConfig(embeddings="randomized-response", total_epsilon=8.0,
                                         delta=1e-5, code_bits=4),
}


@pytest.mark.parametrize("mode", list(PRIVACY))
def test_train_and_attack_reports_both_attacks(mode: str) -> None:
    data = DataConfig(dataset="sklearn-small", options={"n_samples": 500, "sigma_cf": 0.0})
    config = RunConfig(seed=1, data=data, training=TrainingConfig(epochs=2),
                       privacy=PRIVACY[mode])
    aux = load_inputs(config.replace(seed=9))  # another draw of the same distribution
    out = train_and_attack(config, aux, n_candidates=50, shadow_models=1, decoder_epochs=3)
    assert out.membership is not None and out.inversion is not None
    assert 0.0 <= out.membership["metrics"]["accuracy"] <= 1.0
    assert out.membership["details"] == {"candidates": 100, "members": 50}
    assert math.isfinite(out.inversion["metrics"]["mse_ratio"])
    truth, recon = out.examples  # type: ignore[misc]
    assert truth.shape == recon.shape and truth.shape[0] == 10
    protected = any(p["kind"] == "embedding-dp" for p in out.result.extra.get("protections", []))
    assert protected == (mode != "off")
