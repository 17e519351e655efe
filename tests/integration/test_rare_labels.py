"""Training that learns on a rare label: selection on validation AUC by default (accuracy kept
the first epoch of a protected 8 %-positive task), the decision threshold chosen on validation
and reported, warnings when the model kept learnt little."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.helpers.imbalanced import imbalanced_inputs
from vflink.data import PartySchema, PartyTable
from vflink.errors import ConfigError, RunError
from vflink.runfiles.config import (
    AlignmentConfig,
    DataConfig,
    PrivacyConfig,
    RunConfig,
    TrainingConfig,
)
from vflink.runfiles.inputs import Inputs
from vflink.runner.predict import decision_threshold, predict_records
from vflink.runner.train import run_training


def config(select: str = "auto", labels: str = "dp", denoise: str = "posterior",
           **training: object) -> RunConfig:
    # no refit: these runs are about what the protected training selects and keeps; seeded
    # noise (the simulations' switch, named denoise): secret noise would make the figures
    # compared below vary from run to run
    privacy = PrivacyConfig(labels=labels, **({"labels_total_epsilon": 4.0,
                                               "labels_denoise": denoise,
                                               "labels_refit": False,
                                               "reproducible_noise": True}
                                              if labels == "dp" else {}))
    return RunConfig(seed=1, algorithm="splitnn", data=DataConfig(dataset="-"),
                     alignment=AlignmentConfig(method="exact"),
                     training=TrainingConfig(epochs=8, patience=8, select=select,
                                             **training),  # type: ignore[arg-type]
                     privacy=privacy)


@pytest.fixture(scope="module")
def tables():  # type: ignore[no-untyped-def]
    return imbalanced_inputs(2500, positive=0.08, seed=1)


def test_accuracy_keeps_the_first_epoch_of_a_protected_rare_label_and_says_so(
        tables: object, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="vflink.runner.plans"):
        # each release used as drawn (the posterior's evidence would lift accuracy later on)
        before = run_training(config("accuracy", denoise="none"),
                              tables=tables)  # type: ignore[arg-type]
    assert before.best_epoch == 1
    warnings = before.extra["warnings"]
    assert any("the kept model is the first epoch's" in w for w in warnings)
    assert any("kept model is the first epoch's" in r.getMessage() for r in caplog.records)
    # at 0.5 it predicts no positive at all: its accuracy is the base rate
    assert before.extra["decision"]["predicted_positive_at_0.5"]["test"] == 0.0
    after = run_training(config(), tables=tables)  # type: ignore[arg-type]
    assert after.best_epoch > 1
    assert after.metrics["test"]["auc"] > before.metrics["test"]["auc"] + 0.1
    decision = after.extra["decision"]
    assert decision["criterion"] == "f1" and decision["chosen_on"] == "validation"
    for split in ("validation", "test"):  # both classes predicted at the chosen threshold
        assert 0.0 < decision[split]["predicted_positive"] < 1.0
    assert not any("first epoch" in w for w in after.extra.get("warnings", []))
    # 1,750 training records at 8 %: about 140 positives, under the 200 the warning asks for
    rare = [w for w in after.extra["warnings"] if "rarer class has" in w]
    assert len(rare) == 1 and "ε = 4" in rare[0]
    count = int(rare[0].split("rarer class has ")[1].split()[0])
    assert 100 < count < 200
    # the validation metric it watched is the one of the epoch it kept
    aucs = [r.validation["auc"] for r in after.history]
    assert after.best_epoch == int(np.argmax(aucs)) + 1


def test_log_loss_selection_and_a_fixed_threshold(tables: object, tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = run_training(config("log-loss", labels="off", threshold=0.3), out,
                          tables=tables)  # type: ignore[arg-type]
    losses = [r.validation["log_loss"] for r in result.history]
    assert result.best_epoch == int(np.argmin(losses)) + 1
    assert set(result.metrics["test"]) == {"accuracy", "auc", "log_loss"}
    written = json.loads((out / "metrics.json").read_text())
    assert written["decision"]["threshold"] == 0.3
    assert written["decision"]["criterion"] == "fixed"
    # predictions cut at the run's threshold
    records = tables.primary.frame.iloc[:300].drop(columns=["y"])  # type: ignore[attr-defined]
    predicted = predict_records(out, records, tables=tables).frame  # type: ignore[arg-type]
    assert ((predicted["probability"] >= 0.3).astype(int) == predicted["prediction"]).all()
    assert decision_threshold(out) == 0.3
    written["decision"]["threshold"] = 1.5
    (out / "metrics.json").write_text(json.dumps(written))
    with pytest.raises(RunError, match="decision.threshold"):
        decision_threshold(out)
    assert set(written["decision"]["test"]) == {"accuracy", "balanced_accuracy", "precision",
                                                "recall", "f1", "predicted_positive"}


def test_a_metric_the_task_lacks_is_refused_before_training() -> None:
    rng = np.random.default_rng(0)
    keys = [f"k{i}" for i in range(200)]
    primary = pd.DataFrame({"id": keys, "p0": rng.normal(size=200), "y": rng.normal(size=200)})
    secondary = pd.DataFrame({"id": keys, "s0": rng.normal(size=200)})
    inputs = Inputs(
        PartyTable.from_frame(PartySchema(name="primary", role="primary", key=("id",),
                                          numeric=("p0",), label="y", task="regression"),
                              primary, "mem:p"),
        (PartyTable.from_frame(PartySchema(name="bank", role="secondary", key=("id",),
                                           numeric=("s0",)), secondary, "mem:s"),))
    regression = RunConfig(seed=0, algorithm="splitnn", data=DataConfig(dataset="-"),
                           alignment=AlignmentConfig(method="exact"),
                           training=TrainingConfig(epochs=1, select="auc"))
    with pytest.raises(ConfigError, match=r"training.select = \"auc\"` does not apply"):
        run_training(regression, tables=inputs)
    fine = run_training(regression.replace(training=TrainingConfig(epochs=1, select="r2")),
                        tables=inputs)
    assert "decision" not in fine.extra  # a threshold is a binary task's
    with pytest.raises(ConfigError, match="training.threshold"):
        TrainingConfig(threshold=1.0)
    with pytest.raises(ConfigError, match="training.select"):
        TrainingConfig(select="accuracy-at-0.5")
