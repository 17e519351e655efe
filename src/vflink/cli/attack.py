"""``vflink attack``: run an attack against a finished run; ``--list`` shows the attacks."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from vflink.errors import ConfigError

__all__ = ["register", "run"]

HELP = """Measure what an honest-but-curious party could still learn from a finished run.

The attack reads what one party recorded of what it received (the run must have been made with
[evaluation] record = true), is scored against the run's evaluation-only ground truth, and its
result is appended to the run's privacy ledger (privacy.json). `--list` shows every attack.
"""


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "attack", help="run a privacy attack against a finished run", description=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", type=Path, default=None, help="run directory from `vflink train`")
    p.add_argument("--attack", default=None, help="attack name (see --list)")
    p.add_argument("--party", default=None,
                   help="the attacking party (default: the first party of the attack's role)")
    p.add_argument("--out", type=Path, default=None,
                   help="also write the result as JSON into this directory "
                        "(ATTACK-PARTY.json)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing ATTACK-PARTY.json in --out")
    p.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                   help="an attack parameter (VALUE parsed as JSON when possible); repeatable")
    p.add_argument("--truth", type=Path, default=None,
                   help="run directory holding the ground truth and the ledger, when --run is "
                        "one party's own state directory (runs across hosts)")
    p.add_argument("--list", action="store_true", help="list the attacks, one line each")
    p.add_argument("--config", type=Path, default=None,
                   help="accepted for symmetry; the run directory's own files are used")
    p.set_defaults(func=run)


def _params(items: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--param must be KEY=VALUE, got {item!r}")
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value
        if isinstance(out[key], list):
            out[key] = tuple(out[key])
    return out


def run(args: argparse.Namespace) -> int:
    from vflink.runner.attack import attack_lines, run_attack  # heavy imports only when used

    console = Console()
    if args.list:
        for name, role, summary in attack_lines():
            console.print(f"{name:<20} ({role}) {escape(summary)}", highlight=False,
                          soft_wrap=True)  # one line per attack, whatever the terminal width
        return 0
    if args.run is None or args.attack is None:
        raise ConfigError("give --run RUN_DIR and --attack NAME (or --list)")
    result = run_attack(args.run, args.attack, party=args.party, params=_params(args.param),
                        out=args.out, truth_dir=args.truth, overwrite=args.overwrite)
    table = Table(title=f"{result.attack} by {result.party}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in result.metrics.items():
        table.add_row(key, f"{value:.6g}")
    console.print(table)
    console.print(escape(result.explanation), highlight=False)
    console.print(f"appended to {(args.truth or args.run) / 'privacy.json'}", highlight=False)
    return 0
