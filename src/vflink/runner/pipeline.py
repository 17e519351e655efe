"""A run as a pipeline of stages: load → align → plan → train → evaluate → write.

Every stage has one signature, ``stage(ctx: RunContext) -> RunContext``, and
:func:`build_pipeline` chooses what each does from registries by the config, before any stage
runs (so an unknown name fails first):

* the **alignment method** (``ALIGNMENTS`` in :mod:`vflink.runner.prepare`: exact, soft,
  fields, psi, psu) by ``alignment.method`` (``fields`` when a soft alignment names
  ``[[alignment.fields]]``);
* the **training plan** (``PLANS`` in :mod:`vflink.runner.plans`: the SplitNN family, the
  FedSim family, Solo / Combine at the primary, FLORIST union training) by the plan the
  alignment method fixes (psu: ``union``) or else the algorithm's kind;
* the **protections** (``PROTECTIONS`` in :mod:`vflink.runner.protections`: similarity noise,
  embedding DP) the config turns on; the align and plan stages add their settings to what
  they send the parties, and the evaluate stage collects their reports;
* the **writers** of a run directory (``WRITERS`` in :mod:`vflink.runner.writers`).

The pipeline calls parties through the plan's trainee; it never checks a protocol's state
itself. Stage modules call down (plans, loop, parties), never back up into this module.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from vflink.runfiles.config import RunConfig
from vflink.runfiles.inputs import load_inputs
from vflink.runner.context import AlignmentMethod, Plan, RunContext
from vflink.runner.loop import CHECKPOINT, train_and_evaluate
from vflink.runner.plans import PLANS, plan_name
from vflink.runner.prepare import ALIGNMENTS, method_name
from vflink.runner.protections import Protection, chosen
from vflink.runner.resume import check_resume, run_fingerprint
from vflink.runner.writers import write

__all__ = ["STAGES", "Pipeline", "Stage", "build_pipeline", "run_pipeline"]

class Stage(Protocol):
    def __call__(self, ctx: RunContext) -> RunContext: ...


def load(ctx: RunContext) -> RunContext:
    """The parties' tables (given, or those the run file names); a resume check first."""
    if ctx.prepared is not None:
        ctx.inputs = ctx.prepared.inputs
        return ctx
    ctx.inputs = ctx.tables if ctx.tables is not None else load_inputs(ctx.config)
    if ctx.resume and ctx.models_dir is not None and ctx.plan.checkpoints:
        # before any alignment work
        check_resume(ctx.config, ctx.models_dir / ctx.inputs.primary.name, ctx.inputs.primary,
                     CHECKPOINT)
    return ctx


def align(ctx: RunContext) -> RunContext:
    """The alignment method's stage (``ALIGNMENTS``), unless the caller gave an alignment."""
    if ctx.prepared is None:
        ctx.prepared = ctx.method.stage(ctx)
    return ctx


def plan(ctx: RunContext) -> RunContext:
    """The training plan (``PLANS``) builds the trainee: parties, splits, batch size."""
    ctx.plan.build(ctx)
    return ctx


def train(ctx: RunContext) -> RunContext:
    """The one training loop (:func:`vflink.runner.loop.train_and_evaluate`) for every plan."""
    if ctx.trainee is None or ctx.counter is None or ctx.inputs is None:
        raise RuntimeError("the plan stage did not build a trainee")  # pragma: no cover
    accounting: dict[str, Any] = {}
    checkpoints = ctx.out_dir is not None and ctx.plan.checkpoints
    ctx.metrics, ctx.history, ctx.best_epoch = train_and_evaluate(
        ctx.trainee, ctx.config, ctx.splits, ctx.counter, batch_size=ctx.batch_size,
        progress=ctx.progress, checkpoints=checkpoints, state_prefix=ctx.state_prefix,
        resume=ctx.resume,
        fingerprint=run_fingerprint(ctx.config, ctx.inputs.primary) if checkpoints else None,
        accounting=accounting)
    ctx.communication = accounting["communication"]
    return ctx


def evaluate(ctx: RunContext) -> RunContext:
    """The plan's evaluations (task metrics are the loop's; then truth, attacks, figures)."""
    ctx.result = ctx.plan.evaluate(ctx)
    return ctx


@dataclass(frozen=True)
class Pipeline:
    """What :func:`build_pipeline` chose for a run: one entry of each registry, the stages."""

    method: AlignmentMethod
    plan: Plan
    protections: tuple[Protection, ...]
    stages: Sequence[Stage]


def build_pipeline(config: RunConfig) -> Pipeline:
    """The alignment method, the training plan, the protections and the stages of a run of
    ``config``."""
    method = ALIGNMENTS.get(method_name(config.alignment))
    training = PLANS.get(method.plan or plan_name(config))
    training.check(config)
    return Pipeline(method, training, chosen(config), STAGES)


#: The stages of every run, in order
STAGES: tuple[Stage, ...] = (load, align, plan, train, evaluate, write)


def run_pipeline(ctx: RunContext, stages: Sequence[Stage]) -> RunContext:
    for stage in stages:
        ctx = stage(ctx)
    return ctx
