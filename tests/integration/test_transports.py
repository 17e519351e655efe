"""The same scenarios over the in-process and the gRPC transport (mutual TLS on 127.0.0.1)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.network import served_in_threads, write_party_files
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
from vflink.runner.train import run_training

pytestmark = pytest.mark.network

OPTIONS = {"n_samples": 900, "sigma_cf": 0.1, "seed": 3}
SCENARIOS = {
    "exact-splitnn": ("splitnn", AlignmentConfig(method="exact")),
    "soft-fedsim": ("fedsim", AlignmentConfig(method="soft", metric="euclidean", top_k=4,
                                              privacy="bloom", tau=0.9999)),
    # a CNN bottom model (VFL-AFE §4.1) on every party, its features viewed as a 1 × n image
    "exact-splitnn-cnn": ("splitnn", AlignmentConfig(method="exact")),
}
MODELS = {"exact-splitnn-cnn": ModelConfig(bottom="cnn", channels=(4, 6), kernels=(3, 3),
                                           image_shape=(1, 1, -1), cut_dim=8)}


def run(scenario: str, transport: str, tmp_path: Path) -> RunResult:
    algorithm, alignment = SCENARIOS[scenario]
    config = RunConfig(seed=3, algorithm=algorithm,
                       data=DataConfig(dataset="sklearn-small", options=dict(OPTIONS)),
                       alignment=alignment, training=TrainingConfig(epochs=3, patience=3),
                       model=MODELS.get(scenario, ModelConfig()),
                       # the same figures over both transports: the seeded noise (the default
                       # label protection's and the coordinator's), behind the one switch
                       privacy=PrivacyConfig(reproducible_noise=True))
    out = tmp_path / f"{scenario}-{transport}"
    if transport == "inprocess":
        return run_training(config, out)
    files = write_party_files(tmp_path / transport, dataset="sklearn-small",
                              options=OPTIONS, seed=3)
    with served_in_threads(files["coordinator"], files["secondary"]):
        federation = network_federation(load_party_config(files["primary"]), run_id=out.name)
        try:
            primary = load_inputs(config).primary
            return run_training(config, out, tables=Inputs(primary, ()), federation=federation)
        finally:
            federation.close()


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_same_metrics_and_bytes_over_both_transports(scenario: str, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VFLINK_SECRET", "a-test-secret-shared-by-data-parties")
    local = run(scenario, "inprocess", tmp_path)
    remote = run(scenario, "grpc", tmp_path)
    for split in ("train", "validation", "test"):
        assert remote.metrics[split] == pytest.approx(local.metrics[split], rel=1e-6)
    assert remote.best_epoch == local.best_epoch
    # per-epoch payload bytes and message counts per direction are equal
    for a, b in zip(local.history, remote.history, strict=True):
        assert a.communication == b.communication
    assert local.history[0].communication["secondary->primary"]["bytes"] > 0
    assert remote.communication == local.communication  # the run's totals too
