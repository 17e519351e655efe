"""FLORIST in runs: every named strategy trains over the PSU union; PSI as an exact alignment
method gives the same run over both transports."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.helpers.network import served_in_threads, write_party_files
from vflink.alignment.synthetic import STRATEGIES
from vflink.runner.config import (
    AlignmentConfig,
    DataConfig,
    ModelConfig,
    RunConfig,
    TrainingConfig,
)
from vflink.runner.inputs import Inputs, load_inputs
from vflink.runner.network import network_federation
from vflink.runner.party_config import load_party_config
from vflink.runner.train import RunResult, prepare, run_training

OPTIONS = {"n_samples": 900, "sigma_cf": 0.1, "seed": 3}


def union_config(algorithm: str, alpha: float, beta: float) -> RunConfig:
    return RunConfig(seed=1, algorithm=algorithm,
                     data=DataConfig(dataset="kdd-protein", options={"max_rows": 1500}),
                     alignment=AlignmentConfig(method="psu", alpha=alpha, beta=beta),
                     model=ModelConfig(hidden=(16,), cut_dim=8, top_hidden=(8,)),
                     training=TrainingConfig(epochs=1, batch_size=128, split=(0.5, 0.2, 0.3)))


def test_every_strategy_trains_over_the_union() -> None:
    config = union_config("label-majority", 0.3, 0.4)
    prepared = prepare(config)  # hides, then PSU once; every strategy reuses the parties
    sim = prepared.summary["simulation"]
    n = len(prepared.inputs.primary)
    train = n - sim.n_held_out
    hidden_p, hidden_s = sim.sizes["hidden_from_primary"], sim.sizes["hidden_from_secondary"]
    assert hidden_p == round(0.4 * train) and hidden_s == round(0.3 * train)
    # the union is exactly the plaintext union of what each party kept
    assert sim.sizes["union"] == len(set(sim.p_table.frame["id"]) | set(sim.s_table.frame["id"]))
    for name in STRATEGIES.names():
        result = run_training(config.replace(algorithm=name), prepared=prepared)
        test = result.metrics["test"]
        assert 0.0 <= test["auc"] <= 1.0 and 0.0 <= test["ace"] <= 1.0, name
        florist = result.extra["florist"]
        if name == "baseline-full":
            assert florist["alpha"] == florist["beta"] == 0.0
            assert result.sizes["union"] == n
        elif name == "baseline-partial":
            assert result.sizes["train_uids"] < sim.sizes["union"] - sim.n_held_out
        else:
            assert result.sizes["train_uids"] == sim.sizes["union"] - sim.n_held_out
            # the spectral attack ran on both sides (synthetic labels and features exist)
            assert 0.0 <= test["attack_auc_passive"] <= 1.0
            assert 0.0 <= test["attack_auc_active"] <= 1.0
        if name.endswith(("-tr", "-te")) or name in ("florist", "florist-vanilla"):
            assert florist["calibration"]["a"] < 1.0


def run_psi(transport: str, tmp_path: Path) -> RunResult:
    config = RunConfig(seed=3, algorithm="splitnn",
                       data=DataConfig(dataset="sklearn-small", options=dict(OPTIONS)),
                       alignment=AlignmentConfig(method="psi"),
                       training=TrainingConfig(epochs=2, patience=2))
    out = tmp_path / f"psi-{transport}"
    if transport == "inprocess":
        return run_training(config, out)
    files = write_party_files(tmp_path / transport, dataset="sklearn-small", options=OPTIONS,
                              seed=3)
    with served_in_threads(files["coordinator"], files["secondary"]):
        federation = network_federation(load_party_config(files["primary"]), run_id=out.name)
        try:
            primary = load_inputs(config).primary
            return run_training(config, out, tables=Inputs(primary, ()), federation=federation)
        finally:
            federation.close()


@pytest.mark.network
def test_psi_alignment_is_the_exact_alignment_over_both_transports(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VFLINK_SECRET", "a-test-secret-shared-by-data-parties")
    local = run_psi("inprocess", tmp_path)
    remote = run_psi("grpc", tmp_path)
    exact = run_training(RunConfig(seed=3, algorithm="splitnn", data=DataConfig(
        dataset="sklearn-small", options=dict(OPTIONS)), alignment=AlignmentConfig(
        method="exact"), training=TrainingConfig(epochs=2, patience=2)))
    for split in ("train", "validation", "test"):
        assert remote.metrics[split] == pytest.approx(local.metrics[split], rel=1e-6)
        # PSI links exactly the records keyed-hash matching links: the same run
        assert local.metrics[split] == pytest.approx(exact.metrics[split], rel=1e-6)
    assert local.sizes["aligned_rows"] == exact.sizes["aligned_rows"]
    assert np.isfinite(local.metrics["test"]["accuracy"])
