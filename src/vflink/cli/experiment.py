"""``vflink experiment --config exp.toml``: algorithms × seeds (× a swept parameter)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

__all__ = ["register", "run"]

HELP = """Run a reproduction experiment: every algorithm × seed (× value of one swept
parameter, e.g. the identifier noise σ_cf of FedSim Figure 5) on one dataset. Each (value, seed)
is linked once and all algorithms train on that alignment and split. Writes results.json (every
run and mean ± std), results.md (tables), plot.png and config.json into the output directory.
Example files: examples/experiments/*.toml.
"""


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "experiment", help="algorithms × seeds (× sweep) with mean ± std tables",
        description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, type=Path, help="experiment TOML file")
    p.add_argument("--out", type=Path, default=None,
                   help="output directory (default: runs/<experiment name>)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing directory")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.markdown import Markdown
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    from vflink.experiments.grid import run_experiment
    from vflink.reporting.experiment import markdown_table
    from vflink.runfiles.experiment import load_experiment

    exp = load_experiment(args.config)
    out = args.out or Path("runs") / exp.name
    console = Console()
    total = len(exp.configs) * len(exp.seeds) * len(exp.algorithms)
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console) as bar:
        task = bar.add_task(exp.name, total=total)

        def update(done: int, total: int, label: str) -> None:
            bar.update(task, completed=done, description=f"{exp.name}: {label}")

        results = run_experiment(exp, out, overwrite=args.overwrite, progress=update)
    console.print(Markdown(markdown_table(results)))
    console.print(f"results: {out}/results.md, results.json, plot.png")
    return 0
