"""Per-algorithm overrides and grid sweeps in experiment files."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from vflink.errors import ConfigError
from vflink.runfiles.experiment import load_experiment, parse_experiment

BASE = """version = 1
[experiment]
algorithms = ["solo", "top1sim", "fedsim"]
seeds = [0]
{extra}
[data]
dataset = "sklearn-small"
[alignment]
method = "soft"
privacy = "off"
[training]
batch_size = 128
lr = 0.001
epochs = 5
"""


def _parse(extra: str):  # type: ignore[no-untyped-def]
    return parse_experiment(tomllib.loads(BASE.format(extra=extra)))


def test_overrides_apply_to_their_algorithm_only() -> None:
    exp = _parse("""[experiment.overrides.top1sim]
batch_size = 4096
lr = 0.003
[experiment.overrides.top1sim.model]
hidden = [200]
""")
    base = exp.configs[0]
    top1 = exp.config_for(base, "top1sim")
    fedsim = exp.config_for(base, "fedsim")
    assert top1.algorithm == "top1sim" and fedsim.algorithm == "fedsim"
    assert (top1.training.batch_size, top1.training.lr, top1.training.epochs) == (4096, 0.003, 5)
    assert top1.model.hidden == (200,) and top1.model.cut_dim == base.model.cut_dim
    assert (fedsim.training.batch_size, fedsim.training.lr) == (128, 0.001)
    assert fedsim.model == base.model


def test_every_override_problem_is_reported_at_once() -> None:
    with pytest.raises(ConfigError) as err:
        _parse("""[experiment.overrides.top1sim]
batch_sise = 4096
[experiment.overrides.top1sim.model]
widths = [3]
[experiment.overrides.nosuch]
lr = 1.0
""")
    text = " ".join(err.value.problems)
    assert "batch_sise" in text and "widths" in text and "nosuch" in text
    assert len(err.value.problems) == 3


def test_override_values_are_validated() -> None:
    with pytest.raises(ConfigError) as err:
        _parse("""[experiment.overrides.solo]
lr = -1.0
""")
    assert any("training.lr" in p for p in err.value.problems)


def test_several_sweep_keys_run_their_grid() -> None:
    exp = _parse('sweep = { "alignment.top_k" = [3, 5], "data.options.sigma_cf" = [0.0, 0.1] }')
    assert len(exp.configs) == 4
    assert exp.sweep_values[0] == "top_k=3, sigma_cf=0.0"
    assert [(c.alignment.top_k, c.data.options["sigma_cf"]) for c in exp.configs] == [
        (3, 0.0), (3, 0.1), (5, 0.0), (5, 0.1)]


def test_single_sweep_key_keeps_plain_values() -> None:
    exp = _parse('sweep = { "data.options.sigma_cf" = [0.0, 0.1] }')
    assert exp.sweep_key == "data.options.sigma_cf" and exp.sweep_values == (0.0, 0.1)


def test_shipped_reference_experiment_parses() -> None:
    path = Path(__file__).resolve().parents[3] / "examples/experiments/fedsim-reference.toml"
    exp = load_experiment(path)
    assert len(exp.configs) == 2 * 2 * 3 and exp.seeds == (0, 1, 2)
    pools = {c.alignment.pool for c in exp.configs}
    assert pools == {"split", "all"}
    top1 = exp.config_for(exp.configs[0], "top1sim").training
    assert (top1.batch_size, top1.lr, top1.weight_decay, top1.epochs) == (4096, 3e-3, 1e-4, 100)
    fedsim = exp.config_for(exp.configs[0], "fedsim")
    assert (fedsim.training.knn_batch_size, fedsim.training.lr, fedsim.training.epochs) == (
        32, 1e-3, 50)
    assert fedsim.model.aggregator.merge == "average" and fedsim.training.optimizer == "lamb"
    combine = exp.config_for(exp.configs[0], "combine").model
    # the authors' Combine MLP, 200 -> 100 -> 1 (a 1-wide cut and a linear head compose to it)
    assert (combine.hidden, combine.cut_dim, combine.top_hidden) == ((200, 100), 1, ())
