"""The training entry point: :func:`run_training` builds a run's pipeline from its config,
runs it, and writes the run directory.

The stages (:mod:`vflink.runner.pipeline`: load → align → plan → train → evaluate → write)
are chosen from registries by the config; the write stage's writers (``WRITERS``,
:mod:`vflink.runner.writers`) put the run directory in place, which this module stages and
renames atomically. An experiment reuses one alignment (``prepared``, from
:func:`vflink.runner.prepare.prepare`) for every algorithm of a seed, since linkage does not
depend on the algorithm.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from vflink.data.table import PartyTable
from vflink.errors import ConfigError
from vflink.runfiles.config import RunConfig
from vflink.runfiles.inputs import Inputs
from vflink.runfiles.results import RunResult
from vflink.runfiles.rundir import atomic_run_dir
from vflink.runner.compute import run_compute
from vflink.runner.context import AfterTraining, Prepared, RunContext
from vflink.runner.federation import Federation
from vflink.runner.loop import CHECKPOINT, Progress
from vflink.runner.pipeline import build_pipeline, run_pipeline
from vflink.runner.prepare import as_inputs
from vflink.transport import Transcript

__all__ = ["run_training"]

log = logging.getLogger(__name__)

def run_training(config: RunConfig, out_dir: Path | None = None, *, overwrite: bool = False,
                 progress: Progress | None = None, transcript: Transcript | None = None,
                 tables: Inputs | tuple[PartyTable, Sequence[PartyTable]] | None = None,
                 prepared: Prepared | None = None, federation: Federation | None = None,
                 resume: bool = False, after_training: AfterTraining | None = None
                 ) -> RunResult:
    """Run one algorithm end to end; write a run directory if ``out_dir``.

    Without a ``federation`` (or a ``prepared`` alignment that carries one) every party is
    built in this process. With ``out_dir`` every party checkpoints at epoch boundaries into
    its own state directory; ``resume`` continues an interrupted run from its checkpoints.
    ``after_training(primary, splits)`` runs on the trained parties before the result is
    built (e.g. attacks that query the model; :mod:`vflink.experiments.afe`).
    """
    torch.set_num_threads(config.training.threads)
    with run_compute(config.compute):  # [compute]: this run's chunked stages
        options: dict[str, Any] = {"progress": progress, "transcript": transcript,
                   "tables": None if tables is None else as_inputs(tables),
                   "prepared": prepared, "federation": federation,
                   "after_training": after_training}
        if out_dir is None:
            if resume:
                raise ConfigError("--resume needs the run directory of the interrupted run")
            return _run(config, None, False, options)
        with atomic_run_dir(out_dir, overwrite=overwrite, resume=resume,
                            keep_if=lambda d: any(d.glob(f"models/*/{CHECKPOINT}.json"))
                            ) as staging:
            result = _run(config, staging, resume, options)
        return RunResult(**{**result.__dict__, "out_dir": Path(out_dir)})


def _run(config: RunConfig, out_dir: Path | None, resume: bool, options: Mapping[str, Any]
         ) -> RunResult:
    pipeline = build_pipeline(config)
    ctx = RunContext(config=config, method=pipeline.method, plan=pipeline.plan,
                     protections=pipeline.protections, out_dir=out_dir, resume=resume,
                     **options)
    ctx = run_pipeline(ctx, pipeline.stages)
    if ctx.result is None:  # pragma: no cover - the evaluate stage ran
        raise ConfigError("the run produced no result")
    return ctx.result
