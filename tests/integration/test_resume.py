"""Checkpoints and --resume: an interrupted run continues to the same final model."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from tests.helpers.network import start_process, stop_processes, write_party_files
from vflink.cli.train import summarise
from vflink.errors import PeerUnavailable
from vflink.parties import SecondaryParty
from vflink.privacy.config import PrivacyConfig
from vflink.protocol import Forward
from vflink.runfiles.config import (
    AlignmentConfig,
    DataConfig,
    RunConfig,
    TrainingConfig,
    load_config,
)
from vflink.runfiles.results import RunResult
from vflink.runfiles.rundir import staging_dir
from vflink.runner.train import run_training

OPTIONS = {"n_samples": 1500, "sigma_cf": 0.1, "seed": 5}


def config(epochs: int = 6) -> RunConfig:
    return RunConfig(seed=5, algorithm="fedsim",
                     data=DataConfig(dataset="sklearn-small", options=dict(OPTIONS)),
                     alignment=AlignmentConfig(method="soft", top_k=4, privacy="off",
                                               sigma=0.1),
                     training=TrainingConfig(epochs=epochs, patience=epochs, lr=3e-3),
                     # a resume re-links: the same similarities (and the same final model as
                     # an uninterrupted run) need the seeded noise, behind the one switch
                     privacy=PrivacyConfig(reproducible_noise=True))


@pytest.mark.slow
def test_in_process_interruption_and_resume(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    whole = run_training(config(), tmp_path / "whole")
    calls = {"n": 0}
    original = SecondaryParty.on_forward

    def dying(self: SecondaryParty, sender: str, message: Forward):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] == 80:  # somewhere in epoch 2 or 3
            raise PeerUnavailable(self.name, "simulated crash")
        return original(self, sender, message)

    monkeypatch.setattr(SecondaryParty, "on_forward", dying)
    with pytest.raises(PeerUnavailable):
        run_training(config(), tmp_path / "cut")
    assert not (tmp_path / "cut").exists()  # nothing that looks complete
    assert (staging_dir(tmp_path / "cut") / "models" / "primary" / "checkpoint.json").exists()
    monkeypatch.setattr(SecondaryParty, "on_forward", original)
    resumed = run_training(config(), tmp_path / "cut", resume=True)
    assert resumed.metrics == whole.metrics
    assert [h.train_loss for h in resumed.history] == [h.train_loss for h in whole.history]
    assert not staging_dir(tmp_path / "cut").exists()
    # the resumed run reports the whole run: totals, epochs and the summary line
    assert_same_report(tmp_path / "whole", tmp_path / "cut")
    assert resumed.communication == whole.communication
    assert summary_bytes(resumed) == summary_bytes(whole)


def assert_same_report(whole: Path, resumed: Path) -> None:
    a = json.loads((whole / "metrics.json").read_text())
    b = json.loads((resumed / "metrics.json").read_text())
    assert b["communication_total"] == a["communication_total"]
    assert sum(v["bytes"] for v in a["communication_total"].values()) > 0
    assert [(e["epoch"], e["train_loss"], e["validation"], e["communication"])
            for e in b["epochs"]] == [(e["epoch"], e["train_loss"], e["validation"],
                                       e["communication"]) for e in a["epochs"]]
    assert b["alignment"]["communication"] == a["alignment"]["communication"]
    assert b["best_epoch"] == a["best_epoch"] and b["metrics"] == a["metrics"]


def summary_bytes(result: RunResult) -> str:
    console = Console(record=True, width=200)
    summarise(result, console)
    return re.search(r"[\d.]+ MB exchanged", console.export_text()).group(0)  # type: ignore[union-attr]


RUN = """version = 1
seed = 5
algorithm = "fedsim"
[data]
dataset = "sklearn-small"
[data.options]
n_samples = 3000
sigma_cf = 0.1
seed = 5
[alignment]
method = "soft"
top_k = 4
privacy = "off"
sigma = 0.1
[training]
epochs = 12
patience = 12
lr = 0.003
[privacy]
reproducible_noise = true
"""


def train(run: Path, party: Path, out: Path, env: dict[str, str], *extra: str
          ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "vflink.cli.main", "train", "--config",
                           str(run), "--party", str(party), "--out", str(out), *extra],
                          env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
@pytest.mark.network
def test_kill_secondary_then_resume_over_grpc(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Three processes on 127.0.0.1: kill -9 the secondary mid-training, the primary fails
    clearly within its deadline, and --resume after a restart gives the uninterrupted result."""
    opts = {"n_samples": 3000, "sigma_cf": 0.1, "seed": 5}
    files = write_party_files(tmp_path, dataset="sklearn-small", options=opts, seed=5,
                              private=False)  # RUN sends raw identifiers (privacy = "off")
    run = tmp_path / "run.toml"
    run.write_text(RUN)
    env = {**os.environ, "VFLINK_SECRET": "a-test-secret-shared-by-data-parties"}
    monkeypatch.setenv("VFLINK_SECRET", env["VFLINK_SECRET"])  # for the in-process comparison
    proc: subprocess.Popen[str] | None = None
    coordinator = start_process(files["coordinator"], tmp_path / "coordinator.log")
    secondary = start_process(files["secondary"], tmp_path / "secondary.log")
    try:
        whole = train(run, files["primary"], tmp_path / "whole", env)
        assert whole.returncode == 0, whole.stderr
        # the interrupted run
        out = tmp_path / "cut"
        proc = subprocess.Popen([sys.executable, "-m", "vflink.cli.main", "train", "--config",
                                 str(run), "--party", str(files["primary"]), "--out", str(out)],
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        checkpoint = staging_dir(out) / "models" / "primary" / "checkpoint.json"
        deadline = time.monotonic() + 120
        while not checkpoint.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert checkpoint.exists(), "no checkpoint was written"
        secondary.send_signal(signal.SIGKILL)
        secondary.wait()
        killed_at = time.monotonic()
        _, stderr = proc.communicate(timeout=60)
        assert proc.returncode != 0
        assert time.monotonic() - killed_at < 10 + 5  # within the primary's deadline
        message = " ".join(stderr.split())
        assert "secondary" in message and "unavailable" in message, message
        assert not out.exists()
        # restart the secondary, resume
        secondary = start_process(files["secondary"], tmp_path / "secondary2.log")
        resumed = train(run, files["primary"], out, env, "--resume")
        assert resumed.returncode == 0, resumed.stderr
        a = json.loads((tmp_path / "whole" / "metrics.json").read_text())
        b = json.loads((out / "metrics.json").read_text())
        assert b["metrics"] == a["metrics"]
        assert b["best_epoch"] == a["best_epoch"]
        assert_same_report(tmp_path / "whole", out)  # totals of the whole run, not the rest
        line = lambda text: re.search(r"[\d.]+ MB exchanged", text).group(0)  # noqa: E731
        assert line(" ".join(resumed.stdout.split())) == line(" ".join(whole.stdout.split()))
        # and the three-process run equals the same run with every party in one process
        local = run_training(load_config(run), tmp_path / "local")
        for split in ("train", "validation", "test"):
            assert a["metrics"][split] == pytest.approx(local.metrics[split], rel=1e-6)
    finally:
        stop_processes([p for p in (coordinator, secondary, proc) if p is not None])
