"""Runner: build parties from a config, run them, write run directories."""

from __future__ import annotations

from vflink.runner.config import RunConfig, load_config, parse_config
from vflink.runner.train import RunResult, run_training

__all__ = ["RunConfig", "RunResult", "load_config", "parse_config", "run_training"]
