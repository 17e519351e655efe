"""Build parties from a config, align, train with early stopping, evaluate, write a run dir.

Alignment runs the real protocol (keyed hashes or soft linkage through a coordinator) and yields
:class:`Prepared` inputs; training then builds fresh parties that talk through a channel. An
experiment reuses one ``Prepared`` for every algorithm of a seed, since linkage does not depend on
the algorithm.
"""

from __future__ import annotations

import logging
import os
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
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
from vflink.linkage import SearchOptions
from vflink.metrics.functional import evaluate, higher_is_better, primary_metric
from vflink.models.merge import AggregatorConfig
from vflink.models.spec import BottomSpec
from vflink.parties import CoordinatorParty, PrimaryParty, SecondaryParty, TrainingPlan
from vflink.runner.algorithms import Algorithm, get_algorithm
from vflink.runner.config import RunConfig, config_to_dict
from vflink.runner.link import encoding_for
from vflink.runner.rundir import atomic_run_dir, write_json
from vflink.transport import InProcessHub, TrafficCounter, Transcript
from vflink.types import MISSING, Alignment, Task

__all__ = [
    "EpochRecord",
    "Inputs",
    "Prepared",
    "Progress",
    "RunResult",
    "combined_table",
    "load_inputs",
    "load_party_tables",
    "prepare",
    "run_training",
    "train_and_evaluate",
]

log = logging.getLogger(__name__)

#: ``progress(stage, done, total)``: the CLI renders it as a progress bar.
Progress = Callable[[str, int, int], None]

COORDINATOR = "coordinator"


@dataclass(frozen=True)
class Inputs:
    """The parties' tables, and ground truth where a dataset has it (for Combine only)."""

    primary: PartyTable
    secondaries: tuple[PartyTable, ...]
    truth: dict[str, npt.NDArray[np.int64]] | None = None


@dataclass(frozen=True)
class Prepared:
    """Inputs plus the alignments each kind of algorithm consumes.

    ``alignments[kind][secondary]`` with kind ``"base"`` (top-1 of the configured alignment),
    ``"top1"``, ``"topk"`` or ``"exact"``; ``rows`` are the primary rows every algorithm trains
    and is evaluated on, so their metrics are comparable.
    """

    inputs: Inputs
    alignments: dict[str, dict[str, Alignment]]
    rows: npt.NDArray[np.int64]
    communication: dict[str, dict[str, int]]
    summary: dict[str, Any] = field(default_factory=dict)


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


def load_inputs(config: RunConfig) -> Inputs:
    """The parties' tables from a built-in dataset or from files."""
    data = config.data
    if data.dataset is not None:
        options = dict(data.options)
        options.setdefault("seed", config.seed)
        ds = load_dataset(data.dataset, **options)
        truth = None
        if ds.true_secondary_index is not None:
            truth = {t.name: np.asarray(idx) for t, idx in
                     zip(ds.secondaries, ds.true_secondary_index, strict=True)}
        return Inputs(ds.primary, tuple(ds.secondaries), truth)
    tables = [load_table(schema) for schema in data.parties]
    primary = next(t for t in tables if t.schema.role == "primary")
    return Inputs(primary, tuple(t for t in tables if t.schema.role == "secondary"))


def load_party_tables(config: RunConfig) -> tuple[PartyTable, tuple[PartyTable, ...]]:
    inputs = load_inputs(config)
    return inputs.primary, inputs.secondaries


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


def _as_inputs(tables: Inputs | tuple[PartyTable, Sequence[PartyTable]]) -> Inputs:
    if isinstance(tables, Inputs):
        return tables
    return Inputs(tables[0], tuple(tables[1]))


def combined_table(primary: PartyTable, secondaries: Sequence[PartyTable],
                   alignments: Mapping[str, Alignment]) -> PartyTable:
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


def _needs(algorithms: Sequence[Algorithm]) -> set[str]:
    return {a.links for a in algorithms if a.kind == "vfl"} | {"base"}


