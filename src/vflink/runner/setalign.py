"""FLORIST's set alignments as alignment methods: ECDH PSI (``psi``) and PSU (``psu``).

``psi`` aligns exactly, as ``exact`` does, by the intersection (``prepare_psi``). ``psu`` is a
simulation of FLORIST §3 (``simulate``): from tables where both parties hold every record, it
hides a fraction β of the training records from the primary (whose labels become synthetic)
and α from the secondary (whose features become synthetic), and runs PSU between the parties'
remaining tables through their channel. Which rows were hidden is evaluation-only truth used
for the spectral attack; the parties never receive it. Training over the union is the
``union`` plan (:mod:`vflink.runner.union`), which the ``psu`` entry of ``ALIGNMENTS`` fixes.

The same code runs in one process (the secondary's table given here: it is built behind an
in-process hub) and across hosts (``vflink train --party``: the secondary is served elsewhere and
reached through the federation's gRPC channel). Across hosts the secondary's own table says
which records it holds, so ``alignment.alpha`` must be 0 there (serve the secondary with a table
that lacks the records to simulate α).

It may import the party layer (:mod:`vflink.parties.setalign` is the party-side hook), run
files and the federation; nothing in the orchestration above it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from vflink.alignment._dh import key_bytes
from vflink.alignment.engine import EngineSettings, require_engine
from vflink.alignment.groups import Group, get_group
from vflink.data.split import split_rows
from vflink.data.table import PartyTable
from vflink.errors import ConfigError
from vflink.parties import SecondaryParty
from vflink.parties.setalign import SetAlignment, SetAlignmentDriver, pair_by_uid
from vflink.parties.setengine import drive_engine_psi
from vflink.parties.union import uid_rows
from vflink.protocol.channel import Channel
from vflink.protocol.sessions import new_session_name
from vflink.runfiles.algorithms import get_algorithm
from vflink.runfiles.config import RunConfig
from vflink.runfiles.inputs import Inputs
from vflink.runner.compute import current_compute
from vflink.runner.context import Prepared
from vflink.runner.federation import Federation, recorder_for, run_policy
from vflink.transport import InProcessHub, TrafficCounter, Transcript
from vflink.types import MISSING, Alignment

__all__ = ["Simulation", "group_of", "prepare_psi", "prepare_psu", "psi_alignments",
           "set_limits", "simulate"]

log = logging.getLogger(__name__)


def group_of(config: RunConfig) -> Group:
    """The run's DH group, its batches on the run's engine."""
    return get_group(config.alignment.group, compute=current_compute())


def psi_alignments(inputs: Inputs, federation: Federation, config: RunConfig,
                   session: str | None = None,
                   engines: dict[str, dict[str, Any]] | None = None) -> dict[str, Alignment]:
    """Exact alignment by ECDH PSI with each secondary under ``session`` (new per run): both
    learn the intersection and a UID per intersecting record; the secondary then tells the
    primary its rows in UID order. With ``alignment.protocol`` = ``rr22``/``kkrt`` the
    intersection comes from the PSI engine instead (:mod:`vflink.parties.setengine`), and
    ``engines`` receives each secondary's engine run (protocol, security, addresses)."""
    primary = inputs.primary
    keys = key_bytes(primary.frame, primary.schema.key, who=primary.source)
    protocol = config.alignment.protocol
    engine = _engine_of(federation, protocol)
    out: dict[str, Alignment] = {}
    for name in federation.secondaries:
        driver = SetAlignmentDriver(keys, federation.channel, group_of(config))
        session = session or new_session_name("psi")  # finished sessions are immutable
        if engine is not None:  # RR22/KKRT through the engine, agreed in the session
            mine = drive_engine_psi(driver, name, session, protocol=protocol, reveal="both",
                                    settings=engine, key_columns=len(primary.schema.key))
        else:
            mine = driver.psi(name, session=session, reveal="both")
        view = driver.fetch_rows(name, session)
        own, theirs = pair_by_uid(mine, view.secondary_index)
        sec = np.full(len(primary), -1, dtype=np.int64)
        sec[own] = theirs
        out[name] = Alignment(np.arange(len(primary), dtype=np.int64), sec[:, None], None, name,
                              {"matched": float(len(own) / max(len(primary), 1)),
                               **set_limits(mine)})
        if mine.engine and engines is not None:
            engines[name] = {**mine.engine, "seconds": dict(mine.timings)}
    return out


def _engine_of(federation: Federation, protocol: str) -> EngineSettings | None:
    """The primary's engine link for ``protocol`` (None: the DH PSI), refused with the install
    command or what to configure where it cannot run."""
    if protocol == "dh":
        return None
    require_engine(protocol)
    federation.policy.check_psi_protocol("primary", protocol)
    if federation.psi_engine is None:
        raise ConfigError(f"alignment.protocol = {protocol!r} runs the PSI engine, whose link "
                          "the primary's party file configures: add a [psi] section with "
                          "`listen = \"host:port\"` (docs/how-to/scale-out.md)")
    return federation.psi_engine


