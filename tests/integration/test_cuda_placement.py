"""Every plan on ``training.device = "cuda"``, on a machine without a GPU.

Under :func:`tests.helpers.fake_cuda.fake_cuda`, "cuda" is a device that computes on the CPU
but refuses what CUDA refuses (two devices in one op, ``.numpy()`` of a device tensor, a CPU
generator for a device op) and draws its own random numbers on another stream than the CPU's.
So a run on it must equal its CPU run exactly: a tensor made on the wrong device fails the
run, and randomness drawn on the device instead of the CPU changes its results. What the fake
cannot show, CUDA's own numerics and speed, is left to ``test_training_resources.py -k cuda``
on a machine with a GPU (docs/how-to/scale-out.md, "Training on a GPU").
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers.fake_cuda import FakeCudaTensor, fake_cuda
from tests.helpers.network import served_in_threads, write_party_files
from tests.integration.test_training_resources import (
    DEVICE_SCENARIOS,
    OPTIONS,
    _weights,
    device_config,
)
from vflink.errors import PeerUnavailable
from vflink.parties import PrimaryParty, SecondaryParty
from vflink.privacy.config import LABEL_MODES, PrivacyConfig
from vflink.protocol import Forward
from vflink.runfiles.config import ALGORITHMS, EvaluationConfig, RunConfig
from vflink.runfiles.inputs import Inputs, load_inputs
from vflink.runfiles.party import load_party_config
from vflink.runfiles.results import RunResult
from vflink.runfiles.rundir import staging_dir
from vflink.runner.attack import run_attack
from vflink.runner.network import network_federation
from vflink.runner.predict import predict_records
from vflink.runner.train import run_training

#: the deterministic plans (union training draws PSU's secret exponents afresh every run)
PLANS = sorted(s for s in DEVICE_SCENARIOS if s != "psu-union")
#: the primary's protections of its labels, each on FedSim's gradients
LABELS = [m for m in LABEL_MODES if m != "off"]


def config(scenario: str, labels: str = "off", record: bool = False, **training: Any
           ) -> RunConfig:
    base = device_config(scenario, **training)
    return dataclasses.replace(
        base, privacy=dataclasses.replace(base.privacy, labels=labels),
        evaluation=EvaluationConfig(record=record))


@pytest.fixture
def parties(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """Every primary, secondary and union-training primary the test builds."""
    from vflink.parties.union import UnionPrimary

    made: list[Any] = []
    for cls in (PrimaryParty, SecondaryParty, UnionPrimary):
        def spy(self: Any, *args: Any, _init: Any = cls.__init__, **kwargs: Any) -> None:
            _init(self, *args, **kwargs)
            made.append(self)

        monkeypatch.setattr(cls, "__init__", spy)
    yield made


def models_of(party: Any) -> list[Any]:
    """A party's models: its own, or (a secondary) those of every training run it holds."""
    if isinstance(party, SecondaryParty):
        return [r.model for r in party.training_runs() if r.model is not None]
    return [party.model] if getattr(party, "model", None) is not None else []


def assert_on_the_device(parties: list[Any]) -> None:
    models = [m for p in parties for m in models_of(p)]
    assert models, "no party built a model"
    for model in models:
        assert all(isinstance(t, FakeCudaTensor) for t in model.parameters()), model


def assert_same_run(got: RunResult, want: RunResult, got_dir: Path, want_dir: Path) -> None:
    assert got.metrics == want.metrics
    assert got.best_epoch == want.best_epoch
    assert [h.train_loss for h in got.history] == [h.train_loss for h in want.history]
    a, b = _weights(want_dir / "models"), _weights(got_dir / "models")
    assert a and a.keys() == b.keys()
    for key, tensor in a.items():
        assert torch.equal(b[key], tensor), key


