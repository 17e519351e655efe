"""FLORIST in runs: exact alignment by ECDH PSI (``alignment.method = "psi"``) and training over
the PSU union with synthetic rows (``alignment.method = "psu"``, algorithms named after the
paper's strategies: ``label-majority-tr``, ``fea-sampling``, ``baseline-partial``...).

The union run is a simulation of FLORIST §3: from tables where both parties hold every record,
it hides a fraction β of the training records from the primary (whose labels become synthetic)
and α from the secondary (whose features become synthetic), runs PSU between the parties'
remaining tables through their channel, trains over the UID list, and evaluates on held-out
records that both parties hold. Which rows were hidden is evaluation-only truth used for the
spectral attack; the parties never receive it.

The same code runs in one process (the secondary's table given here: it is built behind an
in-process hub) and across hosts (``vflink train --party``: the secondary is served elsewhere and
reached through the federation's gRPC channel). Across hosts the secondary's own table says
which records it holds, so ``alignment.alpha`` must be 0 there (serve the secondary with a table
that lacks the records to simulate α), and the active party's attack, which is scored against
which rows were synthetic at the secondary, is not computed (NaN): only the secondary knows.
``baseline-partial`` learns the intersection by ECDH PSI (that is what the baseline reveals)
in both cases.

Batches are scheduled over the training UIDs in a canonical order (the primary's own rows
first, by row), so a run repeats from its seed whenever the primary holds every training
record. The positions of records the primary lacks come from PSU's secret random exponents,
so their order, hence the batches they fall in, differ between runs.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd
import torch

from vflink.alignment._dh import key_bytes
from vflink.alignment.groups import Group, get_group
from vflink.alignment.synthetic import Calibration, get_strategy
from vflink.attacks.base import AttackView
from vflink.attacks.spectral import SpectralAttack
from vflink.data.split import split_rows
from vflink.data.table import PartyTable
from vflink.errors import ConfigError
from vflink.metrics.calibration import adaptive_calibration_error
from vflink.metrics.functional import accuracy, auc
from vflink.models.spec import BottomSpec
from vflink.parties import SecondaryParty
from vflink.parties.setalign import SetAlignment, SetAlignmentDriver, pair_by_uid
from vflink.parties.union import UnionPrimary, uid_rows
from vflink.protocol.channel import Channel
from vflink.protocol.sessions import new_session_name
from vflink.runfiles.algorithms import get_algorithm
from vflink.runfiles.config import RunConfig
from vflink.runfiles.inputs import Inputs, load_inputs
from vflink.runfiles.results import EpochRecord, FloristResult
from vflink.runner.compute import current_compute
from vflink.runner.context import Prepared
from vflink.runner.federation import Federation, run_policy
from vflink.transport import InProcessHub, TrafficCounter, Transcript
from vflink.types import MISSING, Alignment

__all__ = ["FloristResult", "prepare_set_alignment", "psi_alignments", "run_union"]

log = logging.getLogger(__name__)

Progress = Callable[[str, int, int], None]


def _group(config: RunConfig) -> Group:
    """The run's DH group, its batches on the run's engine (issue 22)."""
    return get_group(config.alignment.group, compute=current_compute())


def psi_alignments(inputs: Inputs, federation: Federation, config: RunConfig,
                   session: str | None = None) -> dict[str, Alignment]:
    """Exact alignment by ECDH PSI with each secondary under ``session`` (new per run): both
    learn the intersection and a UID per intersecting record; the secondary then tells the
    primary its rows in UID order."""
    primary = inputs.primary
    keys = key_bytes(primary.frame, primary.schema.key, who=primary.source)
    out: dict[str, Alignment] = {}
    for name in federation.secondaries:
        driver = SetAlignmentDriver(keys, federation.channel, _group(config))
        session = session or new_session_name("psi")  # finished sessions are immutable
        mine = driver.psi(name, session=session, reveal="both")
        view = driver.fetch_rows(name, session)
        own, theirs = pair_by_uid(mine, view.secondary_index)
        sec = np.full(len(primary), -1, dtype=np.int64)
        sec[own] = theirs
        out[name] = Alignment(np.arange(len(primary), dtype=np.int64), sec[:, None], None, name,
                              {"matched": float(len(own) / max(len(primary), 1))})
    return out


def _subset(table: PartyTable, keep: npt.NDArray[np.int64]) -> PartyTable:
    frame = table.frame.iloc[np.sort(keep)].reset_index(drop=True)
    return PartyTable(table.schema, frame, table.source)


def _metrics(y: npt.NDArray[Any], p: npt.NDArray[np.float64]) -> dict[str, float]:
    both = len(np.unique(y)) == 2
    return {"auc": auc(y, p) if both else float("nan"),
            "ace": adaptive_calibration_error(y, p),
            "accuracy": accuracy(y, p)}


@dataclass(frozen=True)
class _Simulation:
    """The parties after FLORIST §3's hiding and PSU: reused by every strategy of a seed."""

    alpha: float
    beta: float
    p_table: PartyTable
    counter: TrafficCounter
    channel: Channel
    peer: str
    mine: SetAlignment
    p_rows: npt.NDArray[np.int64]
    #: evaluation-only truth: the secondary's row per UID and its table, as simulated (None
    #: when it runs on another host)
    s_rows: npt.NDArray[np.int64] | None
    s_table: PartyTable | None
    train_uids: npt.NDArray[np.int64]
    val_uids: npt.NDArray[np.int64]
    test_uids: npt.NDArray[np.int64]
    n_held_out: int
    #: |I_p|, which PSU tells the primary (Theorem 1)
    n_secondary: int
    positive_rate: float
    psu_communication: dict[str, dict[str, int]]
    sizes: dict[str, int]


