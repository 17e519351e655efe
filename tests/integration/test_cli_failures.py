"""Every failure is one message and an exit code from the table, never a stack trace
(docs/reference/exit-codes.md)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.helpers.cli import run_cli
from tests.helpers.network import stop_processes
from tests.helpers.tables import two_party_tables
from vflink.cli._errors import EXIT_FAILED, EXIT_TERMINATED, EXIT_USAGE
from vflink.cli.main import main
from vflink.errors import PeerUnavailable
from vflink.parties import SecondaryParty
from vflink.protocol import Forward
from vflink.runfiles.rundir import staging_dir

SRC = Path(__file__).resolve().parents[2] / "src"

SMALL = """version = 1
[data]
dataset = "sklearn-small"
[data.options]
n_samples = 300
[training]
epochs = 2
"""




def test_out_under_a_regular_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "run.toml").write_text(SMALL)
    (tmp_path / "afile").write_text("")
    code, err = run_cli(["train", "--config", str(tmp_path / "run.toml"),
                         "--out", str(tmp_path / "afile" / "run")], capsys)
    assert code == EXIT_USAGE
    assert "afile is a file, not a directory" in err, err


@pytest.mark.skipif(not Path("/proc/self").exists(), reason="needs /proc")
def test_out_under_proc(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "run.toml").write_text(SMALL)
    code, err = run_cli(["train", "--config", str(tmp_path / "run.toml"),
                         "--out", "/proc/vflink-test-run"], capsys)
    assert code == EXIT_USAGE
    assert "cannot create the run directory" in err, err


def test_failed_train_leaves_no_empty_runs_folder(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "run.toml").write_text(SMALL.replace("n_samples = 300", "n_samples = -3"))
    code, _ = run_cli(["train", "--config", str(tmp_path / "run.toml"),
                       "--out", str(tmp_path / "runs" / "deep" / "r")], capsys)
    assert code == EXIT_USAGE
    assert not (tmp_path / "runs").exists()


def test_infinite_regression_label_is_a_data_error_before_training(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"a": rng.normal(size=50), "y": rng.normal(size=50)})
    frame.loc[17, "y"] = np.inf
    frame.to_csv(tmp_path / "p.csv", index=False)
    (tmp_path / "run.toml").write_text(
        'version = 1\nalgorithm = "solo"\n[[data.parties]]\nname = "p"\nrole = "primary"\n'
        'path = "p.csv"\nnumeric = ["a"]\nlabel = "y"\ntask = "regression"\n')
    out = tmp_path / "runs" / "r"
    code, err = run_cli(["train", "--config", str(tmp_path / "run.toml"), "--out", str(out)],
                        capsys)
    assert code == EXIT_USAGE
    assert "p.csv" in err and "'y'" in err and "infinite" in err and "row 17" in err, err
    assert "value inf" in err  # a number, not np.float64(inf)
    assert not (tmp_path / "runs").exists()  # no hidden partial run either


def test_missing_label_prints_nan_not_numpy_repr(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    frame = pd.DataFrame({"a": [1.0, 2.0, 3.0], "y": [1.0, np.nan, 0.0]})
    frame.to_csv(tmp_path / "p.csv", index=False)
    (tmp_path / "run.toml").write_text(
        'version = 1\nalgorithm = "solo"\n[[data.parties]]\nname = "p"\nrole = "primary"\n'
        'path = "p.csv"\nnumeric = ["a"]\nlabel = "y"\ntask = "binary"\n')
    code, err = run_cli(["train", "--config", str(tmp_path / "run.toml"),
                         "--out", str(tmp_path / "r")], capsys)
    assert code == EXIT_USAGE
    assert "value nan" in err and "np.float64" not in err, err


@pytest.fixture
def interrupted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    primary, bank = two_party_tables(300, secondary_features=3, seed=2)
    primary.frame.to_csv(tmp_path / "primary.csv", index=False)
    bank.frame.to_csv(tmp_path / "bank.csv", index=False)
    run = tmp_path / "run.toml"
    run.write_text('version = 1\n[[data.parties]]\nname = "primary"\nrole = "primary"\n'
                   'path = "primary.csv"\nkey = ["id"]\nnumeric = ["p0", "p1"]\nlabel = "y"\n'
                   'task = "binary"\n[[data.parties]]\nname = "bank"\nrole = "secondary"\n'
                   'path = "bank.csv"\nkey = ["id"]\nnumeric = ["s0", "s1", "s2"]\n'
                   '[training]\nepochs = 3\npatience = 3\n')
    original = SecondaryParty.on_forward
    calls = {"n": 0}

    def dying(self: SecondaryParty, sender: str, message: Forward):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] == 5:
            raise PeerUnavailable(self.name, "simulated crash")
        return original(self, sender, message)

    monkeypatch.setattr(SecondaryParty, "on_forward", dying)
    out = tmp_path / "runs" / "r"
    assert main(["train", "--config", str(run), "--out", str(out)]) == EXIT_FAILED
    monkeypatch.setattr(SecondaryParty, "on_forward", original)
    return run, out


@pytest.mark.parametrize("damage", ["empty primary checkpoint", "truncated primary checkpoint",
                                    "empty secondary weights", "truncated secondary weights"])
def test_damaged_checkpoint_on_resume(interrupted: tuple[Path, Path], damage: str,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    run, out = interrupted
    models = staging_dir(out) / "models"
    if "primary" in damage:
        target = models / "primary" / "checkpoint.json"
    else:
        doc = json.loads(sorted((models / "bank").glob("checkpoint-*.json"))[-1].read_text())
        target = models / "bank" / doc["tensors"]
    data = target.read_bytes()
    target.write_bytes(b"" if "empty" in damage else data[: len(data) // 2])
    code, err = run_cli(["train", "--config", str(run), "--out", str(out), "--resume"], capsys)
    assert code == EXIT_USAGE
    assert "truncated or not a vflink state file" in err, err
    if "primary" in damage:  # our own file: named in full
        assert target.name in err
    else:  # another party's file: the boundary message names the party and the state only
        assert "party 'bank'" in err and "checkpoint-0001" in err
        assert str(target.parent) not in err
    assert staging_dir(out).is_dir()  # the interrupted run is kept


def test_unexpected_error_names_a_log_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    import vflink.runner.train as train_module

    def boom(*args: object, **kwargs: object) -> None:
        raise ZeroDivisionError("something nobody expected")

    monkeypatch.setattr(train_module, "run_training", boom)
    monkeypatch.setenv("VFLINK_LOG_DIR", str(tmp_path / "logs"))
    (tmp_path / "run.toml").write_text(SMALL)
    code, err = run_cli(["train", "--config", str(tmp_path / "run.toml"),
                         "--out", str(tmp_path / "r")], capsys)
    assert code == EXIT_FAILED
    assert "unexpected error" in err and "ZeroDivisionError" in err, err
    logs = list((tmp_path / "logs").glob("vflink-train-*.log"))
    assert len(logs) == 1
    assert logs[0].name in err.replace(" ", "")  # rich may wrap the path
    assert "Traceback" in logs[0].read_text() and "boom" in logs[0].read_text()


def test_a_partys_internal_error_names_its_trace_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """An in-process party's internal error (the coordinator's, as a failing Ray task gave)
    names a log file that exists and holds the trace, not only "that party's log"."""
    import re

    import vflink.parties.coordinator as coordinator

    def boom(*args: object, **kwargs: object) -> None:
        raise ZeroDivisionError("a planted bug in the search")

    monkeypatch.setattr(coordinator, "search_neighbours", boom)
    monkeypatch.setenv("VFLINK_LOG_DIR", str(tmp_path / "logs"))
    tour = Path(__file__).resolve().parents[2] / "examples" / "tour"
    code, err = run_cli(["link", "--primary", str(tour / "houses.csv"), "--secondary",
                         str(tour / "places.csv"), "--on", "latitude,longitude", "--metric",
                         "haversine", "--top-k", "3", "--seed", "0", "--out",
                         str(tmp_path / "links.csv")], capsys)
    assert code == EXIT_FAILED
    assert "internal error in party 'coordinator'" in err, err
    logs = list((tmp_path / "logs").glob("vflink-incident-*.log"))
    assert len(logs) == 1 and str(logs[0]) in err.replace(" ", ""), err
    incident = re.search(r"incident ([0-9a-f]{12})", err)
    assert incident is not None and incident.group(1) in logs[0].name
    assert "Traceback" in logs[0].read_text() and "a planted bug" in logs[0].read_text()
    assert not (tmp_path / "links.csv").exists()
    # -vv shows the trace the party logged on the console too (a fresh process: the console
    # handler is the first command's of a process)
    planted = ("import sys\nimport vflink.parties.coordinator as c\n"
               "def boom(*a, **k):\n    raise ZeroDivisionError('a planted bug')\n"
               "c.search_neighbours = boom\nfrom vflink.cli.main import main\n"
               "sys.exit(main(sys.argv[1:]))\n")
    done = subprocess.run(
        [sys.executable, "-c", planted, "-vv", "link", "--primary", str(tour / "houses.csv"),
         "--secondary", str(tour / "places.csv"), "--on", "latitude,longitude", "--metric",
         "haversine", "--top-k", "3", "--seed", "0", "--out", str(tmp_path / "links.csv")],
        capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "PYTHONPATH": str(SRC), "COLUMNS": "200"})
    assert done.returncode == EXIT_FAILED
    assert "Traceback" in done.stderr and "a planted bug" in done.stderr, done.stderr[-2000:]


@pytest.mark.slow
def test_sigterm_gives_a_message_and_143(tmp_path: Path) -> None:
    (tmp_path / "run.toml").write_text(SMALL.replace("n_samples = 300", "n_samples = 20000")
                                       .replace("epochs = 2", "epochs = 200"))
    out = tmp_path / "runs" / "r"
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    proc = subprocess.Popen([sys.executable, "-m", "vflink.cli.main", "train", "--config",
                             str(tmp_path / "run.toml"), "--out", str(out)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    checkpoint = staging_dir(out) / "models" / "primary" / "checkpoint.json"
    try:
        while not checkpoint.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert checkpoint.exists()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        stop_processes([proc])  # waited for on every path: no process outlives the test
    assert proc.returncode == EXIT_TERMINATED, err
    assert "terminated" in err and "Traceback" not in err, err
    assert staging_dir(out).is_dir() and not out.exists()  # kept for --resume


def test_missing_files_are_named_by_their_resolved_path(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    code, err = run_cli(["train", "--config", "nope.toml"], capsys)
    assert code == EXIT_USAGE and str(tmp_path / "nope.toml") in err.replace(" ", ""), err
    code, err = run_cli(["predict", "--run", "r", "--input", "in.csv", "--out", "o.csv"], capsys)
    assert code == EXIT_USAGE and str(tmp_path / "in.csv") in err.replace(" ", ""), err
    # a data file named in a run file resolves against the run file, not the working directory
    sub = tmp_path / "cfg"
    sub.mkdir()
    (sub / "run.toml").write_text(
        'version = 1\nalgorithm = "solo"\n[[data.parties]]\nname = "p"\nrole = "primary"\n'
        'path = "p.csv"\nnumeric = ["a"]\nlabel = "y"\ntask = "binary"\n')
    code, err = run_cli(["train", "--config", "cfg/run.toml", "--out", "r"], capsys)
    assert code == EXIT_USAGE and str(sub / "p.csv") in err.replace(" ", ""), err
    assert not (tmp_path / "r").exists()
