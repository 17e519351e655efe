"""FLORIST in runs: every named strategy trains over the PSU union; union training and PSI as
an exact alignment method give the same run over both transports."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.helpers.network import served_in_threads, start_process, write_party_files
from vflink.alignment.synthetic import STRATEGIES
from vflink.errors import ConfigError
from vflink.privacy.config import PrivacyConfig
from vflink.runfiles.config import (
    AlignmentConfig,
    DataConfig,
    ModelConfig,
    RunConfig,
    TrainingConfig,
)
from vflink.runfiles.inputs import Inputs, load_inputs
from vflink.runfiles.party import load_party_config
from vflink.runfiles.results import RunResult
from vflink.runner.network import network_federation
from vflink.runner.prepare import prepare
from vflink.runner.train import run_training

OPTIONS = {"n_samples": 900, "sigma_cf": 0.1, "seed": 3}


def union_config(algorithm: str, alpha: float, beta: float, epochs: int = 1) -> RunConfig:
    return RunConfig(seed=1, algorithm=algorithm,
                     data=DataConfig(dataset="kdd-protein", options={"max_rows": 1500}),
                     alignment=AlignmentConfig(method="psu", alpha=alpha, beta=beta),
                     model=ModelConfig(hidden=(16,), cut_dim=8, top_hidden=(8,)),
                     training=TrainingConfig(epochs=epochs, batch_size=128,
                                             split=(0.5, 0.2, 0.3)),
                     # runs compared number for number: the seeded draws, behind the switch
                     privacy=PrivacyConfig(reproducible_noise=True))


@pytest.mark.slow
def test_every_strategy_trains_over_the_union() -> None:
    config = union_config("label-majority", 0.3, 0.4)
    prepared = prepare(config)  # hides, then PSU once; every strategy reuses the parties
    sim = prepared.summary["simulation"]
    n = len(prepared.inputs.primary)
    train = n - sim.n_held_out
    hidden_p, hidden_s = sim.sizes["hidden_from_primary"], sim.sizes["hidden_from_secondary"]
    assert hidden_p == round(0.4 * train) and hidden_s == round(0.3 * train)
    # the union is exactly the plaintext union of what each party kept
    assert sim.s_table is not None
    assert sim.sizes["union"] == len(set(sim.p_table.frame["id"]) | set(sim.s_table.frame["id"]))
    for name in STRATEGIES.names():
        run = config.replace(algorithm=name)
        if name == "label-neighbors":  # the default (dp) cannot account for it: refused
            with pytest.raises(ConfigError, match="the default label protection"):
                run_training(run, prepared=prepared)
            run = run.replace(privacy=PrivacyConfig(reproducible_noise=True, labels="rr-prior"))
        result = run_training(run, prepared=prepared)
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
                       training=TrainingConfig(epochs=2, patience=2),
                       privacy=PrivacyConfig(reproducible_noise=True))
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
        method="exact"), training=TrainingConfig(epochs=2, patience=2),
        privacy=PrivacyConfig(reproducible_noise=True)))
    for split in ("train", "validation", "test"):
        assert remote.metrics[split] == pytest.approx(local.metrics[split], rel=1e-6)
        # PSI links exactly the records keyed-hash matching links: the same run
        assert local.metrics[split] == pytest.approx(exact.metrics[split], rel=1e-6)
    assert local.sizes["aligned_rows"] == exact.sizes["aligned_rows"]
    assert np.isfinite(local.metrics["test"]["accuracy"])


#: compared run for run: the primary holds every training record (β = 0), so the batches do not
#: depend on PSU's random exponents (vflink.runner.union)
SAME_OVER_BOTH = ("fea-sampling", "fea-gaussian", "fea-sampling-tr", "baseline-partial")


@pytest.mark.slow
@pytest.mark.network
def test_union_training_is_the_same_over_both_transports(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VFLINK_SECRET", "a-test-secret-shared-by-data-parties")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the served process computes as this one does
    config = union_config("fea-sampling", alpha=0.3, beta=0.0, epochs=2)
    # in one process: the simulation hides 30 % of the training records from the secondary
    prepared = prepare(config)
    sim = prepared.summary["simulation"]
    local = {a: run_training(config.replace(algorithm=a), prepared=prepared)
             for a in SAME_OVER_BOTH}
    # across hosts: `vflink serve` (a real process) holds the table the simulation left the
    # secondary; the primary runs the same code against it over gRPC with mutual TLS
    assert sim.s_table is not None
    s_schema = sim.s_table.schema
    s_path = tmp_path / "passive.parquet"
    sim.s_table.frame.to_parquet(s_path, index=False)
    primary = prepared.inputs.primary
    local_both = run_training(union_config("florist", alpha=0.0, beta=0.4),
                              tables=Inputs(primary, (sim.s_table,)))
    files = write_party_files(tmp_path, dataset="kdd-protein", options={"max_rows": 1500},
                              seed=1, primary=primary.name, secondary=s_schema.name,
                              secondary_table={"path": s_path, "key": list(s_schema.key),
                                               "numeric": list(s_schema.numeric)},
                              reproducible_secondary=True)  # its stand-ins repeat too
    with files[s_schema.name].open("a") as f:  # fea-gaussian leaks membership by design
        f.write('[policy]\nunion_features = ["fea-sampling", "fea-gaussian", "none"]\n')
    proc = start_process(files[s_schema.name], tmp_path / "passive.log")
    try:
        federation = network_federation(load_party_config(files[primary.name]), run_id="union")
        try:
            tables = Inputs(primary, ())  # the secondary's data stay with it
            remote_config = union_config("fea-sampling", alpha=0.0, beta=0.0, epochs=2)
            remote = {a: run_training(remote_config.replace(algorithm=a), tables=tables,
                                      federation=federation) for a in SAME_OVER_BOTH}
            remote_both = run_training(union_config("florist", alpha=0.0, beta=0.4),
                                       tables=tables, federation=federation)
        finally:
            federation.close()
    finally:
        proc.terminate()
        proc.wait(10)
    for a in SAME_OVER_BOTH:
        here, there = local[a], remote[a]
        assert there.sizes["union"] == here.sizes["union"] == len(primary)
        assert there.sizes["train_uids"] == here.sizes["train_uids"]
        for split in ("train", "validation"):
            assert there.metrics[split] == pytest.approx(here.metrics[split], rel=1e-6), a
        test_here, test_there = dict(here.metrics["test"]), dict(there.metrics["test"])
        # the active party's attack is scored against the secondary's truth: not across hosts
        assert np.isnan(test_there.pop("attack_auc_active"))
        assert np.isnan(test_there.pop("attack_auc_active_outlier"))
        if a != "baseline-partial":
            assert 0.0 <= test_here.pop("attack_auc_active") <= 1.0
        else:
            test_here.pop("attack_auc_active")
        test_here.pop("attack_auc_active_outlier")
        assert test_there == pytest.approx(test_here, rel=1e-6, nan_ok=True), a
        assert there.communication == here.communication, a
        assert there.extra["florist"]["p_p"] == here.extra["florist"]["p_p"] < 1.0
    # synthetic labels across hosts: the records the primary lacks sit where PSU's secret
    # exponents put them in U, so the batches (hence the numbers) differ between any two runs;
    # the plan and the sizes do not
    local_sizes = dict(local_both.sizes)
    assert local_sizes.pop("hidden_from_secondary") == 0  # only the simulation knows
    assert remote_both.sizes == local_sizes
    assert local_sizes["union"] < len(primary) and local_sizes["secondary_rows"] < len(primary)
    assert remote_both.extra["florist"]["calibration"] == local_both.extra["florist"][
        "calibration"]
    assert 0.0 <= remote_both.metrics["test"]["attack_auc_passive"] <= 1.0
    assert 0.0 <= remote_both.metrics["test"]["auc"] <= 1.0
