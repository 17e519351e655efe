"""What the stages of a run hand each other, and what a registry entry must provide.

:class:`RunContext` travels through the stages (:mod:`vflink.runner.pipeline`);
:class:`Prepared` is the alignment stage's output (the aligned inputs), which experiments also
reuse across algorithms. :class:`AlignmentMethod` and :class:`Plan` are the shapes of the
entries of the ``ALIGNMENTS`` and ``PLANS`` registries. No stage logic here.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import numpy.typing as npt

from vflink.runfiles.config import RunConfig
from vflink.runfiles.inputs import Inputs
from vflink.runfiles.results import EpochRecord, RunResult
from vflink.runner.federation import Federation
from vflink.runner.loop import Progress, Trainee
from vflink.runner.protections import Protection
from vflink.transport import TrafficCounter, Transcript
from vflink.types import Alignment

if TYPE_CHECKING:
    from vflink.parties import PrimaryParty

__all__ = ["AfterTraining", "AlignmentMethod", "Plan", "Prepared", "RunContext"]


@dataclass(frozen=True)
class Prepared:
    """Inputs plus the alignments each kind of algorithm consumes.

    ``alignments[kind][secondary]`` with kind ``"base"`` (top-1 of the configured alignment),
    ``"top1"``, ``"topk"`` or ``"exact"``; ``sessions[kind]`` names the coordinator session a
    secondary fetches its view of that alignment from; ``rows`` are the primary rows every
    algorithm trains and is evaluated on, so their metrics are comparable.
    """

    inputs: Inputs
    alignments: dict[str, dict[str, Alignment]]
    sessions: dict[str, str]
    rows: npt.NDArray[np.int64]
    communication: dict[str, dict[str, int]]
    federation: Federation | None = None
    summary: dict[str, Any] = field(default_factory=dict)


#: ``after_training(primary, (train, validation, test))`` on the trained parties.
AfterTraining = Callable[["PrimaryParty", tuple[npt.NDArray[np.int64], ...]], None]


@dataclass
class RunContext:
    """What a run's stages hand each other: the config and options, then each stage's output."""

    config: RunConfig
    method: AlignmentMethod
    plan: Plan
    out_dir: Path | None = None
    progress: Progress | None = None
    transcript: Transcript | None = None
    tables: Inputs | None = None
    federation: Federation | None = None
    prepared: Prepared | None = None
    resume: bool = False
    after_training: AfterTraining | None = None
    #: the protections the config turns on (``PROTECTIONS``, chosen by the pipeline)
    protections: tuple[Protection, ...] = ()
    start: float = field(default_factory=time.perf_counter)
    # load
    inputs: Inputs | None = None
    # plan
    trainee: Trainee | None = None
    counter: TrafficCounter | None = None
    splits: tuple[npt.NDArray[np.int64], ...] = ()
    batch_size: int = 0
    state_prefix: str = ""
    state: dict[str, Any] = field(default_factory=dict)  # the plan's own hand-offs
    # train
    metrics: dict[str, dict[str, float]] = field(default_factory=dict)
    history: tuple[EpochRecord, ...] = ()
    best_epoch: int = 0
    communication: dict[str, dict[str, int]] = field(default_factory=dict)
    # evaluate
    result: RunResult | None = None

    @property
    def models_dir(self) -> Path | None:
        return None if self.out_dir is None else self.out_dir / "models"


@dataclass(frozen=True)
class AlignmentMethod:
    """An entry of ``ALIGNMENTS``: how one ``alignment.method`` aligns the parties.

    ``prepare(config, inputs, federation, needs=..., scale=..., encoding=...)`` aligns through
    an existing federation (what :func:`vflink.runner.prepare.prepare` calls, e.g. for an
    experiment that reuses one alignment for every algorithm); ``stage(ctx)`` is the align
    stage of a run (it may build the federation first). ``plan`` names the training plan the
    method fixes (psu: ``"union"``), or ``None`` for the algorithm's own.
    """

    name: str
    prepare: Callable[..., Prepared]
    stage: Callable[[RunContext], Prepared]
    plan: str | None = None


class Plan(Protocol):
    """An entry of ``PLANS``: how one family of algorithms trains and is evaluated.

    ``check(config)`` resolves the plan's names before any stage runs; ``build(ctx)`` (the plan
    stage) sets ``ctx.trainee``, ``ctx.counter``, ``ctx.splits``, ``ctx.batch_size`` and
    ``ctx.state_prefix``; ``evaluate(ctx)`` (the evaluate stage) returns the run's result.
    ``checkpoints``: whether its parties write states a run can resume from.
    """

    @property
    def checkpoints(self) -> bool: ...

    def check(self, config: RunConfig) -> None: ...

    def build(self, ctx: RunContext) -> None: ...

    def evaluate(self, ctx: RunContext) -> RunResult: ...
