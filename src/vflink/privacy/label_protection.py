"""The primary's protection of its labels on what it sends back (``[privacy] labels``).

A secondary receives, per training batch, the gradient of the loss with respect to the
embeddings it sent; those gradients reveal the primary's labels (Li et al., ICLR 2022:
:mod:`vflink.attacks.label_leakage`). :class:`LabelProtection` holds the state of one mode for
one training run of the primary and calls the pure functions of :mod:`vflink.privacy.label_dp`,
:mod:`vflink.privacy.marvell` and :mod:`vflink.privacy.rr_prior`; the party applies it in its own
process, before a gradient leaves it (:class:`vflink.parties.PrimaryParty`,
:class:`vflink.parties.union.UnionPrimary`):

* ``dp`` — :meth:`LabelProtection.noisy_logit_gradient` replaces the loss's backward pass: each
  record's loss gradient at the logits plus Gaussian noise (the release), back-propagated
  through the whole network — on a classification task as the posterior mean of the gradient
  given every release of the record's label so far (``labels_denoise = "posterior"``,
  post-processing: :mod:`vflink.privacy.label_dp`); budget first (σ from
  ``labels_total_epsilon`` and the run's epochs), the releases counted per record in the
  primary's :class:`~vflink.privacy.budget.ReleaseBudget` and refused when spent;
* ``marvell`` / ``max-norm`` — :meth:`LabelProtection.perturb` on the rows of each batch's
  gradient for one secondary, after the primary's own (clean) update;
* ``rr-prior`` — :meth:`LabelProtection.randomize` replaces the training labels once, before
  training.

What each mode guarantees, and what it does not: docs/how-to/label-protection.md.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from dp_accounting import gaussian_mechanism

from vflink.errors import ConfigError, PrivacyBudgetExceeded
from vflink.privacy import label_dp, marvell, rr_prior
from vflink.privacy.accounting import ACCOUNTANT, calibrate_total, max_releases_within
from vflink.privacy.budget import ReleaseBudget, ReleaseSetting, check_within
from vflink.privacy.config import (
    DEFAULT_LABELS_EPSILON,
    DEFAULT_MARVELL_POWER,
    LABEL_MODES,
    label_mode_for,
)
from vflink.privacy.ledger import explain_epsilon
from vflink.privacy.limits import dp_auc_ceiling, explain_ceiling, gdp_auc_ceiling, gdp_mu
from vflink.privacy.randomized_response import keep_probability
from vflink.randomness import NOT_PRIVATE, REPRODUCIBLE, NoiseSource, describe
from vflink.types import Task

__all__ = ["DENOISERS", "LabelProtection", "LabelSettings", "check_label_task",
           "resolve_settings"]

log = logging.getLogger(__name__)

#: How the budget and the ledger name a calibration of the ``dp`` mode.
DP_CALIBRATION = "labels total-epsilon (PLD)"
#: σ_π of the one release of the rate of positives (union training, ``dp``): noise std on the
#: count, whose sensitivity is 1. It costs about 1/(2·20²) of a Gaussian budget (under 1 % of
#: a typical run's) and errs by 20/n on the rate of n records.
RATE_NOISE_MULTIPLIER = 20.0
#: How the budget and the ledger name that release's calibration.
RATE_CALIBRATION = "labels positive rate (Gaussian on the count)"

#: What a label guarantee (``dp``, ``rr-prior``) does not cover: figures the primary computes
#: from its clean labels for its own eyes, and choices made on them (docs/how-to/
#: label-protection.md, "What is not covered"). A primary that publishes them releases more.
DOES_NOT_COVER = ("validation-based model selection, early stopping and the decision "
                  "threshold (chosen on the clean validation labels); the training loss and "
                  "the training-split metrics the run reports (computed from the clean "
                  "training labels, for the primary's own eyes: metrics.json, the summary, "
                  "the report); the class count or a regression label's scaling; features "
                  "and membership")

#: What the refit (``privacy.labels_refit``) leaves outside a label guarantee: the primary's
#: final model is fitted on its clean labels once the last gradient has gone.
REFIT_NOT_COVERED = ("the primary's final model, refit on its clean training labels after "
                     "the last gradient was sent (privacy.labels_refit), and whatever is "
                     "computed from it (its predictions, its metrics): a peer that receives "
                     "them receives what clean labels taught it (labels_refit = false keeps "
                     "the model label-DP)")

#: How ``dp`` uses its releases (``privacy.labels_denoise``): ``"posterior"`` trains on the
#: posterior mean of each record's gradient given all its releases so far (classification;
#: the default there), ``"none"`` on each release alone (the only choice for regression).
DENOISERS = ("posterior", "none")

#: The attack AUC within this distance of 0.5 counts as defeated (docs: label-protection.md).
DEFEATED_WITHIN = 0.1


@dataclass(frozen=True, kw_only=True)
class LabelSettings:
    """The primary's label settings (:meth:`vflink.privacy.config.PrivacyConfig.
    label_settings`), as its training plan carries them."""

    mode: str
    epsilon: float = DEFAULT_LABELS_EPSILON
    delta: float = 1e-5
    clip: float = 1.0
    marvell_power: float = DEFAULT_MARVELL_POWER
    #: the noise seed, given only where the run asked for reproducible noise (``[privacy]
    #: reproducible_noise``: not private); ``None``: the secret source (vflink.randomness)
    seed: int | None = None
    #: ``dp``: how the releases are used (:data:`DENOISERS`; ``None``: by the task)
    denoise: str | None = None
    #: ``dp`` with the posterior: releases per record in a run (``None``: one per epoch)
    releases: int | None = None
    #: ``dp``, ``rr-prior``: refit the primary's own layers on its clean labels after the
    #: last gradient has gone (:data:`REFIT_NOT_COVERED`)
    refit: bool = False

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LabelSettings:
        known = {"mode", "epsilon", "delta", "clip", "marvell_power", "seed", "denoise",
                 "releases", "refit"}
        unknown = sorted(set(data) - known)
        if unknown or data.get("mode") not in LABEL_MODES:
            raise ConfigError(f"label protection settings: unknown key(s) {unknown} or mode "
                              f"{data.get('mode')!r}; modes: {', '.join(LABEL_MODES)}")
        return cls(**dict(data))


def _finite(value: float) -> float | None:
    return float(value) if math.isfinite(float(value)) else None


def resolve_settings(settings: Mapping[str, Any] | None, task: Task
                     ) -> dict[str, Any] | None:
    """``settings`` with the task's mode when they name none (the default: ``dp`` on a binary
    task, off on others), or ``None`` when the labels go unprotected."""
    if settings is None:
        return None
    mode = label_mode_for(settings.get("mode"), task)
    return None if mode == "off" else {**settings, "mode": mode}


def check_label_task(mode: str, task: Task) -> None:
    """Refuse a mode the task cannot have: Marvell models two classes (Li et al. §4),
    randomized response needs classes."""
    if mode == "marvell" and task is not Task.BINARY:
        raise ConfigError(f"`privacy.labels = \"marvell\"` perturbs gradients between the two "
                          f"classes of a binary task (Li et al., ICLR 2022, §4); this run's task "
                          f"is {task.value}: use \"dp\" or \"max-norm\""
                          + (" or \"rr-prior\"" if task.is_classification else ""))
    if mode == "rr-prior" and not task.is_classification:
        raise ConfigError(f"`privacy.labels = \"rr-prior\"` randomises class labels (Ghazi et "
                          f"al., NeurIPS 2021); this run's task is {task.value}: use \"dp\" "
                          "or \"max-norm\"")


