"""Runner: build parties from a config, run them, write run directories."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vflink.runfiles.config import RunConfig, load_config, parse_config
    from vflink.runfiles.results import RunResult
    from vflink.runner.train import run_training

__all__ = ["RunConfig", "RunResult", "load_config", "parse_config", "run_training"]

# Imported on first use (PEP 562): `vflink.runfiles.algorithms` and friends must stay importable
# without torch, for a fast `vflink --help`.
_LAZY = {"RunConfig": "vflink.runfiles.config", "load_config": "vflink.runfiles.config",
         "parse_config": "vflink.runfiles.config", "RunResult": "vflink.runfiles.results",
         "run_training": "vflink.runner.train"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'vflink.runner' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
