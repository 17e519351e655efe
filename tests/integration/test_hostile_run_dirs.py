"""Run directories made by someone else are data: `vflink report` and
`vflink attack` never write through a link planted in them, never copy a linked file into a
page, and a deep or linked file is exit 2 naming it; in a run *beside* the reported one it is
skipped with a warning."""

from __future__ import annotations

import json
import logging
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.helpers.imbalanced import imbalanced_inputs
from vflink.cli.main import main
from vflink.errors import DataError, RunError
from vflink.models.statefile import StateFileError, read_state_header, save_state
from vflink.privacy.ledger import Ledger
from vflink.reporting.experiment import plot_results
from vflink.reporting.link_quality import read_link_quality
from vflink.runfiles.config import (
    AlignmentConfig,
    DataConfig,
    EvaluationConfig,
    RunConfig,
    TrainingConfig,
)
from vflink.runner.evaluation import read_truth
from vflink.runner.predict import predict_records
from vflink.runner.train import run_training

SECRET = "SECRET-OUTSIDE-THE-RUN"
DEEP = '{"a":' * 5000 + "1" + "}" * 5000  # json.loads alone: RecursionError


@pytest.fixture(scope="module")
def made_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("made") / "splitnn"
    config = RunConfig(seed=0, algorithm="splitnn", data=DataConfig(dataset="-"),
                       alignment=AlignmentConfig(method="exact"),
                       training=TrainingConfig(epochs=2, patience=2),
                       evaluation=EvaluationConfig(record=True))
    run_training(config, out, tables=imbalanced_inputs())
    return out


@pytest.fixture
def run(made_run: Path, tmp_path: Path) -> Path:
    """A fresh copy of the run in ``tmp_path/runs/run``, to tamper with."""
    out = tmp_path / "runs" / "run"
    shutil.copytree(made_run, out, symlinks=True)
    return out


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    path = tmp_path / "home" / "victim.txt"
    path.parent.mkdir()
    path.write_text(f"{SECRET}\n")
    return path


def _said(capsys: pytest.CaptureFixture[str]) -> str:
    """What the command printed, without whitespace: rich wraps long paths anywhere."""
    got = capsys.readouterr()
    return "".join((got.out + got.err).split())


def _bare(text: str) -> str:
    return "".join(text.split())


