"""The ``vflink`` command line: a real run from files, and every bad input failing cleanly."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.helpers.tables import two_party_tables
from vflink.cli.main import main

RUN = """version = 1
seed = 0
algorithm = "splitnn"
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
path = "bank.parquet"
key = ["id"]
numeric = ["s0", "s1", "s2", "s3", "s4", "s5", "s6", "s7"]
{bank_extra}
[training]
epochs = 3
"""


def write_inputs(tmp_path: Path, *, bank_extra: str = "",
                 edit_primary: Callable[[pd.DataFrame], pd.DataFrame] | None = None,
                 edit_bank: Callable[[pd.DataFrame], pd.DataFrame] | None = None) -> Path:
    primary, bank = two_party_tables(600, seed=3)
    p, b = primary.frame.copy(), bank.frame.copy()
    if edit_primary:
        p = edit_primary(p)
    if edit_bank:
        b = edit_bank(b)
    p.to_csv(tmp_path / "primary.csv", index=False)
    b.to_parquet(tmp_path / "bank.parquet")
    config = tmp_path / "run.toml"
    config.write_text(RUN.format(bank_extra=bank_extra))
    return config


def test_train_writes_a_complete_run_directory(tmp_path: Path) -> None:
    config = write_inputs(tmp_path)
    out = tmp_path / "runs" / "r1"
    assert main(["train", "--config", str(config), "--out", str(out)]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert set(metrics["metrics"]) == {"train", "validation", "test"}
    assert set(metrics["metrics"]["test"]) == {"accuracy", "auc"}
    assert len(metrics["epochs"]) == 3
    assert metrics["epochs"][0]["communication"]["bank->primary"]["bytes"] > 0
    assert json.loads((out / "config.json").read_text())["algorithm"] == "splitnn"
    assert (out / "learning_curve.png").stat().st_size > 1000
    assert (out / "models" / "primary" / "model.json").exists()
    assert (out / "models" / "bank" / "model.json").exists()
    # an existing run directory is not silently replaced
    assert main(["train", "--config", str(config), "--out", str(out)]) == 2  # a usage error


def _nan_label(f: pd.DataFrame) -> pd.DataFrame:
    f = f.astype({"y": float})
    f.loc[5, "y"] = np.nan
    return f


def _text_in_numeric(f: pd.DataFrame) -> pd.DataFrame:
    f = f.astype({"s3": str})  # numbers as text still parse; the one bad value must be found
    f.loc[7, "s3"] = "n/a?"
    return f


def _duplicate_key(f: pd.DataFrame) -> pd.DataFrame:
    f.loc[9, "id"] = f.loc[2, "id"]
    return f


BAD_INPUTS = {
    "missing file": ({"edit_primary": None}, "primary.csv: file not found"),
    "unknown column": ({"edit_bank": lambda f: f.drop(columns=["s5"])},
                       "['s5'] expected but missing from the table"),
    "non-numeric": ({"edit_bank": _text_in_numeric}, "column 's3' is numeric but holds"),
    "nan label": ({"edit_primary": _nan_label}, "label column 'y' has missing (NaN) values"),
    "duplicate keys": ({"edit_primary": _duplicate_key}, "duplicate key"),
    "empty table": ({"edit_bank": lambda f: f.iloc[:0]}, "empty"),
    "label on secondary": ({"bank_extra": 'label = "risk"',
                            "edit_bank": lambda f: f.assign(risk=1)},
                           "only the primary party may hold"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_fails_cleanly(tmp_path: Path, case: str,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    kwargs, needle = BAD_INPUTS[case]
    config = write_inputs(tmp_path, **kwargs)  # type: ignore[arg-type]
    if case == "missing file":
        (tmp_path / "primary.csv").unlink()
    out = tmp_path / "runs" / "bad"
    code = main(["train", "--config", str(config), "--out", str(out)])
    err = capsys.readouterr().err
    assert code != 0
    assert needle in " ".join(err.split()), err
    assert not out.exists()
    assert not any((tmp_path / "runs").glob(".*partial*"))


def test_bad_config_lists_all_problems(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "run.toml"
    config.write_text('version = 1\nalgorithm = "nope"\n[data]\ndataset = "sklearn-small"\n'
                      "[training]\nepochs = 0\nbatch_size = -3\n")
    assert main(["train", "--config", str(config)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    for needle in ("algorithm", "training.epochs", "training.batch_size"):
        assert needle in err


def test_help_explains_commands(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    text = capsys.readouterr().out
    assert "train" in text and "demo" in text
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    assert "metrics.json" in capsys.readouterr().out
