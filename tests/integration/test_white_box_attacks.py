"""White-box label attacks on real runs, from the secondary's own recording only: what it
holds (the rows each Forward asked for, in order; the seed of the spec it was sent), what it
reads with it, and each attack judged against the most AUC the protection's stated guarantee
allows (`vflink attack`, the ledger, the report).

Label noise seeded from the run seed (``runner/protections.py``), which the secondary
receives, is regenerated and every label read; secret noise reads nothing. Which privacy keys
make the noise seeded or secret is ``tests/helpers/noise.py``'s."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.helpers.cli import clean
from tests.helpers.imbalanced import imbalanced_inputs
from tests.helpers.noise import secret, seeded
from vflink.attacks.limits import dp_auc_ceiling
from vflink.cli.main import main
from vflink.parties.recording import read_recording
from vflink.privacy.ledger import Ledger
from vflink.protocol.messages import Forward, SetupBottom
from vflink.reporting.ledger import label_verdict
from vflink.runfiles.config import (
    AlignmentConfig,
    DataConfig,
    EvaluationConfig,
    PrivacyConfig,
    RunConfig,
    TrainingConfig,
)
from vflink.runner.attack import run_attack
from vflink.runner.train import run_training
from vflink.transport import Transcript

RUNS = {"dp": seeded(labels="dp"), "dp-secure": secret(labels="dp"),
        "dp-seed-7": seeded(labels="dp", labels_seed=7), "marvell": seeded(labels="marvell"),
        "off": {"labels": "off"}}


def config(**privacy: Any) -> RunConfig:
    return RunConfig(seed=4, algorithm="splitnn", data=DataConfig(dataset="-"),
                     alignment=AlignmentConfig(method="exact"),
                     training=TrainingConfig(epochs=3, patience=3),
                     evaluation=EvaluationConfig(record=True),
                     privacy=PrivacyConfig(**privacy))


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Transcript]]:
    base = tmp_path_factory.mktemp("white-box")
    tables = imbalanced_inputs(1500, positive=0.1, seed=2)
    out = {}
    for name, privacy in RUNS.items():
        transcript = Transcript()
        run_training(config(**privacy), base / name, tables=tables, transcript=transcript)
        out[name] = (base / name, transcript)
    return out


def test_the_secondary_records_the_primarys_order_and_the_seed_it_was_sent(
        runs: dict[str, tuple[Path, Transcript]]) -> None:
    run_dir, transcript = runs["dp"]
    rec = read_recording(run_dir / "models" / "bank")
    positions, asked, batch = rec.get("requests")
    grads, ids, grad_batch = rec.get("gradients")
    forwards = [r.message for r in transcript.records
                if isinstance(r.message, Forward) and r.message.train]
    assert batch is not None and grad_batch is not None
    assert len(np.unique(batch)) == len(forwards)
    for message in forwards:  # what the primary asked, in its order
        mine = batch == message.batch_id
        assert np.array_equal(asked[mine], message.rows)
        # each asked row's position among the batch's gradient rows
        assert np.array_equal(ids[grad_batch == message.batch_id][positions[mine]],
                              message.rows)
    (spec,) = [r.message.spec for r in transcript.records
               if isinstance(r.message, SetupBottom)]
    assert rec.manifest["meta"]["setup__primary"] == {"message": "setup_bottom",
                                                      "seed": spec.seed}
    # still only what it received: no label, no primary feature
    assert not any("label" in key for key in rec.arrays)


def test_noise_seeded_from_the_run_seed_is_regenerated_and_every_label_read(
        runs: dict[str, tuple[Path, Transcript]]) -> None:
    for name in ("dp", "marvell"):
        result = run_attack(runs[name][0], "label-noise-subtraction",
                            params={"brute_force": 0})
        found = result.details["found"]
        assert found is not None and "setup_bottom from primary" in found["how"]
        assert found["mechanism"] == name
        assert result.metrics["auc"] >= 0.95
        protection = result.details["protection"]
        assert protection["within_limit"] is False
        if name == "dp":  # beyond what (ε = 4, δ = 1e-5) allows any test of one label
            assert protection["limit"] == pytest.approx(dp_auc_ceiling(4.0, 1e-5), abs=1e-3)
            assert "goes BEYOND it" in result.explanation
        verdict = label_verdict(Ledger.read(runs[name][0] / "privacy.json").attacks)
        assert verdict is not None and "does NOT hold" in verdict


def test_a_small_labels_seed_is_found_by_brute_force(
        runs: dict[str, tuple[Path, Transcript]]) -> None:
    result = run_attack(runs["dp-seed-7"][0], "label-noise-subtraction",
                        params={"brute_force": 50})
    assert result.details["found"]["how"].startswith("labels_seed = 7")
    assert result.metrics["auc"] >= 0.95


def test_secret_noise_reads_nothing_and_the_black_box_attacks_stay_within_epsilon(
        runs: dict[str, tuple[Path, Transcript]]) -> None:
    run_dir = runs["dp-secure"][0]
    subtraction = run_attack(run_dir, "label-noise-subtraction", params={"brute_force": 300})
    assert subtraction.details["found"] is None and subtraction.metrics["auc"] == 0.5
    assert subtraction.details["protection"]["within_limit"] is True
    for name in ("label-epoch-average", "label-residual"):
        result = run_attack(run_dir, name)
        assert result.details["protection"]["within_limit"] is True, result.explanation
        # and within the Gaussian releases' own, tighter, ceiling (sampling slack: 0.05)
        assert result.details["protection"]["leak"] <= (
            result.details["protection"]["gaussian_limit"] + 0.05)
    verdict = label_verdict(Ledger.read(run_dir / "privacy.json").attacks)
    assert verdict == ("labels = dp: holds within its stated limit against every label "
                       "attack run (label-noise-subtraction, label-epoch-average, "
                       "label-residual)")


def test_unprotected_labels_are_read_by_averaging_and_marvell_states_no_limit(
        runs: dict[str, tuple[Path, Transcript]]) -> None:
    off = run_attack(runs["off"][0], "label-epoch-average")
    assert off.metrics["auc"] >= 0.9 and off.metrics["mean_rows_per_record"] == 3
    assert off.details["protection"]["limit"] is None
    run_dir = runs["marvell"][0]
    entry = next(p for p in Ledger.read(run_dir / "privacy.json").protections
                 if p["kind"] == "label-marvell")
    assert entry["guarantee"]["limit"] is None and "leak_auc_bound_max" not in entry["guarantee"]
    assert entry["guarantee"]["model_auc_max"] > 0.5
    assert "no formal guarantee and no stated limit" in entry["explanation"]
    assert "per batch and per row" in entry["explanation"]
    residual = run_attack(run_dir, "label-residual")
    # no limit stated: within only when at chance
    assert residual.details["protection"]["within_limit"] is (
        abs(residual.metrics["auc"] - 0.5) <= 0.1)


def test_the_cli_prints_the_limit_and_the_report_the_verdict(
        runs: dict[str, tuple[Path, Transcript]], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = runs["marvell"][0]
    capsys.readouterr()
    code = main(["attack", "--run", str(run_dir), "--attack", "label-noise-subtraction",
                 "--param", "brute_force=0"])
    out = clean(capsys.readouterr().out)
    assert code == 0
    assert "stated limit (AUC)" in out and "labels = marvell: does NOT hold" in out
    from vflink.reporting.report import write_report

    page = write_report(run_dir, tmp_path / "report.html").read_text()
    assert "labels = marvell: does NOT hold within its stated limit" in page
    assert "BEYOND" not in page or "chance (no limit stated)" in page


def test_one_point_of_the_label_grid() -> None:
    """The label-protection grid's unit of work: one mode × the attacks × one data set × one
    seed, trained and attacked, as one runs line."""
    from vflink.experiments.label_protection import measure

    line = measure(config(**secret(labels="dp")), ("label-norm", "label-epoch-average"),
                   tables=imbalanced_inputs(600, positive=0.1, seed=2))
    assert line["labels"] == "dp" and line["seed"] == 4 and line["epsilon"] == 4.0
    assert set(line["attacks"]) == {"label-norm", "label-epoch-average"}
    for figures in line["attacks"].values():
        assert figures["limit"] == pytest.approx(dp_auc_ceiling(4.0, 1e-5), abs=1e-3)
        assert figures["within_limit"] is True and 0.0 <= figures["auc"] <= 1.0
    assert line["holds"] is True and line["guarantee"]["label_dp"] is True
    assert 0.0 < line["decision"]["threshold"] < 1.0 and "auc" in line["test"]
