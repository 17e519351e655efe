"""Protections by name (``PROTECTIONS``): what a run adds to protect what the parties release.

====================  ===========================================================================
``similarity-noise``  Gaussian noise on the similarities the coordinator returns to the primary
                      (FedSim Theorems 1-2: ``alignment.tau`` / ``sigma`` / ``delta``, the private
                      default τ when the identifiers are private); acts on the alignment request
``embedding-dp``      each secondary clips and noises the embeddings it sends (VFL-AFE;
                      ``[privacy]``); acts on the training plan every party builds from
``label-protection``  the primary protects its labels on the gradients it sends back
                      (``[privacy] labels``: max-norm, marvell, dp, rr-prior); acts on the
                      primary's own training plan (never announced to a secondary)
====================  ===========================================================================

Every entry has the same small shape (:class:`Protection`): whether the config turns it on,
a check against the task, the public settings it adds to the request its stage sends to the
parties (the coordinator's alignment request, or the :class:`~vflink.parties.TrainingPlan`),
and what it contributes to the run's record (the alignment summary, or ``RunResult.extra``:
``protections`` for the privacy ledger, ``privacy`` for metrics.json) from what the parties
report back. The protection itself is applied party-side: the coordinator adds the similarity
noise (:mod:`vflink.linkage.privacy`); each secondary wraps its release
(:mod:`vflink.parties.privacy`); the primary protects what it sends back
(:mod:`vflink.privacy.label_protection`). :func:`vflink.runner.pipeline.build_pipeline` picks the
entries a config turns on (:func:`chosen`); the stages ask them, never the config's sections.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from vflink.errors import ConfigError
from vflink.linkage.privacy import describe_protection
from vflink.privacy.config import PrivacyConfig
from vflink.privacy.label_protection import check_label_task
from vflink.randomness import REPRODUCIBLE, SECRET
from vflink.registry import Registry
from vflink.runfiles.config import RunConfig
from vflink.types import Task

if TYPE_CHECKING:
    from vflink.parties import PrimaryParty

__all__ = ["ALIGNMENT", "PROTECTIONS", "TRAINING", "Protection", "check_privacy_task", "chosen",
           "coordinator_seed", "label_noise_seed", "label_settings", "merge_reports",
           "request_settings"]

#: the stages a protection acts on: the alignment request, or the training plan
ALIGNMENT, TRAINING = "alignment", "training"


@dataclass(frozen=True)
class Protection:
    """An entry of ``PROTECTIONS``.

    * ``acts_on``: ``"alignment"`` (its settings go into the coordinator's linkage request) or
      ``"training"`` (into the training plan every party builds its part from);
    * ``enabled(config)``: whether the run file turns it on;
    * ``check(config, task)``: refuses settings the task cannot have, before training;
    * ``settings(config, mode)``: the public keyword arguments it adds to that request
      (``mode``: the linkage mode of an alignment request; ``"exact"`` links carry no distances);
    * ``report(evidence)``: what it adds to the run's record, from what the parties reported
      back: the coordinator's linkage parameters (``Alignment.meta``) for an alignment
      protection, the trained primary (which collects each secondary's ledger entries) for a
      training one.
    """

    name: str
    acts_on: str
    enabled: Callable[[RunConfig], bool]
    settings: Callable[[RunConfig, str], dict[str, Any]]
    report: Callable[[Any], dict[str, Any]]
    check: Callable[[RunConfig, Task], None] = lambda config, task: None


PROTECTIONS: Registry[Protection] = Registry("protection")


def chosen(config: RunConfig, acts_on: str | None = None) -> tuple[Protection, ...]:
    """The protections ``config`` turns on (in the registry's order), those acting on
    ``acts_on`` only when given."""
    entries = (PROTECTIONS.get(name) for name in PROTECTIONS)
    return tuple(p for p in entries if p.enabled(config)
                 and (acts_on is None or p.acts_on == acts_on))


def request_settings(protections: Sequence[Protection], config: RunConfig, *,
                     mode: str = "soft") -> dict[str, Any]:
    """The settings every protection of ``protections`` adds to one request."""
    out: dict[str, Any] = {}
    for protection in protections:
        out.update(protection.settings(config, mode))
    return out


# -- similarity noise (FedSim Theorems 1-2) --------------------------------------------------

def _noise_settings(config: RunConfig, mode: str) -> dict[str, Any]:
    """τ / σ / δ of the coordinator's noise: the given ones, or the private default τ when the
    identifiers are private (:meth:`vflink.runfiles.config.AlignmentConfig.noise`)."""
    a_cfg = config.alignment
    tau, sigma = a_cfg.noise(mode)
    return {"tau": tau, "sigma": sigma, "delta": a_cfg.delta}


def _noise_report(meta: Any) -> dict[str, Any]:
    """The noise the coordinator applied, for the alignment summary (and so the ledger)."""
    out = {k: meta.get(k) for k in ("sigma", "tau", "epsilon", "delta")}
    if "resolution" in meta:  # Theorem 2's distance step of a multi-field link
        out["resolution"] = meta["resolution"]
    out["similarity_protection"] = describe_protection(
        meta.get("sigma"), meta.get("tau"), meta.get("epsilon"), meta.get("delta"))
    # where the coordinator drew it (its meta says when it was seeded: not private)
    out["noise"] = REPRODUCIBLE if meta.get("reproducible_noise") else SECRET
    return out


PROTECTIONS.add("similarity-noise", Protection(
    "similarity-noise", ALIGNMENT,
    enabled=lambda config: config.alignment.method == "soft",
    settings=_noise_settings, report=_noise_report))


# -- embedding DP (VFL-AFE) -----------------------------------------------------------------

def check_privacy_task(privacy: PrivacyConfig, task: Task) -> None:
    """Distribution adjusting (§3.3) clusters gradients into classes: classification only."""
    if privacy.adjust and not task.is_classification:
        raise ConfigError(f"`privacy.embeddings = \"{privacy.embeddings}\"` uses distribution "
                          "adjusting (VFL-AFE §3.3), which needs a classification task; this "
                          f"run's task is {task.value}: use \"vanilla\" or \"rescale\"")


def _embedding_report(primary: PrimaryParty) -> dict[str, Any]:
    """Each secondary's report: ledger entries, and the same figures keyed by party."""
    entries = primary.privacy_reports()
    figures = {e["party"]: {"kind": e["kind"], **e["params"], **e["guarantee"]}
               for e in entries}
    return {"protections": entries, "privacy": figures}


PROTECTIONS.add("embedding-dp", Protection(
    "embedding-dp", TRAINING,
    enabled=lambda config: config.privacy.enabled,
    settings=lambda config, mode: {"privacy": config.privacy.public_settings()},
    report=_embedding_report,
    check=lambda config, task: check_privacy_task(config.privacy, task)))


def merge_reports(reports: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The training protections' reports as one ``RunResult.extra`` part: their ledger entries
    (``protections``) in order, their figures (``privacy``) by party."""
    out: dict[str, Any] = {}
    for report in reports:
        for key, value in report.items():
            if isinstance(value, list):
                out.setdefault(key, []).extend(value)
            elif isinstance(value, dict):
                out.setdefault(key, {}).update(value)
            else:
                out[key] = value
    return out


# -- label protection (the primary's gradients) ---------------------------------------------

def label_noise_seed(config: RunConfig) -> int | None:
    """The primary's label-noise seed, only with ``[privacy] reproducible_noise`` (not
    private): ``privacy.labels_seed``, else one derived from the run seed. ``None`` otherwise:
    the label noise is secret (:mod:`vflink.randomness`)."""
    privacy = config.privacy
    if not privacy.reproducible_noise:
        return None
    if privacy.labels_seed is not None:
        return int(privacy.labels_seed)
    seq = np.random.SeedSequence([config.seed, 0x1AB])
    return int(seq.generate_state(1, np.uint64)[0] >> 1)


def coordinator_seed(config: RunConfig, derived: int | None = None) -> int | None:
    """The in-process coordinator's similarity-noise seed, only with ``[privacy]
    reproducible_noise`` (not private): the run seed, or ``derived`` from it by the caller.
    ``None`` otherwise: the coordinator's noise is secret (:mod:`vflink.randomness`)."""
    if not config.privacy.reproducible_noise:
        return None
    return config.seed if derived is None else derived


def label_settings(config: RunConfig) -> dict[str, Any]:
    """The primary's label settings with its noise seed (its own; never sent to a peer)."""
    return {**config.privacy.label_settings(), "seed": label_noise_seed(config)}


def _label_report(primary: PrimaryParty) -> dict[str, Any]:
    entry = primary.label_report()
    if entry is None:
        return {}
    return {"protections": [entry],
            "privacy": {entry["party"]: {"kind": entry["kind"], **entry["params"],
                                         **{k: v for k, v in entry["guarantee"].items()
                                            if not isinstance(v, (dict, list))}}}}


PROTECTIONS.add("label-protection", Protection(
    "label-protection", TRAINING,
    enabled=lambda config: config.privacy.protects_labels,
    settings=lambda config, mode: {"labels": label_settings(config)},
    report=_label_report,
    check=lambda config, task: check_label_task(config.privacy.label_mode(task), task)))
