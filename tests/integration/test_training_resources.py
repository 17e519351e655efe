"""training.feature_store and training.device in real runs (issue 22, items 2 and 5).

A run that reads every party's features per batch from a memory-mapped Arrow file gives the
same metrics, history and predictions as one that holds them in memory, over both transports;
the device option is validated, and on a machine with CUDA a run on it matches the CPU run.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from tests.helpers.network import served_in_threads, write_party_files
from vflink.errors import ConfigError
from vflink.runfiles.config import (
    AlignmentConfig,
    DataConfig,
    ModelConfig,
    RunConfig,
    TrainingConfig,
    parse_config,
)
from vflink.runfiles.inputs import Inputs, load_inputs
from vflink.runfiles.party import load_party_config
from vflink.runfiles.results import RunResult
from vflink.runner.network import build_handler, network_federation
from vflink.runner.train import run_training

OPTIONS = {"n_samples": 600, "sigma_cf": 0.1, "seed": 5}
SCENARIOS = {
    "exact-splitnn": ("splitnn", AlignmentConfig(method="exact"), ModelConfig()),
    # K links per record, FedSim's gates, and dropout drawn per batch on every party
    "soft-fedsim": ("fedsim", AlignmentConfig(method="soft", metric="euclidean", top_k=3,
                                              privacy="bloom", tau=0.9999),
                    ModelConfig(dropout=0.1)),
}


def _config(scenario: str, **training: str) -> RunConfig:
    algorithm, alignment, model = SCENARIOS[scenario]
    return RunConfig(seed=5, algorithm=algorithm,
                     data=DataConfig(dataset="sklearn-small", options=dict(OPTIONS)),
                     alignment=alignment, model=model,
                     training=TrainingConfig(epochs=2, patience=2, **training))


def _run(scenario: str, transport: str, store: str, tmp_path: Path) -> RunResult:
    config = _config(scenario, feature_store=store)
    out = tmp_path / f"{scenario}-{transport}-{store}"
    if transport == "inprocess":
        return run_training(config, out)
    files = write_party_files(tmp_path / f"{transport}-{store}", dataset="sklearn-small",
                              options=OPTIONS, seed=5)
    with files["secondary"].open("a") as fh:  # the served party's own choice
        fh.write(f'[training]\nfeature_store = "{store}"\n')
    with served_in_threads(files["coordinator"], files["secondary"]):
        federation = network_federation(load_party_config(files["primary"]), run_id=out.name)
        try:
            primary = load_inputs(config).primary
            return run_training(config, out, tables=Inputs(primary, ()), federation=federation)
        finally:
            federation.close()


def _arrow_files(root: Path) -> list[Path]:
    return sorted(root.rglob("features/*.arrow"))


@pytest.mark.network
@pytest.mark.parametrize("transport", ["inprocess", "grpc"])
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_mapped_features_train_identically(scenario: str, transport: str, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VFLINK_SECRET", "a-test-secret-shared-by-data-parties")
    memory = _run(scenario, transport, "memory", tmp_path)
    assert not _arrow_files(tmp_path)
    mapped = _run(scenario, transport, "mmap", tmp_path)
    # the mapped run did read its features from mapped files
    files = _arrow_files(tmp_path)
    assert len(files) == 2, files  # the secondary's and the primary's
    assert mapped.metrics == memory.metrics  # equal, not approximately
    assert mapped.best_epoch == memory.best_epoch
    assert [h.train_loss for h in mapped.history] == [h.train_loss for h in memory.history]
    # the same trained weights, hence the same predictions
    weights = {s: _weights(tmp_path / f"{scenario}-{transport}-{s}" / "models")
               for s in ("memory", "mmap")}
    assert weights["memory"].keys() == weights["mmap"].keys() and weights["memory"]
    for key, tensor in weights["memory"].items():
        assert torch.equal(weights["mmap"][key], tensor), key


def _weights(models: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    out = {}
    for path in sorted(models.rglob("model.*.safetensors")):
        out.update({f"{path.parent.name}/{k}": v for k, v in load_file(path).items()})
    return out


def test_training_options_are_validated() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({"version": 1, "data": {"dataset": "sklearn-small"},
                      "training": {"device": "gpu", "feature_store": "disk"}})
    text = str(info.value)
    assert "`training.device` must be one of auto, cpu, cuda, got 'gpu'" in text
    assert "`training.feature_store` must be one of auto, memory, mmap, got 'disk'" in text
    config = parse_config({"version": 1, "data": {"dataset": "sklearn-small"},
                           "training": {"device": "auto", "feature_store": "mmap"}})
    assert config.training.resources().device == "auto"
    assert TrainingConfig().device == "cpu" and TrainingConfig().feature_store == "auto"


def test_party_file_training_section(tmp_path: Path) -> None:
    files = write_party_files(tmp_path, dataset="sklearn-small", options=OPTIONS, seed=5,
                              insecure=True)
    assert load_party_config(files["secondary"]).training is None
    with files["secondary"].open("a") as fh:
        fh.write('[training]\ndevice = "auto"\nfeature_store = "memory"\n')
    training = load_party_config(files["secondary"]).training
    assert training is not None and (training.device, training.feature_store) == ("auto",
                                                                                   "memory")
    text = files["secondary"].read_text().replace('device = "auto"', 'device = "tpu"')
    files["secondary"].write_text(text + "gpus = 2\n")
    with pytest.raises(ConfigError) as info:
        load_party_config(files["secondary"])
    message = str(info.value)
    assert str(files["secondary"]) in message
    assert "`training.device` must be one of auto, cpu, cuda, got 'tpu'" in message
    assert "[training] has unknown key(s) ['gpus']" in message


def test_cuda_without_cuda_names_the_party(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("VFLINK_SECRET", "a-test-secret-shared-by-data-parties")
    files = write_party_files(tmp_path, dataset="sklearn-small", options=OPTIONS, seed=5,
                              insecure=True)
    with files["secondary"].open("a") as fh:
        fh.write('[training]\ndevice = "cuda"\n')
    config = load_party_config(files["secondary"])
    with pytest.raises(ConfigError, match=r"party 'secondary': `training.device = \"cuda\"` "
                                          r"but CUDA is not available"):
        build_handler(config)
    # a run file's parties fail the same way, before any work
    with pytest.raises(ConfigError, match="CUDA is not available"):
        run_training(_config("exact-splitnn", device="cuda"), tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_auto_resolves_to_the_cpu_without_cuda(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cpu = run_training(_config("exact-splitnn"), tmp_path / "cpu")
    auto = run_training(_config("exact-splitnn", device="auto"), tmp_path / "auto")
    assert auto.metrics == cpu.metrics


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (training."
                    "device = \"cuda\"); this machine has none")
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_cuda_matches_cpu_within_float_tolerance(scenario: str, tmp_path: Path) -> None:
    cpu = run_training(_config(scenario), tmp_path / "cpu")
    gpu_config = _config(scenario, device="cuda")
    gpu = run_training(gpu_config, tmp_path / "cuda")
    assert gpu.best_epoch == cpu.best_epoch
    for split in ("train", "validation", "test"):
        assert gpu.metrics[split] == pytest.approx(cpu.metrics[split], rel=1e-3, abs=1e-4)
    mapped = run_training(dataclasses.replace(gpu_config, training=dataclasses.replace(
        gpu_config.training, feature_store="mmap")), tmp_path / "cuda-mmap")
    assert mapped.metrics["test"] == pytest.approx(gpu.metrics["test"], rel=1e-3, abs=1e-4)


def _file_config(scenario: str, files: dict[str, Path], store: str) -> RunConfig:
    """``_config`` with the dataset's tables as files (the secondary's read from its file)."""
    from vflink.datasets import load_dataset

    base = _config(scenario, feature_store=store)
    ds = load_dataset("sklearn-small", **OPTIONS)
    parties = tuple(dataclasses.replace(t.schema, path=files[t.name]) for t in ds.parties)
    return dataclasses.replace(base, data=DataConfig(parties=parties))


@pytest.mark.network
@pytest.mark.parametrize("transport", ["inprocess", "grpc"])
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_streamed_table_trains_identically(scenario: str, transport: str, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A secondary whose table is read in record batches (issue 22: never a whole DataFrame,
    ``vflink.data.streamed``) trains exactly as one that holds its table and features in
    memory, and as the dataset's own in-memory run: the same metrics, losses and weights."""
    from vflink.data import streamed
    from vflink.datasets import load_dataset
    from vflink.datasets.export import export_dataset

    monkeypatch.setenv("VFLINK_SECRET", "a-test-secret-shared-by-data-parties")
    files = export_dataset(load_dataset("sklearn-small", **OPTIONS), tmp_path / "tables",
                           fmt="parquet")
    reads: list[str] = []
    monkeypatch.setattr(streamed, "load_table", lambda *a, **k: reads.append("whole") or
                        __import__("vflink.data.table", fromlist=["load_table"]).load_table(
                            *a, **k))
    results = {}
    whole_reads = {}
    for store in ("memory", "mmap"):
        reads.clear()
        out = tmp_path / f"{scenario}-{transport}-{store}"
        config = _file_config(scenario, files, store)
        if transport == "inprocess":
            results[store] = run_training(config, out)
            whole_reads[store] = len(reads)
            continue
        ds = load_dataset("sklearn-small", **OPTIONS)
        schema = next(t.schema for t in ds.parties if t.name == "secondary")
        party_files = write_party_files(
            tmp_path / f"party-{store}", dataset="sklearn-small", options=OPTIONS, seed=5,
            secondary_table={"path": str(files["secondary"]), "key": list(schema.key),
                             "identifiers": list(schema.identifiers),
                             "numeric": list(schema.numeric)})
        with party_files["secondary"].open("a") as fh:
            fh.write(f'[training]\nfeature_store = "{store}"\n')
        with served_in_threads(party_files["coordinator"], party_files["secondary"]):
            federation = network_federation(load_party_config(party_files["primary"]),
                                            run_id=out.name)
            try:
                primary = load_inputs(config).primary
                results[store] = run_training(config, out, tables=Inputs(primary, ()),
                                              federation=federation)
            finally:
                federation.close()
        whole_reads[store] = len(reads)
    # the memory run read the secondary's table whole; the mapped one never did (in-process
    # nor served: load_table is the only whole read, StreamedTable.frame included)
    assert whole_reads["memory"] >= 1 and whole_reads["mmap"] == 0, whole_reads
    assert _arrow_files(tmp_path / f"{scenario}-{transport}-mmap") or \
        _arrow_files(tmp_path / "party-mmap")
    baseline = _run(scenario, "inprocess", "memory", tmp_path / "dataset")
    for result in (results["mmap"], baseline):
        assert result.metrics == results["memory"].metrics
        assert [h.train_loss for h in result.history] == \
            [h.train_loss for h in results["memory"].history]
    weights = {s: _weights(tmp_path / f"{scenario}-{transport}-{s}" / "models")
               for s in ("memory", "mmap")}
    assert weights["memory"].keys() == weights["mmap"].keys() and weights["memory"]
    for key, tensor in weights["memory"].items():
        assert torch.equal(weights["mmap"][key], tensor), key
