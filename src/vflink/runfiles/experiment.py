"""Experiment files: their schema, loading and all-errors-at-once validation.

An experiment file is a run file (see :mod:`vflink.runfiles.config`) plus an ``[experiment]``
table::

    [experiment]
    name = "sklearn-noise"
    algorithms = ["solo", "top1sim", "fedsim", "combine"]
    seeds = [0, 1, 2, 3, 4]
    sweep = { "data.options.sigma_cf" = [0.0, 0.1, 0.2, 0.3] }   # optional

    [experiment.overrides.top1sim]     # optional: per-algorithm training settings
    batch_size = 4096
    lr = 0.003
    [experiment.overrides.combine.model]   # ... and model settings
    hidden = [200]

A sweep over several keys runs their grid (every combination). Overrides take the keys of
``[training]`` (and a ``model`` table with the keys of ``[model]``); they are validated with the
rest of the file and recorded with each run.

Running an experiment is :mod:`vflink.experiments.grid`.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vflink._checks import raise_if
from vflink.config import read_toml
from vflink.errors import ConfigError
from vflink.runfiles.algorithms import algorithm_names
from vflink.runfiles.config import (
    ModelConfig,
    RunConfig,
    TrainingConfig,
    parse_config,
)

__all__ = ["Experiment", "apply_overrides", "load_experiment", "parse_experiment"]

log = logging.getLogger(__name__)

#: ``progress(done, total, label)``
ExperimentProgress = Callable[[int, int, str], None]


@dataclass(frozen=True)
class Experiment:
    name: str
    algorithms: tuple[str, ...]
    seeds: tuple[int, ...]
    sweep_key: str | None
    sweep_values: tuple[Any, ...]
    configs: tuple[RunConfig, ...]  # one per sweep value (or one without a sweep)
    raw: dict[str, Any]
    #: per-algorithm changes: {"training": {...}, "model": {...}}
    overrides: dict[str, dict[str, dict[str, Any]]] = dataclasses.field(default_factory=dict)

    def config_for(self, config: RunConfig, algorithm: str) -> RunConfig:
        """``config`` with ``algorithm`` and that algorithm's overrides applied."""
        return apply_overrides(config, algorithm, self.overrides.get(algorithm, {}))


def apply_overrides(config: RunConfig, algorithm: str,
                    changes: dict[str, dict[str, Any]]) -> RunConfig:
    training, model = config.training, config.model
    if changes.get("training"):
        training = TrainingConfig(**{**_fields(training), **changes["training"]})
    if changes.get("model"):
        model = ModelConfig(**{**_fields(model), **changes["model"]})
    return config.replace(algorithm=algorithm, training=training, model=model)


def _fields(obj: Any) -> dict[str, Any]:
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}


