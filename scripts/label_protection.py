"""Measure label protection: each protection × each label-inference attack, and the
privacy-utility curve against the label ε (docs/how-to/label-protection.md).

    PYTHONPATH=src python scripts/label_protection.py run \
        --config examples/experiments/label-protection-adult.toml \
        --runs examples/experiments/label-protection-adult-runs.jsonl
    PYTHONPATH=src python scripts/label_protection.py table \
        examples/experiments/label-protection-adult-runs.jsonl [--curve FIGURE.png]

``run`` trains every (sweep point, seed, algorithm) of an experiment file with
``[evaluation] record = true`` in a scratch run directory, runs the attacks on it
(``--attacks``; default: norm, direction, k-means, spectral, fuzzy c-means, model completion),
and appends one line per run to ``--runs`` (runs already there are skipped, so an interrupted
measurement continues). ``table`` prints the protection × attack table and the curve table
(:mod:`vflink.experiments.label_protection`), and draws the figure.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

import vflink
from vflink.experiments.label_protection import (
    ATTACK_COLUMNS,
    adjusting_table,
    curve_table,
    load_runs,
    plot_curve,
    power_table,
    protection_table,
    run_key,
)
from vflink.runfiles.config import EvaluationConfig
from vflink.runfiles.experiment import load_experiment


def _record(config: Any, run: Any, attacks: dict[str, Any], seconds: float) -> dict[str, Any]:
    privacy = config.privacy
    labelled = privacy.labels in ("dp", "rr-prior")
    ledger = run.privacy
    label = next((p for p in ledger.get("protections", [])
                  if str(p.get("kind", "")).startswith("label-")), None)
    guarantee = {k: v for k, v in ((label or {}).get("guarantee") or {}).items()
                 if not isinstance(v, (dict, list, str))}
    return {"dataset": config.data.dataset, "labels": privacy.labels,
            "epsilon": privacy.label_epsilon if labelled else None,
            "power": privacy.marvell_power if privacy.labels == "marvell" else None,
            "embeddings": privacy.embeddings, "seed": config.seed,
            "algorithm": config.algorithm, "test": run.metrics["test"],
            "validation": run.metrics["validation"], "best_epoch": run.summary.get("best_epoch"),
            "seconds": seconds, "attacks": attacks, "guarantee": guarantee}


def run(args: argparse.Namespace) -> None:
    exp = load_experiment(args.config)
    runs_file: Path = args.runs
    done = {run_key(r) for r in load_runs([runs_file])} if runs_file.is_file() else set()
    scratch = Path(tempfile.mkdtemp(prefix="label-protection-"))
    try:
        for base in exp.configs:
            for seed in args.seeds or exp.seeds:
                for algorithm in exp.algorithms:
                    config = exp.config_for(base, algorithm).replace(
                        seed=seed, evaluation=EvaluationConfig(record=True))
                    p = config.privacy
                    labelled = p.labels in ("dp", "rr-prior")
                    key = run_key({"dataset": config.data.dataset, "labels": p.labels,
                                   "epsilon": p.label_epsilon if labelled else None,
                                   "embeddings": p.embeddings,
                                   "power": p.marvell_power if p.labels == "marvell" else None,
                                   "algorithm": algorithm, "seed": seed})
                    if key in done:
                        continue
                    start = time.perf_counter()
                    out = scratch / f"run-{len(done)}"
                    trained = vflink.train(config, out=out, overwrite=True)
                    seconds = time.perf_counter() - start
                    results: dict[str, Any] = {}
                    for name in args.attacks:
                        res = trained.attack(name)
                        results[name] = {k: v for k, v in res.metrics.items()
                                         if k in ("auc", "accuracy", "auc_features_only",
                                                  "accuracy_features_only", "majority")}
                    record = _record(config, trained, results, seconds)
                    with open(runs_file, "a", encoding="utf-8") as fh:
                        fh.write(json.dumps(record, default=float) + "\n")
                    done.add(key)
                    print(json.dumps({k: record[k] for k in ("labels", "epsilon", "seed",
                                                             "test", "attacks")},
                                     default=float), flush=True)
                    shutil.rmtree(out, ignore_errors=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def table(args: argparse.Namespace) -> None:
    runs = load_runs(args.runs)
    if len({r.get("embeddings") for r in runs}) > 1:  # VFL-AFE's +D under label protection
        print(adjusting_table(runs))
        return
    if len({r.get("power") for r in runs if r.get("labels") == "marvell"}) > 1:
        print(power_table(runs))  # Marvell's power (with the unprotected runs to pair with)
        return
    names = {name for r in runs for name in (r.get("attacks") or {})}
    columns = tuple((n, h) for n, h in ATTACK_COLUMNS if n in names)
    if any(r.get("labels") not in ("dp", "rr-prior") or r.get("epsilon") == args.epsilon
           for r in runs):
        print(protection_table(runs, epsilon=args.epsilon, attacks=columns))
        print()
    if len({r.get("epsilon") for r in runs if r.get("epsilon") is not None}) > 1:
        print(curve_table(runs))
        if args.curve is not None:
            plot_curve(runs, args.curve, title=args.title)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run", help="train, attack, append to the runs file")
    p.add_argument("--config", type=Path, required=True, help="an experiment file")
    p.add_argument("--runs", type=Path, required=True, help="the .jsonl file to append to")
    p.add_argument("--seeds", type=int, nargs="*", default=None)
    p.add_argument("--attacks", nargs="*", default=[n for n, _ in ATTACK_COLUMNS])
    p.set_defaults(func=run)
    t = sub.add_parser("table", help="the docs' tables (and figure) from runs files")
    t.add_argument("runs", type=Path, nargs="+")
    t.add_argument("--epsilon", type=float, default=4.0,
                   help="the label ε of the protection table's dp and rr-prior rows")
    t.add_argument("--curve", type=Path, default=None, help="draw the curve into this PNG")
    t.add_argument("--title", default="label protection")
    t.set_defaults(func=table)
    args = parser.parse_args()
    torch.set_num_threads(1)
    logging.basicConfig(level=logging.WARNING)
    args.func(args)


if __name__ == "__main__":
    main()