def set_limits(result: SetAlignment) -> dict[str, float]:
    """What the peer's policy said of the guesses a deviating primary can test against its set
    (``guess_limit`` per ``guess_window_s``), for the run's ledger; empty if it did not say."""
    return {k: v for k, v in result.limits.items() if k in ("guess_limit", "guess_window_s")}


def _subset(table: PartyTable, keep: npt.NDArray[np.int64]) -> PartyTable:
    frame = table.frame.iloc[np.sort(keep)].reset_index(drop=True)
    return PartyTable(table.schema, frame, table.source)


@dataclass(frozen=True)
class Simulation:
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
    #: the primary's run id in its training messages (``Federation.run``)
    run: str = ""
    #: the secondary in this process (None when it runs on another host): its recording of
    #: what it received (``[evaluation] record``) is written with the run
    local: SecondaryParty | None = None


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
                          policy=run_policy(config), resources=config.training.resources(),
                          reproducible_noise=config.privacy.reproducible_noise,
                          recorder=recorder_for(config))
    peer.compute = current_compute()
    hub.register(secondary.name, peer)
    return peer, hub.channel(inputs.primary.name), counter, len(hidden_s_rows)


def simulate(config: RunConfig, inputs: Inputs, alpha: float, beta: float,
              transcript: Transcript | None = None, federation: Federation | None = None
              ) -> Simulation:
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
                              group_of(config)).psu(peer, session=psu_session)
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
    return Simulation(alpha, beta, p_table, counter, channel, peer, mine, p_rows, s_rows,
                       s_table, train_uids, val_uids, test_uids, len(held_out), n_secondary,
                       float(np.mean(y_all[np.setdiff1d(train, hide_p)])), psu_bytes, sizes,
                       federation.run if federation is not None and remote
                       else new_session_name("run"),
                       local)


def _canonical(uids: npt.NDArray[np.int64], p_rows: npt.NDArray[np.int64]
               ) -> npt.NDArray[np.int64]:
    """The UIDs in an order that does not depend on PSU's random exponents where that is
    possible: those of the primary's own records by row, then the others in U's order."""
    held = p_rows[uids] >= 0
    own = uids[held][np.argsort(p_rows[uids[held]], kind="stable")]
    return np.concatenate([own, uids[~held]])


def prepare_psu(config: RunConfig, inputs: Inputs, federation: Federation | None, *,
                fractions: tuple[float, float] | None = None, transcript: Transcript | None = None,
                **_: Any) -> Prepared:
    """``psu``: hide records (FLORIST §3) and run PSU once, so that every strategy of a seed
    reuses the parties; ``fractions`` (α, β) default to the run file's."""
    n = len(inputs.primary)
    rows = np.arange(n, dtype=np.int64)
    a_cfg = config.alignment
    alpha, beta = fractions if fractions is not None else (a_cfg.alpha, a_cfg.beta)
    sim = simulate(config, inputs, alpha, beta, transcript,
                   federation=None if inputs.secondaries else federation)
    return Prepared(inputs, {}, {}, rows, sim.psu_communication, federation,
                    {"method": "psu", "simulation": sim})


def prepare_psi(config: RunConfig, inputs: Inputs, federation: Federation, **_: Any
                ) -> Prepared:
    """``psi``: the intersection by ECDH PSI (or by the PSI engine's ``alignment.protocol``),
    as exact alignment gives it."""
    n = len(inputs.primary)
    rows = np.arange(n, dtype=np.int64)
    if get_algorithm(config.algorithm).kind == "florist":
        raise ConfigError(f"algorithm {config.algorithm!r} trains over the PSU union: set "
                          "alignment.method = \"psu\"")
    before = federation.counter.snapshot()
    before_kinds = federation.counter.kinds()
    session = new_session_name("psi")  # a finished session is immutable: new per run
    engines: dict[str, dict[str, Any]] = {}
    base = psi_alignments(inputs, federation, config, session, engines)
    if config.alignment.unmatched == "drop":
        for a in base.values():
            rows = rows[a.for_primary_rows(n)[rows, 0] != MISSING]
    protocol = config.alignment.protocol
    summary = {"method": "psi", "protocol": protocol,
               # the report names the group; an engine run names its protocol and model
               "group": (f"{protocol} engine, semi-honest" if protocol != "dh"
                         else config.alignment.group),
               **({"engine": engines} if engines else {}),
               "matched_fraction": {k: float(np.mean(a.matched)) for k, a in base.items()},
               "unmatched": config.alignment.unmatched,
               "set_limits": {k: {m: a.meta[m] for m in ("guess_limit", "guess_window_s")
                                  if m in a.meta} for k, a in base.items()},
               # every kind that crossed, for the ledger (as the coordinator's methods list)
               "messages": TrafficCounter.kinds_delta(federation.counter.kinds(),
                                                      before_kinds)}
    return Prepared(inputs, {"base": base, "top1": base, "exact": base},
                    dict.fromkeys(("base", "top1", "exact"), session), rows,
                    TrafficCounter.delta(federation.counter.snapshot(), before), federation,
                    summary)
