"""Build parties from a config, align, train with early stopping, evaluate, write a run dir.

Alignment runs the real protocol (keyed hashes or soft linkage through a coordinator) and yields
:class:`Prepared` inputs; training then builds fresh parties that talk through a channel. An
experiment reuses one ``Prepared`` for every algorithm of a seed, since linkage does not depend on
the algorithm.
"""

from __future__ import annotations

import dataclasses
import logging
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
from vflink.data.table import PartyTable
from vflink.errors import ConfigError
from vflink.linkage.privacy import describe_protection
from vflink.metrics.functional import evaluate, higher_is_better, primary_metric
from vflink.models.merge import AggregatorConfig
from vflink.models.spec import BottomSpec
from vflink.parties import PrimaryParty, TrainingPlan
from vflink.parties.linking import LinkField
from vflink.protocol import Ack, AlignmentReady, EncodingSpec
from vflink.protocol.sessions import new_session_name
from vflink.runner.algorithms import Algorithm, get_algorithm
from vflink.runner.compute import current_compute, run_compute
from vflink.runner.config import AlignmentConfig, RunConfig, config_to_dict
from vflink.runner.evaluation import linkage_figures, recorder_for, write_truth
from vflink.runner.federation import Federation, in_process
from vflink.runner.inputs import Inputs, identifier_features, load_inputs
from vflink.runner.ledger import write_run_ledger
from vflink.runner.link import (
    describe_fields,
    encoding_for,
    encoding_summary,
    field_encodings,
    fields_encoder,
    link_fields,
)
from vflink.runner.link_quality import training_link_quality, write_link_quality
from vflink.runner.pools import link_by_split, run_splits
from vflink.runner.privacy import check_privacy_task, privacy_extra
from vflink.runner.resume import check_resume, run_fingerprint
from vflink.runner.rundir import atomic_run_dir, write_json
from vflink.transport import InProcessHub, TrafficCounter, Transcript
from vflink.types import MISSING, Alignment, Task

__all__ = [
    "CHECKPOINT",
    "EpochRecord",
    "Inputs",
    "Prepared",
    "Progress",
    "RunResult",
    "combined_table",
    "load_inputs",
    "prepare",
    "release_plan",
    "run_training",
    "train_and_evaluate",
]

log = logging.getLogger(__name__)

#: ``progress(stage, done, total)``: the CLI renders it as a progress bar.
Progress = Callable[[str, int, int], None]
#: ``after_training(primary, (train, validation, test))`` on the trained parties.
AfterTraining = Callable[[PrimaryParty, tuple[npt.NDArray[np.int64], ...]], None]

