"""The Python API (docs/python-api.md): every call gives what the matching command gives, takes
DataFrames as well as paths, and fails with a ConfigError/DataError naming the argument."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import vflink
from tests.helpers.tables import two_party_tables
from vflink.cli.main import main

ROOT = Path(__file__).resolve().parents[2]

RUN = """version = 1
seed = 0
algorithm = "{algorithm}"
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
numeric = ["s0", "s1", "s2", "s3", "s4", "s5", "s6", "s7"]
[training]
epochs = 2
[evaluation]
record = true
[privacy]
reproducible_noise = true  # the API and the CLI must give the same figures
"""

#: The same run as RUN, as a mapping with the tables handed over in memory (no paths).
RUN_DICT = {
    "seed": 0, "algorithm": "splitnn",
    "data": {"parties": [
        {"name": "primary", "role": "primary", "key": ["id"], "numeric": ["p0", "p1"],
         "label": "y", "task": "binary"},
        {"name": "bank", "role": "secondary", "key": ["id"],
         "numeric": [f"s{i}" for i in range(8)]}]},
    "training": {"epochs": 2}, "evaluation": {"record": True},
    "privacy": {"reproducible_noise": True},
}


@pytest.fixture(autouse=True)
def no_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VFLINK_SECRET", raising=False)  # derived from the seed: reproducible


def places(tmp_path: Path) -> tuple[Path, Path]:
    rng = np.random.default_rng(0)
    n = 60
    lat, lon = rng.uniform(50, 52, n), rng.uniform(-1, 1, n)
    p = pd.DataFrame({"pid": [f"p{i:03d}" for i in range(n)], "lat": lat, "lon": lon,
                      "x": rng.normal(size=n)})
    order = rng.permutation(n)
    s = pd.DataFrame({"sid": [f"0{i:03d}" for i in range(n)],  # leading zeros: text
                      "lat": lat[order] + rng.normal(0, 1e-3, n),
                      "lon": lon[order] + rng.normal(0, 1e-3, n), "z": rng.normal(size=n)})
    p.to_csv(tmp_path / "p.csv", index=False)
    s.to_csv(tmp_path / "s.csv", index=False)
    return tmp_path / "p.csv", tmp_path / "s.csv"


# ---------------------------------------------------------------------------------- link


@pytest.mark.parametrize("privacy", ["bloom", "off"])
def test_link_gives_the_cli_links_from_paths_and_from_dataframes(tmp_path: Path,
                                                                 privacy: str) -> None:
    p, s = places(tmp_path)
    cli_out = tmp_path / "cli.csv"
    assert main(["link", "--primary", str(p), "--secondary", str(s), "--on", "lat,lon",
                 "--metric", "haversine", "--top-k", "3", "--tau", "0.9", "--seed", "1",
                 "--privacy", privacy, "--id", "pid", "--secondary-id", "sid",
                 "--out", str(cli_out)]) == 0
    expected = pd.read_csv(cli_out, dtype={"primary_id": str, "secondary_id": str})
    cli_summary = json.loads(cli_out.with_name("cli.csv.summary.json").read_text())

    api_out = tmp_path / "api.csv"
    from_paths = vflink.link(p, s, on="lat,lon", metric="haversine", top_k=3, tau=0.9, seed=1,
                             privacy=privacy, id="pid", secondary_id="sid", out=api_out,
                             charts=True)
    assert api_out.read_bytes() == cli_out.read_bytes()  # the same file, byte for byte
    assert api_out.with_name("api.csv.similarity.png").exists()  # drawn: charts=True
    assert not cli_out.with_name("cli.csv.similarity.png").exists()  # not asked for

    frames = vflink.link(pd.read_csv(p), pd.read_csv(s, dtype={"sid": str}),
                         on=["lat", "lon"], metric="haversine", top_k=3, tau=0.9, seed=1,
                         privacy=privacy, id="pid", secondary_id="sid")
    for links in (from_paths, frames):
        assert isinstance(links, vflink.Links) and len(links) == 180
        pd.testing.assert_frame_equal(links.frame[expected.columns.tolist()], expected,
                                      check_exact=False, rtol=1e-5, check_dtype=False)
        for key in ("sizes", "metric", "privacy", "top_k", "sigma", "tau", "epsilon",
                    "encoding", "improvement_delta", "skipped_rows"):
            assert links.summary[key] == cli_summary[key], key
    assert frames.frame["secondary_id"].iloc[0].startswith("0")  # ids stay text
    assert frames.path is None and frames.alignment.secondary_index.shape == (60, 3)


def test_link_refuses_bad_arguments_naming_each_of_them(tmp_path: Path) -> None:
    p, s = places(tmp_path)
    with pytest.raises(vflink.ConfigError) as info:
        vflink.link(p, s, on="lat,lon", metric="cosine", top_k=0, mode="fuzzy")
    text = str(info.value)
    assert "`metric` must be one of" in text and "'cosine'" in text
    assert "`top_k` must be an int ≥ 1, got 0" in text
    assert "`mode` must be one of" in text
    with pytest.raises(vflink.ConfigError, match="`on` is required"):
        vflink.link(p, s, metric="euclidean")
    with pytest.raises(vflink.ConfigError, match="at most one of `tau` and `sigma`"):
        vflink.link(p, s, on="lat,lon", metric="euclidean", tau=0.9, sigma=1.0)
    with pytest.raises(vflink.ConfigError, match="`primary` must be a pandas DataFrame"):
        vflink.link([1, 2], s, on="lat", metric="euclidean")  # type: ignore[arg-type]
    with pytest.raises(vflink.ConfigError, match=r"`out` must end in \.csv or \.parquet"):
        vflink.link(p, s, on="lat,lon", metric="euclidean", out=tmp_path / "links.txt")
    with pytest.raises(vflink.DataError, match="no record-id column 'nope'"):
        vflink.link(p, s, on="lat,lon", metric="euclidean", id="nope")
    out = tmp_path / "links.csv"
    out.write_text("keep me")
    with pytest.raises(vflink.ConfigError, match="overwrite=True"):
        vflink.link(p, s, on="lat,lon", metric="euclidean", out=out)
    assert out.read_text() == "keep me"


def test_link_with_fields_and_blocking_from_mappings(tmp_path: Path) -> None:
    p, s = places(tmp_path)
    links = vflink.link(p, s, fields=[{"on": ["lat", "lon"], "metric": "haversine"}],
                        top_k=2, seed=0, privacy="off")
    assert links.summary["sizes"]["links"] == 120
    assert "haversine(lat,lon)" in links.outcome.search_metric


def test_link_imports_no_training_library(tmp_path: Path) -> None:
    p, s = places(tmp_path)
    code = ("import sys, vflink\n"
            f"vflink.link({str(p)!r}, {str(s)!r}, on='lat,lon', metric='euclidean', top_k=2,"
            " seed=0)\n"
            "print([m for m in ('torch', 'sklearn', 'grpc') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"},
                         timeout=120, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"


# --------------------------------------------------------------------------------- align


def key_tables(tmp_path: Path) -> tuple[Path, Path, set[str]]:
    p = pd.DataFrame({"cid": ["007", "010", "3", "4", "5", "6"], "a": range(6)})
    s = pd.DataFrame({"cid": ["6", "007", "99", "4", "7"], "b": range(5)})
    p.to_csv(tmp_path / "p.csv", index=False)
    s.to_csv(tmp_path / "s.csv", index=False)
    return tmp_path / "p.csv", tmp_path / "s.csv", {"007", "4", "6"}


def oracle_pairs(p: Path, s: Path) -> list[tuple[int, int]]:
    """The plaintext join of the two key columns (read as text)."""
    a = pd.read_csv(p, dtype=str)["cid"].tolist()
    b = pd.read_csv(s, dtype=str)["cid"].tolist()
    return sorted((i, b.index(k)) for i, k in enumerate(a) if k in b)


def pairs_of(matches: vflink.Matches) -> list[tuple[int, int]]:
    return sorted(map(tuple, matches.pairs[["primary_row", "secondary_row"]]
                      .astype(int).to_numpy().tolist()))


@pytest.mark.parametrize("method", ["psu", "psi"])
def test_align_gives_the_cli_sizes_and_the_plaintext_pairs(tmp_path: Path, method: str) -> None:
    p, s, common = key_tables(tmp_path)
    assert main(["align", "--method", method, "--primary", str(p), "--secondary", str(s),
                 "--on", "cid", "--out", str(tmp_path / "cli")]) == 0
    cli = json.loads((tmp_path / "cli" / "summary.json").read_text())
    matches = vflink.align(p, s, on="cid", method=method, out=tmp_path / "api")
    assert matches.summary["sizes"] == cli["sizes"]
    assert json.loads((tmp_path / "api" / "summary.json").read_text())["sizes"] == cli["sizes"]
    assert pairs_of(matches) == oracle_pairs(p, s)
    # the CLI's files hold the same pairs (UIDs differ per run: fresh DH secrets)
    cli_p = pd.read_parquet(tmp_path / "cli" / "primary.parquet")
    cli_s = pd.read_parquet(tmp_path / "cli" / "secondary.parquet")
    joined = cli_p.merge(cli_s, on="uid")
    assert sorted(zip(joined["row_x"], joined["row_y"], strict=True)) == oracle_pairs(p, s)
    frames = vflink.align(pd.read_csv(p, dtype=str), pd.read_csv(s, dtype=str), on=["cid"],
                          method=method)
    assert pairs_of(frames) == oracle_pairs(p, s)
    if method == "psu":
        assert len(matches.primary) == 6 and len(matches.secondary) == 5
        assert matches.summary["sizes"]["union"] == 6 + 5 - len(common)


def test_align_exact_matches_keyed_hashes_as_a_run_does(tmp_path: Path) -> None:
    p, s, _ = key_tables(tmp_path)
    matches = vflink.align(p, s, on="cid", method="exact", seed=0)
    assert pairs_of(matches) == oracle_pairs(p, s)
    assert matches.summary["sizes"] == {"primary": 6, "matched": 3}
    assert matches.summary["encoding"] == "hmac-sha256"
    with pytest.raises(vflink.ConfigError) as info:
        vflink.align(p, s, on="cid", method="fuzzy", reveal="all")
    assert "`method` must be one of exact, psi, psu, got 'fuzzy'" in str(info.value)
    assert "`reveal` must be one of" in str(info.value)
    with pytest.raises(vflink.DataError, match=r"key column\(s\) \['nope'\] not found"):
        vflink.align(p, s, on="nope", method="psi")


# --------------------------------------------------------------------------------- train


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("api-run")
    primary, bank = two_party_tables(500, seed=3)
    primary.frame.to_csv(root / "primary.csv", index=False)
    bank.frame.to_csv(root / "bank.csv", index=False)
    (root / "run.toml").write_text(RUN.format(algorithm="splitnn"))
    return root


@pytest.fixture(scope="module")
def cli_run(files: Path) -> Path:
    out = files / "runs" / "cli"
    assert main(["train", "--config", str(files / "run.toml"), "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def api_run(files: Path) -> vflink.Run:
    frames = {"primary": pd.read_csv(files / "primary.csv", dtype={"id": str}),
              "bank": pd.read_csv(files / "bank.csv", dtype={"id": str})}
    return vflink.train(RUN_DICT, tables=frames, out=files / "runs" / "api")


def test_train_from_dataframes_gives_the_cli_metrics(cli_run: Path, api_run: vflink.Run
                                                     ) -> None:
    cli = json.loads((cli_run / "metrics.json").read_text())
    assert api_run.metrics == cli["metrics"]
    assert api_run.result is not None and api_run.result.metrics == cli["metrics"]
    assert [e["train_loss"] for e in cli["epochs"]] == api_run.history["train_loss"].tolist()
    assert set(api_run.history.columns) >= {"epoch", "train_loss", "validation_accuracy",
                                            "seconds", "bytes"}
    for name in ("config.json", "metrics.json", "privacy.json", "learning_curve.png"):
        assert (api_run.path / name).exists(), name


def test_train_from_a_path_and_from_a_run_config_agree(files: Path, cli_run: Path) -> None:
    from_path = vflink.train(files / "run.toml", out=files / "runs" / "path")
    loaded = vflink.Run.load(cli_run)
    config = vflink.RunConfig(**{**loaded.config.__dict__})  # built with keyword arguments
    from_config = vflink.train(config, out=files / "runs" / "config")
    expected = json.loads((cli_run / "metrics.json").read_text())["metrics"]
    assert from_path.metrics == from_config.metrics == expected
    assert from_path.algorithm == "splitnn"
    solo = vflink.train(files / "run.toml", out=files / "runs" / "solo", algorithm="solo")
    assert solo.config.algorithm == "solo" and solo.metrics != expected


def test_run_load_reads_what_the_cli_wrote(cli_run: Path) -> None:
    run = vflink.Run.load(cli_run)
    metrics = json.loads((cli_run / "metrics.json").read_text())
    privacy = json.loads((cli_run / "privacy.json").read_text())
    assert run.metrics == metrics["metrics"] and run.headline == "accuracy"
    assert len(run.history) == len(metrics["epochs"])
    assert run.privacy["messages"] == privacy["messages"]
    assert run.result is None


def test_predict_gives_the_cli_predictions(files: Path, cli_run: Path, api_run: vflink.Run
                                           ) -> None:
    new = pd.read_csv(files / "primary.csv", dtype={"id": str}).iloc[:30]
    new.to_csv(files / "new.csv", index=False)
    out = files / "pred.csv"
    assert main(["predict", "--run", str(cli_run), "--input", str(files / "new.csv"),
                 "--out", str(out), "--overwrite"]) == 0
    expected = pd.read_csv(out)
    got = vflink.Run.load(cli_run).predict(files / "new.csv")
    pd.testing.assert_frame_equal(got.astype(expected.dtypes.to_dict()), expected,
                                  check_exact=False, rtol=1e-5)
    assert set(got.attrs["metrics"]) >= {"accuracy"}
    # trained on DataFrames: the run keeps them; reopened, it asks for them by name
    in_memory = api_run.predict(new)
    pd.testing.assert_frame_equal(in_memory.astype(expected.dtypes.to_dict()), expected,
                                  check_exact=False, rtol=1e-5)
    reopened = vflink.Run.load(api_run.path)
    with pytest.raises(vflink.ConfigError, match=r"tables=\{'primary': \.\.\., 'bank'"):
        reopened.predict(new)
    with pytest.raises(vflink.ConfigError, match=r"`tables` lacks \['primary'\]"):
        reopened.predict(new, tables={"bank": files / "bank.csv"})
    again = reopened.predict(new, tables={"primary": files / "primary.csv",
                                          "bank": files / "bank.csv"})
    pd.testing.assert_frame_equal(again, in_memory)


def test_attack_appends_to_the_ledger_and_report_writes_a_page(files: Path,
                                                                api_run: vflink.Run) -> None:
    before = len(api_run.privacy["attacks"])
    result = api_run.attack("label-norm")
    assert 0.0 <= result.metrics["auc"] <= 1.0
    attacks = api_run.privacy["attacks"]
    assert len(attacks) == before + 1 and attacks[-1]["attack"] == "label-norm"
    page = api_run.report(files / "report.html")
    assert page.read_text(encoding="utf-8").lstrip().lower().startswith("<!doctype html")
    with pytest.raises(vflink.ConfigError, match="overwrite=True"):
        api_run.report(files / "report.html")


def test_train_refuses_bad_configs_and_tables(files: Path) -> None:
    with pytest.raises(vflink.ConfigError, match="`config` must be the path of a TOML run"):
        vflink.train(42)  # type: ignore[arg-type]
    with pytest.raises(vflink.ConfigError, match=r"party\(ies\) \['shop'\]"):
        vflink.train(RUN_DICT, tables={"shop": pd.DataFrame()}, out=files / "runs" / "x")
    with pytest.raises(vflink.ConfigError, match="`tables` needs"):
        vflink.train({"data": {"dataset": "sklearn-small"}}, tables={"primary": pd.DataFrame()},
                     out=files / "runs" / "y")
    with pytest.raises(vflink.ConfigError) as info:
        vflink.train({**RUN_DICT, "training": {"epochs": 0}}, tables={})
    assert "training.epochs" in str(info.value)
    bad = pd.read_csv(files / "primary.csv", dtype={"id": str}).drop(columns=["p1"])
    with pytest.raises(vflink.DataError, match="p1"):
        vflink.train(RUN_DICT, tables={"primary": bad, "bank": files / "bank.csv"},
                     out=files / "runs" / "z")
    with pytest.raises(vflink.RunError, match="already exists"):
        vflink.train(files / "run.toml", out=files / "runs" / "cli")
    with pytest.raises(vflink.RunError, match="nowhere: no such folder"):
        vflink.Run.load(files / "nowhere")