def _local_secondary(config: RunConfig, inputs: Inputs, p_keys: list[bytes],
                     held_out: npt.NDArray[np.int64], hide_s: npt.NDArray[np.int64],
                     transcript: Transcript | None
                     ) -> tuple[SecondaryParty, Channel, TrafficCounter, int]:
    """The secondary in this process, on its table less the records hidden from it."""
    secondary = inputs.secondaries[0]
    s_keys = key_bytes(secondary.frame, secondary.schema.key, who=secondary.source)
    s_pos = pd.Series(np.arange(len(s_keys)), index=pd.Index(s_keys))
    if s_pos.reindex(pd.Index([p_keys[i] for i in held_out])).isna().any():
        raise ConfigError("union training evaluates on records both parties hold: every "
                          "primary record needs a counterpart at the secondary")
    hidden_s_rows = s_pos.reindex(pd.Index([p_keys[i] for i in hide_s])).dropna()
    keep_s = np.setdiff1d(np.arange(len(secondary)), hidden_s_rows.to_numpy(dtype=np.int64))
    counter = TrafficCounter()
    hub = InProcessHub(transcript=transcript, counter=counter)
    # the run's own policy: one operator owns both parties in a simulation (run_policy)
    peer = SecondaryParty(_subset(secondary, keep_s), hub.channel(secondary.name),
                          policy=run_policy(config))
    peer.compute = current_compute()
    hub.register(secondary.name, peer)
    return peer, hub.channel(inputs.primary.name), counter, len(hidden_s_rows)


