"""``vflink train --config run.toml``: one training run, written to a run directory."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vflink.runfiles.algorithms import ALGORITHMS as ALGORITHM_REGISTRY

if TYPE_CHECKING:  # heavy modules are imported in run(), so `--help` is instant
    from rich.console import Console

    from vflink.runfiles.results import RunResult

from vflink.cli._compute import add_compute_args, with_compute_args

__all__ = ["register", "run"]

ALGORITHMS = ALGORITHM_REGISTRY.names()

HELP = """Train one algorithm as configured in a TOML run file (`algorithm`, or --algorithm):

""" + "\n".join(f"  {name:18s} {ALGORITHM_REGISTRY.get(name).description}"
               for name in ALGORITHMS) + """

The run directory receives the resolved config (config.json), metrics.json (per split, per
epoch, communication bytes per direction), privacy.json, learning_curve.png and each party's
saved model in models/<party>/ (model.json + model.<digest>.safetensors: no pickle).
It appears only when the run has finished: a failed run leaves nothing that looks complete
(only a hidden .<name>.partial with checkpoints, for --resume).
"""


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "train", help="train one algorithm from a TOML run file", description=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, type=Path,
                   help="TOML run file (see docs/reference/run-file.md)")
    p.add_argument("--out", type=Path, default=None,
                   help="run directory to create (default: runs/<config name>-<algorithm>)")
    p.add_argument("--algorithm", choices=ALGORITHMS, default=None,
                   help="override the file's `algorithm`")
    p.add_argument("--seed", type=int, default=None, help="override the file's `seed`")
    p.add_argument("--overwrite", action="store_true", help="replace an existing run directory")
    p.add_argument("--party", type=Path, default=None,
                   help="the primary's party file: run against secondaries and a coordinator "
                   "served elsewhere (`vflink serve`) over gRPC with mutual TLS")
    add_compute_args(p)
    p.add_argument("--resume", action="store_true",
                   help="continue an interrupted run from its last epoch checkpoint")
    p.set_defaults(func=run)


def summarise(result: RunResult, console: Console) -> None:
    metric = result.headline
    test = result.metrics["test"]
    others = ", ".join(f"{k} {v:.4f}" for k, v in test.items() if k != metric)
    total = sum(v["bytes"] for v in result.communication.values())
    console.print(f"[bold]{result.algorithm}[/]: test {metric} [bold]{test[metric]:.4f}[/] "
                  f"({others}); best epoch {result.best_epoch}; {total / 1e6:.1f} MB exchanged; "
                  f"{result.seconds:.1f} s")
    decision = result.extra.get("decision")
    if decision:  # a binary task: the threshold chosen on validation, and the test at it
        t = decision["test"]
        console.print(f"decision threshold {decision['threshold']:.4g} (chosen on validation: "
                      f"{decision['criterion']}): test precision {t['precision']:.4f}, recall "
                      f"{t['recall']:.4f}, F1 {t['f1']:.4f}, {t['predicted_positive']:.1%} "
                      "predicted positive", highlight=False)
    from vflink.reporting.ledger import privacy_summary

    line = privacy_summary(result)
    if line:
        console.print(line, highlight=False, markup=False)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from vflink.api import train
    from vflink.cli._progress import epoch_progress
    from vflink.runfiles.config import load_config
    from vflink.runfiles.party import load_party_config
    from vflink.runfiles.rundir import check_run_dir

    config = load_config(args.config)
    changes: dict[str, Any] = {}
    if args.algorithm:
        changes["algorithm"] = args.algorithm
    if args.seed is not None:
        changes["seed"] = args.seed
    if args.party is not None:  # the primary's own [compute], from its party file
        party_file = load_party_config(args.party)
        party_compute = party_file.compute
        if party_compute != type(party_compute)():
            changes["compute"] = party_compute
        if party_file.training is not None:  # and its own [training]
            changes["training"] = dataclasses.replace(
                config.training, device=party_file.training.device,
                feature_store=party_file.training.feature_store)
    if changes:
        config = config.replace(**changes)
    config = with_compute_args(config, args)
    out = args.out or Path("runs") / f"{args.config.stem}-{config.algorithm}"
    check_run_dir(out, overwrite=args.overwrite, resume=args.resume)  # before any work
    console = Console()
    with epoch_progress(f"training {config.algorithm}", console) as progress:
        run_ = train(config, out=out, overwrite=args.overwrite, resume=args.resume,
                     party=args.party, progress=progress)
    if run_.result is not None:
        summarise(run_.result, console)
    console.print(f"run directory: {out}")
    return 0
