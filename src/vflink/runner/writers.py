"""The write stage of a run: ``WRITERS``, each putting one part of a run directory in place.

=================  ==========================================================================
``config``         config.json: the resolved run file
``metrics``        metrics.json: the run's result
``ledger``         privacy.json: the privacy ledger (:mod:`vflink.reporting.ledger`)
``link-quality``   the training linkage's quality, where the dataset knows (read by predict)
``learning-curve`` learning_curve.png
=================  ==========================================================================

``RUN_DIRECTORY`` lists what a run directory gets, in order; the writers read the run's
config and result only (the staging directory is :func:`vflink.runner.train.run_training`'s).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from vflink.registry import Registry
from vflink.reporting.ledger import write_run_ledger
from vflink.reporting.link_quality import write_link_quality
from vflink.runfiles.config import RunConfig, config_to_dict
from vflink.runfiles.results import RunResult
from vflink.runfiles.rundir import write_json
from vflink.runner.context import RunContext

__all__ = ["RUN_DIRECTORY", "WRITERS", "write"]

#: ``writer(run_dir, config, result)``: one part of a run directory
Writer = Callable[[Path, RunConfig, RunResult], None]
WRITERS: Registry[Writer] = Registry("run-directory writer")


@WRITERS.register("config")
def _write_config(run_dir: Path, config: RunConfig, result: RunResult) -> None:
    write_json(run_dir / "config.json", config_to_dict(config))


@WRITERS.register("metrics")
def _write_metrics(run_dir: Path, config: RunConfig, result: RunResult) -> None:
    write_json(run_dir / "metrics.json", result.to_json())


@WRITERS.register("ledger")
def _write_ledger(run_dir: Path, config: RunConfig, result: RunResult) -> None:
    write_run_ledger(run_dir, result)


@WRITERS.register("link-quality")
def _write_link_quality(run_dir: Path, config: RunConfig, result: RunResult) -> None:
    if "link_quality" in result.extra:  # read by `vflink predict`
        write_link_quality(run_dir, result.extra["link_quality"])


@WRITERS.register("learning-curve")
def _write_learning_curve(run_dir: Path, config: RunConfig, result: RunResult) -> None:
    from vflink.reporting.plots import learning_curve  # matplotlib only when writing

    learning_curve(result, run_dir / "learning_curve.png")


#: what a run directory gets, in order
RUN_DIRECTORY = ("config", "metrics", "ledger", "link-quality", "learning-curve")


def write(ctx: RunContext) -> RunContext:
    """The write stage: every writer of ``RUN_DIRECTORY`` into the (staging) run directory."""
    if ctx.out_dir is not None and ctx.result is not None:
        for name in RUN_DIRECTORY:
            WRITERS.get(name)(ctx.out_dir, ctx.config, ctx.result)
    return ctx