def _simulate(config: RunConfig, inputs: Inputs, alpha: float, beta: float,
              transcript: Transcript | None = None, federation: Federation | None = None
              ) -> _Simulation:
    remote = not inputs.secondaries
    if remote:
        if federation is None or len(federation.secondaries) != 1:
            raise ConfigError("union training (alignment.method = \"psu\") runs between the "
                              "primary and one secondary: give the secondary's table, or a "
                              "federation with one secondary served elsewhere")
        if alpha > 0:
            raise ConfigError(f"alignment.alpha = {alpha} simulates records the secondary "
                              "lacks by removing them from its table in this process; across "
                              "hosts the secondary's own table decides which records it holds: "
                              "serve it with a table that lacks them and set alpha = 0")
    elif len(inputs.secondaries) != 1:
        raise ConfigError("union training (alignment.method = \"psu\") is a simulation of FLORIST "
                          "§3 with the primary and one secondary; got "
                          f"{len(inputs.secondaries)} secondary table(s) here")
    primary = inputs.primary
    n = len(primary)
    train, val, test = split_rows(np.arange(n, dtype=np.int64), config.training.split,
                                  np.random.default_rng([config.seed, 0]))
    p_keys = key_bytes(primary.frame, primary.schema.key, who=primary.source)
    held_out = np.concatenate([val, test])
    # FLORIST §3: hide β of the training records from the active party and α from the
    # passive one (independently), with the seed
    hide_rng = np.random.default_rng([config.seed, 17])
    hide_p = hide_rng.choice(train, size=int(round(beta * len(train))), replace=False)
    hide_s = hide_rng.choice(train, size=int(round(alpha * len(train))), replace=False)
    keep_p = np.setdiff1d(np.arange(n), hide_p)
    p_table = _subset(primary, keep_p)
    # the parties, talking through a channel: in this process or across hosts
    local: SecondaryParty | None = None
    if federation is not None and remote:
        channel, counter, peer = federation.channel, federation.counter, federation.secondaries[0]
        n_hidden_s = 0
    else:
        local, channel, counter, n_hidden_s = _local_secondary(config, inputs, p_keys, held_out,
                                                               hide_s, transcript)
        peer = local.name
    before = counter.snapshot()
    psu_session = new_session_name("psu")
    mine = SetAlignmentDriver(key_bytes(p_table.frame, p_table.schema.key), channel,
                              _group(config)).psu(peer, session=psu_session)
    psu_bytes = TrafficCounter.delta(counter.snapshot(), before)
    p_rows = uid_rows(mine)
    s_rows, s_table = None, None
    if local is not None:
        s_table = local.table
        theirs = local.set_alignment(psu_session)
        if theirs is None:
            raise ConfigError("the secondary did not finish PSU")
        s_rows = uid_rows(theirs)
    # UIDs of the primary's held-out records (rows of p_table: keep_p is sorted)
    new_row = np.full(n, -1, dtype=np.int64)
    new_row[keep_p] = np.arange(len(keep_p))
    uid_of_row = np.full(len(keep_p), -1, dtype=np.int64)
    uid_of_row[p_rows[p_rows >= 0]] = np.flatnonzero(p_rows >= 0)
    val_uids, test_uids = uid_of_row[new_row[val]], uid_of_row[new_row[test]]
    train_uids = _canonical(np.setdiff1d(np.arange(len(p_rows)),
                                         np.concatenate([val_uids, test_uids])), p_rows)
    y_all = primary.frame[primary.schema.label].to_numpy()
    n_secondary = int(mine.sizes["secondary"])
    sizes = {"primary_rows": len(p_table), "secondary_rows": n_secondary,
             "union": len(p_rows), "validation": len(val), "test": len(test),
             "hidden_from_primary": len(hide_p)}
    if local is not None:
        sizes["hidden_from_secondary"] = n_hidden_s
    return _Simulation(alpha, beta, p_table, counter, channel, peer, mine, p_rows, s_rows,
                       s_table, train_uids, val_uids, test_uids, len(held_out), n_secondary,
                       float(np.mean(y_all[np.setdiff1d(train, hide_p)])), psu_bytes, sizes)


def _canonical(uids: npt.NDArray[np.int64], p_rows: npt.NDArray[np.int64]
               ) -> npt.NDArray[np.int64]:
    """The UIDs in an order that does not depend on PSU's random exponents where that is
    possible: those of the primary's own records by row, then the others in U's order."""
    held = p_rows[uids] >= 0
    own = uids[held][np.argsort(p_rows[uids[held]], kind="stable")]
    return np.concatenate([own, uids[~held]])


