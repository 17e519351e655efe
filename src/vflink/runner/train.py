"""Build parties from a config, align, train with early stopping, evaluate, write a run dir."""

from __future__ import annotations

import logging
import os
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd
import torch

from vflink.data.schema import PartySchema
from vflink.data.split import split_rows
from vflink.data.table import PartyTable, load_table
from vflink.datasets import load_dataset
from vflink.errors import ConfigError
from vflink.metrics.functional import evaluate, higher_is_better, primary_metric
from vflink.models.spec import BottomSpec
from vflink.parties import CoordinatorParty, PrimaryParty, SecondaryParty, TrainingPlan
from vflink.runner.config import RunConfig, config_to_dict
from vflink.runner.rundir import atomic_run_dir, write_json
from vflink.transport import InProcessHub, TrafficCounter, Transcript
from vflink.types import MISSING, Alignment, Task

__all__ = [
    "EpochRecord",
    "Progress",
    "RunResult",
    "combined_table",
    "load_party_tables",
    "run_training",
    "train_and_evaluate",
]

log = logging.getLogger(__name__)

#: ``progress(stage, done, total)``: the CLI renders it as a progress bar.
Progress = Callable[[str, int, int], None]

COORDINATOR = "coordinator"


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


def load_party_tables(config: RunConfig) -> tuple[PartyTable, tuple[PartyTable, ...]]:
    """The primary's and the secondaries' tables, from a built-in dataset or from files."""
    data = config.data
    if data.dataset is not None:
        options = dict(data.options)
        options.setdefault("seed", config.seed)
        ds = load_dataset(data.dataset, **options)
        return ds.primary, tuple(ds.secondaries)
    tables = [load_table(schema) for schema in data.parties]
    primary = next(t for t in tables if t.schema.role == "primary")
    return primary, tuple(t for t in tables if t.schema.role == "secondary")


def _secret(env: str) -> bytes:
    value = os.environ.get(env)
    if value:
        if len(value.encode()) < 16:
            raise ConfigError(f"the secret in ${env} must be at least 16 bytes")
        return value.encode()
    # Every data party lives in this process, so a fresh random secret is as good as a shared
    # one; the coordinator never receives it.
    log.info("$%s is not set: using a random alignment secret for this in-process run", env)
    return secrets.token_bytes(32)


def combined_table(primary: PartyTable, secondaries: Sequence[PartyTable],
                   alignments: dict[str, Alignment]) -> PartyTable:
    """Combine baseline: every party's features joined centrally (a research upper bound).

    Numeric identifiers of the primary are used as features here too: FedSim §6.1 uses the
    common features in training for Combine only.
    """
    frame = primary.frame.copy()
    schema = primary.schema
    numeric = list(schema.numeric)
    numeric += [c for c in schema.identifiers if pd.api.types.is_numeric_dtype(frame[c])
                and c not in numeric]
    categorical = list(schema.categorical)
    n = len(frame)
    new_cols: dict[str, Any] = {}
    for sec in secondaries:
        idx = alignments[sec.name].for_primary_rows(n)[:, 0]
        present = idx != MISSING
        safe = np.where(present, idx, 0)
        for col in (*sec.schema.numeric, *sec.schema.categorical):
            values = sec.frame[col].iloc[safe].reset_index(drop=True)
            name = f"{sec.name}.{col}"
            new_cols[name] = values.where(pd.Series(present), None)
            (numeric if col in sec.schema.numeric else categorical).append(name)
    frame = pd.concat([frame, pd.DataFrame(new_cols)], axis=1)
    combined = PartySchema(name=schema.name, role="primary", numeric=tuple(numeric),
                           categorical=tuple(categorical), label=schema.label, task=schema.task)
    return PartyTable.from_frame(combined, frame, f"combine({primary.source})")


def _plan(config: RunConfig, learn_missing: bool) -> TrainingPlan:
    m, t = config.model, config.training
    bottom = BottomSpec(hidden=m.hidden, out_dim=m.cut_dim, activation=m.activation,
                        dropout=m.dropout, optimizer=t.optimizer, lr=t.lr,
                        weight_decay=t.weight_decay, seed=config.seed)
    return TrainingPlan(bottom=bottom, top_hidden=m.top_hidden, learn_missing=learn_missing)


