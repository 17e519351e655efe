"""``vflink serve --config party.toml``: run a secondary party or the coordinator as a service."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from vflink.cli._compute import add_compute_args, with_compute_args

__all__ = ["register", "run"]

HELP = """Serve one party (a secondary data party or the linkage coordinator) over gRPC with
mutual TLS until interrupted (Ctrl-C or SIGTERM). The party file names the party, its data, its
listen address, the peers it calls, its certificates and which peers may call it. The primary
then drives alignment and training against it with `vflink train --config run.toml --party
primary.toml`. See docs/how-to/separate-hosts.md ("Parties on separate hosts").
"""


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "serve", help="serve a secondary party or the coordinator over gRPC",
        description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, type=Path, help="the party's TOML file")
    add_compute_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # TLS handshakes that fail (a certificate from another CA, no certificate, plaintext) end
    # inside gRPC's C core before any Python code runs; at INFO its log names each refusal.
    # The core writes that log to descriptor 2 in its own format: routed through logging
    # (vflink.cli._grpc_log) from before gRPC loads, so vflink's messages come first and alone.
    os.environ.setdefault("GRPC_VERBOSITY", "INFO")
    from vflink.cli._grpc_log import route_grpc_core_log

    with route_grpc_core_log():
        return _serve(args)


def _serve(args: argparse.Namespace) -> int:
    from rich.console import Console

    from vflink.runfiles.party import load_party_config
    from vflink.runner.network import serve

    config = with_compute_args(load_party_config(args.config), args)
    console = Console(stderr=True)

    def ready(address: str) -> None:
        security = "plaintext (insecure)" if config.insecure else "mutual TLS"
        console.print(f"[bold]{config.name}[/] ({config.role}) serving on {address} with "
                      f"{security}; accepting calls from: {', '.join(config.allowed) or 'nobody'}"
                      "; Ctrl-C to stop", highlight=False)
        if config.role == "secondary":  # what its PSU/PSI answers can reveal (security.md)
            console.print(f"dictionary limit per peer: "
                          f"{config.policy.describe_dictionary_limit()}", highlight=False,
                          soft_wrap=True)

    serve(config, on_ready=ready)
    console.print(f"{config.name} stopped")
    return 0
