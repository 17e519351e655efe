"""A whole in-process run under an explicit [policy]: every party enforces it and the run
still trains; what the policy refuses fails before anything is released."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from vflink.errors import ConfigError
from vflink.parties.policy import PartyPolicy
from vflink.runfiles.config import AlignmentConfig, DataConfig, RunConfig, TrainingConfig
from vflink.runner.train import run_training


def test_a_run_within_its_policy_trains_and_reports_the_noise(tmp_path: Path) -> None:
    policy = PartyPolicy(max_tau=0.999, max_pending_batches=2, max_snapshots=1)
    config = RunConfig(seed=1, algorithm="fedsim", policy=policy,
                       data=DataConfig(dataset="sklearn-small", options={"n_samples": 600}),
                       alignment=AlignmentConfig(method="soft", top_k=3, tau=0.999),
                       training=TrainingConfig(epochs=2, patience=2))
    result = run_training(config, tmp_path / "run")
    link = result.extra["alignment"]
    assert link["privacy"] == "bloom" and link["tau"] <= 0.999 + 1e-9 and link["sigma"] > 0
    assert math.isfinite(result.metrics["test"]["accuracy"])


def test_a_run_outside_its_policy_is_refused_at_load() -> None:
    with pytest.raises(ConfigError, match="requires noise"):
        RunConfig(data=DataConfig(dataset="sklearn-small"), policy=PartyPolicy(),
                  alignment=AlignmentConfig(method="soft", tau=1.0))  # σ = 0, explicitly