def train_and_evaluate(primary: PrimaryParty, config: RunConfig,
                       splits: tuple[npt.NDArray[np.int64], ...], counter: TrafficCounter,
                       *, learn_missing: bool, progress: Progress | None = None
                       ) -> tuple[dict[str, dict[str, float]], tuple[EpochRecord, ...], int]:
    """Train with early stopping on the validation metric; restore the best epoch; evaluate."""
    train, val, test = splits
    t = config.training
    rng = np.random.default_rng([config.seed, 1])
    primary.setup(_plan(config, learn_missing), train)
    metric = primary_metric(primary.task)
    better = higher_is_better(metric)
    best: float | None = None
    best_epoch = 0
    stale = 0
    history = []
    for epoch in range(1, t.epochs + 1):
        before = counter.snapshot()
        start = time.perf_counter()
        losses = [primary.train_step(b) for b in primary.batches(train, t.batch_size, rng)]
        val_metrics = evaluate(primary.task, primary.targets(val), primary.predict_scores(val))
        record = EpochRecord(epoch, float(np.mean(losses)), val_metrics,
                             TrafficCounter.delta(counter.snapshot(), before),
                             time.perf_counter() - start)
        history.append(record)
        score = val_metrics[metric]
        if best is None or (score > best if better else score < best):
            best, best_epoch, stale = score, epoch, 0
            primary.snapshot("best")
        else:
            stale += 1
        log.info("epoch %d: loss %.4f, validation %s %.4f", epoch, record.train_loss, metric,
                 score)
        if progress is not None:
            progress("epoch", epoch, t.epochs)
        if stale >= t.patience:
            log.info("early stopping after epoch %d (best %d)", epoch, best_epoch)
            break
    primary.restore("best")
    metrics = {name: evaluate(primary.task, primary.targets(rows), primary.predict_scores(rows))
               for name, rows in (("train", train), ("validation", val), ("test", test))}
    return metrics, tuple(history), best_epoch


def run_training(config: RunConfig, out_dir: Path | None = None, *, overwrite: bool = False,
                 progress: Progress | None = None, transcript: Transcript | None = None,
                 tables: tuple[PartyTable, tuple[PartyTable, ...]] | None = None) -> RunResult:
    """Run one algorithm end to end in this process; write a run directory if ``out_dir``."""
    torch.set_num_threads(config.training.threads)
    if out_dir is None:
        return _run(config, None, progress, transcript, tables)
    with atomic_run_dir(out_dir, overwrite=overwrite) as staging:
        result = _run(config, staging, progress, transcript, tables)
        write_json(staging / "config.json", config_to_dict(config))
        write_json(staging / "metrics.json", result.to_json())
        from vflink.runner.plots import learning_curve  # matplotlib only when writing

        learning_curve(result, staging / "learning_curve.png")
    return RunResult(**{**result.__dict__, "out_dir": Path(out_dir)})


def _run(config: RunConfig, out_dir: Path | None, progress: Progress | None,
         transcript: Transcript | None,
         tables: tuple[PartyTable, tuple[PartyTable, ...]] | None) -> RunResult:
    start = time.perf_counter()
    primary_table, secondary_tables = tables if tables is not None else load_party_tables(config)
    if config.algorithm != "solo" and not secondary_tables:
        raise ConfigError(f"algorithm {config.algorithm!r} needs at least one secondary party")
    secret = _secret(config.alignment.secret_env)
    counter = TrafficCounter()
    hub = InProcessHub(transcript=transcript, counter=counter)
    models_dir = None if out_dir is None else out_dir / "models"
    hub.register(COORDINATOR, CoordinatorParty(COORDINATOR))
    for table in secondary_tables:
        hub.register(table.name, SecondaryParty(
            table, hub.channel(table.name), secret=secret,
            out_dir=None if models_dir is None else models_dir / table.name))
    names = tuple(t.name for t in secondary_tables)
    aligner = PrimaryParty(primary_table, hub.channel(primary_table.name), secondaries=names,
                           secret=secret)
    alignments = aligner.align_exact(COORDINATOR) if names else {}
    n = len(primary_table)
    learn_missing = config.alignment.unmatched == "keep"
    rows = np.arange(n, dtype=np.int64)
    if not learn_missing:
        for a in alignments.values():
            rows = rows[a.for_primary_rows(n)[rows, 0] != MISSING]
    matched = {k: float(np.mean(a.matched)) for k, a in alignments.items()}
    log.info("aligned: %d of %d primary rows kept (%s)", len(rows), n, matched)
    splits = split_rows(rows, config.training.split, np.random.default_rng([config.seed, 0]))
    if config.algorithm == "splitnn":
        primary = aligner
        primary.out_dir = None if models_dir is None else models_dir / primary_table.name
        primary.set_alignments(alignments)
    else:
        table = (combined_table(primary_table, secondary_tables, alignments)
                 if config.algorithm == "combine" else primary_table)
        primary = PrimaryParty(table, hub.channel(primary_table.name), secondaries=(),
                               out_dir=None if models_dir is None
                               else models_dir / primary_table.name)
    align_comm = counter.snapshot()
    metrics, history, best_epoch = train_and_evaluate(
        primary, config, splits, counter, learn_missing=learn_missing, progress=progress)
    primary.save_states()
    sizes = {"primary_rows": n, "aligned_rows": len(rows), "train": len(splits[0]),
             "validation": len(splits[1]), "test": len(splits[2]),
             **{f"{t.name}_rows": len(t) for t in secondary_tables}}
    return RunResult(
        algorithm=config.algorithm, task=primary.task, metrics=metrics, history=history,
        best_epoch=best_epoch, communication=counter.snapshot(), sizes=sizes,
        seconds=time.perf_counter() - start,
        extra={"alignment": {"method": config.alignment.method,
                             "unmatched": config.alignment.unmatched,
                             "matched_fraction": matched, "communication": align_comm}},
    )
