"""VFL-AFE's Figure 9 / Table 2 (utility), Table 1 (membership inference) and Figure 10
(inversion) on Adult and Fashion-MNIST halves (``scripts/reproduce_afe.py`` is its entry point).

For each seed: centralised (``combine``), unprotected (``splitnn``, privacy off) and the four
protected variants (vanilla, +R = rescale, +D = adjust, AFE) with the experiment file's
``[privacy]`` settings; with ``attacks`` (classification data with an auxiliary set:
Fashion-MNIST's test images) the unprotected, vanilla and AFE runs are also attacked
(:func:`vflink.experiments.afe.train_and_attack`). Writes ``results.json`` and ``results.md``
(mean ± std over seeds) and ``inversion.png``. Each run is one pipeline
(:func:`vflink.runner.train.run_training`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from vflink.attacks import inversion_grid_png
from vflink.config import read_toml
from vflink.experiments.afe import train_and_attack
from vflink.runfiles.config import DataConfig, PrivacyConfig, RunConfig
from vflink.runfiles.experiment import parse_experiment
from vflink.runfiles.inputs import load_inputs
from vflink.runner.train import run_training

__all__ = ["ATTACKED", "METHODS", "merge_results", "method_config", "reproduce_afe",
           "summarise"]

#: method → (algorithm, ``privacy.embeddings``)
METHODS = {"centralised": ("combine", "off"), "unprotected": ("splitnn", "off"),
           "vanilla": ("splitnn", "vanilla"), "+R": ("splitnn", "rescale"),
           "+D": ("splitnn", "adjust"), "AFE": ("splitnn", "afe"),
           # vflink's own variants (docs/how-to/privacy.md), not in the paper
           "normalized": ("splitnn", "normalized"),
           "randomized-response": ("splitnn", "randomized-response")}
ATTACKED = ("unprotected", "vanilla", "AFE", "normalized", "randomized-response")

#: ``on_run(record)``: one finished run's figures (seed, method, test, seconds, ...)
OnRun = Callable[[dict[str, Any]], None]


def method_config(base: RunConfig, method: str, seed: int,
                  total_epsilon: float | None = None, delta: float | None = None,
                  attacked: bool = False) -> RunConfig:
    """The run of one method of :data:`METHODS` and one seed; with ``total_epsilon`` the run's
    total ε (budget first) replaces the file's per-release ε, and an ``attacked``
    run keeps two releases per record in its budget for the attack's queries after training
    (the candidates' embeddings, and the primary's posteriors on them: ``reserve_releases =
    2``; ``randomized-response`` answers them from its one release)."""
    algorithm, mode = METHODS[method]
    settings = {**base.privacy.__dict__, "embeddings": mode}
    if total_epsilon is not None:
        settings.update(epsilon=None, total_epsilon=total_epsilon)
        if attacked and mode not in ("off", "randomized-response", "release-once"):
            settings["reserve_releases"] = 2
    if delta is not None:
        settings["delta"] = delta
    privacy = PrivacyConfig(**settings)
    return base.replace(seed=seed, algorithm=algorithm, privacy=privacy)


def merge_results(config: Path, folders: Sequence[Path], out: Path) -> str:
    """Summarise the ``results.json`` of several output folders (runs split over processes,
    e.g. one per seed) into ``out``; one run per (seed, method): the first folder wins."""
    merged: dict[tuple[int, str], dict[str, Any]] = {}
    for d in folders:
        for r in json.loads((d / "results.json").read_text())["runs"]:
            merged.setdefault((r["seed"], r["method"]), r)
    runs = list(merged.values())
    out.mkdir(parents=True, exist_ok=True)
    seeds = sorted({r["seed"] for r in runs})
    (out / "results.json").write_text(json.dumps(
        {"config": str(config), "seeds": seeds, "merged": [str(d) for d in folders],
         "runs": runs}, indent=2, default=float))
    methods = [m for m in METHODS if any(r["method"] == m for r in runs)]
    return summarise(str(config), seeds, methods, runs, out)


def reproduce_afe(config: Path, out: Path, *, seeds: Sequence[int] | None = None,
                  methods: Sequence[str] = tuple(METHODS), attacks: bool = False,
                  aux_rows: int = 5000, on_run: OnRun | None = None,
                  total_epsilon: float | None = None, delta: float | None = None) -> str:
    """Run every (seed, method) of the experiment file ``config``; write ``out``'s results;
    return the summary table (results.md). ``total_epsilon``/``delta``: see
    :func:`method_config`."""
    exp = parse_experiment(read_toml(config), base_dir=config.parent.resolve())
    base = exp.configs[0]
    chosen_seeds = list(seeds) if seeds is not None else list(exp.seeds)
    out.mkdir(parents=True, exist_ok=True)
    runs: list[dict[str, Any]] = []
    examples: dict[str, Any] = {}
    for seed in chosen_seeds:
        aux = None
        if attacks:
            options = {**base.data.options, "subset": "test", "max_rows": aux_rows}
            aux = load_inputs(base.replace(data=DataConfig(dataset=base.data.dataset,
                                                           options=options), seed=seed))
        for method in methods:
            run = method_config(base, method, seed, total_epsilon, delta,
                                attacked=aux is not None and method in ATTACKED)
            start = time.perf_counter()
            record: dict[str, Any] = {"seed": seed, "method": method}
            if aux is not None and method in ATTACKED:
                outcome = train_and_attack(run, aux)
                result = outcome.result
                record["membership"] = outcome.membership
                record["inversion"] = outcome.inversion
                if seed == chosen_seeds[0] and outcome.examples is not None:
                    examples.setdefault("truth", outcome.examples[0])
                    examples[method] = outcome.examples[1]
            else:
                result = run_training(run)
            record.update({"test": result.metrics["test"], "best_epoch": result.best_epoch,
                           "seconds": time.perf_counter() - start,
                           "privacy": result.extra.get("privacy", {})})
            runs.append(record)
            if on_run is not None:
                on_run(record)
            (out / "results.json").write_text(json.dumps(
                {"config": str(config), "seeds": chosen_seeds, "runs": runs}, indent=2,
                default=float))
    text = summarise(exp.name, chosen_seeds, list(methods), runs, out)
    if "truth" in examples:
        rows = [("truth", examples["truth"])] + [(m, examples[m]) for m in ATTACKED
                                                 if m in examples]
        inversion_grid_png(rows, (28, 14), out / "inversion.png")
    return text


def summarise(name: str, seeds: list[int], methods: list[str], runs: list[dict[str, Any]],
              out: Path) -> str:
    """results.md: test accuracy, MI accuracy and inversion MSE ratio, mean ± std over seeds."""
    lines = [f"# {name}", "", f"seeds {seeds}; test accuracy (mean ± std, %)", "",
             "| method | accuracy | MI accuracy | inversion MSE ratio | ε total (worst record) |",
             "|---|---|---|---|---|"]
    for method in methods:
        chosen = [r for r in runs if r["method"] == method]
        acc = np.array([r["test"]["accuracy"] for r in chosen]) * 100
        mi = [r["membership"]["metrics"]["accuracy"] * 100 for r in chosen
              if r.get("membership")]
        inv = [r["inversion"]["metrics"]["mse_ratio"] for r in chosen if r.get("inversion")]
        eps = [max(p["epsilon_total"] for p in r["privacy"].values()) for r in chosen
               if r.get("privacy")]
        cells = [f"{acc.mean():.2f} ± {acc.std():.2f} (n={len(acc)})",
                 f"{np.mean(mi):.2f} ± {np.std(mi):.2f}" if mi else "",
                 f"{np.mean(inv):.3f}" if inv else "",
                 f"{np.mean(eps):.1f}" if eps else ""]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    text = "\n".join(lines) + "\n"
    (out / "results.md").write_text(text)
    return text