def _intersection_uids(sim: _Simulation, config: RunConfig) -> npt.NDArray[np.int64]:
    """baseline-partial: the UIDs of the records both parties hold, which the primary learns by
    ECDH PSI with the secondary (revealing the intersection is what the baseline costs)."""
    found = SetAlignmentDriver(key_bytes(sim.p_table.frame, sim.p_table.schema.key),
                               sim.channel, _group(config)).psi(
        sim.peer, session=new_session_name("psi-partial"), reveal="primary")
    if sim.mine.uid_index is None:
        raise ConfigError("union training needs a finished PSU session")
    return np.asarray(sim.mine.uid_index, dtype=np.int64)[found.rows]


def run_union(config: RunConfig, *, tables: Inputs | None = None,
              prepared: Prepared | None = None, transcript: Transcript | None = None,
              progress: Progress | None = None, federation: Federation | None = None
              ) -> FloristResult:
    """One FLORIST union-training run (see the module docstring).

    ``federation``: the secondary served elsewhere (``tables`` then hold the primary's table
    only); without one, the secondary's table in ``tables`` is built in this process.
    """
    start = time.perf_counter()
    torch.set_num_threads(config.training.threads)
    strategy = get_strategy(config.algorithm)
    a_cfg, t_cfg, m_cfg = config.alignment, config.training, config.model
    # baseline-full hides nothing: every record is real on both sides
    alpha, beta = (0.0, 0.0) if strategy.schedule == "full" else (a_cfg.alpha, a_cfg.beta)
    cached = None if prepared is None else prepared.summary.get("simulation")
    if isinstance(cached, _Simulation) and (cached.alpha, cached.beta) == (alpha, beta):
        sim = cached
    else:
        inputs = tables if tables is not None else (
            prepared.inputs if prepared is not None else load_inputs(config))
        if federation is None and prepared is not None and not inputs.secondaries:
            federation = prepared.federation
        sim = _simulate(config, inputs, alpha, beta, transcript, federation)
    counter, channel, p_rows = sim.counter, sim.channel, sim.p_rows
    before_run = counter.snapshot()
    train_uids, val_uids, test_uids = sim.train_uids, sim.val_uids, sim.test_uids
    if strategy.schedule == "intersection":  # baseline-partial: real data on both sides only
        train_uids = train_uids[np.isin(train_uids, _intersection_uids(sim, config))]
    n_train = len(train_uids)
    p_a = float(np.mean(p_rows[sim.train_uids] >= 0))
    # the passive party's share of the union is public after PSU: |I_p| and |U| (Theorem 1)
    p_p = (sim.n_secondary - sim.n_held_out) / max(len(p_rows) - sim.n_held_out, 1)
    pi = sim.positive_rate
    calib = Calibration()
    if strategy.calibration is not None:
        # what is synthetic is known from the shares, not from the simulation's α and β
        # (across hosts the primary knows only what PSU told it)
        calib = Calibration.for_synthetic(
            labels=strategy.calibrate in ("labels", "both") and p_a < 1.0,
            features=strategy.calibrate in ("features", "both") and p_p < 1.0,
            p_a=p_a, p_p=p_p, positive_rate=pi)
    spec = BottomSpec(hidden=m_cfg.hidden, out_dim=m_cfg.cut_dim, activation=m_cfg.activation,
                      dropout=0.0, optimizer=t_cfg.optimizer, lr=t_cfg.lr,
                      weight_decay=t_cfg.weight_decay, seed=config.seed)
    active = UnionPrimary(sim.p_table, channel, sim.peer, sim.mine, strategy=strategy,
                          calibration=calib, spec=spec, top_hidden=m_cfg.top_hidden,
                          fit_uids=train_uids)
    batch_rng = np.random.default_rng([config.seed, 1])
    history: list[EpochRecord] = []
    for epoch in range(1, t_cfg.epochs + 1):
        before = counter.snapshot()
        t0 = time.perf_counter()
        order = batch_rng.permutation(train_uids)
        last = epoch == t_cfg.epochs
        losses = [active.train_step(order[i:i + t_cfg.batch_size], record=last)
                  for i in range(0, len(order), t_cfg.batch_size)]
        val_m = _metrics(active.labels_of(val_uids), active.predict(val_uids))
        history.append(EpochRecord(epoch, float(np.mean(losses)), val_m,
                                   TrafficCounter.delta(counter.snapshot(), before),
                                   time.perf_counter() - t0))
        log.info("%s epoch %d: loss %.4f, validation AUC %.4f, ACE %.4f", strategy.name, epoch,
                 history[-1].train_loss, val_m["auc"], val_m["ace"])
        if progress is not None:
            progress("epoch", epoch, t_cfg.epochs)
    test_m = _metrics(active.labels_of(test_uids), active.predict(test_uids))
    attack = _attack_aucs(active.records, sim.s_rows)
    test_m.update(attack)
    sizes = {**sim.sizes, "train_uids": n_train}
    extra = {"florist": {"strategy": strategy.name, "alpha": alpha, "beta": beta,
                         "group": a_cfg.group, "p_a": p_a, "p_p": p_p, "positive_rate": pi,
                         "calibration": {"a": calib.a, "b": calib.b,
                                         "mode": strategy.calibration},
                         "psu_communication": sim.psu_communication, **attack}}
    return FloristResult(
        algorithm=strategy.name, task=sim.p_table.schema.task,  # type: ignore[arg-type]
        metrics={"train": {"loss": history[-1].train_loss}, "validation": history[-1].validation,
                 "test": test_m},
        history=tuple(history), best_epoch=len(history),
        communication=TrafficCounter.delta(counter.snapshot(), before_run), sizes=sizes,
        seconds=time.perf_counter() - start, extra=extra)


