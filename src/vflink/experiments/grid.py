"""Reproduction runs: algorithms × seeds (× one swept parameter), tables of mean ± std.

An experiment file is a run file plus an ``[experiment]`` table (its schema, an example and
its validation: :mod:`vflink.runfiles.experiment`).

Linkage does not depend on the algorithm, so each (sweep value, seed) is aligned once and every
algorithm trains on the same alignment and the same split.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from vflink._files import atomic_write_text
from vflink.reporting.experiment import markdown_table, plot_results
from vflink.runfiles.config import config_to_dict
from vflink.runfiles.experiment import Experiment
from vflink.runfiles.rundir import atomic_run_dir, write_json
from vflink.runner.prepare import prepare
from vflink.runner.train import run_training

__all__ = ["run_experiment"]

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
