"""`vflink audit`: a one-run canary audit of the label protection (Steinke, Nasr & Jagielski
2023), its empirical ε lower bound beside the claimed ε; black-box and white-box."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import vflink
from tests.helpers.cli import clean
from tests.helpers.imbalanced import imbalanced_inputs
from tests.helpers.noise import SECRET, secret, seeded
from vflink.cli.main import main
from vflink.errors import ConfigError
from vflink.privacy.ledger import Ledger
from vflink.runfiles.config import (
    AlignmentConfig,
    DataConfig,
    PrivacyConfig,
    RunConfig,
    TrainingConfig,
)
from vflink.runner.audit import run_audit


def config(epochs: int = 3, **privacy: object) -> RunConfig:
    return RunConfig(seed=2, algorithm="splitnn", data=DataConfig(dataset="-"),
                     alignment=AlignmentConfig(method="exact"),
                     training=TrainingConfig(epochs=epochs, patience=epochs),
                     privacy=PrivacyConfig(**privacy))


def test_the_audit_of_dp_stays_below_its_claim_and_is_recorded(tmp_path: Path) -> None:
    out = tmp_path / "audit"
    figures = run_audit(config(**secret(labels="dp")), canaries=400,
                        tables=imbalanced_inputs(1200, positive=0.1, seed=3), out=out, seed=0)
    assert figures["mode"] == "dp" and figures["attack"] == "label-epoch-average"
    assert figures["epsilon_claimed"] == pytest.approx(4.0, abs=1e-3)
    assert 0.0 <= figures["epsilon_lower"] <= figures["epsilon_claimed"]
    assert figures["holds"] is True
    assert 0 < figures["canaries_trained"] <= 400 and figures["guesses"] in figures["tried"]
    lo, hi = figures["accuracy_interval"]
    assert lo <= figures["accuracy"] <= hi
    assert json.loads((out / "audit.json").read_text())["epsilon_lower"] == pytest.approx(
        figures["epsilon_lower"])
    entry = Ledger.read(out / "privacy.json").attacks[-1]
    assert entry["attack"] == "label-audit"
    assert entry["details"]["protection"]["within_limit"] is True
    assert "within the claim" in entry["explanation"]


def test_white_box_audits_read_seeded_noise_and_nothing_of_secret_noise() -> None:
    tables = imbalanced_inputs(2000, positive=0.1, seed=3)
    params = {"brute_force": 0}
    # the noise seeded from the run seed: the claim is proved false (ε = 2:
    # 346 right guesses of 346 prove ε ≥ 4.2 at 95 %, whatever the claim)
    seeded_ = run_audit(config(**seeded(labels="dp", labels_total_epsilon=2.0)),
                        canaries=1000, tables=tables, seed=1, white_box=True,
                        attack_params=params)
    assert seeded_["attack_details"]["found"] is not None
    assert seeded_["epsilon_lower"] > seeded_["epsilon_claimed"] and seeded_["holds"] is False
    assert "ABOVE the claim" in seeded_["explanation"]
    secret_ = run_audit(config(**secret(labels="dp")), canaries=1000, tables=tables, seed=1,
                        white_box=True, attack_params=params)
    assert secret_["attack_details"]["found"] is None
    assert secret_["epsilon_lower"] <= secret_["epsilon_claimed"] and secret_["holds"] is True


def test_the_audit_refuses_what_it_cannot_audit() -> None:
    tables = imbalanced_inputs(300, seed=3)
    with pytest.raises(ConfigError, match="canaries"):
        run_audit(config(labels="dp"), canaries=200, tables=tables)
    soft = config(labels="dp").replace(alignment=AlignmentConfig(
        method="soft", metric="euclidean", top_k=2, privacy="bloom"))
    with pytest.raises(ConfigError, match="exact"):
        run_audit(soft, canaries=10, tables=tables)
    with pytest.raises(ConfigError, match="confidence"):
        run_audit(config(labels="dp"), canaries=10, tables=tables, confidence=1.5)


def test_vflink_audit_from_a_run_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                      ) -> None:
    run_file = tmp_path / "run.toml"
    run_file.write_text('version = 1\nalgorithm = "splitnn"\nseed = 3\n'
                        '[data]\ndataset = "sklearn-small"\n'
                        '[data.options]\nn_samples = 900\n'
                        '[alignment]\nmethod = "exact"\n'
                        '[training]\nepochs = 2\npatience = 2\n'
                        '[privacy]\nlabels = "dp"\n'
                        + "".join(f"{k} = {str(v).lower()}\n" for k, v in SECRET.items()))
    out = tmp_path / "run"
    capsys.readouterr()
    code = main(["audit", "--config", str(run_file), "--out", str(out), "--canaries", "200",
                 "--canary-seed", "0"])
    said = clean(capsys.readouterr().out)
    assert code == 0 and "empirical ε ≥" in said and "claimed ε = 4" in said
    assert (out / "audit.json").is_file()
    assert main(["audit", "--config", str(run_file), "--out", str(out), "--canaries", "200",
                 "--brute-force", "10"]) == 2  # --brute-force without --white-box
    # the same from the Python API
    figures = vflink.audit(run_file, canaries=200, canary_seed=0)
    assert figures["epsilon_claimed"] == pytest.approx(4.0, abs=0.01)
    assert figures["holds"] is True and figures["epsilon_lower"] <= figures["epsilon_claimed"]
    assert "empirical ε ≥" in clean(figures["explanation"])
    with pytest.raises(ConfigError, match="white_box"):
        vflink.audit(run_file, canaries=200, brute_force=10)


@pytest.mark.slow
@pytest.mark.parametrize("epsilon", [1.0, 4.0])
def test_one_run_audit_of_dp_with_a_thousand_canaries(epsilon: float) -> None:
    """The slow job's audit: dp at ε 1 and 4, 1,000 canaries, black-box (epoch averaging)
    and white-box against the secure source: the empirical lower bound never exceeds the
    claimed ε."""
    tables = imbalanced_inputs(3000, positive=0.1, seed=1)
    cfg = config(epochs=5, **secret(labels="dp", labels_total_epsilon=epsilon))
    for white_box in (False, True):
        figures = run_audit(cfg, canaries=1000, tables=tables, seed=5, white_box=white_box,
                            attack_params={"brute_force": 1000} if white_box else None)
        assert figures["canaries_trained"] >= 600
        assert figures["epsilon_lower"] <= figures["epsilon_claimed"], figures["explanation"]
        assert figures["epsilon_claimed"] == pytest.approx(epsilon, abs=1e-3)
