"""A run's result records: what ``metrics.json`` in a run directory holds.

Plain data (no party, transport or torch code), so that reporting, experiments and the API may
read them: :class:`RunResult` for one trained algorithm, :class:`EpochRecord` for one epoch of
its history. The pipeline (:mod:`vflink.runner`) builds them; ``RunResult.to_json`` is the
``metrics.json`` format.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vflink._typed import ANY, Int, ListOf, MapOf, Num, Obj, Opt, Str
from vflink.metrics.functional import primary_metric
from vflink.types import Task

__all__ = ["METRICS_SCHEMA", "EpochRecord", "FloristResult", "RunResult"]

_COUNTS = MapOf(MapOf(Num()))  # "bank->primary": {"messages": 3, "bytes": 1024}

#: What readers of ``metrics.json`` (reports, the Python API, ``vflink predict``) rely on, as
#: :meth:`RunResult.to_json` writes it: checked before use (:mod:`vflink._typed`), so a run
#: directory from elsewhere with a wrong type is refused naming the file and the key. Keys
#: not named here (a plan's extras) are left as they are.
METRICS_SCHEMA = Obj(
    required={"algorithm": Str()},
    optional={
        "task": Str(), "headline_metric": Str(),
        "metrics": MapOf(MapOf(Opt(Num()))),
        "best_epoch": Opt(Int()),
        "epochs": ListOf(Obj(optional={
            "epoch": Int(), "train_loss": Opt(Num()), "validation": MapOf(Opt(Num())),
            "communication": _COUNTS, "seconds": Opt(Num())})),
        "communication_total": _COUNTS,
        "sizes": MapOf(Opt(Num())),
        "seconds": Opt(Num()),
        "alignment": Obj(optional={"method": Str(), "communication": _COUNTS}),
        "linkage_figures": ANY,
    })


@dataclass(frozen=True)
class EpochRecord:
    epoch: int
    train_loss: float
    validation: dict[str, float]
    communication: dict[str, dict[str, int]]
    seconds: float


@dataclass(frozen=True)
class RunResult:
    algorithm: str
    task: Task
    metrics: dict[str, dict[str, float]]
    history: tuple[EpochRecord, ...]
    best_epoch: int
    communication: dict[str, dict[str, int]]
    sizes: dict[str, int]
    seconds: float
    out_dir: Path | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def headline(self) -> str:
        return primary_metric(self.task)

    def to_json(self) -> dict[str, Any]:
        return {
            "algorithm": self.algorithm,
            "task": self.task.value,
            "headline_metric": self.headline,
            "metrics": self.metrics,
            "best_epoch": self.best_epoch,
            "epochs": [
                {"epoch": r.epoch, "train_loss": r.train_loss, "validation": r.validation,
                 "communication": r.communication, "seconds": r.seconds}
                for r in self.history
            ],
            "communication_total": self.communication,
            "sizes": self.sizes,
            "seconds": self.seconds,
            **self.extra,
        }


@dataclass(frozen=True)
class FloristResult(RunResult):
    """A union-training run: AUC is the headline (the data are imbalanced, FLORIST §3)."""

    @property
    def headline(self) -> str:
        return "auc"