@pytest.mark.parametrize("scenario", PLANS)
def test_a_plan_on_cuda_trains_as_on_the_cpu(scenario: str, tmp_path: Path, parties: list[Any],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    cpu = run_training(config(scenario), tmp_path / "cpu")
    parties.clear()
    with fake_cuda(monkeypatch) as device:  # features read per batch from mapped files too
        cuda = run_training(config(scenario, device="cuda", feature_store="mmap"),
                            tmp_path / "cuda")
    assert_on_the_device(parties)
    assert device.ops > 1000
    assert_same_run(cuda, cpu, tmp_path / "cuda", tmp_path / "cpu")


@pytest.mark.slow
@pytest.mark.parametrize("labels", LABELS)
def test_label_protection_on_cuda_releases_what_the_cpu_releases(
        labels: str, tmp_path: Path, parties: list[Any],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The primary's noise on its gradients is drawn where the CPU run draws it: the same
    gradients reach the secondary, so the same model results."""
    cpu = run_training(config("soft-fedsim-dropout", labels), tmp_path / "cpu")
    parties.clear()
    with fake_cuda(monkeypatch):
        cuda = run_training(config("soft-fedsim-dropout", labels, device="cuda"),
                            tmp_path / "cuda")
    assert_on_the_device(parties)
    assert_same_run(cuda, cpu, tmp_path / "cuda", tmp_path / "cpu")


def test_union_training_runs_on_cuda(tmp_path: Path, parties: list[Any],
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from vflink.parties.union import UnionPrimary

    with fake_cuda(monkeypatch):
        result = run_training(device_config("psu-union", device="cuda"), tmp_path / "union")
    union = [p for p in parties if isinstance(p, UnionPrimary)]
    assert union
    assert_on_the_device(union)
    assert 0.0 <= result.metrics["test"]["auc"] <= 1.0


@pytest.mark.slow
def test_predict_and_attacks_on_a_cuda_run_equal_the_cpu_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``vflink predict`` runs the saved models on the run's device, and the attacks that
    query a party's own bottom model run it there: both as on the CPU."""
    runs = {"cpu": config("soft-fedsim-dropout", record=True),
            "cuda": config("soft-fedsim-dropout", record=True, device="cuda")}
    records = load_inputs(runs["cpu"]).primary.frame.iloc[:60]
    out: dict[str, Any] = {}
    for name, cfg in runs.items():
        with fake_cuda(monkeypatch) if name == "cuda" else contextlib.nullcontext():
            run_training(cfg, tmp_path / name)
            predicted = predict_records(tmp_path / name, records)
            attacks = {a: run_attack(tmp_path / name, a)
                       for a in ("label-completion", "label-norm", "label-fcm")}
        out[name] = predicted, attacks
    (cpu_pred, cpu_attacks), (cuda_pred, cuda_attacks) = out["cpu"], out["cuda"]
    assert len(cuda_pred.frame) == 60
    assert cuda_pred.frame.equals(cpu_pred.frame)
    for name, result in cpu_attacks.items():
        assert cuda_attacks[name].metrics == result.metrics, name


@pytest.mark.slow
def test_an_interrupted_cuda_run_resumes_to_the_cpu_runs_model(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkpoint written from the device (optimiser moments, the dropout streams) is read
    back onto it: the resumed run equals an uninterrupted CPU run."""
    scenario = "soft-fedsim-dropout"
    base = config(scenario)
    cfg = dataclasses.replace(base, training=dataclasses.replace(
        base.training, epochs=4, patience=4))
    whole = run_training(cfg, tmp_path / "whole")
    on_cuda = dataclasses.replace(cfg, training=dataclasses.replace(cfg.training,
                                                                    device="cuda"))
    calls = {"n": 0}
    original = SecondaryParty.on_forward

    def dying(self: SecondaryParty, sender: str, message: Forward) -> Any:
        calls["n"] += 1
        if calls["n"] == 30:  # in the third epoch
            raise PeerUnavailable(self.name, "simulated crash")
        return original(self, sender, message)

    with fake_cuda(monkeypatch):
        monkeypatch.setattr(SecondaryParty, "on_forward", dying)
        with pytest.raises(PeerUnavailable):
            run_training(on_cuda, tmp_path / "cut")
        assert (staging_dir(tmp_path / "cut") / "models" / "primary" / "checkpoint.json"
                ).exists()
        monkeypatch.setattr(SecondaryParty, "on_forward", original)
        resumed = run_training(on_cuda, tmp_path / "cut", resume=True)
    assert_same_run(resumed, whole, tmp_path / "cut", tmp_path / "whole")


@pytest.mark.network
def test_a_primary_on_cuda_trains_with_a_served_secondary_on_the_cpu(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, parties: list[Any]) -> None:
    """Each party picks its own device: what crosses the boundary is CPU data, so a primary
    on CUDA and a secondary on the CPU across gRPC train the in-process CPU run's model."""
    monkeypatch.setenv("VFLINK_SECRET", "a-test-secret-shared-by-data-parties")
    scenario = "exact-splitnn-dropout"
    files = write_party_files(tmp_path / "parties", dataset="sklearn-small", options=OPTIONS,
                              seed=5)
    cfg = config(scenario, device="cuda")
    with served_in_threads(files["coordinator"], files["secondary"]):
        federation = network_federation(load_party_config(files["primary"]), run_id="cuda")
        try:
            primary = load_inputs(cfg).primary
            with fake_cuda(monkeypatch):
                cuda = run_training(cfg, tmp_path / "cuda", tables=Inputs(primary, ()),
                                    federation=federation)
        finally:
            federation.close()
    on_device = [p for p in parties if isinstance(p, PrimaryParty)]
    assert_on_the_device(on_device)
    served = [m for p in parties if isinstance(p, SecondaryParty) for m in models_of(p)]
    assert served and all(not isinstance(t, FakeCudaTensor)
                          for m in served for t in m.parameters())
    cpu = run_training(config(scenario), tmp_path / "cpu")
    assert cuda.metrics == cpu.metrics
    assert [h.train_loss for h in cuda.history] == [h.train_loss for h in cpu.history]


def test_the_device_benchmark_runs_a_case_on_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """``benchmarks/training.py --device cuda`` times each case in a subprocess of its own
    (:func:`device_case`): its CUDA case trains what its CPU case trains."""
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "training.py"
    spec = importlib.util.spec_from_file_location("training_benchmark", path)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    cpu = bench.device_case(10, 32, "cpu", samples=400, epochs=1, threads=1)
    with fake_cuda(monkeypatch) as device:
        cuda = bench.device_case(10, 32, "cuda", samples=400, epochs=1, threads=1)
    assert device.ops > 1000
    assert cuda["test"] == cpu["test"] and cuda["train_loss"] == cpu["train_loss"]
    assert cuda["cuda_peak_allocated_mib"] == 0.0 and cpu["peak_rss_mib"] > 0


@pytest.mark.parametrize("scenario", ["soft-fedsim-dropout", "exact-splitnn-cnn"])
def test_convolutions_with_cudnn_run_in_float64_and_stay_within_rounding(
        scenario: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where cuDNN would run a convolution (and round its inputs to TF32 by default), FedSim's
    merge and the CNN bottoms compute it in float64 instead: the run stays within float32
    rounding of the CPU run, and that path, too, keeps every tensor on the device."""
    from vflink.models import device as device_module

    cpu = run_training(config(scenario), tmp_path / "cpu")
    calls: list[torch.device] = []
    exact = device_module.float64_conv

    def spy(conv: torch.nn.Conv2d, x: torch.Tensor) -> torch.Tensor:
        calls.append(x.device)
        return exact(conv, x)

    monkeypatch.setattr(device_module, "float64_conv", spy)
    monkeypatch.setattr(torch.backends.cudnn, "is_available", lambda: True)
    with fake_cuda(monkeypatch):
        cuda = run_training(config(scenario, device="cuda"), tmp_path / "cuda")
    assert calls and set(calls) == {torch.device("cuda", 0)}
    assert [h.train_loss for h in cuda.history] == pytest.approx(
        [h.train_loss for h in cpu.history], rel=1e-5)
    for split in ("train", "validation", "test"):
        assert cuda.metrics[split] == pytest.approx(cpu.metrics[split], rel=1e-3, abs=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_every_algorithm_on_cuda_trains_as_on_the_cpu(algorithm: str, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Each training algorithm (FedSim and its ablations, the baselines, FLORIST, the union
    ones) on K = 3 soft links, with dropout and the default protection of the labels."""
    base = config("soft-fedsim-dropout")
    cfg = dataclasses.replace(base, algorithm=algorithm, privacy=dataclasses.replace(
        base.privacy, labels=PrivacyConfig().labels))
    cpu = run_training(cfg, tmp_path / "cpu")
    with fake_cuda(monkeypatch) as device:
        cuda = run_training(dataclasses.replace(cfg, training=dataclasses.replace(
            cfg.training, device="cuda")), tmp_path / "cuda")
    assert device.ops > 1000
    assert_same_run(cuda, cpu, tmp_path / "cuda", tmp_path / "cpu")