#: State names every party writes into its own state directory; a state NAME is the pair
#: NAME.json + NAME.<digest>.safetensors (vflink.models.statefile).
CHECKPOINT, BEST, FINAL = "checkpoint", "best", "model"


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
            transcript: Transcript | None = None, federation: Federation | None = None,
            scale: tuple[float, float] | None = None,
            encoding: EncodingSpec | tuple[EncodingSpec, ...] | None = None) -> Prepared:
    """Align the parties through the coordinator (the real protocol).

    Without a ``federation`` the other parties are built in this process. ``scale`` fixes
    Eq. 1's (μ0, σ0) and ``encoding`` the identifier encoding (e.g. a Bloom filter's value
    range; one per field for [[alignment.fields]]), both to a training linkage's when
    predicting.
    """
    inputs = _as_inputs(tables) if tables is not None else load_inputs(config)
    algs = [get_algorithm(a) for a in (algorithms or [config.algorithm])]
    needs = _needs(algs)
    a_cfg = config.alignment
    if federation is None:
        federation = in_process(inputs, config, transcript=transcript)
    names = federation.secondaries
    if not names:
        rows = np.arange(len(inputs.primary), dtype=np.int64)
        return Prepared(inputs, {}, {}, rows, {}, federation)
    if a_cfg.method in ("psi", "psu"):  # FLORIST: set protocols between the data parties
        from vflink.runner.florist import prepare_set_alignment

        return prepare_set_alignment(config, inputs, federation)
    if a_cfg.method == "exact" and "topk" in needs:
        raise ConfigError("algorithms that use K links (fedsim, avgsim, featuresim...) need "
                          "soft linkage: set alignment.method = \"soft\"")
    primary = PrimaryParty(inputs.primary, federation.channel, secondaries=names,
                           secret=federation.secret, policy=federation.policy)
    primary.compute = current_compute()
    initiator = primary.initiator()
    coordinator = federation.coordinator
    alignments: dict[str, dict[str, Alignment]] = {}
    sessions: dict[str, str] = {}
    summary: dict[str, Any] = {"method": a_cfg.method}
    before = federation.counter.snapshot()
    before_kinds = federation.counter.kinds()
    # every run opens its sessions under new names: a finished session is immutable (issue 19)
    soft_session, exact_session = new_session_name("soft"), new_session_name("exact")
    if a_cfg.method == "exact":
        base = initiator.align_exact(coordinator, session=exact_session)
        alignments = {"base": base, "top1": base, "exact": base}
        sessions = dict.fromkeys(alignments, exact_session)
        summary.update(encoding_summary("hmac-sha256", federation.secret_source))
    else:
        top_k = a_cfg.top_k if "topk" in needs else 1
        fields: tuple[LinkField, ...] = ()
        spec: EncodingSpec | None = None
        if a_cfg.fields:  # several fields, each with its own metric and weight (issue 14)
            encodings = _field_encodings(inputs, a_cfg, encoding)
            fields = link_fields(a_cfg.fields, encodings)
            search_metric = describe_fields(a_cfg.fields, a_cfg.blocking)

            def align(**kw: Any) -> dict[str, Alignment]:
                return initiator.align_fields(coordinator, fields, blocking=a_cfg.blocking,
                                              **kw)
        else:
            # The primary proposes the encoding; a numeric Bloom range comes from its own
            # identifiers (widened by 10 %), as it must when the secondaries' data are
            # elsewhere.
            sides = [(inputs.primary.frame, inputs.primary.schema.identifiers)]
            spec, search_metric = encoding_for(a_cfg.metric, bloom=a_cfg.privacy == "bloom",
                                               sides=sides, margin=0.1)
            if isinstance(encoding, EncodingSpec):  # the training's: same centres
                spec = encoding
            one: EncodingSpec = spec

            def align(**kw: Any) -> dict[str, Alignment]:
                return initiator.align_soft(coordinator, one, metric=search_metric, **kw)
        if a_cfg.pool == "split":  # the FedSim authors' protocol (vflink.runner.pools)
            splits = run_splits(config, inputs, np.arange(len(inputs.primary), dtype=np.int64))
            soft = link_by_split(config, inputs, federation, splits, spec, metric=search_metric,
                                 top_k=top_k, session=soft_session, fields=fields)
        else:
            tau, sigma = a_cfg.noise()  # the private default τ unless given
            soft = align(top_k=top_k, tau=tau, sigma=sigma, delta=a_cfg.delta,
                         session=soft_session, scale=scale)
        top1 = {k: Alignment(a.primary_index, a.secondary_index[:, :1],
                             None if a.similarity is None else a.similarity[:, :1], k,
                             dict(a.meta)) for k, a in soft.items()}
        alignments = {"base": top1, "top1": top1, "topk": soft}
        sessions = dict.fromkeys(("base", "top1", "topk"), soft_session)
        if "exact" in needs and a_cfg.pool == "split":
            alignments["exact"] = link_by_split(config, inputs, federation, splits, spec,
                                                metric=search_metric, top_k=1, mode="exact",
                                                session=exact_session, fields=fields)
        elif "exact" in needs:
            alignments["exact"] = align(top_k=1, mode="exact", session=exact_session)
        if "exact" in needs:
            sessions["exact"] = exact_session
        first = soft[names[0]]
        summary.update({k: first.meta.get(k) for k in ("mu0", "sigma0", "sigma", "tau",
                                                       "epsilon", "delta")})
        if "resolution" in first.meta:  # Theorem 2's distance step of a multi-field link
            summary["resolution"] = first.meta["resolution"]
        summary["similarity_protection"] = describe_protection(
            first.meta.get("sigma"), first.meta.get("tau"), first.meta.get("epsilon"),
            first.meta.get("delta"))
        summary.update({"metric": a_cfg.metric if spec is not None else search_metric,
                        "top_k": top_k, "privacy": a_cfg.privacy, "pool": a_cfg.pool})
        if spec is not None:
            summary.update(encoding_summary(spec.encoder, federation.secret_source))
            summary["encoding_spec"] = dataclasses.asdict(spec)  # public; reused by predict
        else:
            encoder = fields_encoder([f.spec for f in fields])
            summary.update(encoding_summary(encoder, federation.secret_source))
            # public, per field; reused by predict (same centres, so similarities compare)
            summary["fields"] = [f.describe() for f in a_cfg.fields]
            summary["field_encoding_specs"] = [dataclasses.asdict(f.spec) for f in fields]
            if a_cfg.blocking:
                summary["blocking"] = "keyed digests (HMAC-SHA256) of " + ", ".join(
                    b.on + (f"[:{b.prefix}]" if b.prefix else "") for b in a_cfg.blocking)
    n = len(inputs.primary)
    rows = np.arange(n, dtype=np.int64)
    if a_cfg.method == "exact" and a_cfg.unmatched == "drop":
        for a in alignments["base"].values():
            rows = rows[a.for_primary_rows(n)[rows, 0] != MISSING]
    summary["matched_fraction"] = {k: float(np.mean(a.matched))
                                   for k, a in alignments["base"].items()}
    summary["unmatched"] = a_cfg.unmatched
    crossing = identifier_features(inputs)
    if crossing:  # for the ledger: these identifiers also crossed as features (issue 14)
        summary["identifiers_as_features"] = crossing
    log.info("aligned: %d of %d primary rows kept (%s)", len(rows), n,
             summary["matched_fraction"])
    communication = TrafficCounter.delta(federation.counter.snapshot(), before)
    summary["messages"] = TrafficCounter.kinds_delta(federation.counter.kinds(), before_kinds)
    return Prepared(inputs, alignments, sessions, rows, communication, federation, summary)