def prepare(config: RunConfig, tables: Inputs | tuple[PartyTable, Sequence[PartyTable]] | None
            = None, *, algorithms: Sequence[str] | None = None,
            transcript: Transcript | None = None,
            scale: tuple[float, float] | None = None) -> Prepared:
    """Align the parties through a coordinator (the real protocol, in this process).

    ``scale`` fixes Eq. 1's (μ0, σ0), e.g. to a training linkage's when predicting.
    """
    inputs = _as_inputs(tables) if tables is not None else load_inputs(config)
    algs = [get_algorithm(a) for a in (algorithms or [config.algorithm])]
    needs = _needs(algs)
    a_cfg = config.alignment
    names = tuple(t.name for t in inputs.secondaries)
    if not names:
        rows = np.arange(len(inputs.primary), dtype=np.int64)
        return Prepared(inputs, {}, rows, {})
    if a_cfg.method == "exact" and "topk" in needs:
        raise ConfigError("algorithms that use K links (fedsim, avgsim, featuresim...) need "
                          "soft linkage: set alignment.method = \"soft\"")
    secret = _secret(a_cfg.secret_env)
    hub = InProcessHub(transcript=transcript)
    search = SearchOptions(mode=a_cfg.search)  # type: ignore[arg-type]
    hub.register(COORDINATOR, CoordinatorParty(COORDINATOR, seed=config.seed, search=search))
    for table in inputs.secondaries:
        hub.register(table.name, SecondaryParty(table, hub.channel(table.name), secret=secret))
    primary = PrimaryParty(inputs.primary, hub.channel(inputs.primary.name), secondaries=names,
                           secret=secret)
    initiator = primary.initiator()
    alignments: dict[str, dict[str, Alignment]] = {}
    summary: dict[str, Any] = {"method": a_cfg.method}
    if a_cfg.method == "exact":
        base = initiator.align_exact(COORDINATOR)
        alignments = {"base": base, "top1": base, "exact": base}
    else:
        sides = [(inputs.primary.frame, inputs.primary.schema.identifiers)]
        sides += [(t.frame, t.schema.identifiers) for t in inputs.secondaries]
        spec, search_metric = encoding_for(a_cfg.metric, bloom=a_cfg.privacy == "bloom",
                                           sides=sides)
        top_k = a_cfg.top_k if "topk" in needs else 1
        soft = initiator.align_soft(COORDINATOR, spec, metric=search_metric, top_k=top_k,
                                    tau=a_cfg.tau, sigma=a_cfg.sigma, delta=a_cfg.delta,
                                    session="soft", scale=scale)
        top1 = {k: Alignment(a.primary_index, a.secondary_index[:, :1],
                             None if a.similarity is None else a.similarity[:, :1], k,
                             dict(a.meta)) for k, a in soft.items()}
        alignments = {"base": top1, "top1": top1, "topk": soft}
        if "exact" in needs:
            alignments["exact"] = initiator.align_soft(COORDINATOR, spec, metric=search_metric,
                                                       top_k=1, mode="exact", session="exact")
        first = soft[names[0]]
        summary.update({k: first.meta.get(k) for k in ("mu0", "sigma0", "sigma", "tau",
                                                       "epsilon", "delta")})
        summary.update({"metric": a_cfg.metric, "top_k": top_k, "privacy": a_cfg.privacy})
    n = len(inputs.primary)
    rows = np.arange(n, dtype=np.int64)
    if a_cfg.method == "exact" and a_cfg.unmatched == "drop":
        for a in alignments["base"].values():
            rows = rows[a.for_primary_rows(n)[rows, 0] != MISSING]
    summary["matched_fraction"] = {k: float(np.mean(a.matched))
                                   for k, a in alignments["base"].items()}
    summary["unmatched"] = a_cfg.unmatched
    log.info("aligned: %d of %d primary rows kept (%s)", len(rows), n,
             summary["matched_fraction"])
    return Prepared(inputs, alignments, rows, hub.counter.snapshot(), summary)


def _plan(config: RunConfig, algorithm: Algorithm, *, learn_missing: bool, k: int
          ) -> TrainingPlan:
    m, t = config.model, config.training
    bottom = BottomSpec(hidden=m.hidden, out_dim=m.cut_dim, activation=m.activation,
                        dropout=m.dropout, optimizer=t.optimizer, lr=t.lr,
                        weight_decay=t.weight_decay, seed=config.seed)
    agg = AggregatorConfig(**{**m.aggregator.__dict__, "seed": config.seed})
    return TrainingPlan(bottom=bottom, top_hidden=m.top_hidden, learn_missing=learn_missing,
                        aggregator=algorithm.aggregator, k=k, aggregator_config=agg,
                        pair_dim=m.pair_dim)


