"""FLORIST union training as a training plan (``union``): its trainee and its evaluation.

The ``psu`` alignment method (:mod:`vflink.runner.setalign`) runs PSU on the simulated tables;
this plan trains over the UID list with the one training loop (:mod:`vflink.runner.loop`),
through the party-side hook :class:`vflink.parties.union.UnionPrimary` (the passive side is
:class:`vflink.parties.union.UnionPeer`), and evaluates on held-out records both parties hold.
What differs from a SplitNN plan lives here: a fixed number of epochs (no early stopping; the
last epoch is the result), AUC / ACE / accuracy as metrics (the data are imbalanced, FLORIST §3),
the last epoch's batches recorded for the spectral attack, and the synthetic-label calibration.

Batches are scheduled over the training UIDs in a canonical order (the primary's own rows
first, by row), so a run repeats from its seed whenever the primary holds every training
record. The positions of records the primary lacks come from PSU's secret random exponents,
so their order, hence the batches they fall in, differ between runs. ``baseline-partial``
learns the intersection by ECDH PSI (that is what the baseline reveals). Across hosts the
active party's attack, which is scored against which rows were synthetic at the secondary, is
not computed (NaN): only the secondary knows.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from vflink.alignment._dh import key_bytes
from vflink.alignment.synthetic import Calibration, Strategy, get_strategy
from vflink.attacks.base import AttackView
from vflink.attacks.spectral import SpectralAttack
from vflink.errors import ConfigError
from vflink.metrics.calibration import adaptive_calibration_error
from vflink.metrics.functional import accuracy, auc
from vflink.models.device import resolve_device
from vflink.models.spec import BottomSpec
from vflink.parties.setalign import SetAlignmentDriver
from vflink.parties.union import UnionPrimary, check_union_labels
from vflink.privacy.budget import BUDGET_DIR, ReleaseBudget
from vflink.privacy.label_protection import (
    LabelProtection,
    check_label_task,
    resolve_settings,
)
from vflink.protocol.sessions import new_session_name
from vflink.runfiles.config import RunConfig
from vflink.runfiles.results import EpochRecord, FloristResult, RunResult
from vflink.runner.context import RunContext
from vflink.runner.evaluation import EVALUATIONS, save_truth
from vflink.runner.loop import FINAL
from vflink.runner.protections import label_settings
from vflink.runner.setalign import Simulation, group_of, set_limits, simulate
from vflink.types import Task

__all__ = ["UnionPlan", "UnionTrainee", "union_fractions"]

log = logging.getLogger(__name__)

Rows = npt.NDArray[np.int64]


def union_fractions(config: RunConfig) -> tuple[float, float]:
    """(α, β) of a union run: baseline-full hides nothing (every record is real on both
    sides), the others the run file's."""
    if get_strategy(config.algorithm).schedule == "full":
        return 0.0, 0.0
    return config.alignment.alpha, config.alignment.beta


def _metrics(y: npt.NDArray[Any], p: npt.NDArray[np.float64]) -> dict[str, float]:
    both = len(np.unique(y)) == 2
    return {"auc": auc(y, p) if both else float("nan"),
            "ace": adaptive_calibration_error(y, p),
            "accuracy": accuracy(y, p)}


def _intersection_uids(sim: Simulation, config: RunConfig) -> Rows:
    """baseline-partial: the UIDs of the records both parties hold, which the primary learns by
    ECDH PSI with the secondary (revealing the intersection is what the baseline costs)."""
    found = SetAlignmentDriver(key_bytes(sim.p_table.frame, sim.p_table.schema.key),
                               sim.channel, group_of(config)).psi(
        sim.peer, session=new_session_name("psi-partial"), reveal="primary")
    if sim.mine.uid_index is None:
        raise ConfigError("union training needs a finished PSU session")
    return np.asarray(sim.mine.uid_index, dtype=np.int64)[found.rows]


