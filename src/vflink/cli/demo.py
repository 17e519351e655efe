"""``vflink demo``: Solo vs SplitNN vs Combine on the embedded synthetic dataset (< 2 minutes)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # heavy modules are imported when the demo runs, so `--help` is instant
    from rich.table import Table

    from vflink.runfiles.config import RunConfig
    from vflink.runfiles.results import RunResult

__all__ = ["DEMO_DATASET", "demo_config", "register", "run"]

DEMO_DATASET = "sklearn-small"

HELP = f"""Run a complete small example on the embedded synthetic dataset {DEMO_DATASET!r}
(FedSim App. E "sklearn", scaled down): one primary party with labels and a few features, one
secondary party with more features, aligned by keyed hashes through a coordinator. Trains
Solo (primary only), SplitNN (across the party boundary) and Combine (all features centralised,
an upper bound) and prints a comparison table. Finishes in well under two minutes on 2 cores.
"""


def demo_config(seed: int = 0) -> RunConfig:
    from vflink.runfiles.config import DataConfig, RunConfig, TrainingConfig

    return RunConfig(
        seed=seed,
        data=DataConfig(dataset=DEMO_DATASET),
        training=TrainingConfig(epochs=60, batch_size=128, lr=1e-3, patience=10),
    )


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "demo", help="Solo vs SplitNN vs Combine on an embedded dataset", description=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", type=Path, default=None,
                   help="TOML run file to use instead of the built-in demo settings")
    p.add_argument("--out", type=Path, default=Path("runs/demo"),
                   help="run directory (default: runs/demo)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing run directory (e.g. an earlier demo's)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    p.set_defaults(func=run)


def comparison_table(results: list[RunResult]) -> Table:
    from rich.table import Table

    metrics = list(results[0].metrics["test"])
    table = Table(title="vflink demo: test metrics (7:1:2 split, early stopping on validation)")
    table.add_column("algorithm", style="bold")
    for m in metrics:
        table.add_column(m, justify="right")
    table.add_column("best epoch", justify="right")
    table.add_column("MB exchanged", justify="right")
    table.add_column("seconds", justify="right")
    for r in results:
        mb = sum(v["bytes"] for v in r.communication.values()) / 1e6
        table.add_row(r.algorithm, *(f"{r.metrics['test'][m]:.4f}" for m in metrics),
                      str(r.best_epoch), f"{mb:.1f}", f"{r.seconds:.1f}")
    return table


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from vflink.cli._outputs import refuse_existing
    from vflink.cli._progress import epoch_progress
    from vflink.runfiles.config import load_config
    from vflink.runfiles.inputs import load_inputs
    from vflink.runfiles.rundir import atomic_run_dir, write_json
    from vflink.runner.train import run_training

    refuse_existing(args.out, overwrite=args.overwrite, what="run directory")
    config = load_config(args.config) if args.config else demo_config(args.seed)
    console = Console()
    start = time.perf_counter()
    tables = load_inputs(config)
    primary, secondaries = tables.primary, tables.secondaries
    console.print(f"dataset: primary {primary.name!r} {len(primary)} rows × "
                  f"{len(primary.schema.features)} features; "
                  + ", ".join(f"secondary {t.name!r} {len(t)} rows × {len(t.schema.features)} "
                              "features" for t in secondaries))
    results = []
    with atomic_run_dir(args.out, overwrite=args.overwrite) as staging:
        for algorithm in ("solo", "splitnn", "combine"):
            cfg = config.replace(algorithm=algorithm)
            with epoch_progress(f"{algorithm:8s}", console) as progress:
                results.append(run_training(cfg, staging / algorithm, progress=progress,
                                            tables=tables))
        write_json(staging / "comparison.json", {
            "dataset": config.data.dataset,
            "headline_metric": results[0].headline,
            "test": {r.algorithm: r.metrics["test"] for r in results},
            "seconds": time.perf_counter() - start,
        })
    console.print(comparison_table(results))
    console.print(f"run directory: {args.out}  ({time.perf_counter() - start:.1f} s in all)")
    return 0