def _field_encodings(inputs: Inputs, alignment: AlignmentConfig,
                     encoding: EncodingSpec | tuple[EncodingSpec, ...] | None
                     ) -> tuple[EncodingSpec, ...]:
    """Each field's encoding, proposed by the primary from its own table (a numeric range from
    its own values widened by 10 %, as for one field), or the training's when predicting."""
    p = inputs.primary
    own = [c for f in alignment.fields for c in f.on] + [b.on for b in alignment.blocking]
    undeclared = sorted({c for c in own if c not in p.schema.identifiers})
    if undeclared:
        raise ConfigError(f"[[alignment.fields]] / [[alignment.blocking]] name {undeclared}, "
                          f"which party {p.name!r} does not declare as `identifiers` "
                          f"({', '.join(p.schema.identifiers) or 'none'}): every party links "
                          "only on columns it declares as identifiers")
    if isinstance(encoding, tuple):
        if len(encoding) != len(alignment.fields):
            raise ConfigError(f"the training linkage had {len(encoding)} field(s), the run "
                              f"file has {len(alignment.fields)}")
        return encoding
    return field_encodings(alignment.fields, private=alignment.privacy == "bloom",
                           primary=p.frame, margin=0.1, sources=(p.source,))


def _plan(config: RunConfig, algorithm: Algorithm, *, learn_missing: bool, k: int
          ) -> TrainingPlan:
    m, t = config.model, config.training
    # randomized-response: each secondary sends the one-hot of a code (width k, issue 20)
    bottom = BottomSpec(hidden=m.hidden, out_dim=config.privacy.cut_width(m.cut_dim),
                        activation=m.activation,
                        dropout=m.dropout, optimizer=t.optimizer, lr=t.lr,
                        weight_decay=t.weight_decay, seed=config.seed,
                        standardize=m.standardize, bottom=m.bottom, channels=m.channels,
                        kernels=m.kernels, image_shape=m.image_shape)
    agg = AggregatorConfig(**{**m.aggregator.__dict__, "seed": config.seed})
    privacy = config.privacy.public_settings() if config.privacy.enabled else None
    return TrainingPlan(bottom=bottom, top_hidden=m.top_hidden, learn_missing=learn_missing,
                        aggregator=algorithm.aggregator, k=k, aggregator_config=agg,
                        pair_dim=m.pair_dim, privacy=privacy)


