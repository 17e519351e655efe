"""``vflink certs --out DIR --parties primary,bank,coordinator``: development certificates."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

__all__ = ["register", "run"]

HELP = """Create a development CA and one TLS key/certificate pair per party, for the gRPC
transport's mutual TLS.

DIR receives ca.pem and ca.key (the CA) and <party>.pem / <party>.key for each party (key
files are readable by their owner only). Each certificate names its party as common name and
DNS subject alternative name; peers accept a call only from a certificate of this CA whose party
is allowed, and a client only talks to a server whose certificate names the expected peer.

Give every party its own <party>.key and a copy of ca.pem; keep ca.key away from all of them.
For real deployments, have the certificates issued by a CA the organisations agree on.
"""


def _party_list(text: str) -> list[str]:
    names = [p.strip() for p in text.split(",")]
    if not all(names):
        raise argparse.ArgumentTypeError(f"expected comma-separated party names, got {text!r}")
    return names


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "certs", help="create a development CA and per-party TLS certificates", description=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, type=Path, metavar="DIR",
                   help="directory to write the files to")
    p.add_argument("--parties", required=True, type=_party_list,
                   help="comma-separated party names, e.g. primary,bank,coordinator")
    p.add_argument("--days", type=int, default=365, help="validity in days (default: 365)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace existing CA and party files (a new CA: reissue every party)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from vflink.errors import ConfigError
    from vflink.transport.grpc.tls import create_dev_pki

    if args.days < 1:
        raise ConfigError(f"`--days` must be >= 1, got {args.days}")
    written = create_dev_pki(args.out, args.parties, days=args.days, overwrite=args.overwrite)
    console = Console()
    for path in written:
        note = " (private key, mode 0600)" if path.suffix == ".key" else ""
        console.print(f"wrote {path}{note}", highlight=False)
    console.print(f"[bold]{len(args.parties)}[/] party certificate(s) valid for {args.days} "
                  f"day(s), signed by the development CA in {args.out}", highlight=False)
    return 0
