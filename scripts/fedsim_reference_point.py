"""Run one point of examples/experiments/fedsim-reference.toml (some algorithms, one seed).

    PYTHONPATH=src python scripts/fedsim_reference_point.py --pool split --top-k 10 \\
        --sigma-cf 0.2 --seed 0 --algorithms fedsim top1sim solo combine --out runs/ref.jsonl

Appends one JSON line per algorithm (test/validation metrics, best epoch, seconds, linkage
recall) to ``--out``; the experiment file's per-algorithm overrides are applied. For long
reproductions on a shared machine, where ``vflink experiment`` would run the whole grid.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import time
from pathlib import Path

import numpy as np
import torch

from vflink.runfiles.config import DataConfig
from vflink.runfiles.experiment import load_experiment
from vflink.runner.prepare import prepare
from vflink.runner.train import run_training

EXPERIMENT = Path(__file__).resolve().parents[1] / "examples/experiments/fedsim-reference.toml"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pool", choices=("split", "all"), default="split")
    parser.add_argument("--top-k", type=int, default=10)
    parser.add_argument("--sigma-cf", type=float, default=0.2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--n-samples", type=int, default=60_000)
    parser.add_argument("--epochs", type=int, default=None, help="cap every algorithm's epochs")
    parser.add_argument("--patience", type=int, default=None,
                        help="stop an algorithm this many epochs after its best validation epoch "
                             "(the file's patience equals its epochs: the authors train them all)")
    parser.add_argument("--algorithms", nargs="+", default=["fedsim", "top1sim", "solo",
                                                            "combine"])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    torch.set_num_threads(1)
    exp = load_experiment(EXPERIMENT)
    base = exp.configs[0]
    config = base.replace(
        seed=args.seed,
        data=DataConfig(dataset="sklearn-reference",
                        options={"sigma_cf": args.sigma_cf, "n_samples": args.n_samples}),
        alignment=base.alignment.__class__(**{**base.alignment.__dict__, "pool": args.pool,
                                              "top_k": args.top_k}))
    start = time.perf_counter()
    prepared = prepare(config, algorithms=args.algorithms)
    n = len(prepared.inputs.primary)
    links = prepared.alignments.get("topk", prepared.alignments["top1"])["secondary"]
    idx = links.for_primary_rows(n)
    truth = prepared.inputs.truth["secondary"] if prepared.inputs.truth else np.arange(n)
    recall = {"top1": float(np.mean(idx[:, 0] == truth)),
              "topk": float(np.mean((idx == truth[:, None]).any(axis=1)))}
    logging.info("linkage %.1f s, recall %s", time.perf_counter() - start, recall)
    for algorithm in args.algorithms:
        run = exp.config_for(config, algorithm)
        t = run.training
        epochs = t.epochs if args.epochs is None else min(t.epochs, args.epochs)
        patience = min(t.patience, epochs, args.patience or epochs)
        run = run.replace(training=dataclasses.replace(t, epochs=epochs, patience=patience))
        result = run_training(run, prepared=prepared)
        record = {"algorithm": algorithm, "pool": args.pool, "top_k": args.top_k,
                  "sigma_cf": args.sigma_cf, "seed": args.seed, "n_samples": n,
                  "test": result.metrics["test"], "validation": result.metrics["validation"],
                  "best_epoch": result.best_epoch, "epochs_run": len(result.history),
                  "patience": run.training.patience,
                  "seconds": result.seconds, "recall": recall,
                  "epoch_seconds": [h.seconds for h in result.history]}
        with args.out.open("a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        logging.info("%s: test %s (best epoch %d, %.0f s)", algorithm, result.metrics["test"],
                     result.best_epoch, result.seconds)


if __name__ == "__main__":
    main()