def _attack_aucs(records: list[Any], s_rows: npt.NDArray[np.int64] | None
                 ) -> dict[str, float]:
    """Spectral attack AUC (App. C) over the last epoch's batches, on both sides: the stronger
    of its two readings, and App. C's own outlier reading (``vflink.attacks.spectral``).

    The passive party's attack is scored against the labels the primary synthesised (it knows
    them); the active party's against the rows the secondary filled, which only the secondary
    knows: NaN when it runs on another host (``s_rows`` None)."""
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


def prepare_set_alignment(config: RunConfig, inputs: Inputs, federation: Federation
                          ) -> Prepared:
    """``prepare`` for ``psi`` (the intersection, as exact alignment gives it) and ``psu``
    (nothing to prepare: each union run does its own PSU on its simulated tables)."""
    n = len(inputs.primary)
    rows = np.arange(n, dtype=np.int64)
    if config.alignment.method == "psu":
        # hide and run PSU once per seed: every strategy of an experiment reuses the parties
        a_cfg = config.alignment
        sim = _simulate(config, inputs, a_cfg.alpha, a_cfg.beta,
                        federation=None if inputs.secondaries else federation)
        return Prepared(inputs, {}, {}, rows, sim.psu_communication, federation,
                        {"method": "psu", "simulation": sim})
    if get_algorithm(config.algorithm).kind == "florist":
        raise ConfigError(f"algorithm {config.algorithm!r} trains over the PSU union: set "
                          "alignment.method = \"psu\"")
    before = federation.counter.snapshot()
    session = new_session_name("psi")  # a finished session is immutable: new per run
    base = psi_alignments(inputs, federation, config, session)
    if config.alignment.unmatched == "drop":
        for a in base.values():
            rows = rows[a.for_primary_rows(n)[rows, 0] != MISSING]
    summary = {"method": "psi", "group": config.alignment.group,
               "matched_fraction": {k: float(np.mean(a.matched)) for k, a in base.items()},
               "unmatched": config.alignment.unmatched}
    return Prepared(inputs, {"base": base, "top1": base, "exact": base},
                    dict.fromkeys(("base", "top1", "exact"), session), rows,
                    TrafficCounter.delta(federation.counter.snapshot(), before), federation,
                    summary)
