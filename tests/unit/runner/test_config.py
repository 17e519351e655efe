from __future__ import annotations

from pathlib import Path

import pytest

from vflink.errors import ConfigError, UnknownNameError
from vflink.registry import Registry
from vflink.runfiles.config import TrainingConfig, load_config, parse_config


def test_minimal_file(tmp_path: Path) -> None:
    path = tmp_path / "run.toml"
    path.write_text('version = 1\n[data]\ndataset = "sklearn-small"\n')
    config = load_config(path)
    assert config.algorithm == "splitnn" and config.training.split == (0.7, 0.1, 0.2)


def test_every_problem_is_reported_at_once() -> None:
    raw = {
        "version": 1,
        "algorithm": "magic",
        "data": {"dataset": "sklearn-small"},
        "training": {"epochs": 0, "lr": -1.0, "split": [0.5, 0.5, 0.5], "colour": "red"},
        "model": {"cut_dim": 0},
    }
    with pytest.raises(ConfigError) as info:
        parse_config(raw)
    text = "\n".join(info.value.problems)
    for needle in ("training.epochs", "training.lr", "training.split", "colour",
                   "model.cut_dim", "algorithm"):
        assert needle in text, needle
    assert "`training.epochs` must be an int ≥ 1, got 0" in text


def test_version_is_required(tmp_path: Path) -> None:
    path = tmp_path / "run.toml"
    path.write_text('[data]\ndataset = "x"\n')
    with pytest.raises(ConfigError, match=r"run\.toml.*version"):
        load_config(path)


def test_relative_paths_resolve_against_the_file(tmp_path: Path) -> None:
    (tmp_path / "conf").mkdir()
    path = tmp_path / "conf" / "run.toml"
    path.write_text(
        'version = 1\n[[data.parties]]\nname = "p"\nrole = "primary"\npath = "p.csv"\n'
        'numeric = ["a"]\nlabel = "y"\ntask = "binary"\n')
    config = load_config(path)
    assert config.data.parties[0].path == tmp_path / "conf" / "p.csv"


def test_invalid_toml_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("version = = 1")
    with pytest.raises(ConfigError, match=r"bad\.toml: not valid TOML"):
        load_config(path)


def test_training_config_message_style() -> None:
    with pytest.raises(ConfigError, match=r"`training.batch_size` must be an int ≥ 1, got 0"):
        TrainingConfig(batch_size=0)


def test_registry_unknown_name_lists_valid_names() -> None:
    reg: Registry[int] = Registry("metric")
    reg.add("euclidean", 1)
    reg.add("hamming", 2)
    with pytest.raises(UnknownNameError, match="unknown metric 'cosine'; valid names are: "
                                               "euclidean, hamming"):
        reg.get("cosine")
