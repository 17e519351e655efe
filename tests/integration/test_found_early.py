"""Values that can be checked before a run starts are checked then, with exit code 2 and a
message naming the value, the limit and the fix (not a policy refusal at run time, exit 1)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import vflink
from tests.helpers.cli import run_cli
from vflink.cli._errors import EXIT_USAGE
from vflink.errors import ConfigError, LinkageError

RUN = """version = 1
algorithm = "fedsim"
[[data.parties]]
name = "primary"
role = "primary"
path = "p.csv"
identifiers = ["lat", "lon"]
numeric = ["x"]
label = "y"
task = "binary"
[[data.parties]]
name = "shop"
role = "secondary"
path = "s.csv"
identifiers = ["lat", "lon"]
numeric = ["z"]
[alignment]
method = "soft"
metric = "euclidean"
top_k = {top_k}
[training]
epochs = 1
"""


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    pd.DataFrame({"lat": rng.normal(size=80), "lon": rng.normal(size=80),
                  "x": rng.normal(size=80), "y": rng.integers(0, 2, 80)}).to_csv(
        tmp_path / "p.csv", index=False)
    pd.DataFrame({"lat": rng.normal(size=60), "lon": rng.normal(size=60),
                  "z": rng.normal(size=60)}).to_csv(tmp_path / "s.csv", index=False)
    return tmp_path


def test_top_k_above_the_coordinators_limit_is_a_config_error(
        run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (run_dir / "run.toml").write_text(RUN.format(top_k=5000))
    code, err = run_cli(["train", "--config", str(run_dir / "run.toml"), "--out",
                         str(run_dir / "r")], capsys)
    assert code == EXIT_USAGE, err
    assert "alignment.top_k = 5000 is more than the coordinator accepts" in err
    assert "policy.max_top_k = 1000" in err and not (run_dir / "r").exists()


def test_top_k_above_a_secondarys_rows_stops_before_the_alignment(
        run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (run_dir / "run.toml").write_text(RUN.format(top_k=70))
    code, err = run_cli(["train", "--config", str(run_dir / "run.toml"), "--out",
                         str(run_dir / "r")], capsys)
    assert code == EXIT_USAGE, err
    assert "alignment.top_k = 70 is larger than the secondary table of party 'shop'" in err
    assert "(60 rows)" in err and "give K ≤ 60" in err and not (run_dir / "r").exists()
    with pytest.raises(LinkageError, match="alignment.top_k = 70"):
        vflink.train(str(run_dir / "run.toml"))


def test_link_top_k_above_the_policy_limit_is_the_users_to_ask(tmp_path: Path) -> None:
    # in-process, every table is the user's: any K up to the secondary's rows, not a policy
    # refusal (exit 1) at 1,000
    rng = np.random.default_rng(1)
    a = pd.DataFrame({"x": rng.normal(size=5), "y": rng.normal(size=5)})
    b = pd.DataFrame({"x": rng.normal(size=1200), "y": rng.normal(size=1200)})
    links = vflink.link(a, b, on="x,y", metric="euclidean", top_k=1100, seed=0)
    assert links.frame.shape[0] == 5 * 1100
    with pytest.raises(LinkageError, match=r"top-k = 1300 is larger than the secondary table "
                                           r"secondary \(1,200 rows\)"):
        vflink.link(a, b, on="x,y", metric="euclidean", top_k=1300, seed=0)


def test_the_api_reports_every_problem_at_once() -> None:
    with pytest.raises(ConfigError) as info:
        vflink.link(pd.DataFrame({"x": [1.0]}), pd.DataFrame({"x": [1.0]}), on="x",
                    metric="euclidean", top_k=0, tau=2)
    problems = info.value.problems
    assert any("top_k" in p for p in problems) and any("tau" in p for p in problems), problems


def test_the_api_lists_every_argument_problem_with_the_bad_names() -> None:
    with pytest.raises(ConfigError) as info:
        vflink.link(pd.DataFrame({"x": [1.0]}), pd.DataFrame({"x": [1.0]}), on="",
                    metric="cosine", top_k=0, tau=2, sigma=-1)
    text = " ".join(info.value.problems)
    for name in ("`on`", "`metric`", "`top_k`", "`tau`", "`sigma`"):
        assert name in text, (name, text)


@pytest.mark.parametrize(("table", "typo", "fix"), [
    ("[[link.fields]]\non = \"name\"\nmetrc = \"levenshtein\"\n", "metrc", "'metric'"),
    ("[[link.fields]]\non = \"name\"\nmetric = \"levenshtein\"\nwieght = 2\n", "wieght",
     "'weight'"),
    ("[link.geo]\nresolution = 1\n", "resolution", "'resolution_km'"),
    ("[link.bloom_filters]\nqgrams = 3\n", "qgrams", "'qgram'"),
    ("tpo_k = 3\n", "tpo_k", "'top_k'"),
])
def test_a_typo_in_a_link_table_names_the_known_keys(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], table: str, typo: str,
        fix: str) -> None:
    pd.DataFrame({"name": ["anna", "bob"], "lat": [1.0, 2.0], "lon": [1.0, 2.0]}).to_csv(
        tmp_path / "a.csv", index=False)
    head = ('[link]\nprimary = "a.csv"\nsecondary = "a.csv"\ntop_k = 1\nout = "l.csv"\n' +
            ("" if "fields" in table else 'on = "lat,lon"\nmetric = "haversine"\n'))
    (tmp_path / "link.toml").write_text(head + table)
    code, err = run_cli(["link", "--config", str(tmp_path / "link.toml")], capsys)
    assert code == EXIT_USAGE, err
    assert f"unknown key(s) ['{typo}']" in err and f"did you mean {fix}" in err, err
    assert "known" in err and "__init__" not in err
    with pytest.raises(ConfigError, match="known keys"):
        vflink.link(tmp_path / "a.csv", tmp_path / "a.csv", top_k=1,
                    fields=[{"on": "name", "metric": "levenshtein", typo: 1}])


def test_a_decimal_comma_in_link_identifiers_gets_the_hint(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "a.csv").write_text("lat;lon\n50,1;4,2\n51,3;5,5\n", encoding="utf-8")
    out = str(tmp_path / "l.csv")
    args = ["link", "--primary", str(tmp_path / "a.csv"), "--secondary",
            str(tmp_path / "a.csv"), "--on", "lat,lon", "--metric", "haversine", "--top-k",
            "1", "--seed", "0", "--sigma", "0.5", "--out", out]
    code, err = run_cli(args, capsys)
    assert code == EXIT_USAGE
    assert "identifier column 'lat' must be numeric" in err
    assert 'decimal comma: set decimal = ","' in err and "--decimal ," in err, err
    code, err = run_cli([*args, "--decimal", ","], capsys)  # and the hint works as given
    assert code == 0, err


def test_missing_inputs_are_exit_2_and_named_at_once(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run_cli(["align", "--primary", str(tmp_path / "a.csv"), "--secondary",
                         str(tmp_path / "b.csv"), "--on", "id", "--out", str(tmp_path / "o")],
                        capsys)
    assert code == EXIT_USAGE
    assert f"{tmp_path / 'a.csv'}: file not found" in err
    assert f"{tmp_path / 'b.csv'}: file not found" in err
    assert not (tmp_path / "o").exists()


def test_a_missing_run_folder_is_said_with_what_is_there(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "splitnn").mkdir(parents=True)
    (tmp_path / "x.csv").write_text("a\n1\n", encoding="utf-8")
    for args in (["report", "runs/nope"], ["attack", "--run", "runs/nope", "--attack",
                                            "label-norm"],
                 ["predict", "--run", "runs/nope", "--input", "x.csv", "--out", "p.csv"]):
        code, err = run_cli(args, capsys)
        assert code == EXIT_USAGE, (args, err)
        assert "runs/nope: no such folder" in err and "runs holds: splitnn" in err, err
    code, err = run_cli(["report", "runs/splitn"], capsys)
    assert "did you mean runs/splitnn?" in err, err


def test_an_unknown_attack_parameter_lists_the_known_ones(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from vflink.attacks import get_attack

    with pytest.raises(ConfigError, match=r"did you mean 'enumerate_limit'.*known keys"):
        get_attack("greedy-similarity", enumerate_limt=3)
    with pytest.raises(ConfigError, match=r"`taus` must be numbers in \(0, 1\], got 'x'"):
        get_attack("greedy-similarity", taus="x")
    assert get_attack("greedy-similarity", taus=0.5).taus == (0.5,)  # type: ignore[attr-defined]


def test_the_greedy_attack_names_the_condition_a_fields_run_misses(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A multi-field run meets every condition the refusal used to list (soft, Bloom filters,
    recorded, in this process) but one: the refusal names that one."""
    import dataclasses

    from tests.integration.test_field_alignment import SECRET, config, write_tables
    from vflink.runfiles.config import EvaluationConfig
    from vflink.runner.attack import run_attack
    from vflink.runner.evaluation import missing_bloom_truth
    from vflink.runner.train import run_training

    monkeypatch.setenv("VFLINK_SECRET", SECRET)
    write_tables(tmp_path)
    cfg = config(tmp_path, blocking=False)
    cfg = cfg.replace(evaluation=EvaluationConfig(record=True),
                      training=dataclasses.replace(cfg.training, epochs=1))
    run_training(cfg, tmp_path / "run")
    with pytest.raises(ConfigError) as info:
        run_attack(tmp_path / "run", "greedy-similarity")
    text = str(info.value)
    assert "several fields ([[alignment.fields]])" in text, text
    assert "record = true" not in text  # met already: not listed as if missing
    assert "method = \"psu\"" in missing_bloom_truth("psu", "bloom", False, True, True)
    assert "privacy = \"off\"" in missing_bloom_truth("soft", "off", False, True, True)
    assert missing_bloom_truth("soft", "bloom", False, True, True) is None


def test_align_reports_every_argument_problem_at_once() -> None:
    table = pd.DataFrame({"id": ["a"]})
    with pytest.raises(ConfigError) as info:
        vflink.align(table, table, on="", method="pss", reveal="nobody")
    text = " ".join(info.value.problems)
    for name in ("`method`", "`reveal`", "`on`"):
        assert name in text, (name, text)
