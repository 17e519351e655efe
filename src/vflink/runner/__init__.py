"""Orchestration: a run as a pipeline of stages, and the commands' orchestration.

What it holds: the run pipeline (``train.run_training`` → ``pipeline``: load → align → plan →
train → evaluate → write), its registries (``prepare.ALIGNMENTS``, ``plans.PLANS``,
``protections.PROTECTIONS``, ``evaluation.EVALUATIONS``, ``writers.WRITERS``), the one
training loop (``loop``), where the parties live (``federation``, ``network``, ``local``), and
the link pipeline of ``vflink link`` and ``vflink.link`` (``link/``: read → encode → candidates →
compare → model → decide → write → charts, each stage's entry chosen from its registry by the
link's settings; the encodings in ``encoding``, shared with a run's alignment stage), and the
orchestration of ``align``, ``predict`` and ``attack``. A new alignment method, training plan
or protection is a registry entry plus a party-side hook (docs/architecture.md), never a branch
here.

What it may import: run files (``vflink.runfiles``), reporting (``vflink.reporting``), the
transport, parties and everything below. Experiments, the API and the CLI import it; it never
imports them. Stage modules call down, never back up into the pipeline.
"""

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
