"""training.feature_store and training.device in real runs (docs/how-to/scale-out.md).

A run that reads every party's features per batch from a memory-mapped Arrow file gives the
same metrics, history and predictions as one that holds them in memory, over both transports;
the device option is validated, and on a machine with CUDA a run on it matches the CPU run.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers.network import served_in_threads, write_party_files
from vflink.errors import ConfigError
from vflink.privacy.config import PrivacyConfig
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


#: every plan a party's device touches, small: K links and FedSim's gates, CNN bottoms, the DP
#: protections (noise, fuzzy c-means and the contrastive loss; randomized-response codes),
#: union training over PSU with synthetic labels drawn from the model's own predictions; each
#: with dropout where the plan has it
DEVICE_SCENARIOS: dict[str, dict[str, Any]] = {
    "exact-splitnn-dropout": {"algorithm": "splitnn", "alignment": AlignmentConfig(
        method="exact"), "model": ModelConfig(dropout=0.2)},
    "soft-fedsim-dropout": {"algorithm": "fedsim", "alignment": SCENARIOS["soft-fedsim"][1],
                            "model": ModelConfig(dropout=0.1)},
    "exact-splitnn-cnn": {"algorithm": "splitnn", "alignment": AlignmentConfig(method="exact"),
                          "model": ModelConfig(bottom="cnn", channels=(4, 6), kernels=(3, 3),
                                               image_shape=(1, 1, -1), cut_dim=8,
                                               dropout=0.1)},
    "exact-splitnn-afe": {"algorithm": "splitnn", "alignment": AlignmentConfig(method="exact"),
                          "model": ModelConfig(dropout=0.1),
                          "privacy": PrivacyConfig(embeddings="afe", epsilon=4.0)},
    "soft-fedsim-randomized-response": {
        "algorithm": "fedsim", "alignment": SCENARIOS["soft-fedsim"][1],
        "privacy": PrivacyConfig(embeddings="randomized-response", total_epsilon=4.0)},
    "psu-union": {"algorithm": "label-random-pred",
                  "alignment": AlignmentConfig(method="psu", alpha=0.2, beta=0.3),
                  "model": ModelConfig(hidden=(16,), cut_dim=8, top_hidden=(8,))},
}


def device_config(scenario: str, **training: str) -> RunConfig:
    """A :data:`DEVICE_SCENARIOS` run on ``training``'s device (default the CPU), its
    gradients sent in clear (``labels = "off"``: the pinned metrics were measured so), its
    model selected on validation accuracy (``select = "accuracy"``) and the noise seeded from
    the run seed (the one switch that keeps them)."""
    s = DEVICE_SCENARIOS[scenario]
    privacy = dataclasses.replace(s.get("privacy", PrivacyConfig()), labels="off",
                                  reproducible_noise=True)
    return RunConfig(seed=5, algorithm=s["algorithm"],
                     data=DataConfig(dataset="sklearn-small", options=dict(OPTIONS)),
                     alignment=s["alignment"], model=s.get("model", ModelConfig()),
                     privacy=privacy,
                     training=TrainingConfig(epochs=2, patience=2, select="accuracy",
                                             **training))


def _config(scenario: str, **training: str) -> RunConfig:
    algorithm, alignment, model = SCENARIOS[scenario]
    return RunConfig(seed=5, algorithm=algorithm,
                     data=DataConfig(dataset="sklearn-small", options=dict(OPTIONS)),
                     alignment=alignment, model=model,
                     training=TrainingConfig(epochs=2, patience=2, **training),
                     privacy=PrivacyConfig(reproducible_noise=True))  # the same figures


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


@pytest.mark.slow
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


def test_auto_resolves_to_the_cpu_without_cuda(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cpu = run_training(_config("exact-splitnn"), tmp_path / "cpu")
    with caplog.at_level("INFO", logger="vflink.models.device"):
        auto = run_training(_config("exact-splitnn", device="auto"), tmp_path / "auto")
    assert auto.metrics == cpu.metrics
    # each party says where its models went, once
    said = sorted(r.getMessage() for r in caplog.records if r.name == "vflink.models.device")
    assert said == [f"party {p!r}: models on the CPU (training.device = \"auto\" and "
                    "torch.cuda.is_available() is False)" for p in ("primary", "secondary")]


#: CPU metrics of the deterministic :data:`DEVICE_SCENARIOS`, recorded with the code from
#: before dropout drew its masks on the CPU for every device (torch 2.13.0 CPU): CPU runs must
#: not change. (Union training is left out: which UIDs the primary lacks come in U's order,
#: which PSU's secret exponents decide afresh every run.)
PINNED_CPU: dict[str, dict[str, Any]] = {
    "exact-splitnn-afe": {
        "test": {
            "accuracy": 0.47107438016528924,
            "auc": 0.4906951286261631
        },
        "loss": [
            0.691531240940094,
            0.6903410702943802
        ]
    },
    "exact-splitnn-cnn": {
        "test": {
            "accuracy": 0.48760330578512395,
            "auc": 0.590311986863711
        },
        "loss": [
            0.6935606747865677,
            0.6914179772138596
        ]
    },
    "exact-splitnn-dropout": {
        "test": {
            "accuracy": 0.7355371900826446,
            "auc": 0.8418171866447728
        },
        "loss": [
            0.6853870749473572,
            0.6772737950086594
        ]
    },
    "soft-fedsim-dropout": {
        "test": {
            "accuracy": 0.6528925619834711,
            "auc": 0.8240284619594964
        },
        "loss": [
            0.6977530930723462,
            0.6838550823075431
        ]
    },
    "soft-fedsim-randomized-response": {
        "test": {
            "accuracy": 0.7107438016528925,
            "auc": 0.7947454844006568
        },
        "loss": [
            0.685823781149728,
            0.5019177688019616
        ]
    }
}


@pytest.mark.parametrize("scenario", sorted(PINNED_CPU))
def test_cpu_runs_keep_their_metrics(scenario: str) -> None:
    result = run_training(device_config(scenario))
    # float32 training: exact equality is the goal; 1e-6 absorbs summation-order rounding only
    assert [h.train_loss for h in result.history] == pytest.approx(
        PINNED_CPU[scenario]["loss"], abs=1e-6)
    assert result.metrics["test"] == pytest.approx(PINNED_CPU[scenario]["test"], abs=1e-6)


NO_CUDA = "needs a CUDA device (training.device = \"cuda\"); this machine has none"
#: the scenarios whose CPU and CUDA runs must agree: those of the transports' tests, and every
#: deterministic plan of DEVICE_SCENARIOS
MATCHING = sorted(SCENARIOS) + sorted(PINNED_CPU)


def _scenario_config(scenario: str, **training: str) -> RunConfig:
    return _config(scenario, **training) if scenario in SCENARIOS else device_config(
        scenario, **training)


@pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA)
@pytest.mark.parametrize("scenario", MATCHING)
def test_cuda_matches_cpu_within_float_tolerance(scenario: str, tmp_path: Path) -> None:
    cpu = run_training(_scenario_config(scenario), tmp_path / "cpu")
    gpu_config = _scenario_config(scenario, device="cuda")
    gpu = run_training(gpu_config, tmp_path / "cuda")
    assert gpu.best_epoch == cpu.best_epoch
    assert [h.train_loss for h in gpu.history] == pytest.approx(
        [h.train_loss for h in cpu.history], rel=1e-3, abs=1e-4)
    for split in ("train", "validation", "test"):
        assert gpu.metrics[split] == pytest.approx(cpu.metrics[split], rel=1e-3, abs=1e-4)
    mapped = run_training(dataclasses.replace(gpu_config, training=dataclasses.replace(
        gpu_config.training, feature_store="mmap")), tmp_path / "cuda-mmap")
    assert mapped.metrics["test"] == pytest.approx(gpu.metrics["test"], rel=1e-3, abs=1e-4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA)
def test_union_training_runs_on_cuda(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Union training over PSU: the primary's model and the simulated secondary's on CUDA
    (its metrics cannot be compared with a CPU run's: U's order is new every run)."""
    from vflink.parties.union import UnionPrimary

    made: list[UnionPrimary] = []
    init = UnionPrimary.__init__

    def spy(self: UnionPrimary, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(UnionPrimary, "__init__", spy)
    result = run_training(device_config("psu-union", device="cuda"), tmp_path / "union")
    assert made and all(p.device.type == "cuda" for p in made)
    assert all(t.device.type == "cuda" for p in made for t in p.model.parameters())
    test = result.metrics["test"]
    assert 0.0 <= test["auc"] <= 1.0 and 0.0 <= test["ace"] <= 1.0


def _file_config(scenario: str, files: dict[str, Path], store: str) -> RunConfig:
    """``_config`` with the dataset's tables as files (the secondary's read from its file)."""
    from vflink.datasets import load_dataset

    base = _config(scenario, feature_store=store)
    ds = load_dataset("sklearn-small", **OPTIONS)
    parties = tuple(dataclasses.replace(t.schema, path=files[t.name]) for t in ds.parties)
    return dataclasses.replace(base, data=DataConfig(parties=parties))


@pytest.mark.slow
@pytest.mark.network
@pytest.mark.parametrize("transport", ["inprocess", "grpc"])
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_streamed_table_trains_identically(scenario: str, transport: str, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A secondary whose table is read in record batches (never a whole DataFrame,
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
