"""Training on a rare label: model selection on validation accuracy (before) against the
default (AUC on a binary task, the decision threshold chosen on validation), printed as JSON.

On an imbalanced task (``--positive`` of the records positive: 8 % by default; the generator
of ``tests/helpers/imbalanced.py``) an in-process SplitNN run is trained for each label
protection (``off``, ``marvell``, ``dp`` at ε = ``--epsilon``) and each selection
(``training.select = "accuracy"``, the old behaviour, and ``"auto"``), over ``--seeds``.
Per point: the test AUC (mean ± std), the epoch kept, the share of test records predicted
positive at the decision threshold and at 0.5, the test F1 at the threshold, the warnings,
and seconds per run. The same data, seeds and process for both selections.

    PYTHONPATH=src python benchmarks/rare_labels.py [--rows 5000 --positive 0.08 --seeds 0 1 2]
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))

from tests.helpers.imbalanced import imbalanced_inputs  # noqa: E402
from vflink.privacy.config import PrivacyConfig  # noqa: E402
from vflink.runfiles.config import (  # noqa: E402
    AlignmentConfig,
    DataConfig,
    RunConfig,
    TrainingConfig,
)
from vflink.runner.train import run_training  # noqa: E402

MODES = ("off", "marvell", "dp")
SELECTIONS = ("accuracy", "auto")


def one(mode: str, select: str, seed: int, rows: int, positive: float, epsilon: float,
        epochs: int) -> dict[str, Any]:
    privacy = PrivacyConfig(labels=mode, **({"labels_total_epsilon": epsilon}
                                            if mode == "dp" else {}))
    config = RunConfig(seed=seed, algorithm="splitnn", data=DataConfig(dataset="-"),
                       alignment=AlignmentConfig(method="exact"),
                       training=TrainingConfig(epochs=epochs, select=select),
                       privacy=privacy)
    start = time.perf_counter()
    result = run_training(config, tables=imbalanced_inputs(rows, positive=positive, seed=seed))
    seconds = time.perf_counter() - start
    decision = result.extra.get("decision") or {}
    return {"test_auc": result.metrics["test"]["auc"], "best_epoch": result.best_epoch,
            "test_accuracy": result.metrics["test"]["accuracy"],
            "threshold": decision.get("threshold"),
            "predicted_positive": decision.get("test", {}).get("predicted_positive"),
            "predicted_positive_at_0.5":
                decision.get("predicted_positive_at_0.5", {}).get("test"),
            "test_f1": decision.get("test", {}).get("f1"),
            "warnings": len(result.extra.get("warnings", [])), "seconds": seconds}


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    def stat(key: str) -> list[float] | None:
        values = [r[key] for r in runs if r[key] is not None]
        return [float(np.mean(values)), float(np.std(values))] if values else None

    return {"test_auc": stat("test_auc"), "best_epoch": [r["best_epoch"] for r in runs],
            "predicted_positive": [r["predicted_positive"] for r in runs],
            "predicted_positive_at_0.5": [r["predicted_positive_at_0.5"] for r in runs],
            "single_class_at_threshold": sum(r["predicted_positive"] in (0.0, 1.0)
                                             for r in runs),
            "test_f1": stat("test_f1"), "warnings": sum(r["warnings"] for r in runs),
            "seconds": stat("seconds")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=5000)
    parser.add_argument("--positive", type=float, default=0.08)
    parser.add_argument("--epsilon", type=float, default=4.0)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args()
    torch.set_num_threads(1)
    logging.basicConfig(level=logging.ERROR)
    out: dict[str, Any] = {"rows": args.rows, "positive": args.positive,
                           "epsilon": args.epsilon, "epochs": args.epochs, "seeds": args.seeds,
                           "algorithm": "splitnn", "points": {}}
    for mode in MODES:
        for select in SELECTIONS:
            runs = [one(mode, select, seed, args.rows, args.positive, args.epsilon,
                        args.epochs) for seed in args.seeds]
            out["points"][f"{mode}/{select}"] = summary(runs)
            print(json.dumps({f"{mode}/{select}": out["points"][f"{mode}/{select}"]}),
                  file=sys.stderr, flush=True)
    auc = {k: v["test_auc"][0] for k, v in out["points"].items()}
    out["auc_gain"] = {m: auc[f"{m}/auto"] - auc[f"{m}/accuracy"] for m in MODES}
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