def _parse_overrides(raw: Any, valid: set[str], problems: list[str]
                     ) -> dict[str, dict[str, dict[str, Any]]]:
    """``[experiment.overrides.<algorithm>]``: training keys, and a ``model`` table."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        problems.append("`experiment.overrides` must be a table of algorithm tables")
        return {}
    training_keys = {f.name for f in dataclasses.fields(TrainingConfig)}
    model_keys = {f.name for f in dataclasses.fields(ModelConfig)}
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for alg, table in raw.items():
        where = f"[experiment.overrides.{alg}]"
        if alg not in valid:
            problems.append(f"{where}: unknown algorithm {alg!r}; valid names are: "
                            f"{', '.join(sorted(valid))}")
            continue
        if not isinstance(table, dict):
            problems.append(f"{where} must be a table")
            continue
        table = dict(table)
        model = table.pop("model", {})
        unknown = sorted(set(table) - training_keys)
        if unknown:
            problems.append(f"{where} has unknown key(s) {unknown}; known: the keys of "
                            f"[training] ({', '.join(sorted(training_keys))}) and a `model` "
                            "table")
        if not isinstance(model, dict):
            problems.append(f"{where}.model must be a table")
            model = {}
        bad_model = sorted(set(model) - model_keys)
        if bad_model:
            problems.append(f"{where}.model has unknown key(s) {bad_model}; known: "
                            f"{', '.join(sorted(model_keys))}")
        out[alg] = {"training": {k: v for k, v in table.items() if k in training_keys},
                    "model": {k: v for k, v in model.items() if k in model_keys}}
    return out


def _set_path(raw: dict[str, Any], path: str, value: Any) -> None:
    if "," in path:  # "alignment.alpha,alignment.beta": one value for several keys (α = β)
        for part in path.split(","):
            _set_path(raw, part.strip(), value)
        return
    node = raw
    keys = path.split(".")
    for key in keys[:-1]:
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise ConfigError(f"sweep key {path!r}: {key!r} is not a table")
    node[keys[-1]] = value


def parse_experiment(raw: dict[str, Any], base_dir: Path | None = None) -> Experiment:
    raw = copy.deepcopy(raw)
    exp = raw.pop("experiment", None)
    problems: list[str] = []
    if not isinstance(exp, dict):
        raise ConfigError("an experiment file needs an [experiment] table with `algorithms` "
                          "and `seeds`")
    unknown = sorted(set(exp) - {"name", "algorithms", "seeds", "sweep", "overrides"})
    if unknown:
        problems.append(f"[experiment] has unknown key(s) {unknown}; known: name, algorithms, "
                        "seeds, sweep, overrides")
    algorithms = exp.get("algorithms")
    valid = set(algorithm_names())
    if (not isinstance(algorithms, list) or not algorithms
            or not all(isinstance(a, str) for a in algorithms)):
        problems.append("`experiment.algorithms` must be a non-empty list of algorithm names")
        algorithms = []
    else:
        bad = [a for a in algorithms if a not in valid]
        if bad:
            problems.append(f"unknown algorithm(s) {bad}; valid names are: "
                            f"{', '.join(sorted(valid))}")
    seeds = exp.get("seeds", [0])
    if (not isinstance(seeds, list) or not seeds
            or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0
                       for s in seeds)):
        problems.append(f"`experiment.seeds` must be a non-empty list of ints ≥ 0, got {seeds!r}")
        seeds = [0]
    sweep = exp.get("sweep", {})
    if not isinstance(sweep, dict):
        problems.append("`experiment.sweep` must map dotted keys to lists of values")
        sweep = {}
    for k, v in sweep.items():
        if not isinstance(v, list) or not v:
            problems.append(f"sweep values for {k!r} must be a non-empty list")
    if any(not isinstance(v, list) or not v for v in sweep.values()):
        sweep = {}
    overrides = _parse_overrides(exp.get("overrides"), valid, problems)
    raise_if(problems, "[experiment] table")
    # One key: its values; several keys: their grid, labelled "a=1, b=2".
    keys = list(sweep)
    key = keys[0] if len(keys) == 1 else (" × ".join(keys) if keys else None)
    grid = list(itertools.product(*sweep.values())) if keys else [()]
    values = [combo[0] if len(keys) == 1 else
              (", ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in zip(keys, combo))
               if keys else None) for combo in grid]
    configs = []
    for value, combo in zip(values, grid, strict=True):
        point = copy.deepcopy(raw)
        for k, v in zip(keys, combo, strict=True):
            _set_path(point, k, v)
        try:
            config = parse_config(point, base_dir)
            for alg, changes in overrides.items():
                apply_overrides(config, alg, changes)  # validates every override
            configs.append(config)
        except ConfigError as exc:
            where = f" (sweep {key} = {value!r})" if key else ""
            raise ConfigError(f"{exc}{where}", exc.problems) from None
    return Experiment(name=str(exp.get("name", "experiment")), algorithms=tuple(algorithms),
                      seeds=tuple(seeds), sweep_key=key, sweep_values=tuple(values),
                      configs=tuple(configs), raw=raw, overrides=overrides)


def load_experiment(path: Path) -> Experiment:
    path = Path(path)
    raw = read_toml(path, "experiment file")
    try:
        return parse_experiment(raw, base_dir=path.parent.resolve())
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}", exc.problems) from None