def release_plan(plan: TrainingPlan, splits: tuple[npt.NDArray[np.int64], ...], epochs: int,
                 batch_size: int) -> dict[str, int] | None:
    """What a budget-first secondary calibrates its noise for (issue 20): the epochs, the
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


def _records(raw: list[dict[str, Any]]) -> list[EpochRecord]:
    return [EpochRecord(**r) for r in raw]


def train_and_evaluate(primary: PrimaryParty, config: RunConfig, plan: TrainingPlan,
                       splits: tuple[npt.NDArray[np.int64], ...], counter: TrafficCounter,
                       *, batch_size: int, progress: Progress | None = None,
                       checkpoints: bool = False, state_prefix: str = "",
                       resume: bool = False, fingerprint: dict[str, Any] | None = None,
                       accounting: dict[str, Any] | None = None
                       ) -> tuple[dict[str, dict[str, float]], tuple[EpochRecord, ...], int]:
    """Train with early stopping on the validation metric; restore the best epoch; evaluate.

    With ``checkpoints`` every party writes its state atomically at each epoch boundary
    (``checkpoint``, and ``best`` when validation improves), so a run that died can be
    continued with ``resume``: the same batches, ids and random numbers follow, and the final
    model equals that of an uninterrupted run. ``fingerprint`` (the run's configuration and
    data, see ``runner/resume.py``) is recorded in each checkpoint.

    ``accounting["communication"]``, if a dict is given, receives the training traffic: setup,
    every epoch and the final evaluation. The setup's share travels in the checkpoint, so a
    resumed run reports the same total as an uninterrupted one. Saving, loading, snapshotting
    and restoring states is bookkeeping and not counted: a resumed run does it differently, and
    state names carry the run id.
    """
    train, val, test = splits
    t = config.training
    rng = np.random.default_rng([config.seed, 1])
    metric = primary_metric(primary.task)
    better = higher_is_better(metric)
    best: float | None = None
    best_epoch = 0
    stale = 0
    first_epoch = 1
    history: list[EpochRecord] = []
    if resume:
        state = primary.load_states(CHECKPOINT, same_data=True)
        progress_state = state["training_progress"]
        rng.bit_generator.state = progress_state["rng"]
        primary.next_batch_id = int(progress_state["next_batch_id"])
        best, best_epoch, stale = (progress_state["best"], progress_state["best_epoch"],
                                   progress_state["stale"])
        history = _records(progress_state["history"])
        setup_traffic = dict(progress_state.get("setup_communication", {}))
        first_epoch = len(history) + 1
        log.info("resuming after epoch %d (best epoch %d)", len(history), best_epoch)
        if progress is not None:
            progress("epoch", len(history), t.epochs)
    else:
        before_setup = counter.snapshot()
        primary.setup(plan, train, release_plan=release_plan(plan, splits, t.epochs,
                                                             batch_size))
        setup_traffic = TrafficCounter.delta(counter.snapshot(), before_setup)
    finished = resume and (stale >= t.patience or first_epoch > t.epochs)
    for epoch in range(first_epoch, t.epochs + 1):
        if finished:
            break
        before = counter.snapshot()
        start = time.perf_counter()
        losses = [primary.train_step(b) for b in primary.batches(train, batch_size, rng)]
        val_metrics = evaluate(primary.task, primary.targets(val), primary.predict_scores(val))
        record = EpochRecord(epoch, float(np.mean(losses)), val_metrics,
                             TrafficCounter.delta(counter.snapshot(), before),
                             time.perf_counter() - start)
        history.append(record)
        score = val_metrics[metric]
        improved = best is None or (score > best if better else score < best)
        if improved:
            best, best_epoch, stale = score, epoch, 0
            if checkpoints:
                primary.save_states(BEST, secondary_name=state_prefix + BEST)
            else:
                primary.snapshot("best")
        else:
            stale += 1
        if checkpoints:
            # per-epoch names for the secondaries: the primary's checkpoint (written last)
            # names the one that belongs to it
            primary.save_states(
                CHECKPOINT,
                secondary_name=f"{state_prefix}checkpoint-{epoch:04d}",
                extra={"run": fingerprint or {}, "training_progress": {
                    "rng": rng.bit_generator.state, "next_batch_id": primary.next_batch_id,
                    "best": best, "best_epoch": best_epoch, "stale": stale,
                    "history": [dataclasses.asdict(r) for r in history],
                    "setup_communication": setup_traffic}})
        log.info("epoch %d: loss %.4f, validation %s %.4f", epoch, record.train_loss, metric,
                 score)
        if progress is not None:
            progress("epoch", epoch, t.epochs)
        if stale >= t.patience:
            log.info("early stopping after epoch %d (best %d)", epoch, best_epoch)
            break
    if checkpoints:
        primary.load_states(BEST)
    else:
        primary.restore("best")
    before_final = counter.snapshot()
    metrics = {name: evaluate(primary.task, primary.targets(rows), primary.predict_scores(rows))
               for name, rows in (("train", train), ("validation", val), ("test", test))}
    if accounting is not None:
        accounting["communication"] = TrafficCounter.combine(
            setup_traffic, *(r.communication for r in history),
            TrafficCounter.delta(counter.snapshot(), before_final))
    return metrics, tuple(history), best_epoch


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
    built (e.g. attacks that query the model; :mod:`vflink.runner.afe_eval`).
    """
    torch.set_num_threads(config.training.threads)
    with run_compute(config.compute):  # [compute]: this run's chunked stages (issue 22)
        return _run_training(config, out_dir, overwrite=overwrite, progress=progress,
                             transcript=transcript, tables=tables, prepared=prepared,
                             federation=federation, resume=resume,
                             after_training=after_training)