class UnionTrainee:
    """The loop's view of :class:`~vflink.parties.union.UnionPrimary`: ``setup`` builds it
    (which sends the peer its UnionSetup) after the calibration is fixed from the PSU shares."""

    metric: str | None = None  # a fixed number of epochs: FLORIST reports the last

    def __init__(self, config: RunConfig, strategy: Strategy, sim: Simulation,
                 budget_dir: Path | None = None) -> None:
        self.config, self.strategy, self.sim = config, strategy, sim
        #: where the primary keeps its labels' release counts across runs (like a SplitNN
        #: primary's): its state directory, else its directory of this run
        self.budget_dir = budget_dir
        self.calibration = Calibration()
        self.p_a = self.p_p = 0.0
        self.n_train = 0
        self.last = False
        self._active: UnionPrimary | None = None

    def earliest_stop(self) -> int:
        return 1  # a fixed number of epochs (no early stopping)

    @property
    def active(self) -> UnionPrimary:
        if self._active is None:
            raise ConfigError("union training is not set up")
        return self._active

    def setup(self, splits: tuple[Rows, ...], epochs: int, batch_size: int) -> Rows:
        sim, strategy, config = self.sim, self.strategy, self.config
        train_uids = splits[0]
        if strategy.schedule == "intersection":  # baseline-partial: real data on both sides
            train_uids = train_uids[np.isin(train_uids, _intersection_uids(sim, config))]
        self.n_train = len(train_uids)
        p_rows = sim.p_rows
        self.p_a = float(np.mean(p_rows[sim.train_uids] >= 0))
        # the passive party's share of the union is public after PSU: |I_p| and |U| (Thm 1)
        self.p_p = (sim.n_secondary - sim.n_held_out) / max(len(p_rows) - sim.n_held_out, 1)
        if strategy.calibration is not None:
            # what is synthetic is known from the shares, not from the simulation's α and β
            # (across hosts the primary knows only what PSU told it)
            self.calibration = Calibration.for_synthetic(
                labels=strategy.calibrate in ("labels", "both") and self.p_a < 1.0,
                features=strategy.calibrate in ("features", "both") and self.p_p < 1.0,
                p_a=self.p_a, p_p=self.p_p, positive_rate=sim.positive_rate)
        m_cfg, t_cfg = config.model, config.training
        spec = BottomSpec(hidden=m_cfg.hidden, out_dim=m_cfg.cut_dim,
                          activation=m_cfg.activation, dropout=0.0, optimizer=t_cfg.optimizer,
                          lr=t_cfg.lr, weight_decay=t_cfg.weight_decay, seed=config.seed)
        self._active = UnionPrimary(sim.p_table, sim.channel, sim.peer, sim.mine,
                                    strategy=strategy, calibration=self.calibration, spec=spec,
                                    top_hidden=m_cfg.top_hidden, fit_uids=train_uids,
                                    labels=self._label_protection(), epochs=epochs,
                                    device=resolve_device(t_cfg.resources().device,
                                                          party=sim.p_table.name),
                                    reproducible_noise=config.privacy.reproducible_noise,
                                    run=sim.run)
        active = self._active
        if active.rate_protected and strategy.calibration is not None:
            # under a label guarantee the shift uses the protected rate, not the clean one
            self.calibration = active.calibration = Calibration.for_synthetic(
                labels=strategy.calibrate in ("labels", "both") and self.p_a < 1.0,
                features=strategy.calibrate in ("features", "both") and self.p_p < 1.0,
                p_a=self.p_a, p_p=self.p_p, positive_rate=active.positive_rate)
        return train_uids

    @property
    def positive_rate(self) -> float:
        """π as the run reports it: the protected one under a label guarantee."""
        active = self._active
        if active is not None and active.rate_protected:
            return active.positive_rate
        return self.sim.positive_rate

    def _label_protection(self) -> LabelProtection | None:
        """``[privacy] labels``: the active party protects its labels (and the synthetic ones)
        on the gradients it sends, as a SplitNN primary does."""
        config, table = self.config, self.sim.p_table
        settings = resolve_settings(label_settings(config), Task.BINARY)
        if settings is None:
            return None
        check_label_task(settings["mode"], Task.BINARY)
        budget = (ReleaseBudget.open(self.budget_dir, table.fingerprint(), len(table),
                                     party=table.name) if self.budget_dir is not None else None)
        return LabelProtection(settings, task=Task.BINARY, party=table.name,
                               n_rows=len(table), classes=2, budget=budget)

    def batches(self, rows: Rows, batch_size: int, rng: np.random.Generator) -> Iterator[Rows]:
        order = rng.permutation(rows)
        for i in range(0, len(order), batch_size):
            yield order[i:i + batch_size]

    def begin_epoch(self, epoch: int, last: bool) -> None:
        self.last = last  # the last epoch's batches are recorded for the spectral attack

    def train_step(self, batch: Rows) -> float:
        return self.active.train_step(batch, record=self.last)

    def evaluate(self, rows: Rows) -> dict[str, float]:
        return _metrics(self.active.labels_of(rows), self.active.predict(rows))

    def log_epoch(self, record: EpochRecord) -> None:
        val = record.validation
        log.info("%s epoch %d: loss %.4f, validation AUC %.4f, ACE %.4f", self.strategy.name,
                 record.epoch, record.train_loss, val["auc"], val["ace"])

    def keep_best(self, checkpoints: bool, state_prefix: str) -> None:
        pass  # never called: no early stopping

    def restore_best(self, checkpoints: bool) -> None:
        pass  # the last epoch is the result

    def save_checkpoint(self, state_prefix: str, epoch: int, extra: dict[str, Any]) -> None:
        raise ConfigError("union training does not checkpoint")

    def load_checkpoint(self) -> dict[str, Any]:
        raise ConfigError("union training does not resume")

    def progress_state(self) -> dict[str, Any]:
        return {}

    def resume_progress(self, state: dict[str, Any]) -> None:
        pass

    def final_metrics(self, splits: tuple[Rows, ...], history: list[EpochRecord]
                      ) -> dict[str, dict[str, float]]:
        return {"train": {"loss": history[-1].train_loss}, "validation": history[-1].validation,
                "test": self.evaluate(splits[2])}