class LabelProtection:
    """One mode of label protection for one training run of the primary.

    Args:
        settings: the mode and its parameters.
        task: the primary's task (fixes the loss, so the sensitivity).
        party: the primary's name (messages, ledger).
        n_rows: the primary's records (release counts are per record).
        classes: the number of classes (classification).
        budget: the release counts of the primary's data, shared by every run on the same data
            (``None``: counts of this object only).
    """

    def __init__(self, settings: LabelSettings | Mapping[str, Any], *, task: Task, party: str,
                 n_rows: int, classes: int = 0, budget: ReleaseBudget | None = None) -> None:
        self.settings = (settings if isinstance(settings, LabelSettings)
                         else LabelSettings.from_dict(settings))
        if self.settings.mode == "off":
            raise ConfigError("LabelProtection needs privacy.labels other than 'off'")
        check_label_task(self.settings.mode, task)
        self.task, self.party, self.n_rows, self.classes = task, party, int(n_rows), int(classes)
        self.budget = budget if budget is not None else ReleaseBudget(n_rows, party=party)
        if self.budget.n_rows != self.n_rows:
            raise ConfigError(f"party {party!r}: the label release counts are for "
                              f"{self.budget.n_rows} records, the party has {n_rows}")
        self.counts = np.zeros(self.n_rows, dtype=np.int64)
        denoise = self.settings.denoise
        if denoise is None:
            # reproducible noise keeps each release as drawn, so that the figures published
            # with the switch (the in-process simulations) stay what they were
            denoise = ("posterior" if task.is_classification and self.settings.seed is None
                       else "none")
        if denoise not in DENOISERS or (denoise == "posterior" and not task.is_classification):
            raise ConfigError(f"`privacy.labels_denoise` must be one of {', '.join(DENOISERS)} "
                              f"(\"posterior\" weighs the classes of a classification task), "
                              f"got {denoise!r} for a {task.value} task")
        #: ``dp``: how the releases are used (:data:`DENOISERS`)
        self.denoise = denoise
        if self.settings.releases is not None and denoise != "posterior":
            raise ConfigError("`privacy.labels_releases` needs `labels_denoise = "
                              "\"posterior\"`: the epochs after a record's last release train "
                              "on the posterior of its releases")
        #: ``dp`` with the posterior: each record's summed log-likelihood of every class over
        #: its releases so far (post-processing of the releases; allocated at the first one)
        self.evidence: npt.NDArray[np.float64] | None = None
        #: ``dp``: the last release itself (g̃ = g + noise), before any use of it
        self.last_release: torch.Tensor | None = None
        seed = self.settings.seed
        self._seed_given = seed is not None
        self._seed = int(seed) if seed is not None else 0
        #: every draw of this protection (vflink.randomness): secret unless a seed was given
        self._noise = NoiseSource(seed=seed)
        self._stream_claimed = not self._seed_given
        # dp: the calibration (σ, planned releases); refused releases raise before any noise
        self.sigma: float | None = None
        self.setting: ReleaseSetting | None = None
        self.planned: dict[str, Any] | None = None
        self._allowed: int | None = None
        self.max_sensitivity = 0.0
        #: releases a resumed run replays (see :meth:`load_state_dict`), per record
        self._replay = np.zeros(self.n_rows, dtype=np.int64)
        #: the checkpoint's noise state was restored (see load_state_dict)
        self.noise_restored = False
        # marvell: per (batch, secondary) figures; the last solution for one-class batches
        self.kl: list[float] = []
        self.kl_before: list[float] = []
        self._last: tuple[marvell.MarvellSolution, torch.Tensor] | None = None
        self.one_class_batches = 0
        # rr-prior: the randomised training labels (kept: a resumed run trains on the same)
        self.randomized: dict[str, Any] | None = None
        #: union training: how the rate of positives was released (dp) or estimated (rr-prior)
        self.rate_release: dict[str, Any] | None = None
        #: the refit after training (``privacy.labels_refit``): what was done, or why not
        self.refit_info: dict[str, Any] | None = None

    @property
    def mode(self) -> str:
        return self.settings.mode

    @property
    def wants_refit(self) -> bool:
        """The primary refits its own layers on its clean labels after the last gradient has
        gone (``dp`` and ``rr-prior`` with ``privacy.labels_refit``): its model trained on
        protected labels; Marvell and max-norm perturb only the rows sent."""
        return self.settings.refit and self.mode in ("dp", "rr-prior")

    @property
    def refit_done(self) -> bool:
        return bool(self.refit_info and self.refit_info.get("done"))

    def note_refit(self, info: Mapping[str, Any]) -> None:
        """Record the refit (or why it was skipped) for the ledger."""
        self.refit_info = dict(info)

    # --- noise sources ------------------------------------------------------------------------

    def _claim_stream(self) -> None:
        """A fixed seed gives every run that starts from it the same noise: two runs on the
        same data would then send gradients whose difference is noise-free. The budget numbers
        the streams; the first keeps the seed (a single run is reproducible), later ones derive
        theirs from (seed, stream) (as :class:`~vflink.privacy.embedding_dp.EmbeddingDP`)."""
        self._stream_claimed = True
        derived = self.budget.claim_stream_seed(self._seed, 0x1AB5)
        if derived is not None:
            self._noise.reseed(derived)

    @property
    def noise_kind(self) -> str:
        """``"secret"`` or ``"reproducible"`` (vflink.randomness)."""
        return self._noise.kind

    def _normal(self, shape: tuple[int, ...]) -> torch.Tensor:
        """Standard normal draws (float64) from this protection's source."""
        if not self._stream_claimed:
            self._claim_stream()
        return self._noise.normal(shape, dtype=torch.float64)

    def _uniform(self, shape: tuple[int, ...]) -> npt.NDArray[np.float64]:
        if not self._stream_claimed:
            self._claim_stream()
        return self._noise.uniform(shape, dtype=torch.float64).numpy()

    # --- dp -------------------------------------------------------------------------------------

    def plan(self, train_rows: npt.NDArray[np.int64], epochs: int) -> None:
        """``dp``, budget first: σ such that the worst-case record, after one release per epoch
        on top of its earlier releases, is at (ε, δ) exactly (the PLD accountant)."""
        if self.mode != "dp":
            return
        s = self.settings
        per_record = int(epochs) if s.releases is None else min(int(epochs), int(s.releases))
        planned = label_dp.planned_label_releases(self.n_rows, train_rows, per_record)
        budget = self.budget
        loss = budget.gaussian_loss() if budget.settings else None
        try:
            sigma = calibrate_total(s.epsilon, s.delta, planned, loss,
                                    lambda r: budget.releases_of(r))
        except ValueError as exc:
            raise PrivacyBudgetExceeded(
                f"party {self.party!r}: label privacy budget ε = {s.epsilon:g} "
                f"(`privacy.labels_total_epsilon`) cannot cover this run: {exc}; no gradient "
                "is sent") from None
        self._set_sigma(sigma)
        m = int(planned.max(initial=0))
        self.planned = {"epsilon_target": s.epsilon, "delta": s.delta, "epochs": int(epochs),
                        "releases_per_record": per_record,
                        "max_releases": m, "records_planned": int((planned > 0).sum())}
        log.info("party %r: labels ε = %g at δ = %g over at most %d releases per record: "
                 "σ = %.4g", self.party, s.epsilon, s.delta, m, sigma)

    def _set_sigma(self, sigma: float) -> None:
        s = self.settings
        self.sigma = float(sigma)
        per_release = float(gaussian_mechanism.get_epsilon_gaussian(self.sigma, s.delta))
        self.setting = ReleaseSetting(sigma=self.sigma, epsilon=per_release, delta=s.delta,
                                      calibration=DP_CALIBRATION, mode="labels-dp")
        self._allowed = max_releases_within(self.sigma, s.delta, s.epsilon)

    def noisy_logit_gradient(self, logits: torch.Tensor, target: torch.Tensor,
                             rows: npt.NDArray[np.int64],
                             loss: label_dp.LossFn | None = None, *,
                             keys: npt.NDArray[np.int64] | None = None) -> torch.Tensor:
        """``dp``: release g̃_i = g_i + N(0, (σΔ)²) for every record of the batch (``rows``: the
        primary's records among them, whose releases are counted; a synthetic record's label
        is noised alike but belongs to no record) and return the gradient to back-propagate:
        the release itself (``denoise = "none"``), or the posterior mean of g_i given every
        release of the record's label so far (``"posterior"``: :mod:`label_dp`; ``keys``, one
        per row of ``logits``, name the record whose releases add up, −1 for none; by default
        ``rows``, which then must be aligned with ``logits``). ``loss``: a loss without a
        closed form here (its per-record sensitivity is measured,
        :func:`label_dp.binary_sensitivity`).

        Raises :class:`PrivacyBudgetExceeded` before any noise is drawn if a record would pass
        its budget; nothing may be sent then."""
        if self.mode != "dp" or self.sigma is None or self.setting is None:
            raise ConfigError(f"party {self.party!r}: label DP is not calibrated (call plan)")
        batch_rows = np.asarray(rows, dtype=np.int64)
        rows = np.unique(batch_rows)
        s = self.settings
        cap = (self.planned or {}).get("releases_per_record") if s.releases is not None else None
        # with labels_releases, a record past its releases this run is not released again:
        # it trains on the posterior of the releases it had (post-processing)
        spent = (self.counts[rows] >= int(cap)) if cap is not None else np.zeros(len(rows), bool)
        done = rows[spent]
        rows = rows[~spent]
        # A record's release after the checkpoint, replayed by a resumed run with the noise
        # restored bit for bit, is not a new release (see load_state_dict) — but only for a
        # closed-form loss: a measured loss's gradient difference may depend on the label.
        replayed = (self._replay[rows] > 0) if loss is None else np.zeros(len(rows), bool)
        if replayed.any():
            self._replay[rows[replayed]] -= 1
        fresh = rows[~replayed]
        check_within(self.budget, self.setting, fresh, limit=s.epsilon, delta=s.delta,
                     allowed=self._allowed, who=f"party {self.party!r} (labels)",
                     key="privacy.labels_total_epsilon")
        if loss is None:
            g = label_dp.logit_gradient(self.task, logits, target, clip=s.clip)
            delta: torch.Tensor | float = label_dp.sensitivity(self.task, s.clip)
            self.max_sensitivity = float(delta)
        else:
            g = label_dp.per_record_gradient(loss, logits, target)
            delta = label_dp.binary_sensitivity(loss, logits)
            if delta.numel():
                self.max_sensitivity = max(self.max_sensitivity, float(delta.max()))
        noise = self._normal(tuple(g.shape)).to(g.device) * self.sigma
        noisy = g.double() + noise * (delta.double() if isinstance(delta, torch.Tensor)
                                      else float(delta))
        # write-ahead: counted (and on disk, with a state directory) before it can be sent
        self.budget.record(self.setting, fresh)
        self.counts[rows] += 1
        self.last_release = noisy.detach()
        if self.denoise == "none":
            return noisy.to(g.dtype)
        keys = batch_rows if keys is None else np.asarray(keys, dtype=np.int64)
        if keys.shape[0] != g.shape[0]:
            raise ConfigError(f"party {self.party!r}: {keys.shape[0]} record keys for "
                              f"{g.shape[0]} logits")
        return self._posterior(logits, noisy, keys, delta, loss,
                               held=done).to(g.device, g.dtype)

    def _posterior(self, logits: torch.Tensor, noisy: torch.Tensor,
                   keys: npt.NDArray[np.int64], delta: torch.Tensor | float,
                   loss: label_dp.LossFn | None,
                   held: npt.NDArray[np.int64] | None = None) -> torch.Tensor:
        """E[g_i | every release of record i's label so far], uniform prior (label_dp).
        ``held``: records not released this time (their releases are spent): their rows of
        ``noisy`` are ignored, only their earlier evidence counts."""
        cands = label_dp.candidate_gradients(self.task, logits.detach().cpu().double(),
                                             loss=loss)
        scale = (delta.detach().cpu().double().reshape(-1) if isinstance(delta, torch.Tensor)
                 else float(delta)) * float(self.sigma or 0.0)
        ll = label_dp.release_log_likelihood(noisy.cpu(), cands, scale).numpy()
        if self.evidence is None or self.evidence.shape[1] != ll.shape[1]:
            self.evidence = np.zeros((self.n_rows, ll.shape[1]), dtype=np.float64)
        keyed = keys >= 0
        total = ll.copy()
        if keyed.any():
            adds = keyed.copy()
            if held is not None and len(held):
                adds &= ~np.isin(keys, held)
            # a record appears once per batch: add its release, then read its sum
            np.add.at(self.evidence, keys[adds], ll[adds])
            total[keyed] = self.evidence[keys[keyed]]
        return label_dp.posterior_gradient(cands, torch.from_numpy(total))

    # --- figures derived from the labels (union training) -------------------------------------

    def release_positive_rate(self, labels: npt.NDArray[Any], rows: npt.NDArray[np.int64]
                              ) -> float:
        """``dp``: the rate of positives among ``rows`` (0/1 ``labels``), released once with
        Gaussian noise and charged to every one of those records, before :meth:`plan` (whose σ
        then leaves room for it).

        Union training fills the labels it lacks from this rate (label-majority, -minority,
        -random-pos) and shifts its logits with it (FLORIST App. E-G): every synthetic label
        and every record's shifted loss depend on it, so the clean rate would leak every
        label into the gradients beyond the accounting. Sensitivity: one record's label
        changes the count of positives by at most 1 (the number of records is fixed, not a
        label), so N(0, σ_π²) on the count with σ_π = RATE_NOISE_MULTIPLIER is a Gaussian
        mechanism of multiplier σ_π, composed with the training releases (PLD). Everything
        computed from the noisy rate is post-processing."""
        if self.mode != "dp":
            raise ConfigError(f"party {self.party!r}: only `dp` releases a noisy rate")
        s = self.settings
        rows = np.unique(np.asarray(rows, dtype=np.int64))
        setting = ReleaseSetting(
            sigma=RATE_NOISE_MULTIPLIER,
            epsilon=float(gaussian_mechanism.get_epsilon_gaussian(RATE_NOISE_MULTIPLIER,
                                                                  s.delta)),
            delta=s.delta, calibration=RATE_CALIBRATION, mode="labels-dp-rate")
        check_within(self.budget, setting, rows, limit=s.epsilon, delta=s.delta,
                     allowed=max_releases_within(RATE_NOISE_MULTIPLIER, s.delta, s.epsilon),
                     who=f"party {self.party!r} (labels)", key="privacy.labels_total_epsilon")
        count = float(np.asarray(labels, dtype=np.float64).sum())
        noisy = count + float(self._normal((1,))[0]) * RATE_NOISE_MULTIPLIER
        self.budget.record(setting, rows)  # write-ahead, as every release
        rate = min(max(noisy / max(len(rows), 1), 0.0), 1.0)
        self.rate_release = {"records": int(len(rows)), "noise_multiplier":
                             RATE_NOISE_MULTIPLIER, "rate": rate,
                             "sensitivity": "1 on the count of positives",
                             "uses": "synthetic labels and the logits shift of union training"}
        return rate

    def randomized_positive_rate(self) -> float:
        """``rr-prior``: the rate of positives estimated from the randomised training labels
        alone (post-processing of their release): with keep probability p, a randomised rate
        r = pπ + (1 − p)(1 − π), so π = (r − (1 − p)) / (2p − 1), clipped to [0, 1]."""
        if self.randomized is None:
            raise ConfigError(f"party {self.party!r}: the labels are not randomised yet")
        noisy = np.asarray(self.randomized["labels"], dtype=np.float64)
        keep = keep_probability(self.settings.epsilon, 2)
        r = float(noisy.mean()) if noisy.size else 0.0
        rate = min(max((r - (1.0 - keep)) / (2.0 * keep - 1.0), 0.0), 1.0)
        self.rate_release = {"records": int(noisy.size), "rate": rate,
                             "from": "the randomised labels (post-processing)",
                             "uses": "synthetic labels and the logits shift of union training"}
        return rate

    # --- marvell / max-norm -------------------------------------------------------------------

    def perturb(self, gradients: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """``marvell`` / ``max-norm``: the rows of one batch's gradient for one secondary,
        perturbed (``labels``: each row's label, 0/1; unused by max-norm)."""
        if self.mode == "max-norm":
            return marvell.max_norm_noise(gradients, normal=self._normal((gradients.shape[0],)))
        if self.mode != "marvell":
            raise ConfigError(f"party {self.party!r}: mode {self.mode!r} does not perturb rows")
        n = gradients.shape[0]
        flat = gradients.reshape(n, -1)
        stats = marvell.batch_statistics(flat, labels)
        normal = self._normal((n, flat.shape[1] + 1))
        if stats is None:  # one class only: the last batch's covariances, or isotropic noise
            self.one_class_batches += 1
            if self._last is not None:
                solution, diff = self._last
                return marvell.marvell_noise(gradients, labels, solution, diff, normal=normal)
            power = self.settings.marvell_power * float((flat.double() ** 2).sum(1).mean())
            iso = math.sqrt(power / max(flat.shape[1], 1))
            return (flat.double() + normal[:, 1:] * iso).to(gradients.dtype).reshape(
                gradients.shape)
        power = self.settings.marvell_power * stats.g
        solution = marvell.solve_marvell(stats.u, stats.v, stats.d, stats.g, stats.p, power)
        self._last = (solution, stats.difference)
        self.kl.append(solution.sum_kl)
        self.kl_before.append(marvell.sum_kl(0.0, 0.0, 0.0, 0.0, u=stats.u, v=stats.v,
                                             d=stats.d, g=stats.g))
        return marvell.marvell_noise(gradients, labels, solution, stats.difference,
                                     normal=normal)

    # --- rr-prior -------------------------------------------------------------------------------

    def randomize(self, targets: torch.Tensor, train_rows: npt.NDArray[np.int64]
                  ) -> torch.Tensor:
        """``rr-prior``: the training labels replaced once by RRWithPrior at ε (the uniform
        prior: no model exists before training), the others left as they are (they never
        train). Counted as one ε-DP release of each training record's label."""
        rows = np.unique(np.asarray(train_rows, dtype=np.int64))
        k = max(self.classes, 2)
        s = self.settings
        if self.randomized is not None:  # resumed: the same randomised labels, no new release
            out = targets.clone()
            saved = np.asarray(self.randomized["labels"], dtype=np.int64)
            out[torch.from_numpy(np.asarray(self.randomized["rows"], dtype=np.int64))] = \
                torch.from_numpy(saved).to(out.dtype)
            return out
        # RRWithPrior is pure ε-DP; the budget composes it as binary randomized response at ε,
        # the least private k-ary response at a given ε (its δ(ε') curve lies above the others)
        setting = ReleaseSetting(sigma=0.0, epsilon=s.epsilon, delta=0.0,
                                 calibration="randomized response with prior (closed form)",
                                 mode="labels-rr-prior", buckets=2)
        check_within(self.budget, setting, rows, limit=s.epsilon, delta=s.delta, allowed=1,
                     who=f"party {self.party!r} (labels)", key="privacy.labels_total_epsilon")
        y = targets[torch.from_numpy(rows)].long().numpy()
        noisy = rr_prior.rr_with_prior(y, rr_prior.uniform_prior(len(rows), k), s.epsilon,
                                       uniforms=self._uniform((len(rows), 2)))
        self.budget.record(setting, rows)
        self.counts[rows] += 1
        self.setting = setting
        self.randomized = {"rows": rows, "labels": noisy, "k": k,
                           "changed": float(np.mean(noisy != y)) if len(y) else 0.0}
        out = targets.clone()
        out[torch.from_numpy(rows)] = torch.from_numpy(noisy).to(out.dtype)
        return out

    # --- ledger and state -----------------------------------------------------------------------

    def report(self) -> dict[str, Any]:
        """This protection's ledger entry (keyword arguments of ``Ledger.add_protection``):
        its figures, where its noise came from (``params["noise"]``; a reproducible source
        makes the entry say it is not private) and what it does not cover."""
        entry = self._report()
        kind = self.noise_kind
        entry["params"] = {**entry["params"], "noise": kind}
        guarantee = dict(entry["guarantee"])
        if self.mode in ("dp", "rr-prior"):
            not_covered = DOES_NOT_COVER + (f"; {REFIT_NOT_COVERED}" if self.refit_done
                                            else "")
            guarantee["does_not_cover"] = not_covered
            if self.refit_info is not None:
                guarantee["refit"] = dict(self.refit_info)
            entry["explanation"] += f". Not covered: {not_covered}"
        if self.rate_release is not None:
            guarantee["positive_rate"] = dict(self.rate_release)
        if kind == REPRODUCIBLE:
            guarantee["private"] = False
            entry["explanation"] = f"{NOT_PRIVATE.upper()}: {describe(kind)}. Otherwise: " \
                + entry["explanation"]
        entry["guarantee"] = guarantee
        return entry

    def _report(self) -> dict[str, Any]:
        s = self.settings
        entry = {"kind": f"label-{self.mode}", "party": self.party, "applies_to": "backward"}
        if self.mode == "dp":
            return {**entry, **self._report_dp()}
        if self.mode == "rr-prior":
            k = int(self.randomized["k"]) if self.randomized else max(self.classes, 2)
            keep = keep_probability(s.epsilon, k)
            eps = self.budget.max_epsilon(s.delta)
            return {**entry, "params": {
                "mode": self.mode, "mechanism": "RRWithPrior (Ghazi et al., NeurIPS 2021, "
                "Algorithm 2), uniform prior: k-ary randomized response",
                "k": k, "keep_probability": keep, "total_epsilon": s.epsilon,
                "changed_fraction": (self.randomized or {}).get("changed")},
                "guarantee": {"epsilon": eps, "delta": 0.0, "label_dp": True,
                              **self._counts(), "accountant": "pure ε-DP (one release)"},
                "explanation": (
                    f"{explain_epsilon(eps, None)}. Party {self.party!r} replaced each "
                    f"training label once before training by randomized response (kept with "
                    f"probability {keep:.3g}, else one of the other {k - 1} classes): "
                    + ("every gradient sent, trained on them, is ε-label-DP (the primary's "
                       "final model, refit on the clean labels after the last gradient, is "
                       "not)" if self.refit_done else
                       "everything trained on them, the model and every gradient sent, is "
                       "ε-label-DP")
                    + " (validation labels, used clean for early stopping, are not covered)")}
        if self.mode == "marvell":
            return {**entry, **self._report_marvell()}
        return {**entry, "params": {"mode": self.mode},
                "guarantee": {"label_dp": False},
                "explanation": ("no formal guarantee: every gradient row sent was scaled by "
                                "random noise so that its expected norm is the batch's largest "
                                "(Li et al.'s max-norm heuristic); it hides the norms, not the "
                                "directions")}

    def _report_marvell(self) -> dict[str, Any]:
        """Marvell's entry. Li et al.'s bound (§4: AUC ≤ 1/2 + √sumKL/2 − sumKL/8) holds for
        the perturbed distributions it is computed from: each batch's rows modelled as two
        isotropic Gaussians. Gradient rows are not such Gaussians (their spread across the
        class-mean direction sits in a few directions, and the perpendicular noise goes to
        one class only), so a detector of one row reads beyond the model's figure
        (``label-residual``); and each batch's noise is fresh, so a record's rows averaged
        over the epochs read more still (``label-epoch-average``). The figure is kept as the
        model's, not stated as a limit on any attack."""
        s = self.settings
        bounds = [marvell.leak_auc_bound(v) for v in self.kl]
        model = (f"{max(bounds):.3f} (mean {np.mean(bounds):.3f} over {len(bounds)} batches)"
                 if bounds else "— (no batch sent)")
        return {"params": {
            "mode": self.mode, "power": s.marvell_power,
            "power_rule": "P = s·‖ḡ₁ − ḡ₀‖² per batch and secondary"},
            "guarantee": {
                "label_dp": False, "limit": None,
                "batches": len(self.kl), "one_class_batches": self.one_class_batches,
                "model_sum_kl_max": max(self.kl, default=None),
                "model_sum_kl_mean": float(np.mean(self.kl)) if self.kl else None,
                # before the noise; None when infinite (most batches hold one row of a
                # class: its rows then differ in distribution with certainty)
                "sum_kl_before_median": _finite(np.median(self.kl_before))
                if self.kl_before else None,
                "model_auc_max": max(bounds, default=None),
                "model_auc_mean": float(np.mean(bounds)) if bounds else None,
                "model": "each batch's rows as two isotropic Gaussians (Li et al., ICLR "
                         "2022, §4): AUC ≤ 1/2 + √sumKL/2 − sumKL/8 holds for that model only",
                "does_not_cover": "the real rows' shape (a detector across the class-mean "
                                  "direction reads beyond the model's figure), a record's "
                                  "rows over several batches (fresh noise per batch averages "
                                  "out over the epochs), the primary's model, validation "
                                  "and every other release"},
            "explanation": (
                "no formal guarantee and no stated limit on any attack. Every gradient row "
                "sent was perturbed by Marvell (Li et al., ICLR 2022): Gaussian noise chosen "
                "per batch and per secondary so that, if that batch's rows of each class were "
                "an isotropic Gaussian, no detector of the label from one of its rows could "
                f"reach an AUC above {model}. That is a figure of the model, per batch and "
                "per row: the rows are not such Gaussians (the noise across the class-mean "
                "direction goes to one class only, which a detector of the perpendicular "
                "part reads), and the noise is fresh in every batch, so averaging a record's "
                "rows over the epochs removes it. What a secondary reads: the label-residual "
                "and label-epoch-average attacks")}

    def _counts(self) -> dict[str, Any]:
        totals = self.budget.totals
        return {"max_releases": int(totals.max(initial=0)),
                "records_released": int((totals > 0).sum()),
                "run_max_releases": int(self.counts.max(initial=0)),
                "scope": "per record of the primary's data (its label), over every release "
                         "since its operator last reset the budget"}

    def _report_dp(self) -> dict[str, Any]:
        s = self.settings
        budget = self.budget
        eps = budget.max_epsilon(s.delta)
        worst = int(np.argmax(budget.gaussian_loss())) if budget.settings else 0
        releases = [[sig, m] for sig, m in budget.releases_of(worst)] if budget.settings \
            else []
        sigma = self.sigma if self.sigma is not None else float("nan")
        sensitivity = self.max_sensitivity or label_dp.sensitivity(self.task, s.clip)
        noise_std = sigma * sensitivity
        loss = {Task.BINARY: "binary cross-entropy: g = σ(z) − y, Δ = 1",
                Task.MULTICLASS: "cross-entropy: g = softmax(z) − e_y, Δ = √2",
                Task.REGRESSION: f"squared error: g = clip(2(z − y), ±{s.clip:g}), "
                                 f"Δ = {2 * s.clip:g}"}[self.task]
        counts = self._counts()
        mu = gdp_mu((float(sig), int(m)) for sig, m in releases) if releases else None
        posterior = self.denoise == "posterior"
        use = ("the posterior mean of each record's gradient given every release of its label "
               "so far (uniform prior; post-processing of the releases)" if posterior else
               "each release as drawn")
        return {
            "params": {"mode": "dp", "sigma": sigma, "noise_std": noise_std,
                       "sensitivity": sensitivity,
                       "where": "each record's loss gradient at the logits, back-propagated "
                                "through the primary's whole network", "loss": loss,
                       "clip": s.clip if self.task is Task.REGRESSION else None,
                       "total_epsilon": s.epsilon, "delta": s.delta,
                       "denoise": self.denoise, "trains_on": use},
            "guarantee": {
                "epsilon": eps, "delta": s.delta, "sigma": sigma, **counts,
                "releases_of_worst_record": releases, "planned": self.planned,
                "accountant": ACCOUNTANT, "subsampling_amplification": False,
                "label_dp": True,
                "attack_auc_ceiling": dp_auc_ceiling(eps, s.delta),
                "gaussian_mu": mu,
                "gaussian_auc_ceiling": None if mu is None else gdp_auc_ceiling(mu),
                "covers": ("every gradient sent to every secondary (colluding or not), "
                           "w.r.t. each record's label; not the primary's final model, refit "
                           "on its clean labels after the last gradient"
                           if self.refit_done else
                           "every gradient sent to every secondary (colluding or not) and the "
                           "primary's trained model, w.r.t. each record's label")},
            "explanation": (
                f"{explain_epsilon(eps, s.delta)}: {explain_ceiling(eps, s.delta, mu)}. Each "
                "record's label entered training only through its loss gradient at the "
                f"logits, released with Gaussian noise (σ = {sigma:.3g} times the "
                f"sensitivity); the primary trained on {use}, back-propagated through its "
                "whole network: every gradient sent"
                + (" is" if self.refit_done else " and the primary's model are")
                + " post-processing; its most-released record was released "
                f"{counts['max_releases']} time{'s' if counts['max_releases'] != 1 else ''}, "
                "composed with the PLD accountant (no subsampling amplification)"
                + (f"; each label was released in its first {s.releases} epoch(s) only, the "
                   "later epochs trained on the posterior of those releases without new ones"
                   if s.releases is not None else "")
                + ("; the gradients sent carry the evidence gathered so far, so an attack "
                   "that reads them approaches the Gaussian figure above rather than chance"
                   if posterior else ""))}

    def state_dict(self) -> dict[str, Any]:
        i = self.budget.find(self.setting) if self.setting is not None else None
        return {"mode": self.mode, "counts": self.counts.copy(), "sigma": self.sigma,
                # the data's releases under this run's setting at this checkpoint: a resumed
                # run tells from them which releases it replays (load_state_dict)
                "budget_counts": None if i is None else self.budget.counts[i].copy(),
                "planned": self.planned,
                # this protection's noise position (a secret source's key and counter: the
                # checkpoint stays in the primary's own directory): a resume replays exactly
                "noise": self._noise.state(),
                "kl": list(self.kl), "kl_before": list(self.kl_before),
                "one_class_batches": self.one_class_batches,
                # dp, posterior: what the releases so far say of each record's label (the
                # replayed releases after the checkpoint add to it again, as they did)
                "evidence": None if self.evidence is None else self.evidence.copy(),
                # a one-class batch after a resume reuses these, as the uninterrupted run would
                "last": None if self._last is None else {
                    "lambdas": [self._last[0].lam10, self._last[0].lam20, self._last[0].lam11,
                                self._last[0].lam21, self._last[0].sum_kl],
                    "difference": self._last[1].clone()},
                "randomized": None if self.randomized is None else {
                    "rows": np.asarray(self.randomized["rows"], dtype=np.int64),
                    "labels": np.asarray(self.randomized["labels"], dtype=np.int64),
                    "k": int(self.randomized["k"]),
                    "changed": float(self.randomized["changed"])}}

    @property
    def replay_is_free(self) -> bool:
        """A release replayed after a resume is no new release: the noise was restored bit
        for bit from the checkpoint and the loss's gradient at the logits differs between two
        inputs by a label-free amount (cross-entropy; not a clipped squared error)."""
        return self.noise_restored and self.task is not Task.REGRESSION

    def _restore_noise(self, saved: Any) -> bool:
        """Continue the checkpoint's noise stream; ``True`` when it was restored exactly.

        A secret stream cannot be re-derived, but its state (its ChaCha20 key and counter)
        travels in the primary's own checkpoint, which is as private as the labels beside it
        and is never sent; a checkpoint written before noise states were saved, or by a source
        of the other kind, is not restored (every replay is then counted)."""
        if isinstance(saved, torch.Tensor):  # an older checkpoint: a torch.Generator state
            saved = {"kind": REPRODUCIBLE, "torch": saved}
        if not isinstance(saved, Mapping) or saved.get("kind") != self.noise_kind:
            return False
        self._noise.set_state(dict(saved))
        self._stream_claimed = True  # resuming continues the checkpoint's stream
        return True

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume a run: its calibration, noise stream and figures; never fewer releases."""
        if state.get("mode") != self.mode:
            raise ConfigError(f"party {self.party!r}: the checkpoint protected labels with "
                              f"{state.get('mode')!r}, this run with {self.mode!r}")
        counts = np.asarray(state["counts"], dtype=np.int64)
        if counts.shape == self.counts.shape:
            self.counts = np.maximum(self.counts, counts)
        self.noise_restored = self._restore_noise(state.get("noise"))
        if state.get("sigma") is not None:
            self._set_sigma(float(state["sigma"]))
            saved = state.get("budget_counts")
            i = self.budget.find(self.setting) if self.setting is not None else None
            if saved is not None and i is not None and self.replay_is_free:
                # Releases after the checkpoint (the interrupted epoch's first batches) were
                # sent and counted. Resuming replays the same batches with the noise restored
                # bit for bit (the same draw for the same record at the same place): a record
                # replayed gets g'ᵢ + nᵢ beside the gᵢ + nᵢ it already released, and their
                # difference σ(z') − σ(z) (softmax for several classes) does not involve its
                # label, whatever embeddings a secondary sends the second time. So the pair is
                # worth one release, and the replay is not counted twice. Otherwise (noise not
                # restored, or a clipped regression gradient whose difference does depend on
                # the label) every replayed release is counted as a new one.
                self._replay = np.maximum(
                    self.budget.counts[i] - np.asarray(saved, dtype=np.int64), 0)
            if self.setting is not None:
                self.budget.merge(self.setting, self.counts)
        self.planned = state.get("planned")
        evidence = state.get("evidence")
        self.evidence = (None if evidence is None
                         else np.asarray(evidence, dtype=np.float64).copy())
        self.kl = [float(v) for v in state.get("kl", [])]
        self.kl_before = [float(v) for v in state.get("kl_before", [])]
        self.one_class_batches = int(state.get("one_class_batches", 0))
        last = state.get("last")
        if last is not None:
            self._last = (marvell.MarvellSolution(*(float(v) for v in last["lambdas"])),
                          torch.as_tensor(last["difference"], dtype=torch.float64))
        self.randomized = state.get("randomized")
