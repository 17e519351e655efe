"""Runner: build parties from a config, run them, write run directories."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vflink.runner.config import RunConfig, load_config, parse_config
    from vflink.runner.train import RunResult, run_training

__all__ = ["RunConfig", "RunResult", "load_config", "parse_config", "run_training"]

# Imported on first use (PEP 562): `vflink.runner.algorithms` and friends must stay importable
# without torch, for a fast `vflink --help`.
_LAZY = {"RunConfig": "vflink.runner.config", "load_config": "vflink.runner.config",
         "parse_config": "vflink.runner.config", "RunResult": "vflink.runner.train",
         "run_training": "vflink.runner.train"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'vflink.runner' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
