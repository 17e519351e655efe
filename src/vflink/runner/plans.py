"""Training plans (``PLANS``) and the evaluations they report (``EVALUATIONS``).

A plan is one family of algorithms: how its parties are built for training, what the one
training loop (:mod:`vflink.runner.loop`) trains, and what the run reports afterwards.

=============  =====================================================================
``vfl``        across the party boundary: the SplitNN family (``splitnn``, ``exact``,
               ``top1sim``: one linked record) and the FedSim family (``fedsim``,
               ``avgsim``, ``featuresim`` and the ablations: K linked records, App. E
               batches); the algorithm's ``links`` pick the alignment it consumes
``solo``       the primary's features only, centralised at the primary
``combine``    every party's features joined on the true alignment (an upper bound)
``union``      FLORIST union training over the PSU union with synthetic rows
               (:mod:`vflink.runner.union`; the ``psu`` alignment method fixes it)
=============  =====================================================================

An evaluation (``EVALUATIONS``) adds one part of a run's result (``RunResult.extra``); a plan
lists the ones it reports, in the order ``metrics.json`` shows them. Adding a plan is an entry
here plus the party-side hook it trains (e.g. :class:`vflink.parties.union.UnionPrimary`).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from vflink.data.schema import PartySchema
from vflink.data.table import PartyTable
from vflink.errors import ConfigError
from vflink.metrics.functional import (
    choose_threshold,
    decision_metrics,
    evaluate,
    higher_is_better,
    log_loss,
    selection_metric,
)
from vflink.models.merge import AggregatorConfig
from vflink.models.spec import BottomSpec
from vflink.parties import PrimaryParty, TrainingPlan
from vflink.privacy.budget import BUDGET_DIR
from vflink.privacy.label_protection import LabelProtection
from vflink.protocol import Ack, AlignmentReady
from vflink.registry import Registry
from vflink.reporting.link_quality import training_link_quality
from vflink.runfiles.algorithms import Algorithm, get_algorithm
from vflink.runfiles.config import RunConfig, TrainingConfig
from vflink.runfiles.inputs import Inputs
from vflink.runfiles.results import EpochRecord, RunResult
from vflink.runner.context import Plan, Prepared, RunContext
from vflink.runner.evaluation import EVALUATIONS, linkage_figures, write_truth
from vflink.runner.federation import recorder_for
from vflink.runner.loop import BEST, CHECKPOINT, FINAL
from vflink.runner.pools import run_splits
from vflink.runner.protections import (
    TRAINING,
    Protection,
    chosen,
    merge_reports,
    request_settings,
)
from vflink.runner.union import UnionPlan
from vflink.transport import InProcessHub, TrafficCounter
from vflink.types import MISSING, Alignment, Task

__all__ = ["PLANS", "PrimaryTrainee", "combined_table", "plan_name",
           "release_plan", "training_plan"]

log = logging.getLogger(__name__)

#: Below this many training records in the rarer class of a binary label, a run under label
#: DP warns (:func:`rare_label_warning`).
RARE_CLASS_RECORDS = 200
#: The refit (``privacy.labels_refit``) holds the training and validation records' model
#: inputs in memory; above this it is skipped (and the ledger says why) rather than swapping.
REFIT_MAX_BYTES = 2 << 30

Rows = npt.NDArray[np.int64]
#: one split's labels and the model's scores on it
Scored = tuple[npt.NDArray[Any], npt.NDArray[np.float64]]


def plan_name(config: RunConfig) -> str:
    """The plan of the run's algorithm (its kind), unless the alignment method fixes one."""
    return get_algorithm(config.algorithm).kind