def train_and_evaluate(primary: PrimaryParty, config: RunConfig, plan: TrainingPlan,
                       splits: tuple[npt.NDArray[np.int64], ...], counter: TrafficCounter,
                       *, batch_size: int, progress: Progress | None = None
                       ) -> tuple[dict[str, dict[str, float]], tuple[EpochRecord, ...], int]:
    """Train with early stopping on the validation metric; restore the best epoch; evaluate."""
    train, val, test = splits
    t = config.training
    rng = np.random.default_rng([config.seed, 1])
    primary.setup(plan, train)
    metric = primary_metric(primary.task)
    better = higher_is_better(metric)
    best: float | None = None
    best_epoch = 0
    stale = 0
    history = []
    for epoch in range(1, t.epochs + 1):
        before = counter.snapshot()
        start = time.perf_counter()
        losses = [primary.train_step(b) for b in primary.batches(train, batch_size, rng)]
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
                 tables: Inputs | tuple[PartyTable, Sequence[PartyTable]] | None = None,
                 prepared: Prepared | None = None) -> RunResult:
    """Run one algorithm end to end in this process; write a run directory if ``out_dir``."""
    torch.set_num_threads(config.training.threads)
    if out_dir is None:
        return _run(config, None, progress, transcript, tables, prepared)
    with atomic_run_dir(out_dir, overwrite=overwrite) as staging:
        result = _run(config, staging, progress, transcript, tables, prepared)
        write_json(staging / "config.json", config_to_dict(config))
        write_json(staging / "metrics.json", result.to_json())
        from vflink.runner.plots import learning_curve  # matplotlib only when writing

        learning_curve(result, staging / "learning_curve.png")
    return RunResult(**{**result.__dict__, "out_dir": Path(out_dir)})


def _truth_alignments(inputs: Inputs, prepared: Prepared, config: RunConfig
                      ) -> Mapping[str, Alignment]:
    if inputs.truth is not None:
        n = len(inputs.primary)
        return {name: Alignment(np.arange(n, dtype=np.int64), idx[:, None], None, name)
                for name, idx in inputs.truth.items()}
    if config.alignment.method == "exact":
        return prepared.alignments["base"]
    raise ConfigError("combine needs the true alignment: exact keys (alignment.method = "
                      "\"exact\") or a dataset with ground truth")


def _run(config: RunConfig, out_dir: Path | None, progress: Progress | None,
         transcript: Transcript | None,
         tables: Inputs | tuple[PartyTable, Sequence[PartyTable]] | None,
         prepared: Prepared | None) -> RunResult:
    start = time.perf_counter()
    algorithm = get_algorithm(config.algorithm)
    if prepared is None:
        prepared = prepare(config, tables, transcript=transcript)
    inputs = prepared.inputs
    if algorithm.kind != "solo" and not inputs.secondaries:
        raise ConfigError(f"algorithm {algorithm.name!r} needs at least one secondary party")
    rows = prepared.rows
    splits = split_rows(rows, config.training.split, np.random.default_rng([config.seed, 0]))
    counter = TrafficCounter()
    hub = InProcessHub(transcript=transcript, counter=counter)
    models_dir = None if out_dir is None else out_dir / "models"
    learn_missing = config.alignment.unmatched == "keep"
    k = 1
    batch_size = config.training.batch_size
    if algorithm.kind == "vfl":
        alignments = prepared.alignments[algorithm.links]
        if algorithm.links == "exact" and config.alignment.method == "soft":
            learn_missing = True  # records without an exact match keep a "missing" embedding
        for table in inputs.secondaries:
            party = SecondaryParty(table, hub.channel(table.name),
                                   out_dir=None if models_dir is None else models_dir / table.name)
            party.set_linked_rows(alignments[table.name].secondary_index)
            hub.register(table.name, party)
        names = tuple(t.name for t in inputs.secondaries)
        primary = PrimaryParty(inputs.primary, hub.channel(inputs.primary.name),
                               secondaries=names,
                               out_dir=None if models_dir is None
                               else models_dir / inputs.primary.name)
        primary.set_alignments(alignments)
        k = next(iter(alignments.values())).k
        if algorithm.uses_k:
            batch_size = config.training.knn_batch_size  # App. E: K times more pairs per batch
    else:
        table = inputs.primary
        if algorithm.kind == "combine":
            table = combined_table(inputs.primary, inputs.secondaries,
                                   _truth_alignments(inputs, prepared, config))
        primary = PrimaryParty(table, hub.channel(inputs.primary.name), secondaries=(),
                               out_dir=None if models_dir is None
                               else models_dir / inputs.primary.name)
    plan = _plan(config, algorithm, learn_missing=learn_missing, k=k)
    metrics, history, best_epoch = train_and_evaluate(
        primary, config, plan, splits, counter, batch_size=batch_size, progress=progress)
    primary.save_states()
    sizes = {"primary_rows": len(inputs.primary), "aligned_rows": len(rows),
             "train": len(splits[0]), "validation": len(splits[1]), "test": len(splits[2]),
             "k": k, **{f"{t.name}_rows": len(t) for t in inputs.secondaries}}
    return RunResult(
        algorithm=algorithm.name, task=primary.task, metrics=metrics, history=history,
        best_epoch=best_epoch, communication=counter.snapshot(), sizes=sizes,
        seconds=time.perf_counter() - start,
        extra={"alignment": {**prepared.summary, "communication": prepared.communication}},
    )