@EVALUATIONS.register("spectral-attack")
def spectral_attack(ctx: RunContext) -> dict[str, Any]:
    """Spectral attack AUC (App. C) over the last epoch's batches, on both sides: the stronger
    of its two readings, and App. C's own outlier reading (``vflink.attacks.spectral``).

    The passive party's attack is scored against the labels the primary synthesised (it knows
    them); the active party's against the rows the secondary filled, which only the secondary
    knows: NaN when it runs on another host."""
    trainee = ctx.trainee
    if not isinstance(trainee, UnionTrainee):
        raise ConfigError("the spectral attack of union training needs a union run")
    records, s_rows = trainee.active.records, trainee.sim.s_rows
    nan = float("nan")
    # App. C's own reading first, the reported AUC last (tables list metrics in this order)
    out = {f"attack_auc_{side}{suffix}": nan for suffix in ("_outlier", "")
           for side in ("passive", "active")}
    if not records:
        return out
    sizes = [len(r.uids) for r in records]
    bounds = np.cumsum([0, *sizes])
    batches = [np.arange(bounds[i], bounds[i + 1]) for i in range(len(records))]
    uids = np.concatenate([r.uids for r in records])
    grads = np.concatenate([r.gradients for r in records])
    fake_labels = np.concatenate([r.synthetic_labels for r in records])
    passive = SpectralAttack(target="gradients").evaluate(
        AttackView(party="passive", role="secondary", gradients=grads,
                   extra={"batches": batches}), {"synthetic": fake_labels})
    out["attack_auc_passive"] = passive.metrics["auc"]
    out["attack_auc_passive_outlier"] = passive.metrics["auc_outlier"]
    if s_rows is not None:
        embs = np.concatenate([r.embeddings for r in records])
        labels = np.concatenate([r.labels for r in records])
        active = SpectralAttack(target="embeddings").evaluate(
            AttackView(party="active", role="primary", embeddings=embs,
                       extra={"batches": batches, "labels": labels}),
            {"synthetic": s_rows[uids] < 0})
        out["attack_auc_active"] = active.metrics["auc"]
        out["attack_auc_active_outlier"] = active.metrics["auc_outlier"]
    return out


def _write_recording(run_dir: Path, trainee: UnionTrainee, state_prefix: str) -> None:
    """``[evaluation] record``: what the secondary received (each training batch's
    gradients by UID, the seed it was told) into its folder of the run, where ``vflink
    attack`` reads it, and the primary's real labels by UID as the evaluation-only truth the
    label attacks are scored against. A UID the primary lacks has a synthetic label, which is
    not the primary's to protect: it is left out of the truth, so no attack is scored on it."""
    sim, active = trainee.sim, trainee.active
    held = np.flatnonzero(active.rows >= 0)  # UIDs of the primary's own records, sorted
    save_truth(run_dir, {
        f"labels__{sim.peer}__rows": held.astype(np.int64),
        f"labels__{sim.peer}__values": active.y.numpy()[active.rows[held]].astype(np.int64)},
        task=Task.BINARY.value, parties={sim.peer: {"labels": int(held.size)}})
    if sim.local is None:
        # across hosts the secondary keeps what it received: asked to save its final state,
        # it writes its model and (when its own [evaluation] record says so) its recording
        # into its own state directory, as after a SplitNN run (vflink attack --truth)
        active.save_peer_state(state_prefix + FINAL)
        log.info("the secondary %s saved its final state (and its recording, if it records) "
                 "in its own state directory; the truth to score attacks is in %s", sim.peer,
                 run_dir)
        return
    recorder = sim.local.recording_of(active.name, sim.run)
    if recorder is not None:
        recorder.flush(run_dir / "models" / sim.peer, party=sim.peer, role="secondary")


