"""DP embeddings end to end: `vflink train` writes the privacy ledger, a budget stops a run,
and over both transports the primary never receives an embedding that was not clipped and
noised (VFL-AFE Algorithm 1 runs inside the secondary)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from tests.helpers.network import served_in_threads, write_party_files
from tests.helpers.tables import two_party_tables
from vflink.cli.main import main
from vflink.errors import ConfigError
from vflink.privacy.accounting import calibrate
from vflink.protocol.messages import Embeddings, SetupPrivacy
from vflink.runfiles.config import (
    AlignmentConfig,
    DataConfig,
    PrivacyConfig,
    RunConfig,
    TrainingConfig,
)
from vflink.runfiles.inputs import Inputs, load_inputs
from vflink.runfiles.party import load_party_config
from vflink.runner.network import network_federation
from vflink.runner.train import run_training
from vflink.transport import Transcript

RUN = """version = 1
seed = 0
algorithm = "splitnn"
[[data.parties]]
name = "primary"
role = "primary"
path = "primary.csv"
key = ["id"]
numeric = ["p0", "p1"]
label = "y"
task = "binary"
[[data.parties]]
name = "bank"
role = "secondary"
path = "bank.csv"
key = ["id"]
numeric = ["s0", "s1", "s2", "s3", "s4", "s5", "s6", "s7"]
[training]
epochs = {epochs}
patience = 10
[privacy]
embeddings = "{mode}"
epsilon = 2.0
delta = 1e-2
clip = 1.0
{extra}
"""


def write_run(tmp_path: Path, *, epochs: int, mode: str = "vanilla", extra: str = "") -> Path:
    primary, bank = two_party_tables(400, seed=3)
    primary.frame.to_csv(tmp_path / "primary.csv", index=False)
    bank.frame.to_csv(tmp_path / "bank.csv", index=False)
    config = tmp_path / f"run-{epochs}-{mode}.toml"
    config.write_text(RUN.format(epochs=epochs, mode=mode, extra=extra))
    return config


def test_train_writes_privacy_json_whose_total_grows_with_epochs(tmp_path: Path) -> None:
    totals = []
    for epochs in (2, 4):
        config = write_run(tmp_path, epochs=epochs)
        out = tmp_path / f"runs-{epochs}"
        assert main(["train", "--config", str(config), "--out", str(out)]) == 0
        ledger = json.loads((out / "privacy.json").read_text())
        assert ledger["version"] == 1
        (entry,) = [p for p in ledger["protections"] if p["kind"] == "embedding-dp"]
        assert entry["kind"] == "embedding-dp" and entry["party"] == "bank"
        assert entry["applies_to"] == "embeddings"
        g, p = entry["guarantee"], entry["params"]
        assert g["epsilon_per_release"] == 2.0 and g["delta"] == 1e-2
        assert p["mode"] == "vanilla" and p["calibration"] == "analytic-gaussian"
        assert p["sigma"] == pytest.approx(calibrate(2.0, 1e-2).sigma)
        # every training record: once per epoch, and once more in the final evaluation
        assert g["max_releases"] == epochs + 1
        assert g["epsilon_total"] > g["epsilon_per_release"]
        totals.append(g["epsilon_total"])
        metrics = json.loads((out / "metrics.json").read_text())
        assert metrics["privacy"]["bank"]["epsilon_total"] == g["epsilon_total"]
        # the ledger adds the alignment's own protections (keyed hashes) to what parties report
        assert all(p in ledger["protections"] for p in metrics["protections"])
    assert totals[1] > totals[0]


def test_a_budget_below_one_release_is_refused_before_training(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]
                                                               ) -> None:
    config = write_run(tmp_path, epochs=3, extra="budget = 1.0")
    out = tmp_path / "runs" / "r"
    assert main(["train", "--config", str(config), "--out", str(out)]) == 2
    assert "privacy.budget" in capsys.readouterr().err
    assert not out.exists() and not (out.parent / ".r.partial").exists()


def test_a_spent_budget_stops_training_and_nothing_looks_finished(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # ε(1 release) = 2 fits, ε(2 releases) ≈ 3.19 does not: epoch 2 must stop
    config = write_run(tmp_path, epochs=5, extra="budget = 2.5")
    out = tmp_path / "runs" / "r"
    assert main(["train", "--config", str(config), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "privacy budget" in err and "2.5" in err and "privacy.budget" in err
    assert not out.exists()
    staging = out.parent / ".r.partial"
    # the last good checkpoint (epoch 1) is kept for inspection, and nothing else
    assert (staging / "models" / "primary" / "checkpoint.json").exists()
    assert (staging / "models" / "bank" / "checkpoint-0001.json").exists()
    assert not (staging / "metrics.json").exists() and not (staging / "privacy.json").exists()


def test_regression_with_adjust_is_a_config_error() -> None:
    config = RunConfig(data=DataConfig(dataset="sklearn-small", options={"n_samples": 300}),
                       training=TrainingConfig(epochs=1), privacy=PrivacyConfig(embeddings="afe"))
    run_training(config)  # binary: fine
    reg = RunConfig(data=DataConfig(dataset="california-housing",
                                    options={"max_rows": 300}),
                    alignment=AlignmentConfig(method="soft", metric="haversine", top_k=2,
                                              privacy="off"),
                    training=TrainingConfig(epochs=1), privacy=PrivacyConfig(embeddings="adjust"))
    with pytest.raises(ConfigError, match="classification"):
        run_training(reg)


# --- the boundary: only clipped and noised embeddings reach the primary ---------------------

OPTIONS = {"n_samples": 600, "sigma_cf": 0.1, "seed": 3}
# ε < 1: Lemma 3.3, σ ≈ 7.8 at δ = 1e-2; the noise (std 2σt) dwarfs any clipped embedding (≤ t)
PRIVACY = PrivacyConfig(embeddings="afe", epsilon=0.4, delta=1e-2, clip=0.05)


def _received(transcript: Transcript, primary: str) -> torch.Tensor:
    embeddings = [r.message.embeddings for r in transcript.records
                  if isinstance(r.message, Embeddings) and r.receiver == primary]
    assert embeddings, "no embeddings crossed"
    return torch.cat(embeddings)


def _check_noised(received: torch.Tensor) -> None:
    std = 2 * calibrate(PRIVACY.epsilon, PRIVACY.delta).sigma * PRIVACY.clip
    norms = torch.linalg.vector_norm(received, dim=1)
    # an un-noised embedding has norm ≤ t after clipping (and ≈ 2t at most after rescaling)
    assert float(norms.min()) > 2 * PRIVACY.clip
    # what crossed is (almost) pure N(0, (2σt)²): clipped signal is ≤ 2t ≪ 2σt = 0.78
    assert float(received.std()) == pytest.approx(std, rel=0.05)


@pytest.mark.network
@pytest.mark.parametrize("transport", ["inprocess", "grpc"])
def test_the_primary_only_receives_noised_embeddings(transport: str, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VFLINK_SECRET", "a-test-secret-shared-by-data-parties")
    config = RunConfig(seed=3, algorithm="splitnn",
                       data=DataConfig(dataset="sklearn-small", options=dict(OPTIONS)),
                       alignment=AlignmentConfig(method="exact"),
                       training=TrainingConfig(epochs=2, patience=2), privacy=PRIVACY)
    transcript = Transcript()
    out = tmp_path / transport
    if transport == "inprocess":
        result = run_training(config, out, transcript=transcript)
    else:
        files = write_party_files(tmp_path / "net", dataset="sklearn-small", options=OPTIONS,
                                  seed=3)
        # the secondary's own protection, in its party file (the primary cannot change it)
        with files["secondary"].open("a") as f:
            f.write('[privacy]\nembeddings = "afe"\nepsilon = 0.4\ndelta = 1e-2\nclip = 0.05\n')
        with served_in_threads(files["coordinator"], files["secondary"]):
            federation = network_federation(load_party_config(files["primary"]),
                                            run_id=out.name, transcript=transcript)
            try:
                primary = load_inputs(config).primary
                result = run_training(config, out, tables=Inputs(primary, ()),
                                      federation=federation)
            finally:
                federation.close()
    received = _received(transcript, "primary")
    _check_noised(received)
    setups = [r.message for r in transcript.records if isinstance(r.message, SetupPrivacy)]
    assert setups and "seed" not in setups[0].settings  # the noise seed never crosses
    (entry,) = [p for p in result.extra["protections"] if p["kind"] == "embedding-dp"]
    assert entry["party"] == "secondary" and entry["params"]["mode"] == "afe"
    assert entry["guarantee"]["records_released"] > 0
    assert (out / "privacy.json").exists()


@pytest.mark.network
def test_a_secondary_refuses_a_run_that_would_weaken_its_protection(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VFLINK_SECRET", "a-test-secret-shared-by-data-parties")
    files = write_party_files(tmp_path, dataset="sklearn-small", options=OPTIONS, seed=3)
    with files["secondary"].open("a") as f:
        f.write('[privacy]\nembeddings = "afe"\nepsilon = 0.4\n')
    config = RunConfig(seed=3, data=DataConfig(dataset="sklearn-small", options=dict(OPTIONS)),
                       training=TrainingConfig(epochs=1),
                       privacy=PrivacyConfig(embeddings="vanilla", epsilon=8.0))
    with served_in_threads(files["coordinator"], files["secondary"]):
        federation = network_federation(load_party_config(files["primary"]), run_id="x")
        try:
            primary = load_inputs(config).primary
            with pytest.raises(ConfigError, match="other settings than the run expects"):
                run_training(config, tables=Inputs(primary, ()), federation=federation)
        finally:
            federation.close()


def test_in_process_noise_is_reproducible_and_exactly_2_sigma_t() -> None:
    """In-process, recompute the clipped embeddings from the secondary's own model and check
    that what the primary received differs from them by exactly the calibrated noise: the same
    noise from the same seed behind the one switch, fresh secret noise without it."""
    config = RunConfig(seed=1, data=DataConfig(dataset="sklearn-small", options=dict(OPTIONS)),
                       training=TrainingConfig(epochs=1),
                       privacy=PrivacyConfig(embeddings="vanilla", epsilon=0.5, clip=0.5,
                                             reproducible_noise=True))
    runs = []
    for _ in range(2):
        transcript = Transcript()
        result = run_training(config, transcript=transcript)
        runs.append((_received(transcript, "primary"), result.metrics))
    torch.testing.assert_close(runs[0][0], runs[1][0])  # same seed, same noise
    assert runs[0][1] == runs[1][1]
    secret = config.replace(privacy=dataclasses.replace(config.privacy,
                                                        reproducible_noise=False))
    transcript = Transcript()
    run_training(secret, transcript=transcript)
    assert not torch.equal(_received(transcript, "primary"), runs[0][0])
    # Lemma 3.3 (ε < 1): noise std 2σt ≈ 6.2 against clipped signal of norm ≤ t = 0.5
    noise_std = 2 * calibrate(0.5, 1e-2).sigma * 0.5
    assert float(runs[0][0].std()) == pytest.approx(noise_std, rel=0.05)


VFL_ALGORITHMS = ("splitnn", "exact", "top1sim", "avgsim", "featuresim", "fedsim",
                  "fedsim-no-weight", "fedsim-no-sort", "fedsim-mlp-merge", "fedsim-mean-merge")


@pytest.mark.parametrize("algorithm", VFL_ALGORITHMS)
def test_every_algorithm_with_secondaries_is_protected(algorithm: str) -> None:
    """Soft linkage: a secondary row linked to several primary records is released several
    times per epoch; the ledger counts every release of it."""
    config = RunConfig(seed=2, algorithm=algorithm,
                       data=DataConfig(dataset="sklearn-small",
                                       options={"n_samples": 400, "sigma_cf": 0.0, "seed": 2}),
                       alignment=AlignmentConfig(method="soft", metric="euclidean", top_k=3,
                                                 privacy="off"),
                       training=TrainingConfig(epochs=1, batch_size=64, knn_batch_size=16),
                       privacy=PrivacyConfig(embeddings="afe", epsilon=4.0))
    transcript = Transcript()
    result = run_training(config, transcript=transcript)
    (entry,) = [p for p in result.extra["protections"] if p["kind"] == "embedding-dp"]
    g = entry["guarantee"]
    assert g["records_released"] > 0 and g["epsilon_total"] >= 4.0 - 1e-6
    assert g["max_links_per_record"] >= 1
    if algorithm not in ("splitnn", "exact", "top1sim"):  # K = 3 links per primary record
        assert g["max_links_per_record"] > 1
        assert g["max_releases"] > 2  # more than one training and one final evaluation release
    sent = _received(transcript, "primary")
    assert float(torch.linalg.vector_norm(sent, dim=1).min()) > 0  # noised, never exactly 0
