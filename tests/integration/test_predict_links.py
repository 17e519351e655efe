"""`vflink predict` says how well each record was linked, and warns about poorly linked rows."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from vflink.cli.main import main
from vflink.data.split import split_rows
from vflink.reporting.link_quality import LINK_QUALITY_FILE
from vflink.runfiles.config import AlignmentConfig, DataConfig, RunConfig, TrainingConfig
from vflink.runner.predict import predict_records
from vflink.runner.prepare import prepare
from vflink.runner.train import run_training

OPTIONS = {"n_samples": 600, "sigma_cf": 0.1, "seed": 4}


def config(algorithm: str, alignment: AlignmentConfig) -> RunConfig:
    return RunConfig(seed=4, algorithm=algorithm,
                     data=DataConfig(dataset="sklearn-small", options=dict(OPTIONS)),
                     alignment=alignment, training=TrainingConfig(epochs=2, patience=2))


@pytest.fixture(autouse=True)
def no_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VFLINK_SECRET", raising=False)  # derived from the seed: reproducible


def test_soft_linkage_best_similarity_percentile_and_warning(tmp_path: Path) -> None:
    # σ = 0: prediction relinks exactly as training did, so the columns have an oracle
    cfg = config("fedsim", AlignmentConfig(method="soft", top_k=3, sigma=0.0))  # Bloom filters
    run = tmp_path / "run"
    run_training(cfg, run)
    quality = json.loads((run / LINK_QUALITY_FILE).read_text())  # JSON, not pickle
    prepared = prepare(cfg)
    primary = prepared.inputs.primary.frame
    best = prepared.alignments["base"]["secondary"].similarity[:, 0]
    train, _, _ = split_rows(prepared.rows, cfg.training.split, np.random.default_rng([4, 0]))
    assert quality["version"] == 1 and quality["method"] == "soft"
    assert quality["percentile"] == 1.0
    assert quality["best_similarity"] == pytest.approx(np.percentile(best[train], 1.0), rel=1e-6)

    new = primary.iloc[:40].drop(columns=["y"]).reset_index(drop=True)
    made_up = new.iloc[[0]].copy()
    made_up[["cf0", "cf1", "cf2"]] = [40.0, -40.0, 40.0]  # nobody lives there
    made_up["id"] = "made-up"
    new = pd.concat([new, made_up], ignore_index=True)
    out = predict_records(run, new)
    frame = out.frame
    assert {"best_similarity", "low_similarity", "probability", "prediction"} <= set(frame)
    np.testing.assert_allclose(frame["best_similarity"].iloc[:40], best[:40], rtol=1e-5)
    expected_low = np.append(best[:40] < quality["best_similarity"], True)
    np.testing.assert_array_equal(frame["low_similarity"].to_numpy(), expected_low)
    assert bool(frame["low_similarity"].iloc[-1])  # the made-up record is flagged
    n_low = int(expected_low.sum())
    assert len(out.warnings) == 1
    assert out.warnings[0].startswith(f"{n_low} of 41 rows have a best-link similarity below")


def test_exact_alignment_says_whether_a_match_was_found(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    cfg = config("splitnn", AlignmentConfig(method="exact"))
    run = tmp_path / "run"
    run_training(cfg, run)
    quality = json.loads((run / LINK_QUALITY_FILE).read_text())
    assert quality["method"] == "exact" and quality["matched_fraction"] == {"secondary": 1.0}
    primary = prepare(cfg).inputs.primary.frame
    new = primary.iloc[:20].drop(columns=["y"]).reset_index(drop=True)
    new.loc[[3, 7], "id"] = ["nobody", "no-one"]
    path = tmp_path / "new.csv"
    new.to_csv(path, index=False)
    out = tmp_path / "pred.csv"
    assert main(["predict", "--run", str(run), "--input", str(path), "--out", str(out)]) == 0
    printed = " ".join(capsys.readouterr().out.split())
    assert "warning: 2 of 20 rows have no exact match at 'secondary'" in printed
    frame = pd.read_csv(out)
    assert "best_similarity" not in frame
    expected = np.ones(20, dtype=bool)
    expected[[3, 7]] = False
    np.testing.assert_array_equal(frame["matched"].to_numpy(), expected)


def test_a_link_quality_file_of_another_version_is_refused(tmp_path: Path) -> None:
    cfg = config("fedsim", AlignmentConfig(method="soft", top_k=2, sigma=0.0))
    run = tmp_path / "run"
    run_training(cfg, run)
    path = run / LINK_QUALITY_FILE
    path.write_text(json.dumps({**json.loads(path.read_text()), "version": 99}))
    new = prepare(cfg).inputs.primary.frame.iloc[:5]
    with pytest.raises(Exception, match="version 99.*reads version 1"):
        predict_records(run, new)
