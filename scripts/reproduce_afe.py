"""Reproduce VFL-AFE's Figure 9 / Table 2 (utility), Table 1 (membership inference) and
Figure 10 (inversion) on Adult and Fashion-MNIST halves.

    PYTHONPATH=src python scripts/reproduce_afe.py --config examples/experiments/afe-fmnist.toml \
        --out runs/afe-fmnist [--seeds 0 1 2] [--attacks]

For each seed: centralised (``combine``), unprotected (``splitnn``, privacy off) and the four
protected variants (vanilla, +R = rescale, +D = adjust, AFE) with the file's ``[privacy]``
settings; with ``--attacks`` (classification data with an auxiliary set: Fashion-MNIST's test
images) the unprotected, vanilla and AFE runs are also attacked (``vflink.experiments.afe``).
Writes ``results.json`` and ``results.md`` (mean ± std over seeds) and ``inversion.png``.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vflink.attacks import inversion_grid_png
from vflink.config import read_toml
from vflink.experiments.afe import train_and_attack
from vflink.runfiles.config import DataConfig, PrivacyConfig, RunConfig
from vflink.runfiles.experiment import parse_experiment
from vflink.runfiles.inputs import load_inputs
from vflink.runner.train import run_training

METHODS = {"centralised": ("combine", "off"), "unprotected": ("splitnn", "off"),
           "vanilla": ("splitnn", "vanilla"), "+R": ("splitnn", "rescale"),
           "+D": ("splitnn", "adjust"), "AFE": ("splitnn", "afe")}
ATTACKED = ("unprotected", "vanilla", "AFE")


def _config(base: RunConfig, method: str, seed: int) -> RunConfig:
    algorithm, mode = METHODS[method]
    privacy = PrivacyConfig(**{**base.privacy.__dict__, "embeddings": mode})
    return base.replace(seed=seed, algorithm=algorithm, privacy=privacy)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seeds", type=int, nargs="*", default=None)
    parser.add_argument("--methods", nargs="*", default=list(METHODS))
    parser.add_argument("--attacks", action="store_true")
    parser.add_argument("--aux-rows", type=int, default=5000)
    parser.add_argument("--merge", type=Path, nargs="*", default=None,
                        help="only summarise the results.json of these output folders (runs "
                        "split over several processes, e.g. one per seed) into --out")
    args = parser.parse_args()
    if args.merge:
        merged: dict[tuple[int, str], dict[str, Any]] = {}
        for d in args.merge:  # one run per (seed, method): the first folder given wins
            for r in json.loads((d / "results.json").read_text())["runs"]:
                merged.setdefault((r["seed"], r["method"]), r)
        runs = list(merged.values())
        args.out.mkdir(parents=True, exist_ok=True)
        seeds = sorted({r["seed"] for r in runs})
        (args.out / "results.json").write_text(json.dumps(
            {"config": str(args.config), "seeds": seeds, "merged": [str(d) for d in args.merge],
             "runs": runs}, indent=2, default=float))
        methods = [m for m in METHODS if any(r["method"] == m for r in runs)]
        print(summarise(str(args.config), seeds, methods, runs, args.out))
        return
    torch.set_num_threads(1)
    logging.basicConfig(level=logging.WARNING)
    exp = parse_experiment(read_toml(args.config), base_dir=args.config.parent.resolve())
    base = exp.configs[0]
    seeds = args.seeds if args.seeds is not None else list(exp.seeds)
    args.out.mkdir(parents=True, exist_ok=True)
    runs: list[dict[str, Any]] = []
    examples: dict[str, Any] = {}
    for seed in seeds:
        aux = None
        if args.attacks:
            options = {**base.data.options, "subset": "test", "max_rows": args.aux_rows}
            aux = load_inputs(base.replace(data=DataConfig(dataset=base.data.dataset,
                                                           options=options), seed=seed))
        for method in args.methods:
            config = _config(base, method, seed)
            start = time.perf_counter()
            record: dict[str, Any] = {"seed": seed, "method": method}
            if aux is not None and method in ATTACKED:
                outcome = train_and_attack(config, aux)
                result = outcome.result
                record["membership"] = outcome.membership
                record["inversion"] = outcome.inversion
                if seed == seeds[0] and outcome.examples is not None:
                    examples.setdefault("truth", outcome.examples[0])
                    examples[method] = outcome.examples[1]
            else:
                result = run_training(config)
            record.update({"test": result.metrics["test"], "best_epoch": result.best_epoch,
                           "seconds": time.perf_counter() - start,
                           "privacy": result.extra.get("privacy", {})})
            runs.append(record)
            print(json.dumps({k: record[k] for k in ("seed", "method", "test", "seconds")},
                             default=float), flush=True)
            (args.out / "results.json").write_text(json.dumps(
                {"config": str(args.config), "seeds": seeds, "runs": runs}, indent=2,
                default=float))
    print(summarise(exp.name, seeds, args.methods, runs, args.out))
    if "truth" in examples:
        rows = [("truth", examples["truth"])] + [(m, examples[m]) for m in ATTACKED
                                                 if m in examples]
        inversion_grid_png(rows, (28, 14), args.out / "inversion.png")


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


if __name__ == "__main__":
    main()
