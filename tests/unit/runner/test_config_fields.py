"""[[alignment.fields]] and [[alignment.blocking]] in run files: parsed into specs, every
problem reported at once, conflicts with the single-field settings said plainly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vflink.errors import ConfigError
from vflink.linkage.fields import Blocking, FieldSpec
from vflink.runfiles.config import (
    AlignmentConfig,
    DataConfig,
    RunConfig,
    config_to_dict,
    load_config,
    parse_config,
)

RUN = """version = 1
algorithm = "fedsim"
[data]
dataset = "sklearn-small"
[alignment]
method = "soft"
top_k = 5
tau = 0.999
{extra}
[[alignment.fields]]
on = ["lat", "lon"]
metric = "haversine"
weight = 1.0
scale = 2.5
[[alignment.fields]]
on = ["name"]
secondary_on = ["title"]
metric = "token-set"
weight = 0.5
[[alignment.blocking]]
on = "postcode"
[[alignment.blocking]]
on = "surname"
secondary_on = "last_name"
prefix = 2
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "run.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_a_run_file_with_fields_and_blocking(tmp_path: Path) -> None:
    a = load_config(write(tmp_path, RUN.format(extra=""))).alignment
    assert a.fields == (
        FieldSpec(on=("lat", "lon"), metric="haversine", weight=1.0, scale=2.5),
        FieldSpec(on=("name",), secondary_on=("title",), metric="token-set", weight=0.5))
    assert a.blocking == (Blocking(on="postcode"),
                          Blocking(on="surname", secondary_on="last_name", prefix=2))


def test_the_resolved_config_round_trips(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, RUN.format(extra="")))
    raw = json.loads(json.dumps(config_to_dict(config)))  # as config.json stores it
    assert "metric" not in raw["alignment"]  # each field has its own
    assert parse_config(raw) == config
    plain = config_to_dict(RunConfig(data=DataConfig(dataset="sklearn-small")))
    assert "fields" not in plain["alignment"] and plain["alignment"]["metric"] == "euclidean"


def test_every_problem_of_every_field_is_reported_at_once(tmp_path: Path) -> None:
    text = RUN.format(extra="").replace('method = "soft"', 'method = "exact"').replace(
        "weight = 0.5", "weight = -1\ncolour = 'red'").replace('metric = "haversine"',
                                                               'metric = "cosine"').replace(
        "prefix = 2", "prefix = 0")
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text))
    problems = info.value.problems
    assert any("alignment.fields #1" in p and "metric" in p for p in problems)
    assert any("alignment.fields #2" in p and "colour" in p for p in problems)
    assert any("alignment.fields #2" in p and "weight" in p for p in problems)
    assert any("alignment.blocking #2" in p and "prefix" in p for p in problems)
    assert any('method = \\"soft\\"' in p or 'method = "soft"' in p for p in problems)
    assert len(problems) == 5, problems


@pytest.mark.parametrize("extra", ['metric = "haversine"', 'metric = "euclidean"'])
def test_a_metric_beside_fields_is_a_clear_error(tmp_path: Path, extra: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, RUN.format(extra=extra)))
    assert list(info.value.problems) == [
        "give either `alignment.metric` (one field: every party's `identifiers` columns) or "
        "[[alignment.fields]] (each field with its own `metric`), not both"]


def test_alignment_on_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, RUN.format(extra='on = ["lat", "lon"]')))
    (problem,) = info.value.problems  # not also "unknown key"
    assert "`alignment.on` is not a setting" in problem and "[[alignment.fields]]" in problem


def test_blocking_needs_fields_and_fields_need_soft_linkage() -> None:
    with pytest.raises(ConfigError, match="needs \\[\\[alignment.fields\\]\\]"):
        AlignmentConfig(method="soft", blocking=["postcode"])
    with pytest.raises(ConfigError, match="soft linkage"):
        AlignmentConfig(method="psi", fields=[{"on": "name", "metric": "exact"}])
    with pytest.raises(ConfigError, match="not both"):
        AlignmentConfig(method="soft", metric="haversine",
                        fields=[{"on": "name", "metric": "exact"}])
    built = AlignmentConfig(method="soft", fields=[FieldSpec(on=("x",), metric="euclidean")],
                            blocking=["k"])
    assert built.blocking == (Blocking(on="k"),)
