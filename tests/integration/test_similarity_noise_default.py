"""Privately released similarities are noised by default (FedSim Theorem 2's τ), every
summary and the ledger say how, and multi-field links take a τ on the scale where the greedy
attack works."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.helpers.tables import places_frames
from vflink.cli import link as cli_link
from vflink.cli.main import main
from vflink.linkage import DEFAULT_TAU, tau_for_sigma
from vflink.randomness import NOT_PRIVATE
from vflink.runfiles.config import AlignmentConfig, DataConfig, RunConfig, TrainingConfig
from vflink.runner.train import run_training

FIELDS = ('[[link.fields]]\non = ["name"]\nsecondary_on = ["title"]\nmetric = "token-set"\n'
          'weight = 0.5\n[[link.fields]]\non = ["lat", "lon"]\nmetric = "haversine"\n')


def _places(tmp: Path) -> tuple[Path, Path]:
    primary, secondary, _ = places_frames()
    p, s = tmp / "places.csv", tmp / "others.csv"
    primary.to_csv(p, index=False)
    secondary.to_csv(s, index=False)
    return p, s


def _link(p: Path, s: Path, out: Path, *extra: str) -> int:
    return main(["link", "--primary", str(p), "--secondary", str(s), "--on", "name",
                 "--secondary-on", "title", "--metric", "levenshtein", "--top-k", "3",
                 "--out", str(out), "--seed", "0", *extra])


def test_the_cli_spells_out_the_library_default() -> None:
    assert cli_link.DEFAULT_TAU == DEFAULT_TAU


def test_vflink_link_without_privacy_options_noises_and_says_so(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p, s = _places(tmp_path)
    out = tmp_path / "links.csv"
    assert _link(p, s, out) == 0
    summary = json.loads(Path(f"{out}.summary.json").read_text())
    assert summary["privacy"] == "bloom" and summary["sigma"] > 0
    assert summary["tau"] == pytest.approx(DEFAULT_TAU)
    assert summary["tau"] == pytest.approx(tau_for_sigma(summary["sigma"], summary["sigma0"]))
    assert summary["similarity_protection"].startswith(
        f"similarities: Gaussian noise σ = {summary['sigma']:.4g}, greedy-attack bound τ = 0.05")
    printed = re.sub(r"[│\s]+", " ", capsys.readouterr().out)  # the table wraps its cells
    assert "protection" in printed and "Gaussian noise σ" in printed
    assert "greedy-attack bound τ = 0.05" in printed
    # --seed made the noise reproducible: the summary and the printed line say so
    assert summary["similarity_protection"].endswith(NOT_PRIVATE)
    assert NOT_PRIVATE in printed
    unseeded = tmp_path / "unseeded.csv"
    assert main(["link", "--primary", str(p), "--secondary", str(s), "--on", "name",
                 "--secondary-on", "title", "--metric", "levenshtein", "--top-k", "3",
                 "--out", str(unseeded)]) == 0
    assert NOT_PRIVATE not in json.loads(
        Path(f"{unseeded}.summary.json").read_text())["similarity_protection"]


def test_tau_1_is_the_explicit_opt_out(tmp_path: Path) -> None:
    p, s = _places(tmp_path)
    out = tmp_path / "links.csv"
    assert _link(p, s, out, "--tau", "1") == 0
    summary = json.loads(Path(f"{out}.summary.json").read_text())
    assert summary["sigma"] == 0 and summary["tau"] == 1
    assert summary["similarity_protection"].startswith("similarities: none (τ = 1)")


def test_a_tiny_table_gets_the_fallback_noise_not_an_error(tmp_path: Path) -> None:
    p, s = tmp_path / "a.csv", tmp_path / "b.csv"
    p.write_text("name\nAnna Smith\nBob Jones\nCarl Berg\n")
    s.write_text("name\nAnna Smyth\nBob Jone\nKarl Berg\n")
    out = tmp_path / "links.csv"
    assert main(["link", "--primary", str(p), "--secondary", str(s), "--on", "name",
                 "--metric", "levenshtein", "--top-k", "2", "--out", str(out)]) == 0
    summary = json.loads(Path(f"{out}.summary.json").read_text())
    assert summary["sigma"] > 0 and summary["tau"] < 1


def test_a_multi_field_link_file_takes_the_readme_tau(tmp_path: Path) -> None:
    _places(tmp_path)
    (tmp_path / "link.toml").write_text(
        'version = 1\n[link]\nprimary = "places.csv"\nsecondary = "others.csv"\ntop_k = 3\n'
        'tau = 0.999\nout = "links.csv"\nseed = 0\n' + FIELDS)
    assert main(["link", "--config", str(tmp_path / "link.toml")]) == 0
    summary = json.loads((tmp_path / "links.csv.summary.json").read_text())
    r = summary["resolution"]
    assert 0 < r < 0.01  # one Bloom-filter bit of the weighted distance in [0, 1]
    assert summary["tau"] == pytest.approx(0.999)
    assert summary["tau"] == pytest.approx(
        tau_for_sigma(summary["sigma"], summary["sigma0"], resolution=r))


def test_an_unreachable_multi_field_tau_names_the_smallest_and_sigma(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _places(tmp_path)
    (tmp_path / "link.toml").write_text(
        'version = 1\n[link]\nprimary = "places.csv"\nsecondary = "others.csv"\ntop_k = 3\n'
        'tau = 0.0001\nout = "links.csv"\nseed = 0\n' + FIELDS)
    assert main(["link", "--config", str(tmp_path / "link.toml")]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "unreachable" in err and "choose tau ≥" in err and "`sigma`" in err


def test_a_training_run_with_fields_takes_the_readme_tau_and_reports_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from vflink.data.schema import PartySchema

    monkeypatch.setenv("VFLINK_SECRET", "a-test-secret-shared-by-the-data-parties")
    primary, secondary, _ = places_frames()
    primary.to_csv(tmp_path / "primary.csv", index=False)
    secondary.to_csv(tmp_path / "bank.csv", index=False)
    parties = (PartySchema(name="primary", role="primary", path=tmp_path / "primary.csv",
                           identifiers=["name", "lat", "lon"], numeric=["p0", "p1"],
                           label="y", task="binary"),
               PartySchema(name="bank", role="secondary", path=tmp_path / "bank.csv",
                           identifiers=["title", "lat", "lon"], numeric=["s0", "s1"]))
    fields = ({"on": ["name"], "secondary_on": ["title"], "metric": "token-set",
               "weight": 0.5}, {"on": ["lat", "lon"], "metric": "haversine"})
    config = RunConfig(seed=1, algorithm="fedsim", data=DataConfig(parties=parties),
                       alignment=AlignmentConfig(method="soft", top_k=3, tau=0.999,
                                                 fields=fields),
                       training=TrainingConfig(epochs=1, patience=1, knn_batch_size=32))
    result = run_training(config, tmp_path / "run")
    link = result.extra["alignment"]
    assert link["tau"] == pytest.approx(0.999) and link["sigma"] > 0
    assert 0 < link["resolution"] < 0.01
    assert "greedy-attack bound τ = 0.999" in link["similarity_protection"]


def test_a_default_training_run_noises_and_the_ledger_says_so(tmp_path: Path) -> None:
    config = RunConfig(seed=1, algorithm="fedsim",
                       data=DataConfig(dataset="sklearn-small", options={"n_samples": 600}),
                       alignment=AlignmentConfig(method="soft", top_k=3),
                       training=TrainingConfig(epochs=1, patience=1))
    assert config.alignment.tau is None and config.alignment.sigma is None
    result = run_training(config, tmp_path / "run")
    link = result.extra["alignment"]
    assert link["privacy"] == "bloom" and link["sigma"] > 0 and link["tau"] < 1
    assert link["similarity_protection"].startswith("similarities: Gaussian noise σ")
    ledger = json.loads((tmp_path / "run" / "privacy.json").read_text())
    noise = [p for p in ledger["protections"] if p["kind"] == "similarity-noise"]
    assert noise and noise[0]["explanation"].startswith("similarities: Gaussian noise σ")


@pytest.mark.parametrize(("line", "where", "fix"), [
    ("tau = 0", ":8:7: tau", "tau = 1 for no noise"),
    ('tau = "0.05"', ":8:7: tau", "e.g. tau = 0.05"),
    ("sigma = -1", ":8:9: sigma", "sigma = 0 for no noise"),
    ("tau = 0.5\nsigma = 0.1", ":8:7: tau and", "at most one"),
    ("tau = 0.0001", ":8:7: tau", "choose tau ≥"),
])
def test_noise_mistakes_in_a_link_file_name_the_line_and_the_fix(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], line: str, where: str,
        fix: str) -> None:
    _places(tmp_path)
    path = tmp_path / "link.toml"
    path.write_text('[link]\nprimary = "places.csv"\nsecondary = "others.csv"\non = ["name"]\n'
                    'secondary_on = ["title"]\nmetric = "levenshtein"\ntop_k = 3\n'
                    f'{line}\nout = "links.csv"\n')
    assert main(["link", "--config", str(path)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"link.toml{where}" in err and fix in err