def training_plan(config: RunConfig, algorithm: Algorithm, *, learn_missing: bool, k: int,
                  protections: Sequence[Protection] | None = None) -> TrainingPlan:
    """The public hyperparameters every party builds its part of the model from, with the
    settings of the training ``protections`` (default: those the config turns on; embedding
    DP adds its public ``privacy`` settings)."""
    m, t = config.model, config.training
    # randomized-response: each secondary sends the one-hot of a code (width k)
    bottom = BottomSpec(hidden=m.hidden, out_dim=config.privacy.cut_width(m.cut_dim),
                        activation=m.activation,
                        dropout=m.dropout, optimizer=t.optimizer, lr=t.lr,
                        weight_decay=t.weight_decay, seed=config.seed,
                        standardize=m.standardize, bottom=m.bottom, channels=m.channels,
                        kernels=m.kernels, image_shape=m.image_shape)
    agg = AggregatorConfig(**{**m.aggregator.__dict__, "seed": config.seed})
    chosen_ = chosen(config, TRAINING) if protections is None else protections
    settings: dict[str, Any] = {"privacy": None, "labels": None,
                                **request_settings(chosen_, config)}
    return TrainingPlan(bottom=bottom, top_hidden=m.top_hidden, learn_missing=learn_missing,
                        aggregator=algorithm.aggregator, k=k, aggregator_config=agg,
                        pair_dim=m.pair_dim, **settings)


