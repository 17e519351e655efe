"""[compute] in run files and party files, and --engine/--address on the commands."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from vflink.cli.main import main
from vflink.engine import ComputeConfig
from vflink.errors import ConfigError
from vflink.runfiles.config import config_to_dict, parse_config
from vflink.runfiles.party import load_party_config
from vflink.runner.compute import current_compute, open_compute, run_compute


def _run(**extra: Any) -> dict[str, Any]:
    return {"version": 1, "data": {"dataset": "sklearn-small"}, **extra}


def test_run_file_compute_section() -> None:
    assert parse_config(_run()).compute == ComputeConfig()
    config = parse_config(_run(compute={"engine": "ray", "address": "local", "num_cpus": 2,
                                        "chunk_rows": 5000}))
    assert config.compute == ComputeConfig(engine="ray", address="local", num_cpus=2,
                                           chunk_rows=5000)
    assert config_to_dict(config)["compute"]["chunk_rows"] == 5000
    assert parse_config(config_to_dict(config)).compute == config.compute  # round trip


def test_run_file_compute_errors_come_with_the_others() -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(_run(seed=-1, compute={"engine": "spark", "chunk_rows": 0, "nodes": 3}))
    problems = "\n".join(err.value.problems)
    for needle in ("seed", "compute.engine", "compute.chunk_rows", "['nodes']"):
        assert needle in problems


def _party_file(tmp: Path, compute: str) -> Path:
    path = tmp / "bank.toml"
    path.write_text('version = 1\n[party]\nname = "bank"\nrole = "secondary"\n'
                    'listen = "127.0.0.1:1"\ndataset = "sklearn-small"\n'
                    '[peers.coordinator]\naddress = "127.0.0.1:2"\nrole = "coordinator"\n'
                    '[security]\ninsecure = true\nallowed = ["primary"]\n' + compute)
    return path


def test_party_file_compute_section(tmp_path: Path) -> None:
    assert load_party_config(_party_file(tmp_path, "")).compute == ComputeConfig()
    config = load_party_config(_party_file(
        tmp_path, '[compute]\nengine = "ray"\naddress = "10.1.2.3:6379"\n'))
    assert config.compute.engine == "ray" and config.compute.address == "10.1.2.3:6379"
    with pytest.raises(ConfigError) as err:
        load_party_config(_party_file(tmp_path, '[compute]\nengine = "ray"\nnum_cpus = 0\n'
                                                'speed = 1\n'))
    assert str(tmp_path / "bank.toml") in str(err.value)
    assert len(err.value.problems) == 2


def test_local_engine_is_no_engine_for_the_stages() -> None:
    with open_compute(ComputeConfig()) as compute:
        assert compute is None  # today's in-process paths, unchanged
    with open_compute(ComputeConfig(num_cpus=2)) as compute:
        assert compute is not None and compute.workers == 2
    with run_compute(ComputeConfig(num_cpus=2)) as outer:
        with run_compute(ComputeConfig()) as inner:  # a run inside a run shares its engine
            assert inner is outer is current_compute()
    assert current_compute() is None


def test_engine_ray_without_the_extra_exits_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # as if the extra were not installed
    pd.DataFrame({"id": ["a", "b"]}).to_csv(tmp_path / "k.csv", index=False)
    code = main(["align", "--primary", str(tmp_path / "k.csv"), "--secondary",
                 str(tmp_path / "k.csv"), "--on", "id", "--out", str(tmp_path / "o"),
                 "--engine", "ray"])
    assert code == 2
    assert "pip install 'vflink[ray]'" in capsys.readouterr().err


def test_engine_flags_in_help(capsys: pytest.CaptureFixture[str]) -> None:
    for command in ("link", "align", "train", "serve"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        out = capsys.readouterr().out
        assert "--engine" in out and "--address" in out, command


def test_parquet_keys_are_scanned_in_batches(tmp_path: Path) -> None:
    from vflink.data.table import iter_parquet_columns
    from vflink.errors import DataError
    from vflink.runner.align import key_table

    frame = pd.DataFrame({"id": [f"{i:03d}" for i in range(25)], "n": range(25),
                          "wide": ["x" * 50] * 25})
    frame.to_parquet(tmp_path / "t.parquet", index=False)
    batches = list(iter_parquet_columns(tmp_path / "t.parquet", ["id", "n"], batch_rows=10))
    assert [len(b) for b in batches] == [10, 10, 5]
    assert list(batches[0].columns) == ["id", "n"]  # the other columns are never read
    table = key_table(tmp_path / "t.parquet", ("id", "n"), name="p")
    assert table.frame["id"].tolist()[:2] == ["000", "001"] and table.frame["n"].iloc[3] == "3"
    frame.to_csv(tmp_path / "t.csv", index=False)
    from_csv = key_table(tmp_path / "t.csv", ("id", "n"), name="p")
    assert from_csv.frame.equals(table.frame)  # the same keys as from CSV
    with pytest.raises(DataError, match=r"t.parquet: column\(s\) \['nope'\] not found"):
        key_table(tmp_path / "t.parquet", ("nope",), name="p")


def test_a_run_may_resume_on_another_engine() -> None:
    from vflink.data.schema import PartySchema
    from vflink.data.table import PartyTable
    from vflink.runner.resume import run_fingerprint

    table = PartyTable(PartySchema(name="p", role="secondary", key=("id",)),
                       pd.DataFrame({"id": ["a"]}), "p")
    local = parse_config(_run())
    ray = parse_config(_run(compute={"engine": "ray", "address": "local"}))
    assert run_fingerprint(local, table) == run_fingerprint(ray, table)
    assert run_fingerprint(local, table) != run_fingerprint(local.replace(seed=3), table)