@dataclass(frozen=True)
class UnionPlan:
    """The ``union`` entry of ``PLANS``: what union training builds, trains and reports."""

    evaluations: tuple[str, ...]
    checkpoints: bool = False  # FLORIST's runs are short: no states to resume from

    def check(self, config: RunConfig) -> None:
        strategy = get_strategy(config.algorithm)
        if config.privacy.protects_labels:  # before any work: dp cannot account for some
            check_union_labels(config.privacy.label_mode(Task.BINARY), strategy,
                               default=config.privacy.labels is None)

    def build(self, ctx: RunContext) -> None:
        config = ctx.config
        alpha, beta = union_fractions(config)
        cached = None if ctx.prepared is None else ctx.prepared.summary.get("simulation")
        if isinstance(cached, Simulation) and (cached.alpha, cached.beta) == (alpha, beta):
            sim = cached
        else:  # e.g. an experiment's alignment of this seed, for other fractions
            inputs = ctx.tables if ctx.tables is not None else ctx.inputs
            if inputs is None:  # pragma: no cover - the load stage ran
                raise ConfigError("union training needs the parties' tables")
            federation = ctx.federation
            if federation is None and ctx.prepared is not None and not inputs.secondaries:
                federation = ctx.prepared.federation
            sim = simulate(config, inputs, alpha, beta, ctx.transcript, federation)
        ctx.counter = sim.counter
        ctx.splits = (sim.train_uids, sim.val_uids, sim.test_uids)
        ctx.batch_size = config.training.batch_size
        federation = ctx.federation
        state = federation.state_dir if federation is not None else None
        own = state if state is not None else (
            None if ctx.models_dir is None else ctx.models_dir / sim.p_table.name)
        ctx.trainee = UnionTrainee(config, get_strategy(config.algorithm), sim,
                                   budget_dir=None if own is None else own / BUDGET_DIR)
        ctx.state.update(fractions=(alpha, beta))

    def evaluate(self, ctx: RunContext) -> RunResult:
        trainee = ctx.trainee
        if not isinstance(trainee, UnionTrainee):
            raise ConfigError("union training needs its trainee")
        attack: dict[str, Any] = {}
        for name in self.evaluations:
            attack.update(EVALUATIONS.get(name)(ctx))
        if ctx.config.evaluation.record and ctx.out_dir is not None:
            _write_recording(ctx.out_dir, trainee, "" if ctx.federation is None
                             else ctx.federation.state_prefix)
        metrics = {**ctx.metrics, "test": {**ctx.metrics["test"], **attack}}
        sim, strategy, calib = trainee.sim, trainee.strategy, trainee.calibration
        alpha, beta = ctx.state["fractions"]
        labels = trainee.active.labels
        protections: dict[str, Any] = {} if labels is None else {
            "protections": [labels.report()]}
        florist = {"strategy": strategy.name, "alpha": alpha, "beta": beta,
                   "group": ctx.config.alignment.group, "p_a": trainee.p_a, "p_p": trainee.p_p,
                   "positive_rate": trainee.positive_rate,
                   "calibration": {"a": calib.a, "b": calib.b, "mode": strategy.calibration},
                   "psu_communication": sim.psu_communication,
                   "set_limits": {sim.peer: set_limits(sim.mine)}, **attack}
        extra: dict[str, Any] = {**protections, "florist": florist}
        return FloristResult(
            algorithm=strategy.name, task=sim.p_table.schema.task,  # type: ignore[arg-type]
            metrics=metrics, history=ctx.history, best_epoch=ctx.best_epoch,
            communication=ctx.communication, sizes={**sim.sizes, "train_uids": trainee.n_train},
            seconds=time.perf_counter() - ctx.start, extra=extra)
