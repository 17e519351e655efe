"""Reproduction runs: algorithms × seeds (× one swept parameter), tables of mean ± std.

An experiment file is a run file (see :mod:`vflink.runner.config`) plus an ``[experiment]``
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

Linkage does not depend on the algorithm, so each (sweep value, seed) is aligned once and every
algorithm trains on the same alignment and the same split.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vflink._checks import raise_if
from vflink._files import atomic_open, atomic_write_text
from vflink.config import read_toml
from vflink.errors import ConfigError
from vflink.runner.algorithms import algorithm_names
from vflink.runner.config import (
    ModelConfig,
    RunConfig,
    TrainingConfig,
    config_to_dict,
    parse_config,
)
from vflink.runner.rundir import atomic_run_dir, write_json
from vflink.runner.train import prepare, run_training

__all__ = ["Experiment", "load_experiment", "parse_experiment", "run_experiment"]

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


def _stats(values: list[float]) -> dict[str, float]:
    arr = np.asarray(values, dtype=np.float64)
    return {"mean": float(arr.mean()), "std": float(arr.std(ddof=0)), "n": int(arr.size)}


def run_experiment(exp: Experiment, out_dir: Path, *, overwrite: bool = False,
                   progress: ExperimentProgress | None = None) -> dict[str, Any]:
    """Run every (sweep value, seed, algorithm); write results.json, results.md, plot.png."""
    total = len(exp.configs) * len(exp.seeds) * len(exp.algorithms)
    done = 0
    runs: list[dict[str, Any]] = []
    start = time.perf_counter()
    with atomic_run_dir(out_dir, overwrite=overwrite) as staging:
        for value, base in zip(exp.sweep_values, exp.configs, strict=True):
            for seed in exp.seeds:
                config = base.replace(seed=seed)
                prepared = prepare(config, algorithms=exp.algorithms)
                for algorithm in exp.algorithms:
                    label = f"{algorithm} seed={seed}" + (
                        f" {exp.sweep_key}={value}" if exp.sweep_key else "")
                    if progress is not None:
                        progress(done, total, label)
                    result = run_training(exp.config_for(config, algorithm),
                                          prepared=prepared)
                    runs.append({"sweep": value, "seed": seed, "algorithm": algorithm,
                                 "test": result.metrics["test"],
                                 "validation": result.metrics["validation"],
                                 "best_epoch": result.best_epoch,
                                 "seconds": result.seconds,
                                 "bytes": sum(v["bytes"] for v in
                                              result.communication.values()),
                                 "encoding": prepared.summary.get("encoding")})
                    headline = result.headline
                    done += 1
                    log.info("%s: test %s", label, result.metrics["test"])
        if progress is not None:
            progress(done, total, "done")
        summary: dict[str, Any] = {}
        for value in exp.sweep_values:
            for algorithm in exp.algorithms:
                chosen = [r for r in runs if r["sweep"] == value and r["algorithm"] == algorithm]
                metrics = chosen[0]["test"].keys()
                summary.setdefault(str(value), {})[algorithm] = {
                    m: _stats([r["test"][m] for r in chosen]) for m in metrics}
        results = {"name": exp.name, "algorithms": list(exp.algorithms),
                   "seeds": list(exp.seeds), "sweep": {"key": exp.sweep_key,
                                                       "values": list(exp.sweep_values)},
                   "headline_metric": headline, "summary": summary, "runs": runs,
                   "encodings": sorted({str(r["encoding"]) for r in runs if r["encoding"]}),
                   "seconds": time.perf_counter() - start}
        write_json(staging / "results.json", results)
        write_json(staging / "config.json", {"experiment": {
            "name": exp.name, "algorithms": list(exp.algorithms), "seeds": list(exp.seeds),
            "sweep": {exp.sweep_key: list(exp.sweep_values)} if exp.sweep_key else {},
            "overrides": exp.overrides},
            "runs": [config_to_dict(c) for c in exp.configs]})
        atomic_write_text(staging / "results.md", markdown_table(results))
        plot_results(results, staging / "plot.png")
    return results


def _fmt(stat: dict[str, float], metric: str) -> str:
    scale = 100.0 if metric == "accuracy" else 1.0
    unit = "%" if metric == "accuracy" else ""
    if math.isnan(stat["mean"]):
        return "n/a"
    return f"{stat['mean'] * scale:.2f} ± {stat['std'] * scale:.2f}{unit}"


def markdown_table(results: dict[str, Any]) -> str:
    """One table per metric: algorithms as rows, sweep values as columns, mean ± std."""
    sweep = results["sweep"]
    values = [str(v) for v in sweep["values"]]
    first = results["summary"][values[0]][results["algorithms"][0]]
    lines = [f"# {results['name']}", "",
             f"Test metrics over seeds {results['seeds']} (mean ± std).", ""]
    if results.get("encodings"):
        lines += ["Identifiers reached the coordinator as: "
                  + ", ".join(results["encodings"]) + ".", ""]
    for metric in first:
        head = [sweep["key"] + " =" + f" {v}" if sweep["key"] else metric for v in values]
        lines += [f"## {metric}", "", "| algorithm | " + " | ".join(head) + " |",
                  "|---|" + "---|" * len(values)]
        for alg in results["algorithms"]:
            cells = [_fmt(results["summary"][v][alg][metric], metric) for v in values]
            lines.append(f"| {alg} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def plot_results(results: dict[str, Any], path: Path) -> None:
    from matplotlib.figure import Figure

    metric = results["headline_metric"]
    values = results["sweep"]["values"]
    fig = Figure(figsize=(6.5, 4.0), dpi=110)
    ax = fig.add_subplot()
    xs = np.arange(len(values))
    for i, alg in enumerate(results["algorithms"]):
        stats = [results["summary"][str(v)][alg][metric] for v in values]
        means = [s["mean"] for s in stats]
        stds = [s["std"] for s in stats]
        if len(values) > 1:
            ax.errorbar(xs, means, yerr=stds, marker="o", capsize=3, label=alg)
        else:
            ax.bar(i, means[0], yerr=stds[0], capsize=3, label=alg)
    if len(values) > 1:
        ax.set_xticks(xs, [str(v) for v in values])
        ax.set_xlabel(results["sweep"]["key"])
    else:
        ax.set_xticks([])
    ax.set_ylabel(f"test {metric}")
    ax.set_title(results["name"])
    ax.legend(fontsize="small")
    fig.tight_layout()
    with atomic_open(path, "wb") as fh:
        fig.savefig(fh, format="png")
