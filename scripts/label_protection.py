"""Measure label protection: each protection × each label-inference attack, and the
privacy-utility curve against the label ε (docs/how-to/label-protection.md).

    PYTHONPATH=src python scripts/label_protection.py run \
        --config examples/experiments/label-protection-adult.toml \
        --runs examples/experiments/label-protection-adult-runs.jsonl
    PYTHONPATH=src python scripts/label_protection.py table \
        examples/experiments/label-protection-adult-runs.jsonl [--curve FIGURE.png]

    PYTHONPATH=src python scripts/label_protection.py grid \
        --runs examples/experiments/label-protection-grid-runs.jsonl [--datasets adult ...]
    PYTHONPATH=src python scripts/label_protection.py grid-table \
        examples/experiments/label-protection-grid-runs.jsonl
    PYTHONPATH=src python scripts/label_protection.py refit-pairs --seeds 0 1 2 3

``grid`` is the measurement behind the default label protection (docs/how-to/
label-protection.md, "The default"): every label mode (off, the default, max-norm, marvell, dp
at ε = 1, 4 and 8 with the posterior and the refit, dp at ε = 4 without the refit and using
each release as drawn, rr-prior at ε = 4)
× every label attack, white-box ones included, on Adult, KDD protein homology and two
imbalanced tasks (``tests/helpers/imbalanced.py``: 5,000 records at 8 % positives, the task of
``benchmarks/rare_labels.py``; 60,000 records at 10 %, harder: class separation 1, 5 % of the
labels flipped, four uninformative columns), 3 seeds, one ``measure`` line per run (secret
noise, as a user runs it; noise subtraction tries every seed received and every small seed
below ``--brute-force``). ``grid-table`` prints one table per dataset.

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
    LABEL_ATTACKS,
    adjusting_table,
    curve_table,
    grid_table,
    load_runs,
    measure,
    plot_curve,
    power_table,
    protection_table,
    run_key,
)
from vflink.privacy.config import PrivacyConfig
from vflink.runfiles.config import (
    AlignmentConfig,
    DataConfig,
    EvaluationConfig,
    ModelConfig,
    RunConfig,
    TrainingConfig,
)
from vflink.runfiles.experiment import load_experiment
from vflink.runfiles.inputs import Inputs

#: the grid's label points: (name, [privacy] keys)
GRID_MODES: tuple[tuple[str, dict[str, Any]], ...] = (
    ("off", {"labels": "off"}),
    ("default", {}),  # no labels key: the default protection (dp, ε = 8, one release, refit)
    ("max-norm", {"labels": "max-norm"}),
    ("marvell", {"labels": "marvell"}),
    ("dp-1", {"labels": "dp", "labels_total_epsilon": 1.0}),
    ("dp-4", {"labels": "dp", "labels_total_epsilon": 4.0}),
    ("dp-4-no-refit", {"labels": "dp", "labels_total_epsilon": 4.0, "labels_refit": False}),
    ("dp-8", {"labels": "dp", "labels_total_epsilon": 8.0}),
    ("dp-4-release", {"labels": "dp", "labels_total_epsilon": 4.0, "labels_denoise": "none"}),
    ("rr-prior-4", {"labels": "rr-prior", "labels_total_epsilon": 4.0}),
)
#: the grid's tasks: name → (dataset, options, generator options, epochs, model)
_PAPER_MODEL = ModelConfig(hidden=(64,), cut_dim=16, top_hidden=())
GRID_DATASETS: dict[str, dict[str, Any]] = {
    "adult": {"dataset": "adult", "epochs": 20, "model": _PAPER_MODEL,
              "options": {"n_secondaries": 2, "label_only_primary": True, "max_rows": 20000}},
    "kdd-protein": {"dataset": "kdd-protein", "epochs": 20, "model": _PAPER_MODEL,
                    "options": {"primary_features": 0}},
    # the defaults a new user runs: the model and training of RunConfig()
    "imbalanced-5k": {"rows": 5000, "positive": 0.08, "generator": {}, "epochs": 30},
    "imbalanced-60k": {"rows": 60000, "positive": 0.10, "epochs": 20,
                       "generator": {"class_sep": 1.0, "flip_y": 0.05, "noise_features": 4}},
}


def grid_point(task: str, mode: dict[str, Any], seed: int
               ) -> tuple[RunConfig, Inputs | None, int]:
    """One grid run: its config, its tables (the imbalanced tasks, redrawn per seed) and how
    many training rows it records at most (every epoch of every training row)."""
    spec = GRID_DATASETS[task]
    training = TrainingConfig(epochs=spec["epochs"], weight_decay=1e-4) \
        if "model" in spec else TrainingConfig(epochs=spec["epochs"])
    privacy = PrivacyConfig(**mode)
    if "rows" in spec:
        import sys
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from tests.helpers.imbalanced import imbalanced_inputs
        tables = imbalanced_inputs(spec["rows"], positive=spec["positive"], seed=seed,
                                   **spec["generator"])
        config = RunConfig(seed=seed, algorithm="splitnn", data=DataConfig(dataset="-"),
                           alignment=AlignmentConfig(method="exact"), training=training,
                           privacy=privacy)
        rows = spec["rows"]
    else:
        tables = None
        config = RunConfig(seed=seed, algorithm="splitnn",
                           data=DataConfig(dataset=spec["dataset"], options=spec["options"]),
                           alignment=AlignmentConfig(method="exact"), model=spec["model"],
                           training=training, privacy=privacy)
        rows = 150_000
    record = int(rows * 0.7 * spec["epochs"]) + 1
    config = config.replace(evaluation=EvaluationConfig(record=True, record_rows=record))
    return config, tables, record


def grid(args: argparse.Namespace) -> None:
    runs_file: Path = args.runs
    done = {(r["dataset"], r.get("point"), int(r["seed"])) for r in load_runs([runs_file])} \
        if runs_file.is_file() else set()
    params = {"label-noise-subtraction": {"brute_force": args.brute_force}}
    for task in args.datasets:
        for name, mode in GRID_MODES:
            if args.modes and name not in args.modes:
                continue
            for seed in args.seeds:
                if (task, name, seed) in done:
                    continue
                config, tables, _ = grid_point(task, mode, seed)
                line = measure(config, LABEL_ATTACKS, tables=tables, params=params)
                line.update({"dataset": task, "point": name})
                with open(runs_file, "a", encoding="utf-8") as fh:
                    fh.write(json.dumps(line, default=float) + "\n")
                done.add((task, name, seed))
                print(json.dumps({"dataset": task, "point": name, "seed": seed,
                                  "test_auc": line["test"].get("auc"), "holds": line["holds"],
                                  "seconds": round(line["seconds"], 1),
                                  "attacks": {k: round(v.get("auc", float("nan")), 3)
                                              for k, v in line["attacks"].items()}},
                                 default=float), flush=True)


def refit_pairs(args: argparse.Namespace) -> None:
    """The refit on the same protected model: each run's test AUC before the refit (its
    protected model, scored once more for this measurement only) and after it, with the
    validation figures the refit chose on (docs/how-to/label-protection.md, "The refit")."""
    import numpy as np

    from vflink.metrics.functional import auc
    from vflink.runner import plans
    from vflink.runner.train import run_training

    measured: dict[str, Any] = {}
    original = plans.PrimaryTrainee._refit

    def measuring(self: Any, splits: Any) -> Any:
        p = self.primary
        measured["test_before"] = auc(np.asarray(p.targets(splits[2])),
                                      p.predict_scores(splits[2]))
        out = original(self, splits)
        measured["test_after"] = auc(np.asarray(out["test"][0]), out["test"][1])
        measured.update({k: p.label_protection.refit_info[k] for k in
                         ("validation_before", "validation_after", "epoch_kept")})
        return out

    plans.PrimaryTrainee._refit = measuring  # type: ignore[method-assign]
    for task in args.datasets:
        for seed in args.seeds:
            config, tables, _ = grid_point(task, {}, seed)
            config = config.replace(evaluation=EvaluationConfig())
            measured.clear()
            with tempfile.TemporaryDirectory() as scratch:
                run_training(config, Path(scratch) / "run", tables=tables)
            print(json.dumps({"dataset": task, "seed": seed, **measured}, default=float),
                  flush=True)


def grid_tables(args: argparse.Namespace) -> None:
    runs = load_runs(args.runs)
    for task in [t for t in GRID_DATASETS if any(r.get("dataset") == t for r in runs)]:
        print(f"**{task}**\n")
        print(grid_table(runs, task))
        print()


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
    g = sub.add_parser("grid", help="every label mode × every attack × the four tasks")
    g.add_argument("--runs", type=Path, required=True, help="the .jsonl file to append to")
    g.add_argument("--datasets", nargs="+", default=list(GRID_DATASETS),
                   choices=list(GRID_DATASETS))
    g.add_argument("--modes", nargs="*", default=None,
                   help=f"points of the grid (default all: {', '.join(n for n, _ in GRID_MODES)})")
    g.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    g.add_argument("--brute-force", type=int, default=10_000,
                   help="noise subtraction tries every labels_seed and run seed below this")
    g.set_defaults(func=grid)
    r = sub.add_parser("refit-pairs", help="the default's test AUC before and after its "
                       "refit, on the same protected model")
    r.add_argument("--datasets", nargs="+", default=["imbalanced-5k", "kdd-protein"],
                   choices=list(GRID_DATASETS))
    r.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    r.set_defaults(func=refit_pairs)
    gt = sub.add_parser("grid-table", help="one table per dataset of the grid's runs")
    gt.add_argument("runs", type=Path, nargs="+")
    gt.set_defaults(func=grid_tables)
    args = parser.parse_args()
    torch.set_num_threads(1)
    logging.basicConfig(level=logging.WARNING)
    args.func(args)


if __name__ == "__main__":
    main()