def test_report_never_writes_through_a_planted_partial_file(
        run: Path, victim: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (run / ".report.html.partial").symlink_to(victim)
    (run / "report.html").symlink_to(victim)
    assert main(["report", str(run)]) == 2  # an existing output needs --overwrite
    assert victim.read_text() == f"{SECRET}\n"
    assert main(["report", str(run), "--overwrite"]) == 0
    assert victim.read_text() == f"{SECRET}\n"
    assert not (run / "report.html").is_symlink()
    assert "<!DOCTYPE html>" in (run / "report.html").read_text()


def test_attack_never_writes_through_a_planted_ledger_temporary(
        run: Path, victim: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (run / "privacy.json.tmp").symlink_to(victim)
    assert main(["attack", "--run", str(run), "--attack", "label-norm"]) == 0
    assert victim.read_text() == f"{SECRET}\n"
    assert [a["attack"] for a in Ledger.read(run / "privacy.json").attacks] == ["label-norm"]


def test_attack_refuses_a_linked_ledger_and_leaves_its_target(
        run: Path, victim: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (run / "privacy.json").unlink()
    (run / "privacy.json").symlink_to(victim)
    assert main(["attack", "--run", str(run), "--attack", "label-norm"]) == 2
    assert _bare(f"{run / 'privacy.json'}: is a symbolic link") in _said(capsys)
    assert victim.read_text() == f"{SECRET}\n"


def test_attack_refuses_a_linked_recording(run: Path, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    manifest = run / "models" / "bank" / "evaluation" / "received.json"
    moved = tmp_path / "received.json"
    shutil.move(manifest, moved)
    manifest.symlink_to(moved)
    assert main(["attack", "--run", str(run), "--attack", "label-norm"]) == 2
    assert _bare(f"{manifest}: is a symbolic link") in _said(capsys)


def test_a_linked_config_is_not_copied_into_the_page(
        run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = json.loads((run / "config.json").read_text())
    config["algorithm"] = SECRET
    outside = tmp_path / "home" / "config.json"
    outside.parent.mkdir()
    outside.write_text(json.dumps(config))
    (run / "config.json").unlink()
    (run / "config.json").symlink_to(outside)
    page = tmp_path / "page.html"
    assert main(["report", str(run), "--out", str(page)]) == 2
    assert _bare(f"{run / 'config.json'}: is a symbolic link") in _said(capsys)
    assert not page.exists()


def _experiment(directory: Path) -> None:
    stat = {"accuracy": {"mean": 0.81, "std": 0.01}}
    results = {"name": "toy", "algorithms": ["solo"], "seeds": [0],
               "sweep": {"key": None, "values": [None]}, "headline_metric": "accuracy",
               "summary": {"None": {"solo": stat}}, "runs": []}
    directory.mkdir(parents=True)
    (directory / "results.json").write_text(json.dumps(results))
    plot_results(results, directory / "plot.png")


def test_a_linked_plot_is_not_copied_into_the_page(
        tmp_path: Path, victim: Path, capsys: pytest.CaptureFixture[str]) -> None:
    exp = tmp_path / "exp"
    _experiment(exp)
    assert main(["report", str(exp)]) == 0  # the plot itself is inlined
    assert 'id="experiment-plot"' in (exp / "report.html").read_text()
    (exp / "report.html").unlink()
    (exp / "plot.png").unlink()
    (exp / "plot.png").symlink_to(victim)
    assert main(["report", str(exp)]) == 2
    assert _bare(f"{exp / 'plot.png'}: is a symbolic link") in _said(capsys)
    assert not (exp / "report.html").exists()


def test_deeply_nested_metrics_in_the_run_is_exit_2_naming_it(
        run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (run / "metrics.json").write_text(DEEP)
    assert main(["report", str(run)]) == 2
    said = _said(capsys)
    assert _bare(f"{run / 'metrics.json'}: JSON nested more than 100 levels deep") in said
    assert "unexpected" not in said


def test_a_bad_run_beside_is_skipped_with_a_warning(
        run: Path, made_run: Path, victim: Path, capsys: pytest.CaptureFixture[str],
        caplog: pytest.LogCaptureFixture) -> None:
    deep = run.parent / "deep"
    shutil.copytree(made_run, deep, symlinks=True)
    (deep / "metrics.json").write_text(DEEP)
    linked = run.parent / "linked"
    shutil.copytree(made_run, linked, symlinks=True)
    (linked / "config.json").unlink()
    (linked / "config.json").symlink_to(victim)
    good = run.parent / "good"  # a sound sibling still shows up in the comparison
    shutil.copytree(made_run, good, symlinks=True)
    with caplog.at_level(logging.WARNING, logger="vflink.reporting.report"):
        assert main(["report", str(run)]) == 0
    warnings = " ".join(r.getMessage() for r in caplog.records
                        if r.name == "vflink.reporting.report")
    assert f"{deep / 'metrics.json'}: JSON nested more than 100 levels deep" in warnings
    assert f"{linked / 'config.json'}: is a symbolic link" in warnings
    page = (run / "report.html").read_text()
    baselines = re.search(r'<table class="baselines">.*?</table>', page, flags=re.S)
    assert baselines is not None
    # this run and the good one; the deep and the linked ones are left out
    assert re.findall(r"<tr><td>([^<]*)</td>", baselines.group(0)) == [
        "splitnn (this run)", "splitnn"]
    assert SECRET not in page


# --- every reader of a run directory refuses a linked file, naming it --------------------------

def test_run_directory_readers_refuse_linked_files(run: Path, tmp_path: Path) -> None:
    def link_out(relative: str) -> Path:
        path = run / relative
        moved = tmp_path / "moved" / relative.replace("/", "_")
        moved.parent.mkdir(exist_ok=True)
        shutil.move(path, moved)
        path.symlink_to(moved)
        return path

    path = link_out("evaluation/truth.json")
    with pytest.raises(DataError, match=f"{path}: is a symbolic link"):
        read_truth(run)
    path = link_out("link_quality.json")
    with pytest.raises(RunError, match=f"{path}: is a symbolic link"):
        read_link_quality(run)
    path = link_out("config.json")
    with pytest.raises(RunError, match=f"{path}: is a symbolic link"):
        predict_records(run, imbalanced_inputs().primary.frame.head(3))


def test_state_files_refuse_links_and_deep_json(tmp_path: Path, victim: Path) -> None:
    save_state(tmp_path, "primary", {"epoch": 3}, kind="primary")
    assert read_state_header(tmp_path, "primary", kind="primary")["state"] == {"epoch": 3}
    (tmp_path / "primary.json").rename(tmp_path / "moved.json")
    (tmp_path / "primary.json").symlink_to(tmp_path / "moved.json")
    with pytest.raises(StateFileError, match="primary.json: is a symbolic link"):
        read_state_header(tmp_path, "primary")
    (tmp_path / "primary.json").unlink()
    (tmp_path / "primary.json").write_text(DEEP)
    with pytest.raises(StateFileError, match="primary.json: JSON nested more than 100"):
        read_state_header(tmp_path, "primary")


def test_metrics_with_wrong_value_types_is_exit_2_naming_the_file_and_the_key(
        run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    metrics = json.loads((run / "metrics.json").read_text())
    good = json.dumps(metrics)
    for key, bad in (("metrics.test.auc", "high"), ("epochs[1].train_loss", [1]),
                     ("sizes.train", {"n": 1}), ("algorithm", 7)):
        doc = json.loads(good)
        target: Any = doc
        parts = key.replace("[", ".").replace("]", "").split(".")
        for part in parts[:-1]:
            target = target[int(part)] if part.isdigit() else target[part]
        target[int(parts[-1]) if parts[-1].isdigit() else parts[-1]] = bad
        (run / "metrics.json").write_text(json.dumps(doc))
        assert main(["report", str(run), "--overwrite"]) == 2, key
        said = _said(capsys)
        assert _bare(f"{run / 'metrics.json'}: key \"{key}\"") in said, (key, said)
        assert "unexpectederror" not in said.lower()
    (run / "metrics.json").write_text(good)
    assert main(["report", str(run), "--overwrite"]) == 0


def test_an_object_array_in_a_recording_is_exit_2_naming_the_file_and_the_key(
        run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    npz = run / "models" / "bank" / "evaluation" / "received.npz"
    with np.load(npz) as data:
        arrays = {k: data[k] for k in data.files}
    key = sorted(arrays)[0]
    arrays[key] = np.array([{"pickled": SECRET}, None], dtype=object)
    np.savez(npz, **arrays)  # numpy pickles the object array
    assert main(["attack", "--run", str(run), "--attack", "label-norm"]) == 2
    said = _said(capsys)
    assert _bare(f"{npz}: key '{key}': holds Python objects") in said, said
    assert SECRET not in said and "unexpectederror" not in said.lower()
    # and a wrong dtype kind (text) is named too
    arrays[key] = np.array(["a", "b"])
    np.savez(npz, **arrays)
    assert main(["attack", "--run", str(run), "--attack", "label-norm"]) == 2
    assert _bare(f"{npz}: key '{key}': expected a boolean or signed integer or unsigned "
                 "integer or float array") in _said(capsys)
