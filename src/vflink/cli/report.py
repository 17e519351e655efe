"""``vflink report RUN_DIR``: one self-contained offline HTML page for a run or experiment."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rich.console import Console

__all__ = ["register", "run"]

HELP = """Write one self-contained HTML page (no external URL, figures inlined) for a run
directory (configuration, learning curve, metrics, soft-linkage figures, communication, privacy
ledger, attack results) or an experiment directory (its tables and plot).
"""


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "report", help="an offline HTML page for a run or an experiment", description=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("directory", type=Path, help="run directory or experiment directory")
    p.add_argument("--out", type=Path, default=None,
                   help="HTML file to write (default: DIRECTORY/report.html)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing HTML file")
    p.add_argument("--config", type=Path, default=None,
                   help="accepted for symmetry; the directory's own files are used")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from vflink.cli._outputs import refuse_existing
    from vflink.reporting.report import write_report  # matplotlib only when used

    target = args.out if args.out is not None else args.directory / "report.html"
    if args.directory.is_dir():  # a missing directory gets write_report's own message
        refuse_existing(target, overwrite=args.overwrite)
    path = write_report(args.directory, args.out)
    Console().print(f"wrote {path}", highlight=False)
    return 0
