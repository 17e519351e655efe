"""One rule for outputs that exist, for every command that writes: exit 2,
a message naming the output and `--overwrite`, and the output left as it was; `--overwrite`
replaces it. `--resume` on a finished run says there is nothing to resume and never advises
`--overwrite` (which would delete the run)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers.cli import run_cli
from vflink.cli._errors import EXIT_USAGE
from vflink.cli.main import main

RUN = """version = 1
seed = 0
algorithm = "splitnn"
[data]
dataset = "sklearn-small"
[data.options]
n_samples = 300
[training]
epochs = 2
[evaluation]
record = true
"""

EXPERIMENT = """version = 1
[experiment]
name = "tiny"
algorithms = ["solo"]
seeds = [0]
[data]
dataset = "sklearn-small"
[data.options]
n_samples = 300
[training]
epochs = 1
"""




def names(err: str, path: Path) -> bool:
    """Whether the message names ``path`` (the console may wrap it anywhere)."""
    return str(path).replace(" ", "") in err.replace(" ", "")


def snapshot(path: Path) -> dict[str, str]:
    """Every file under ``path`` (or ``path`` itself) and a digest of its bytes."""
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("outputs")
    (base / "run.toml").write_text(RUN)
    assert main(["train", "--config", str(base / "run.toml"), "--out", str(base / "run")]) == 0
    return base / "run"


def _tables(tmp_path: Path) -> tuple[str, str]:
    p, s = tmp_path / "a.csv", tmp_path / "b.csv"
    p.write_text("id,name\n1,anna smith\n2,bob jones\n3,carl berg\n")
    s.write_text("id,name\n1,ana smith\n2,bob jonas\n4,karl berg\n")
    return str(p), str(s)


def _link(tmp: Path, run: Path) -> tuple[list[str], Path]:
    p, s = _tables(tmp)
    out = tmp / "links.csv"
    return ["link", "--primary", p, "--secondary", s, "--on", "name", "--metric",
            "levenshtein", "--top-k", "1", "--privacy", "off", "--out", str(out)], out


def _align(tmp: Path, run: Path) -> tuple[list[str], Path]:
    p, s = _tables(tmp)
    out = tmp / "aligned"
    return ["align", "--primary", p, "--secondary", s, "--on", "id", "--out", str(out)], out


def _report(tmp: Path, run: Path) -> tuple[list[str], Path]:
    out = tmp / "page.html"
    return ["report", str(run), "--out", str(out)], out


def _attack(tmp: Path, run: Path) -> tuple[list[str], Path]:
    out = tmp / "attack"
    return ["attack", "--run", str(run), "--attack", "label-norm", "--out", str(out)], out


def _certs(tmp: Path, run: Path) -> tuple[list[str], Path]:
    out = tmp / "certs"
    return ["certs", "--out", str(out), "--parties", "primary,bank"], out


#: Commands run twice: the second run refuses, and --overwrite replaces.
TWICE: dict[str, Callable[[Path, Path], tuple[list[str], Path]]] = {
    "link": _link, "align": _align, "report": _report, "attack": _attack, "certs": _certs}


@pytest.mark.parametrize("command", sorted(TWICE))
def test_a_second_run_refuses_and_overwrite_replaces(
        command: str, finished_run: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    args, out = TWICE[command](tmp_path, finished_run)
    ledger = finished_run / "privacy.json"
    assert run_cli(args, capsys)[0] == 0
    before, ledger_before = snapshot(out), ledger.read_bytes()
    assert before
    code, err = run_cli(args, capsys)
    assert code == EXIT_USAGE, err
    assert names(err, out) and "--overwrite" in err, err
    assert snapshot(out) == before  # nothing replaced ...
    assert ledger.read_bytes() == ledger_before  # ... nor appended (an attack is not re-run)
    code, err = run_cli([*args, "--overwrite"], capsys)
    assert code == 0, err


def _pre_existing(tmp: Path, finished_run: Path, command: str) -> tuple[list[str], Path]:
    (tmp / "exp.toml").write_text(EXPERIMENT)
    (tmp / "run.toml").write_text(RUN)
    cases = {
        "train": (["train", "--config", str(tmp / "run.toml"), "--out", str(tmp / "o")],
                  tmp / "o"),
        "demo": (["demo", "--out", str(tmp / "o")], tmp / "o"),
        "experiment": (["experiment", "--config", str(tmp / "exp.toml"), "--out",
                        str(tmp / "o")], tmp / "o"),
        "predict": (["predict", "--run", str(finished_run), "--input", str(tmp / "new.csv"),
                     "--out", str(tmp / "o.csv")], tmp / "o.csv"),
        "report (default name)": (["report", str(tmp / "o")], tmp / "o" / "report.html"),
    }
    return cases[command]


@pytest.mark.parametrize("command", ["train", "demo", "experiment", "predict",
                                     "report (default name)"])
def test_an_existing_output_is_refused_before_any_work(
        command: str, finished_run: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    args, out = _pre_existing(tmp_path, finished_run, command)
    target = out if out.suffix else out / "mine.txt"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("the user's own file\n")
    code, err = run_cli(args, capsys)
    assert code == EXIT_USAGE, err
    assert names(err, out) and "--overwrite" in err, err
    assert target.read_text() == "the user's own file\n"
    assert sorted(p.name for p in out.parent.iterdir() if p.name.startswith(".")) == []


def test_link_refuses_when_only_its_summary_exists(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    args, out = _link(tmp_path, tmp_path)
    summary = out.with_name(out.name + ".summary.json")
    summary.write_text("{}")
    code, err = run_cli(args, capsys)
    assert code == EXIT_USAGE and names(err, summary) and "--overwrite" in err
    assert summary.read_text() == "{}" and not out.exists()


def test_resume_of_a_finished_run_says_there_is_nothing_to_resume(
        finished_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = snapshot(finished_run)
    config = finished_run.parent / "run.toml"
    code, err = run_cli(["train", "--config", str(config), "--out", str(finished_run),
                         "--resume"], capsys)
    assert code == EXIT_USAGE
    assert "nothing to resume" in err and "finished" in err and names(err, finished_run)
    assert "--overwrite" not in err  # it would delete the finished run
    assert snapshot(finished_run) == before
