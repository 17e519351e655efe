"""``vflink`` command line: one module per command, each registering its own sub-parser."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from rich.console import Console
from rich.logging import RichHandler
from rich.markup import escape

from vflink import __version__
from vflink.cli import align as align_cmd
from vflink.cli import certs, demo, experiment, link, predict, serve, train
from vflink.errors import ConfigError, VflinkError

__all__ = ["main"]

COMMANDS = (train, link, experiment, predict, demo, serve, certs, align_cmd)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vflink",
        description="Vertical federated learning across organisations whose records do not "
                    "share a clean key: private record linkage (exact keyed hashes, fuzzy top-K "
                    "soft linkage) and split learning (SplitNN, FedSim and baselines) across a "
                    "real party boundary, in one process or over gRPC with mutual TLS.",
        epilog="Run `vflink COMMAND --help` for the options of a command.",
    )
    parser.add_argument("--version", action="version", version=f"vflink {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="more log output (-v: info, -vv: debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in COMMANDS:
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    err = Console(stderr=True)
    level = {0: logging.WARNING, 1: logging.INFO}.get(args.verbose, logging.DEBUG)
    logging.basicConfig(level=level, format="%(message)s",
                        handlers=[RichHandler(console=err, show_path=False)])
    try:
        code = int(args.func(args) or 0)
    except ConfigError as exc:
        err.print(f"[bold red]configuration error:[/] {escape(str(exc))}", highlight=False)
        return 2
    except VflinkError as exc:
        err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)
        return 1
    except KeyboardInterrupt:
        err.print("[yellow]interrupted[/]")
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
