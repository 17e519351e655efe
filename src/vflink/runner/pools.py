"""Which records a primary record may be linked to: the whole secondary table, or its split.

``alignment.pool = "all"`` (the default) links every primary record against every secondary
record, as a real deployment must: nobody knows in advance which secondary records belong to
the test set.

``alignment.pool = "split"`` is the FedSim authors' protocol for their synthetic data
(``SimModel.prepare_train_combine`` with ``dataset_type = 'syn'``): the primary's rows are split
into train / validation / test first, and each split's primary records are linked only against
the secondary records *of the same entities* (``data2[train_idx1]`` etc.). The pool of the test
split is then 12,000 records instead of 60,000, which makes linkage much easier (and needs the
ground truth, so it is a research protocol only). The similarities of the validation and test
linkages are normalised with the training linkage's (μ0, σ0), as the authors fit their scaler
on the training similarities only.

Each split is linked through its own in-process coordinator over the same traffic counter; the
merged alignment is then handed to the run's coordinator, so the secondaries fetch it exactly as
they fetch an ``"all"`` alignment.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from vflink.data.split import split_rows
from vflink.data.table import PartyTable
from vflink.errors import ConfigError
from vflink.linkage import SearchOptions
from vflink.parties import CoordinatorParty, PrimaryParty, SecondaryParty
from vflink.parties.linking import LinkField
from vflink.protocol import EncodingSpec
from vflink.runfiles.config import RunConfig
from vflink.runfiles.inputs import Inputs
from vflink.runner.federation import COORDINATOR, Federation, local_roles
from vflink.runner.protections import Protection, coordinator_seed, request_settings
from vflink.transport import InProcessHub
from vflink.types import MISSING, Alignment

__all__ = ["link_by_split", "run_splits"]

log = logging.getLogger(__name__)


def run_splits(config: RunConfig, inputs: Inputs, rows: npt.NDArray[np.int64]
               ) -> tuple[npt.NDArray[np.int64], ...]:
    """(train, validation, test) primary rows: the dataset's fixed split where it has one
    (a reproduction preset such as ``sklearn-reference``), else a seeded split of ``rows``."""
    if inputs.splits is not None:
        keep = np.zeros(len(inputs.primary), dtype=bool)
        keep[rows] = True
        return tuple(np.sort(part[keep[part]]) for part in inputs.splits)
    return split_rows(rows, config.training.split, np.random.default_rng([config.seed, 0]))


def _subset(table: PartyTable, rows: npt.NDArray[np.int64]) -> PartyTable:
    return PartyTable(table.schema, table.frame.iloc[rows].reset_index(drop=True), table.source)


def link_by_split(config: RunConfig, inputs: Inputs, federation: Federation,
                  splits: Sequence[npt.NDArray[np.int64]], spec: EncodingSpec | None, *,
                  metric: str, top_k: int, mode: str = "soft",
                  session: str, fields: Sequence[LinkField] = (),
                  protections: Sequence[Protection] = ()) -> dict[str, Alignment]:
    """Soft-link each split's primary rows against the same split's secondary rows only.

    ``fields`` (with ``config.alignment.blocking``) links on several fields instead of one
    encoded identifier (``spec``, ``metric``). Returns one alignment per secondary over all
    primary rows (global row numbers), and gives it to the run's coordinator under ``session``.
    ``protections`` (similarity noise) add their settings to every split's request.
    """
    if inputs.truth is None:
        raise ConfigError("alignment.pool = \"split\" needs a dataset with ground truth (it "
                          "restricts each split's pool to the true matches of that split)")
    coordinator = federation.parties.get(federation.coordinator)
    if not isinstance(coordinator, CoordinatorParty):
        raise ConfigError("alignment.pool = \"split\" is a simulation protocol: it needs the "
                          "parties in this process")
    a = config.alignment
    names = federation.secondaries
    parts: dict[str, list[tuple[npt.NDArray[np.int64], Alignment, npt.NDArray[np.int64]]]] = {
        n: [] for n in names}
    scale: tuple[float, float] | None = None
    for i, prim_rows in enumerate(splits):
        sec_rows = {n: inputs.truth[n][prim_rows] for n in names}
        if any((r == MISSING).any() for r in sec_rows.values()):
            raise ConfigError("alignment.pool = \"split\" needs every primary record of a split "
                              "to have a true match in every secondary")
        hub = InProcessHub(counter=federation.counter)
        # the same policy and roles as the run's own in-process parties, so each defends itself
        policy = federation.policy
        roles = local_roles(inputs.primary.name, names)
        hub.register(COORDINATOR, CoordinatorParty(
            COORDINATOR, seed=coordinator_seed(config, config.seed * 7 + i),
            search=SearchOptions(mode=a.search),  # type: ignore[arg-type]
            roles=roles, policy=policy))
        tables = {t.name: t for t in inputs.secondaries}
        for n in names:
            hub.register(n, SecondaryParty(_subset(tables[n], sec_rows[n]), hub.channel(n),
                                           secret=federation.secret, roles=roles, policy=policy))
        primary = PrimaryParty(_subset(inputs.primary, prim_rows),
                               hub.channel(inputs.primary.name), secondaries=names,
                               secret=federation.secret, policy=policy)
        # the private default τ unless given (or exact mode): the similarity-noise protection
        protect = request_settings(protections, config, mode=mode)
        if fields:
            got = primary.initiator().align_fields(
                COORDINATOR, fields, blocking=a.blocking, top_k=top_k, mode=mode,
                session=session, scale=scale, **protect)
        elif spec is not None:
            got = primary.initiator().align_soft(
                COORDINATOR, spec, metric=metric, top_k=top_k, mode=mode, session=session,
                scale=scale, **protect)
        else:
            raise ConfigError("a split linkage needs an encoding or fields")
        if scale is None and mode == "soft":  # the training split fixes Eq. 1's (μ0, σ0)
            meta = got[names[0]].meta
            if "mu0" in meta and "sigma0" in meta:
                scale = (float(meta["mu0"]), float(meta["sigma0"]))
        for n in names:
            parts[n].append((prim_rows, got[n], sec_rows[n]))
    merged: dict[str, Alignment] = {}
    for n in names:
        p_idx, s_idx, sims = [], [], []
        for prim_rows, al, pool_rows in parts[n]:
            p_idx.append(prim_rows[al.primary_index])
            local = al.secondary_index
            s_idx.append(np.where(local == MISSING, MISSING, pool_rows[np.maximum(local, 0)]))
            if al.similarity is not None:
                sims.append(al.similarity)
        first = parts[n][0][1]
        merged[n] = Alignment(np.concatenate(p_idx), np.concatenate(s_idx),
                              np.concatenate(sims) if len(sims) == len(parts[n]) else None, n,
                              {**first.meta, "pool_split": 1.0})
    coordinator.adopt(session, merged, primary=inputs.primary.name)
    log.info("linked %d splits, each against its own secondary records (pool = split)",
             len(splits))
    return merged
