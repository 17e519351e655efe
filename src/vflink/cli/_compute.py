"""``--engine`` / ``--address``: where a command's chunked stages run
(docs/how-to/scale-out.md).

Kept free of heavy imports: ``vflink --help`` builds every parser."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any, TypeVar

__all__ = ["add_compute_args", "compute_from_args", "with_compute_args"]

T = TypeVar("T")


def add_compute_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("compute engine (this party's own; never sent to a peer)")
    g.add_argument("--engine", choices=("local", "ray"), default=None,
                   help="where the heavy stages run: local (default: this process) or ray "
                        "(needs `pip install 'vflink[ray]'`); overrides [compute] engine")
    g.add_argument("--address", default=None,
                   help="the Ray cluster: local (start one here, the default), auto, or the "
                        "head's host:port; implies --engine ray; overrides [compute] address")


def compute_from_args(args: argparse.Namespace, base: Any = None) -> Any:
    """``base`` (a ``ComputeConfig``, default the defaults) with the flags applied."""
    from vflink.engine import ComputeConfig

    config = base if base is not None else ComputeConfig()
    return config.override(engine=getattr(args, "engine", None),
                           address=getattr(args, "address", None))


def with_compute_args(config: T, args: argparse.Namespace) -> T:
    """A party or run configuration (anything with a ``compute`` field) with the flags
    applied to its ``[compute]``."""
    compute = compute_from_args(args, config.compute)  # type: ignore[attr-defined]
    return dataclasses.replace(config, compute=compute)  # type: ignore[type-var]