def _run_training(config: RunConfig, out_dir: Path | None, *, overwrite: bool,
                  progress: Progress | None, transcript: Transcript | None,
                  tables: Inputs | tuple[PartyTable, Sequence[PartyTable]] | None,
                  prepared: Prepared | None, federation: Federation | None, resume: bool,
                  after_training: AfterTraining | None) -> RunResult:
    if out_dir is None:
        if resume:
            raise ConfigError("--resume needs the run directory of the interrupted run")
        return _run(config, None, progress, transcript, tables, prepared, federation, False,
                    after_training)
    with atomic_run_dir(out_dir, overwrite=overwrite, resume=resume,
                        keep_if=lambda d: any(d.glob(f"models/*/{CHECKPOINT}.json"))) as staging:
        result = _run(config, staging, progress, transcript, tables, prepared, federation,
                      resume, after_training)
        write_json(staging / "config.json", config_to_dict(config))
        write_json(staging / "metrics.json", result.to_json())
        write_run_ledger(staging, result)
        if "link_quality" in result.extra:  # read by `vflink predict`
            write_link_quality(staging, result.extra["link_quality"])
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
         prepared: Prepared | None, federation: Federation | None, resume: bool,
         after_training: AfterTraining | None = None) -> RunResult:
    if config.alignment.method == "psu":  # FLORIST union training: its own plan
        from vflink.runner.florist import run_union

        return run_union(config, tables=None if tables is None else _as_inputs(tables),
                         prepared=prepared, transcript=transcript, progress=progress,
                         federation=federation)
    start = time.perf_counter()
    algorithm = get_algorithm(config.algorithm)
    models_dir = None if out_dir is None else out_dir / "models"
    if prepared is None:
        inputs = _as_inputs(tables) if tables is not None else load_inputs(config)
        if resume and models_dir is not None:  # before any alignment work
            check_resume(config, models_dir / inputs.primary.name, inputs.primary, CHECKPOINT)
        if federation is None:
            federation = in_process(inputs, config, transcript=transcript, state_root=models_dir)
        prepared = prepare(config, inputs, transcript=transcript, federation=federation)
    inputs = prepared.inputs
    federation = federation or prepared.federation
    if algorithm.kind != "solo" and not inputs.secondaries and not (
            federation and federation.secondaries):
        raise ConfigError(f"algorithm {algorithm.name!r} needs at least one secondary party")
    rows = prepared.rows
    splits = run_splits(config, inputs, rows)
    learn_missing = config.alignment.unmatched == "keep"
    k = 1
    batch_size = config.training.batch_size
    primary_dir = None if models_dir is None else models_dir / inputs.primary.name
    if algorithm.kind == "vfl":
        if federation is None:
            raise ConfigError("a VFL algorithm needs the other parties (a federation)")
        counter = federation.counter
        alignments = prepared.alignments[algorithm.links]
        if algorithm.links == "exact" and config.alignment.method == "soft":
            learn_missing = True  # records without an exact match keep a "missing" embedding
        primary = PrimaryParty(inputs.primary, federation.channel,
                               secondaries=federation.secondaries, out_dir=primary_dir,
                               recorder=recorder_for(config), policy=federation.policy)
        # every secondary fetches the view of the alignment this algorithm uses
        for name in federation.secondaries:
            federation.channel.request(name, AlignmentReady(
                session=prepared.sessions[algorithm.links], coordinator=federation.coordinator),
                Ack)
        primary.set_alignments(alignments)
        k = next(iter(alignments.values())).k
        if algorithm.uses_k:
            batch_size = config.training.knn_batch_size  # App. E: K times more pairs per batch
        state_prefix = federation.state_prefix
    else:
        # Solo and Combine are centralised at the primary: nothing crosses a boundary.
        counter = TrafficCounter()
        table = inputs.primary
        if algorithm.kind == "combine":
            table = combined_table(inputs.primary, inputs.secondaries,
                                   _truth_alignments(inputs, prepared, config))
        hub = InProcessHub(transcript=transcript, counter=counter)
        primary = PrimaryParty(table, hub.channel(inputs.primary.name), secondaries=(),
                               out_dir=primary_dir)
        state_prefix = ""
    plan = _plan(config, algorithm, learn_missing=learn_missing, k=k)
    if algorithm.kind != "vfl":
        plan = dataclasses.replace(plan, privacy=None)  # nothing leaves the primary
    check_privacy_task(config.privacy, primary.task)
    if resume and plan.k != k:
        raise ConfigError("cannot resume: the alignment changed")
    accounting: dict[str, Any] = {}
    start_kinds = counter.kinds()
    metrics, history, best_epoch = train_and_evaluate(
        primary, config, plan, splits, counter, batch_size=batch_size, progress=progress,
        checkpoints=out_dir is not None, state_prefix=state_prefix, resume=resume,
        fingerprint=run_fingerprint(config, inputs.primary) if out_dir is not None else None,
        accounting=accounting)
    if out_dir is not None:
        primary.save_states(FINAL, secondary_name=state_prefix + FINAL)
        if config.evaluation.record:
            write_truth(out_dir, config, prepared, primary, algorithm.links,
                        federation.secret if federation is not None else None)
    if after_training is not None:
        after_training(primary, splits)
    extra = privacy_extra(primary) if plan.privacy is not None else {}
    sizes = {"primary_rows": len(inputs.primary), "aligned_rows": len(rows),
             "train": len(splits[0]), "validation": len(splits[1]), "test": len(splits[2]),
             "k": k, **{f"{t.name}_rows": len(t) for t in inputs.secondaries}}
    return RunResult(
        algorithm=algorithm.name, task=primary.task, metrics=metrics, history=history,
        best_epoch=best_epoch,
        communication=accounting["communication"], sizes=sizes,
        seconds=time.perf_counter() - start,
        extra={"alignment": {**prepared.summary, "communication": prepared.communication},
               **({"link_quality": training_link_quality(
                   config.alignment.method, prepared.alignments["base"],
                   federation.secondaries, splits[0], len(inputs.primary))}
                  if algorithm.kind == "vfl" and federation is not None else {}),
               "messages": TrafficCounter.kinds_delta(counter.kinds(), start_kinds),
               "linkage_figures": linkage_figures(primary.similarity, primary.model),
               **extra},
    )
