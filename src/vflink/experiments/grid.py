"""Reproduction runs: algorithms × seeds (× one swept parameter), tables of mean ± std.

An experiment file (:mod:`vflink.runfiles.experiment`) is a run file plus an ``[experiment]``
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

import logging
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from vflink._files import atomic_open, atomic_write_text
from vflink.runfiles.config import config_to_dict
from vflink.runfiles.experiment import Experiment
from vflink.runfiles.rundir import atomic_run_dir, write_json
from vflink.runner.prepare import prepare
from vflink.runner.train import run_training

__all__ = ["markdown_table", "plot_results", "run_experiment"]

log = logging.getLogger(__name__)

#: ``progress(done, total, label)``
ExperimentProgress = Callable[[int, int, str], None]


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
