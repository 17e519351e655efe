"""``--resume`` is bound to its run: a changed setting or changed data is refused, naming what
changed, and the interrupted run stays resumable."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from tests.helpers.tables import two_party_tables
from vflink.cli.main import main
from vflink.errors import PeerUnavailable
from vflink.parties import SecondaryParty
from vflink.protocol import Forward
from vflink.runfiles.rundir import staging_dir

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
numeric = ["s0", "s1", "s2", "s3"]
[training]
epochs = 4
patience = 4
"""


@pytest.fixture
def interrupted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """A run killed in its third epoch: (run file, --out)."""
    primary, bank = two_party_tables(400, secondary_features=4, seed=1)
    primary.frame.to_csv(tmp_path / "primary.csv", index=False)
    bank.frame.to_csv(tmp_path / "bank.csv", index=False)
    run = tmp_path / "run.toml"
    run.write_text(RUN)
    calls = {"n": 0}
    original = SecondaryParty.on_forward

    def dying(self: SecondaryParty, sender: str, message: Forward):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] == 8:  # 3 batches per epoch + 1 validation forward: in epoch 2
            raise PeerUnavailable(self.name, "simulated crash")
        return original(self, sender, message)

    monkeypatch.setattr(SecondaryParty, "on_forward", dying)
    out = tmp_path / "runs" / "r"
    assert main(["train", "--config", str(run), "--out", str(out)]) == 1
    monkeypatch.setattr(SecondaryParty, "on_forward", original)
    assert (staging_dir(out) / "models" / "primary" / "checkpoint.json").exists()
    return run, out


def resume(run: Path, out: Path, *extra: str) -> int:
    return main(["train", "--config", str(run), "--out", str(out), "--resume", *extra])


def test_changed_seed_is_refused_and_the_run_is_kept(
        interrupted: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    run, out = interrupted
    capsys.readouterr()
    assert resume(run, out, "--seed", "7") == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "seed changed from 0 to 7" in err, err
    assert "Traceback" not in err
    assert staging_dir(out).is_dir() and not out.exists()
    # the same settings still resume, and finish
    assert resume(run, out) == 0
    assert len(json.loads((out / "metrics.json").read_text())["epochs"]) == 4


def test_changed_training_setting_is_named(interrupted: tuple[Path, Path],
                                          capsys: pytest.CaptureFixture[str]) -> None:
    run, out = interrupted
    run.write_text(RUN.replace("epochs = 4", "epochs = 4\nlr = 0.01"))
    capsys.readouterr()
    assert resume(run, out) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "training.lr changed from 0.001 to 0.01" in err, err
    assert staging_dir(out).is_dir()


@pytest.mark.parametrize("party", ["primary", "bank"])
def test_changed_data_is_refused_naming_the_party(interrupted: tuple[Path, Path], party: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    run, out = interrupted
    path = run.parent / f"{party}.csv"
    frame = pd.read_csv(path)
    column = "p0" if party == "primary" else "s2"
    frame.loc[3, column] = frame.loc[3, column] + 1.0
    frame.to_csv(path, index=False)
    capsys.readouterr()
    assert resume(run, out) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"data of party '{party}' changed" in err, err
    assert "Traceback" not in err
    assert staging_dir(out).is_dir() and not out.exists()


@pytest.mark.network
def test_changed_secondary_data_is_refused_over_grpc(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The secondary compares its own data with its checkpoint; over gRPC only the outcome
    crosses, and the primary refuses to resume."""
    from tests.helpers.network import served_in_threads, write_party_files
    from vflink.errors import DataError
    from vflink.runfiles.config import DataConfig, RunConfig, TrainingConfig
    from vflink.runfiles.inputs import Inputs, load_inputs
    from vflink.runfiles.party import load_party_config
    from vflink.runner.network import network_federation
    from vflink.runner.train import run_training

    monkeypatch.setenv("VFLINK_SECRET", "a-test-secret-shared-by-data-parties")
    options = {"n_samples": 600, "sigma_cf": 0.1, "seed": 3}
    config = RunConfig(seed=3, data=DataConfig(dataset="sklearn-small", options=dict(options)),
                       training=TrainingConfig(epochs=3, patience=3))
    files = write_party_files(tmp_path, dataset="sklearn-small", options=options, seed=3)
    out = tmp_path / "runs" / "net"
    primary = load_inputs(config).primary

    def train(resume: bool) -> None:
        federation = network_federation(load_party_config(files["primary"]), run_id=out.name)
        try:
            run_training(config, out, tables=Inputs(primary, ()), federation=federation,
                         resume=resume)
        finally:
            federation.close()

    original = SecondaryParty.on_forward
    calls = {"n": 0}

    def dying(self: SecondaryParty, sender: str, message: Forward):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] == 6:
            raise PeerUnavailable(self.name, "simulated crash")
        return original(self, sender, message)

    with served_in_threads(files["coordinator"], files["secondary"]):
        monkeypatch.setattr(SecondaryParty, "on_forward", dying)
        with pytest.raises(Exception):  # noqa: B017 - the crash, as the transport reports it
            train(resume=False)
        monkeypatch.setattr(SecondaryParty, "on_forward", original)
    assert (staging_dir(out) / "models" / "primary" / "checkpoint.json").exists()
    # the secondary's checkpoints, in the folder it keeps for this primary
    assert list((tmp_path / "state" / "secondary" / "peers" / "primary" / "net")
                .glob("checkpoint-*.json"))
    # the secondary comes back with other data (its identifiers' noise changed)
    text = files["secondary"].read_text()
    files["secondary"].write_text(text.replace("sigma_cf = 0.1", "sigma_cf = 0.2"))
    with served_in_threads(files["coordinator"], files["secondary"]):
        with pytest.raises(DataError, match="data of party 'secondary' changed"):
            train(resume=True)
    assert staging_dir(out).is_dir() and not out.exists()
    # with its old data back, the run resumes and finishes
    files["secondary"].write_text(text)
    with served_in_threads(files["coordinator"], files["secondary"]):
        train(resume=True)
    assert (out / "metrics.json").exists()
