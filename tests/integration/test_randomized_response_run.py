"""`privacy.embeddings = "randomized-response"` end to end: a run at total ε = 4
ends with a ledger whose worst-case record is at ε ≤ 4 (recomputed from the ledger's k and
keep probability with the closed form), the primary receives one-hot codes only, each record
is charged once, and both transports give the same metrics."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from tests.helpers.network import served_in_threads, write_party_files
from tests.integration.test_privacy import write_run
from vflink.cli.main import main
from vflink.protocol.messages import Embeddings
from vflink.runfiles.config import (
    AlignmentConfig,
    DataConfig,
    PrivacyConfig,
    RunConfig,
    TrainingConfig,
)
from vflink.runfiles.inputs import Inputs, load_inputs
from vflink.runfiles.party import load_party_config
from vflink.runfiles.results import RunResult
from vflink.runner.federation import noise_seed
from vflink.runner.network import network_federation
from vflink.runner.train import run_training
from vflink.transport import Transcript

OPTIONS = {"n_samples": 600, "sigma_cf": 0.1, "seed": 3}


def test_a_run_at_total_epsilon_4_spends_at_most_4_once_per_record(tmp_path: Path) -> None:
    config = write_run(tmp_path, epochs=3, mode="randomized-response")
    text = config.read_text().replace("epsilon = 2.0\ndelta = 1e-2",
                                      "total_epsilon = 4\ndelta = 1e-5\ncode_bits = 3")
    config.write_text(text)
    out = tmp_path / "run"
    assert main(["train", "--config", str(config), "--out", str(out)]) == 0
    ledger = json.loads((out / "privacy.json").read_text())
    (entry,) = [p for p in ledger["protections"] if p["kind"] == "embedding-dp"]
    p, g = entry["params"], entry["guarantee"]
    assert p["mode"] == "randomized-response" and p["k"] == 8
    # three epochs, validation after each and a final evaluation: still one release each
    assert g["max_releases"] == g["run_max_releases"] == 1
    assert g["records_released"] == g["releases_total"] > 0
    keep, k = p["keep_probability"], p["k"]
    eps = g["max_releases"] * math.log((k - 1) * keep / (1 - keep))  # closed form
    assert eps <= 4.0 + 1e-9 and eps == pytest.approx(4.0)
    assert g["epsilon_total"] <= 4.0 and g["delta_total"] == 0.0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["privacy"]["bank"]["epsilon_total"] == g["epsilon_total"]


def _config(epochs: int = 2, quantiser: str = "simhash") -> RunConfig:
    return RunConfig(seed=3, algorithm="splitnn",
                     data=DataConfig(dataset="sklearn-small", options=dict(OPTIONS)),
                     alignment=AlignmentConfig(method="exact"),
                     training=TrainingConfig(epochs=epochs, patience=epochs),
                     privacy=PrivacyConfig(embeddings="randomized-response", total_epsilon=8.0,
                                           delta=1e-5, code_bits=4, quantiser=quantiser,
                                           # compared over both transports: seeded noise
                                           reproducible_noise=True))


def _run(transport: str, tmp_path: Path, transcript: Transcript, quantiser: str) -> RunResult:
    config = _config(quantiser=quantiser)
    out = tmp_path / transport
    if transport == "inprocess":
        return run_training(config, out, transcript=transcript)
    files = write_party_files(tmp_path / "net", dataset="sklearn-small", options=OPTIONS,
                              seed=3)
    with files["secondary"].open("a") as f:  # the secondary's own settings, same noise seed
        f.write('[privacy]\nembeddings = "randomized-response"\ntotal_epsilon = 8.0\n'
                f'delta = 1e-5\ncode_bits = 4\nquantiser = "{quantiser}"\n'
                f'reproducible_noise = true\nseed = {noise_seed(config, 0)}\n')
    with served_in_threads(files["coordinator"], files["secondary"]):
        federation = network_federation(load_party_config(files["primary"]), run_id=out.name,
                                        transcript=transcript)
        try:
            primary = load_inputs(config).primary
            return run_training(config, out, tables=Inputs(primary, ()), federation=federation)
        finally:
            federation.close()


@pytest.mark.network
@pytest.mark.parametrize("quantiser", ["simhash", "fields"])
def test_both_transports_give_the_same_metrics_and_only_one_hot_codes_cross(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, quantiser: str) -> None:
    monkeypatch.setenv("VFLINK_SECRET", "a-test-secret-shared-by-data-parties")
    results = {}
    for transport in ("inprocess", "grpc"):
        transcript = Transcript()
        results[transport] = _run(transport, tmp_path, transcript, quantiser)
        received = [r.message.embeddings for r in transcript.records
                    if isinstance(r.message, Embeddings) and r.receiver == "primary"]
        assert received
        for emb in received:  # one-hot rows of width k = 16, nothing else
            assert emb.shape[1] == 16
            assert torch.equal(emb.sum(dim=1), torch.ones(emb.shape[0]))
            assert set(torch.unique(emb).tolist()) <= {0.0, 1.0}
        (entry,) = [p for p in results[transport].extra["protections"]
                    if p["kind"] == "embedding-dp"]
        assert entry["guarantee"]["max_releases"] == 1
        assert entry["params"]["quantiser"] == quantiser
    local, remote = results["inprocess"], results["grpc"]
    for split in ("train", "validation", "test"):
        assert remote.metrics[split] == pytest.approx(local.metrics[split], rel=1e-6)
    assert remote.best_epoch == local.best_epoch