def release_plan(plan: TrainingPlan, splits: tuple[Rows, ...], epochs: int,
                 batch_size: int) -> dict[str, int] | None:
    """What a budget-first secondary calibrates its noise for: the epochs, the
    training batches per epoch, and the evaluation batches of each split (validation after
    every epoch; train, validation and test once after training). ``None`` when the
    protection is per release."""
    if plan.privacy is None or plan.privacy.get("total_epsilon") is None:
        return None
    train, val, test = splits

    def chunks(n: int, size: int) -> int:
        return -(-n // size)

    return {"epochs": epochs, "train_batches": chunks(len(train), batch_size),
            "train_chunks": chunks(len(train), plan.eval_batch_size),
            "validation_chunks": chunks(len(val), plan.eval_batch_size),
            "test_chunks": chunks(len(test), plan.eval_batch_size)}


class PrimaryTrainee:
    """The loop's view of a :class:`~vflink.parties.PrimaryParty` (SplitNN, FedSim, Solo,
    Combine): early stopping on the validation metric ``training.select`` names
    (:func:`~vflink.metrics.functional.selection_metric`: AUC on a binary task by default),
    checkpoints in every party's own state directory, the best epoch restored and evaluated
    on every split; on a binary task the decision threshold chosen on validation
    (``training.threshold``) and every split's figures at it (:attr:`decision`)."""

    def __init__(self, primary: PrimaryParty, plan: TrainingPlan,
                 training: TrainingConfig | None = None) -> None:
        self.primary, self.plan = primary, plan
        self.training = training if training is not None else TrainingConfig()
        try:
            self.metric: str | None = selection_metric(primary.task, self.training.select)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        #: the decision threshold and every split's figures at it (binary tasks), once trained
        self.decision: dict[str, Any] | None = None
        #: what the final evaluation found worth a warning (the run's summary prints them)
        self.warnings: list[str] = []

    def _metrics(self, y: npt.NDArray[Any], scores: npt.NDArray[np.float64]
                 ) -> dict[str, float]:
        out = evaluate(self.primary.task, y, scores)
        if self.metric == "log_loss":  # only when it is watched: the task metrics as before
            out["log_loss"] = log_loss(y, scores)
        return out

    def setup(self, splits: tuple[Rows, ...], epochs: int, batch_size: int) -> Rows:
        self.primary.setup(self.plan, splits[0],
                           release_plan=release_plan(self.plan, splits, epochs, batch_size),
                           epochs=epochs)
        return splits[0]

    def batches(self, rows: Rows, batch_size: int, rng: np.random.Generator) -> Iterator[Rows]:
        return self.primary.batches(rows, batch_size, rng)

    def earliest_stop(self) -> int:
        """``dp`` on the labels: every epoch that releases (one per epoch, or the first
        ``labels_releases``). σ was calibrated for those releases (stopping early leaves
        that budget unspent, the noise just as large), and the posterior's evidence grows
        with every release, so validation may still improve after a plateau; the best
        validation epoch is still the one kept."""
        protection = self.primary.label_protection
        if protection is not None and protection.mode == "dp" and protection.planned:
            planned = protection.planned
            return int(planned.get("releases_per_record", planned.get("epochs", 1)))
        return 1

    def begin_epoch(self, epoch: int, last: bool) -> None:
        pass

    def train_step(self, batch: Rows) -> float:
        return self.primary.train_step(batch)

    def evaluate(self, rows: Rows) -> dict[str, float]:
        p = self.primary
        return self._metrics(p.targets(rows), p.predict_scores(rows))

    def log_epoch(self, record: EpochRecord) -> None:
        log.info("epoch %d: loss %.4f, validation %s %.4f", record.epoch, record.train_loss,
                 self.metric, record.validation[self.metric or ""])

    def keep_best(self, checkpoints: bool, state_prefix: str) -> None:
        if checkpoints:
            self.primary.save_states(BEST, secondary_name=state_prefix + BEST)
        else:
            self.primary.snapshot("best")

    def restore_best(self, checkpoints: bool) -> None:
        if checkpoints:
            self.primary.load_states(BEST)
        else:
            self.primary.restore("best")

    def save_checkpoint(self, state_prefix: str, epoch: int, extra: dict[str, Any]) -> None:
        # per-epoch names for the secondaries: the primary's checkpoint (written last) names
        # the one that belongs to it
        self.primary.save_states(CHECKPOINT, secondary_name=f"{state_prefix}checkpoint-{epoch:04d}",
                                 extra=extra)

    def load_checkpoint(self) -> dict[str, Any]:
        return self.primary.load_states(CHECKPOINT, same_data=True)

    def progress_state(self) -> dict[str, Any]:
        return {"next_batch_id": self.primary.next_batch_id}

    def resume_progress(self, state: dict[str, Any]) -> None:
        self.primary.next_batch_id = int(state["next_batch_id"])

    def final_metrics(self, splits: tuple[Rows, ...], history: list[EpochRecord]
                      ) -> dict[str, dict[str, float]]:
        p = self.primary
        protection = p.label_protection
        scored = (self._refit(splits, protection)
                  if protection is not None and protection.wants_refit else self._scored(splits))
        if p.task is Task.BINARY:  # the same scores: no further message crosses
            self.decision = decide(scored, self.training.threshold)
            rare = rare_label_warning(protection, scored["train"][0])
            if rare is not None:
                self.warnings.append(rare)
        return {name: self._metrics(y, s) for name, (y, s) in scored.items()}

    def _scored(self, splits: tuple[Rows, ...]) -> dict[str, Scored]:
        """Every split's labels and scores, one evaluation pass each (train, validation,
        test)."""
        p = self.primary
        return {name: (p.targets(rows), p.predict_scores(rows))
                for name, rows in zip(("train", "validation", "test"), splits, strict=True)}

    def _refit(self, splits: tuple[Rows, ...], protection: LabelProtection
               ) -> dict[str, Scored]:
        """The final evaluation with the refit (``privacy.labels_refit``): the same evaluation
        messages as without it (train, validation, test, once each, in that order), the
        primary's own layers refit on its clean training labels over the embeddings of the
        first two, then every split scored by the refit model. Nothing reaches a secondary
        after its last gradient but those evaluation requests."""
        p = self.primary
        train_rows, val_rows, test_rows = splits
        size = p.input_bytes(len(train_rows) + len(val_rows))
        if size > REFIT_MAX_BYTES:
            reason = (f"the embeddings of {len(train_rows) + len(val_rows):,} training and "
                      f"validation records would take {size / 2**30:.1f} GiB "
                      f"(the refit holds at most {REFIT_MAX_BYTES / 2**30:.0f} GiB)")
            log.warning("privacy.labels_refit: not refit: %s; the model is the one trained "
                        "on the protected labels", reason)
            protection.note_refit({"done": False, "reason": reason})
            return self._scored(splits)
        train = p.evaluation_inputs(train_rows)
        validation = p.evaluation_inputs(val_rows)
        metric = self.metric
        score = None if metric is None else (
            lambda y, s: self._metrics(y, s)[metric])  # noqa: E731 (one expression)
        info = p.refit(train, validation, epochs=self.training.epochs,
                       batch_size=self.training.batch_size,
                       score=score, higher_is_better=metric is None or higher_is_better(metric))
        info = {"done": True, "metric": metric, **info}
        protection.note_refit(info)
        log.info("privacy.labels_refit: the primary's own layers refit on its clean labels "
                 "(epoch %s kept; validation %s %s -> %s)", info["epoch_kept"], metric,
                 info["validation_before"], info["validation_after"])
        return {"train": (p.targets(train_rows), p.scores_of(train)),
                "validation": (p.targets(val_rows), p.scores_of(validation)),
                "test": (p.targets(test_rows), p.predict_scores(test_rows))}


def rare_label_warning(protection: LabelProtection | None, y_train: npt.ArrayLike
                       ) -> str | None:
    """A warning when label DP protected a binary label whose rarer class has fewer than
    RARE_CLASS_RECORDS training records: each label's evidence is weak at any useful ε, and
    that few records of a class leave the protected training little to learn from (measured:
    docs/how-to/label-protection.md, "The default")."""
    if protection is None or protection.mode not in ("dp", "rr-prior"):
        return None
    y = np.asarray(y_train, dtype=np.float64).reshape(-1)
    if not len(y):
        return None
    rarer = int(min(np.sum(y > 0.5), np.sum(y <= 0.5)))
    if rarer >= RARE_CLASS_RECORDS:
        return None
    eps = protection.settings.epsilon
    return (f"label protection ({protection.mode}, ε = {eps:g}) on a label whose rarer class "
            f"has {rarer} training records (under {RARE_CLASS_RECORDS}): the protected "
            "training has little to learn from and its test figures vary widely between runs "
            "(docs/how-to/label-protection.md, \"The default\"); compare with "
            "labels = \"off\" on data you may share, or raise labels_total_epsilon")


def decide(scored: Mapping[str, Scored],
           threshold: str | float) -> dict[str, Any]:
    """A binary task's decision threshold, chosen on the validation split's labels and scores
    by ``threshold`` (a criterion of :func:`~vflink.metrics.functional.choose_threshold`, or
    a fixed probability), and each split's figures at it and at 0.5."""
    y_val, s_val = scored["validation"]
    value = choose_threshold(np.asarray(y_val, dtype=np.int64), s_val, threshold)
    return {"threshold": value,
            "criterion": threshold if isinstance(threshold, str) else "fixed",
            "chosen_on": "validation",
            **{name: decision_metrics(np.asarray(y, dtype=np.int64), s, value)
               for name, (y, s) in scored.items()},
            "predicted_positive_at_0.5": {
                name: float(np.mean(np.asarray(s, dtype=np.float64) >= 0.5)) if len(s)
                else float("nan") for name, (y, s) in scored.items()}}


@EVALUATIONS.register("decision")
def _decision(ctx: RunContext) -> dict[str, Any]:
    """The decision threshold (binary tasks) and the warnings a model that learnt little
    deserves: the first epoch kept although later ones trained, or one class predicted."""
    trainee = ctx.trainee
    if not isinstance(trainee, PrimaryTrainee):
        return {}
    warnings: list[str] = []
    metric = trainee.metric
    if metric is not None and ctx.best_epoch == 1 and len(ctx.history) > 1:
        values = ", ".join(f"{r.validation.get(metric, float('nan')):.4g}"
                           for r in ctx.history[:6])
        warnings.append(
            f"the kept model is the first epoch's: validation {metric} never improved on it "
            f"over {len(ctx.history)} epochs ({values}{', ...' if len(ctx.history) > 6 else ''})"
            "; the model may have learnt little (a protection's noise, too high a learning "
            "rate, or a metric unfit for the task: see training.select)")
    out: dict[str, Any] = {}
    warnings.extend(trainee.warnings)
    decision = trainee.decision
    if decision is not None:
        out["decision"] = decision
        for split in ("validation", "test"):
            share = decision[split]["predicted_positive"]
            if share in (0.0, 1.0):
                warnings.append(
                    f"at its decision threshold {decision['threshold']:.4g} (chosen on "
                    f"validation) the model predicts one class only on the {split} split: "
                    "its scores do not separate the classes there")
        half = decision["predicted_positive_at_0.5"].get("test")
        if half in (0.0, 1.0):
            warnings.append(
                "at 0.5 the model predicts one class only on the test split: its accuracy "
                "there is the base rate; read the AUC and the figures at the decision threshold "
                "(metrics.json \"decision\")")
    for text in warnings:
        log.warning("%s", text)
    if warnings:
        out["warnings"] = warnings
    return out


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


# -- evaluations: each adds its part of RunResult.extra -------------------------------------

@EVALUATIONS.register("alignment")
def _alignment(ctx: RunContext) -> dict[str, Any]:
    prepared = ctx.prepared
    if prepared is None:  # pragma: no cover - the align stage ran
        return {}
    return {"alignment": {**prepared.summary, "communication": prepared.communication}}


@EVALUATIONS.register("link-quality")
def _link_quality(ctx: RunContext) -> dict[str, Any]:
    """How good the training linkage was, where the dataset knows (read by ``vflink predict``)."""
    federation, prepared, inputs = ctx.federation, ctx.prepared, ctx.inputs
    if federation is None or prepared is None or inputs is None:
        return {}
    return {"link_quality": training_link_quality(
        ctx.config.alignment.method, prepared.alignments["base"], federation.secondaries,
        ctx.splits[0], len(inputs.primary))}


@EVALUATIONS.register("messages")
def _messages(ctx: RunContext) -> dict[str, Any]:
    if ctx.counter is None:  # pragma: no cover - the plan stage ran
        return {}
    return {"messages": TrafficCounter.kinds_delta(ctx.counter.kinds(), ctx.state["kinds"])}


@EVALUATIONS.register("linkage-figures")
def _linkage_figures(ctx: RunContext) -> dict[str, Any]:
    primary = ctx.state["primary"]
    return {"linkage_figures": linkage_figures(primary.similarity, primary.model)}


@EVALUATIONS.register("protections")
def _protections(ctx: RunContext) -> dict[str, Any]:
    """What each training protection of the run reports (``PROTECTIONS``; embedding DP:
    each secondary's ledger entries, VFL-AFE)."""
    return merge_reports([protection.report(ctx.state["primary"])
                          for protection in ctx.state.get("protections", ())])


# -- plans -----------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class PrimaryPlan:
    """A plan whose trainee is a :class:`~vflink.parties.PrimaryParty`: across the boundary
    (``vfl``) or centralised at the primary (``solo``, ``combine``)."""

    kind: str
    evaluations: tuple[str, ...]
    checkpoints: bool = True

    def check(self, config: RunConfig) -> None:
        get_algorithm(config.algorithm)

    def build(self, ctx: RunContext) -> None:
        config, prepared = ctx.config, ctx.prepared
        if prepared is None or ctx.inputs is None:  # pragma: no cover - the align stage ran
            raise ConfigError("the plan stage needs an alignment")
        algorithm = get_algorithm(config.algorithm)
        inputs = prepared.inputs
        federation = ctx.federation = ctx.federation or prepared.federation
        if algorithm.kind != "solo" and not inputs.secondaries and not (
                federation and federation.secondaries):
            raise ConfigError(f"algorithm {algorithm.name!r} needs at least one secondary party")
        ctx.splits = run_splits(config, inputs, prepared.rows)
        models_dir = ctx.models_dir
        primary_dir = None if models_dir is None else models_dir / inputs.primary.name
        primary, k, learn_missing = self._primary(ctx, algorithm, primary_dir)
        for protection in ctx.protections:
            protection.check(config, primary.task)
        # the training protections act on what crosses the boundary: nothing leaves the
        # primary of a centralised plan
        training = tuple(p for p in ctx.protections
                         if p.acts_on == TRAINING and algorithm.kind == "vfl")
        plan = training_plan(config, algorithm, learn_missing=learn_missing, k=k,
                             protections=training)
        if ctx.resume and plan.k != k:
            raise ConfigError("cannot resume: the alignment changed")
        ctx.trainee = PrimaryTrainee(primary, plan, config.training)
        ctx.state.update(primary=primary, training_plan=plan, algorithm=algorithm, k=k,
                         protections=training)
        if ctx.counter is None:  # pragma: no cover - _primary set it
            raise ConfigError("no traffic counter")
        ctx.state["kinds"] = ctx.counter.kinds()

    def _primary(self, ctx: RunContext, algorithm: Algorithm, primary_dir: Path | None
                 ) -> tuple[PrimaryParty, int, bool]:
        config, prepared, federation = ctx.config, ctx.prepared, ctx.federation
        if prepared is None:  # pragma: no cover - checked in build
            raise ConfigError("the plan stage needs an alignment")
        inputs = prepared.inputs
        learn_missing = config.alignment.unmatched == "keep"
        ctx.batch_size = config.training.batch_size
        if self.kind == "vfl":
            if federation is None:
                raise ConfigError("a VFL algorithm needs the other parties (a federation)")
            ctx.counter = federation.counter
            alignments = prepared.alignments[algorithm.links]
            if algorithm.links == "exact" and config.alignment.method == "soft":
                learn_missing = True  # records without an exact match keep a "missing" embedding
            # the label release counts live with the primary's data: its own state directory
            # across hosts, else its directory of this run
            own = federation.state_dir if federation.state_dir is not None else primary_dir
            primary = PrimaryParty(inputs.primary, federation.channel,
                                   secondaries=federation.secondaries, out_dir=primary_dir,
                                   recorder=recorder_for(config), policy=federation.policy,
                                   resources=config.training.resources(),
                                   budget_dir=None if own is None else own / BUDGET_DIR,
                                   run=federation.run)
            # every secondary fetches the view of the alignment this algorithm uses
            for name in federation.secondaries:
                federation.channel.request(name, AlignmentReady(
                    session=prepared.sessions[algorithm.links],
                    coordinator=federation.coordinator), Ack)
            primary.set_alignments(alignments)
            k = next(iter(alignments.values())).k
            if algorithm.uses_k:
                ctx.batch_size = config.training.knn_batch_size  # App. E: K times more pairs
            ctx.state_prefix = federation.state_prefix
            return primary, k, learn_missing
        # Solo and Combine are centralised at the primary: nothing crosses a boundary.
        ctx.counter = TrafficCounter()
        table = inputs.primary
        if algorithm.kind == "combine":
            table = combined_table(inputs.primary, inputs.secondaries,
                                   _truth_alignments(inputs, prepared, config))
        hub = InProcessHub(transcript=ctx.transcript, counter=ctx.counter)
        primary = PrimaryParty(table, hub.channel(inputs.primary.name), secondaries=(),
                               out_dir=primary_dir, resources=config.training.resources())
        ctx.state_prefix = ""
        return primary, 1, learn_missing

    def evaluate(self, ctx: RunContext) -> RunResult:
        config, prepared, inputs = ctx.config, ctx.prepared, ctx.inputs
        if prepared is None or inputs is None:  # pragma: no cover - the stages ran
            raise ConfigError("the evaluate stage needs an alignment")
        primary: PrimaryParty = ctx.state["primary"]
        algorithm: Algorithm = ctx.state["algorithm"]
        federation = ctx.federation
        if ctx.out_dir is not None:
            primary.save_states(FINAL, secondary_name=ctx.state_prefix + FINAL)
            if config.evaluation.record:
                write_truth(ctx.out_dir, config, prepared, primary, algorithm.links,
                            federation.secret if federation is not None else None)
        if ctx.after_training is not None:
            ctx.after_training(primary, ctx.splits)
        splits = ctx.splits
        sizes = {"primary_rows": len(inputs.primary), "aligned_rows": len(prepared.rows),
                 "train": len(splits[0]), "validation": len(splits[1]), "test": len(splits[2]),
                 "k": ctx.state["k"], **{f"{t.name}_rows": len(t) for t in inputs.secondaries}}
        extra: dict[str, Any] = {}
        for name in self.evaluations:
            extra.update(EVALUATIONS.get(name)(ctx))
        return RunResult(
            algorithm=algorithm.name, task=primary.task, metrics=ctx.metrics,
            history=ctx.history, best_epoch=ctx.best_epoch, communication=ctx.communication,
            sizes=sizes, seconds=time.perf_counter() - ctx.start, extra=extra)


PLANS: Registry[Plan] = Registry("training plan")
_CENTRAL = ("alignment", "messages", "linkage-figures", "protections", "decision")
PLANS.add("vfl", PrimaryPlan("vfl", ("alignment", "link-quality", "messages",
                                     "linkage-figures", "protections", "decision")))
PLANS.add("solo", PrimaryPlan("solo", _CENTRAL))
PLANS.add("combine", PrimaryPlan("combine", _CENTRAL))
# a FLORIST strategy's name outside a PSU union trains at the primary alone, as Solo does
PLANS.add("florist", PrimaryPlan("florist", _CENTRAL))
PLANS.add("union", UnionPlan(("spectral-attack",)))
