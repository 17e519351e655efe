"""The stateful wrapper on what a secondary releases: VFL-AFE Algorithm 1 for one party.

:class:`EmbeddingDP` holds the noise generator, the per-record release counts and the
settings, and calls the pure functions of :mod:`vflink.privacy.afe` and
:mod:`vflink.privacy.accounting`. The secondary's bottom model never changes (ARCHITECTURE.md,
convention 4): the party hands its raw output to :meth:`EmbeddingDP.release` and sends what
comes back; it adds :meth:`EmbeddingDP.local_loss` when the gradient returns.

An :class:`EmbeddingDP` lives for one training run (its :attr:`~EmbeddingDP.counts` are that
run's releases); the releases of the party's *data*, which the budget limits and the ledger's
composed (ε, δ) reports, are kept by a :class:`~vflink.privacy.budget.ReleaseBudget` that
outlives runs, sessions and restarts: a new session must not reset a record's budget.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from dp_accounting import gaussian_mechanism

from vflink.errors import ConfigError, PrivacyBudgetExceeded
from vflink.privacy import afe
from vflink.privacy import randomized_response as rr
from vflink.privacy.accounting import (
    ACCOUNTANT,
    Calibration,
    calibrate,
    calibrate_total,
    composed_epsilon_mixed,
    delta_prime,
    max_releases_within,
    max_responses_within,
    planned_releases,
    rescale_p2,
    rescale_sigmas_for,
)
from vflink.privacy.budget import ReleaseBudget, ReleaseSetting, check_within
from vflink.privacy.config import PUBLIC_SETTINGS, PrivacyConfig
from vflink.privacy.ledger import explain_epsilon
from vflink.randomness import NOT_PRIVATE, REPRODUCIBLE, NoiseSource, describe, secret_int

__all__ = ["PLAN_KEYS", "EmbeddingDP", "Observer", "agree_settings", "check_plan"]

#: ``observer(event, figures)``: local diagnostics of training batches, for the secondary's own
#: eyes (``scripts/afe_diagnostics.py``); never part of :meth:`EmbeddingDP.report`, since Δ̃ and
#: the batch's spread are statistics of private data (§3.2: Δ(f, X) is never released).
Observer = Callable[[str, dict[str, float]], None]

log = logging.getLogger(__name__)

#: The run's plan a primary announces for budget-first calibration, and bounds on it.
PLAN_KEYS = ("epochs", "train_batches", "train_chunks", "validation_chunks", "test_chunks")
_PLAN_MAX = 10**7

#: How the ledger and the budget name a randomized-response release's calibration.
RESPONSE_CALIBRATION = "randomized-response (closed form)"

#: p1 of Theorem 3.6 (local sensitivity of the whole data equals that of the batch's support);
#: the paper lets p1 → 1 for large N and gives no estimate, so the ledger assumes 1.
P1 = 1.0


def agree_settings(own: PrivacyConfig | None, requested: dict[str, Any], party: str
                   ) -> PrivacyConfig:
    """The settings a secondary uses when the primary announces ``requested``.

    A secondary with its own settings keeps them and refuses a run that expects different
    ones (a primary cannot weaken a secondary's protection); without its own settings it
    takes the run's.
    """
    try:
        wanted = PrivacyConfig.from_public(dict(requested))
    except ConfigError as exc:
        raise ConfigError(f"party {party!r}: the run's privacy settings are invalid: {exc}",
                          exc.problems) from None
    if own is None:
        return wanted
    mine = own.public_settings()
    differ = [f"{k}: run {requested.get(k)!r}, party {mine[k]!r}" for k in PUBLIC_SETTINGS
              if k != "fcm_clusters" and requested.get(k) != mine[k]]
    if differ:
        raise ConfigError(f"party {party!r} protects its embeddings with other settings than "
                          f"the run expects ({'; '.join(differ)}): align the run's [privacy] "
                          "section with the party's")
    return own


def check_plan(plan: Mapping[str, Any], party: str) -> dict[str, int]:
    """The announced plan as ints ≥ 0 with exactly :data:`PLAN_KEYS` (ConfigError otherwise)."""
    keys = set(plan)
    if keys != set(PLAN_KEYS):
        raise ConfigError(f"party {party!r}: the run's release plan must name exactly "
                          f"{list(PLAN_KEYS)}, got {sorted(keys)}")
    out: dict[str, int] = {}
    for k in PLAN_KEYS:
        v = plan[k]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v != int(v) or not (
                0 <= v <= _PLAN_MAX):
            raise ConfigError(f"party {party!r}: release plan `{k}` must be an int in "
                              f"[0, {_PLAN_MAX}], got {v!r}")
        out[k] = int(v)
    return out


def _planned_epsilon(budget: ReleaseBudget, planned: npt.NDArray[np.int64], sigma: float,
                     delta: float) -> float:
    """ε of the worst-case record after its planned releases at ``sigma`` (PLD)."""
    if not planned.size or planned.max() <= 0:
        return budget.max_epsilon(delta)
    loss = budget.gaussian_loss() + planned / sigma ** 2
    row = int(np.argmax(loss))
    past = dict(budget.releases_of(row))
    past[sigma] = past.get(sigma, 0) + int(planned[row])
    return composed_epsilon_mixed(tuple(sorted(past.items())), delta)


class EmbeddingDP:
    """Clip, rescale and noise one secondary's embeddings; count and account releases.

    Args:
        config: the settings (mode, ε, δ, t, α, β, ...).
        party: the secondary's name (for messages and the ledger).
        n_rows: the number of records of the party (release counts are per record).
        seed: the noise seed, given only where the party asked for reproducible noise
            (``[privacy] reproducible_noise``: not private); ``None``: the secret source
            (:mod:`vflink.randomness`).
        classes: C of Eq. 7 when ``fcm_clusters`` is not set (the number of classes).
        budget: the release counts of the party's data, shared by every run on the same data
            (``None``: counts of this object only).
    """

    def __init__(self, config: PrivacyConfig, *, party: str, n_rows: int,
                 seed: int | None = None, classes: int | None = None,
                 budget: ReleaseBudget | None = None) -> None:
        if not config.enabled:
            raise ConfigError("EmbeddingDP needs privacy.embeddings other than 'off'")
        self.config = config
        self.party = party
        self.n_rows = n_rows
        self.counts = np.zeros(n_rows, dtype=np.int64)
        self.max_links = 0
        self.links = np.zeros(n_rows, dtype=np.int64)
        self.in_train = np.zeros(n_rows, dtype=bool)
        self.classes = classes
        self.budget = budget if budget is not None else ReleaseBudget(n_rows, party=party)
        if self.budget.n_rows != n_rows:
            raise ConfigError(f"party {party!r}: the release counts are for "
                              f"{self.budget.n_rows} records, the party has {n_rows}")
        #: the announced plan (budget first) and what the calibration planned from it
        self.plan: dict[str, int] | None = None
        self.planned: dict[str, Any] | None = None
        #: δ of the Gaussian composition, and k of Eq. 5; budget first with rescaling splits
        #: the run's δ between them (see :meth:`_calibrate_total`)
        self.delta = float(config.delta)
        self.rescale_sigmas = float(config.rescale_sigmas)
        self.calibration: Calibration | None = None
        self.setting: ReleaseSetting | None = None
        self._allowed: int | None = None
        if not config.budget_first:
            self._set_calibration(calibrate(config.release_epsilon, config.delta))
        self._seed_given = seed is not None
        # every protective draw (the Gaussian noise, randomized response) comes from here:
        # secret unless the party asked for reproducible noise (vflink.randomness)
        self._noise = NoiseSource(seed=seed)
        # FCM initialisation, sub-sampling and SimHash's data-independent hyperplanes hide
        # nothing; they draw apart from the noise (their own seed, from the noise seed when
        # reproducible, else from the OS) so the noise sequence does not depend on how often
        # they draw.
        seed = int(seed) if seed is not None else secret_int(63)
        self._seed = seed
        # a fixed seed's stream is claimed from the budget at the first release (see release)
        self._stream_claimed = not self._seed_given
        self._aux = torch.Generator().manual_seed((seed * 7919 + 17) % (2**63))
        self.observer: Observer | None = None
        self._cache: torch.Tensor | None = None  # release-once: each record's release
        self._cached = np.zeros(0, dtype=bool)
        #: randomized-response: each record's released code (−1: not released in this run),
        #: and the seed of the quantiser's hyperplanes (data-independent; kept on resume)
        self._codes = np.full(n_rows if config.randomized_response else 0, -1, dtype=np.int64)
        self._plane_seed = int(np.random.SeedSequence([seed, 0x51A5]).generate_state(
            1, np.uint64)[0] >> 1)
        self._planes: torch.Tensor | None = None
        #: the ``fields`` quantiser's view of the preprocessed row (set by the party once its
        #: preprocessing is fit; ``None``: unknown, the quantiser is ``simhash``)
        self.code_fields: tuple[rr.CodeField, ...] | None = None

    # --- calibration ----------------------------------------------------------------------------

    def _set_calibration(self, calibration: Calibration) -> None:
        cfg = self.config
        self.calibration = calibration
        p2 = rescale_p2(self.rescale_sigmas) if cfg.rescale else 1.0
        self.setting = ReleaseSetting(
            sigma=calibration.sigma, failure=(1.0 - P1 * p2) if cfg.rescale else 0.0,
            epsilon=calibration.epsilon, delta=calibration.delta,
            calibration=calibration.method, mode=cfg.embeddings)
        limit = cfg.spending_limit
        self._allowed = (max_releases_within(calibration.sigma, self.delta, limit)
                         if limit is not None else None)

    def set_plan(self, plan: Mapping[str, Any]) -> None:
        """The run's plan, announced by the primary (budget first); σ follows at the first
        release, once the training rows are known."""
        self.plan = check_plan(plan, self.party)
        self.calibration = self.setting = None

    def note_train_rows(self, rows: npt.NDArray[np.int64]) -> None:
        """The records linked to a training record (``FitPreprocessing``)."""
        self.in_train[:] = False
        self.in_train[np.asarray(rows, dtype=np.int64)] = True

    def _calibrate_total(self) -> None:
        """σ such that the worst-case record, after every release the plan allows on top of
        its earlier ones, is at (total_epsilon, δ) exactly."""
        cfg = self.config
        total = cfg.total_epsilon
        if total is None:
            return
        if self.plan is None:
            raise PrivacyBudgetExceeded(
                f"party {self.party!r}: `privacy.total_epsilon` = {total:g} needs the run's "
                "release plan (epochs, batches, evaluations), which the primary did not "
                "announce; nothing is released without it")
        p = self.plan
        if cfg.randomized_response:
            self._calibrate_response(total)
            return
        if cfg.release_once:  # one release per linked record, then its cached copy
            planned = np.where(self.links > 0, 1 + cfg.reserve_releases, 0).astype(np.int64)
        else:
            planned = planned_releases(
                self.links, self.in_train, epochs=p["epochs"],
                train_batches=p["train_batches"],
                chunks=(p["train_chunks"], p["validation_chunks"], p["test_chunks"]),
                extra=cfg.reserve_releases)
        m_max = int(planned.max(initial=0))
        if cfg.rescale:
            # rescaling's estimate may fail with 1 − Φ(k) per release (Thm 3.6): half of δ
            # goes to the union bound over the record's releases, half to the composition
            self.delta = cfg.delta / 2.0
            self.rescale_sigmas = max(cfg.rescale_sigmas,
                                      rescale_sigmas_for(cfg.delta / 2.0, m_max))
        budget = self.budget
        loss = budget.gaussian_loss() if budget.settings else None
        try:
            sigma = calibrate_total(total, self.delta, planned, loss,
                                    lambda r: budget.releases_of(r))
        except ValueError as exc:
            raise PrivacyBudgetExceeded(
                f"party {self.party!r}: privacy budget ε = {total:g} (`privacy.total_epsilon`) "
                f"cannot cover this run: {exc}; nothing is released") from None
        per_release = float(gaussian_mechanism.get_epsilon_gaussian(sigma, self.delta))
        self._set_calibration(Calibration(sigma, "total-epsilon (PLD)", per_release,
                                          self.delta))
        self.planned = {
            "epsilon_target": total, "delta_target": cfg.delta, "plan": dict(p),
            "reserve_releases": cfg.reserve_releases, "max_releases": m_max,
            "epsilon": _planned_epsilon(budget, planned, sigma, self.delta),
            "records_planned": int((planned > 0).sum()),
        }
        log.info("party %r: total ε = %g at δ = %g over at most %d releases per record: "
                 "σ = %.4g", self.party, total, cfg.delta, m_max, sigma)

    def _response_setting(self, epsilon: float) -> ReleaseSetting:
        return ReleaseSetting(sigma=0.0, failure=0.0, epsilon=float(epsilon), delta=0.0,
                              calibration=RESPONSE_CALIBRATION, mode=self.config.embeddings,
                              buckets=self.config.codes)

    def _set_response(self, epsilon: float) -> None:
        """Randomized response at ``epsilon`` (pure ε-DP: δ = 0 for the release)."""
        cfg = self.config
        self.calibration = Calibration(0.0, RESPONSE_CALIBRATION, float(epsilon), 0.0)
        self.setting = self._response_setting(epsilon)
        limit = cfg.spending_limit
        self._allowed = (max_responses_within(cfg.codes, float(epsilon), self.delta, limit)
                         if limit is not None else None)

    def _calibrate_response(self, total: float) -> None:
        """``randomized-response``: one release per linked record at the run's total ε, or,
        for data released before (an earlier run), the largest ε that keeps the worst-case
        record within the total."""
        cfg = self.config
        budget = self.budget
        planned = self.links > 0
        rows = np.flatnonzero(planned)
        eps = float(total)
        # one record per distinct release history among the planned ones (all alike when the
        # data were never released before)
        probes = (rows[np.unique(budget.counts[:, rows].T, axis=0, return_index=True)[1]]
                  if budget.settings else rows[:1])

        def worst(e: float) -> float:
            plus = self._response_setting(e)
            return max((budget.epsilon(int(r), self.delta, plus=plus) for r in probes),
                       default=0.0)

        if rows.size and budget.settings and budget.counts[:, rows].any():
            if worst(1e-6) > total:
                raise PrivacyBudgetExceeded(
                    f"party {self.party!r}: privacy budget ε = {total:g} "
                    "(`privacy.total_epsilon`) cannot cover this run: earlier releases of its "
                    "records already spend it; nothing is released")
            if worst(eps) > total:
                lo, hi = 1e-6, eps
                while hi - lo > 1e-6 * max(1.0, hi):
                    mid = 0.5 * (lo + hi)
                    lo, hi = (mid, hi) if worst(mid) <= total else (lo, mid)
                eps = lo
        self._set_response(eps)
        p = self.plan or {}
        self.planned = {
            "epsilon_target": total, "delta_target": cfg.delta, "plan": dict(p),
            "reserve_releases": 0, "max_releases": 1 if rows.size else 0,
            "epsilon": worst(eps),
            "records_planned": int(rows.size),
        }
        log.info("party %r: total ε = %g: each of %d records' code released once by "
                 "%d-ary randomized response at ε = %.4g", self.party, total, rows.size,
                 cfg.codes, eps)

    def _ready(self) -> None:
        if self.calibration is None:
            self._calibrate_total()

    # --- figures ------------------------------------------------------------------------------

    @property
    def sigma(self) -> float:
        """The noise multiplier σ (noise std over the sensitivity 2t)."""
        self._ready()
        if self.calibration is None:  # pragma: no cover  (_ready sets it or raises)
            raise ConfigError(f"party {self.party!r}: no noise calibration")
        return self.calibration.sigma

    @property
    def noise_std(self) -> float:
        """Line 9: the noise standard deviation 2σt."""
        return 2.0 * self.sigma * self.config.clip

    @property
    def max_releases(self) -> int:
        return int(self.counts.max()) if self.counts.size else 0

    def note_links(self, links_per_row: npt.NDArray[np.int64]) -> None:
        """Remember how many primary records link to each row (soft linkage: many)."""
        self.links = np.asarray(links_per_row, dtype=np.int64).copy()
        self.max_links = int(links_per_row.max()) if links_per_row.size else 0

    # --- Algorithm 1, lines 6-9 ----------------------------------------------------------------

    def _check_budget(self, rows: npt.NDArray[np.int64]) -> None:
        if self.setting is None:
            return
        key = "privacy.total_epsilon" if self.config.budget_first else "privacy.budget"
        check_within(self.budget, self.setting, rows, limit=self.config.spending_limit,
                     delta=self.delta, allowed=self._allowed, who=f"party {self.party!r}",
                     key=key)

    def _claim_stream(self) -> None:
        """A fixed noise seed gives the same noise to every run that starts from it: two runs
        with different models would then send embeddings whose difference is noise-free. The
        budget numbers the streams; the first keeps the seed (single runs are reproducible as
        before), later ones derive theirs from (seed, stream)."""
        self._stream_claimed = True
        derived = self.budget.claim_stream_seed(self._seed, 0x5EED)
        if derived is not None:
            self._noise.reseed(derived)

    @property
    def noise_kind(self) -> str:
        """``"secret"`` or ``"reproducible"`` (vflink.randomness)."""
        return self._noise.kind

    def _gaussian(self, shape: tuple[int, ...]) -> torch.Tensor:
        """Line 9: N(0, (2σt)²) noise (float32)."""
        return self._noise.normal(shape, dtype=torch.float32) * self.noise_std

    def release(self, out: torch.Tensor, rows: npt.NDArray[np.int64],
                inputs: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Protect the embeddings ``out`` of the (unique) records ``rows``.

        ``inputs``: the records' preprocessed feature rows (the bottom model's input), which
        ``randomized-response`` quantises instead of using ``out``.

        Returns ``(z, released)``: ``z`` = clipped and rescaled embeddings (keeps ``out``'s
        graph, for the backward pass) and ``released = z + noise`` (detached), what may be sent.
        Raises :class:`PrivacyBudgetExceeded` *before* adding noise if a record would pass the
        budget; nothing is released then.
        """
        rows = np.asarray(rows, dtype=np.int64)
        if len(rows) != out.shape[0]:
            raise ValueError(f"{len(rows)} rows for {out.shape[0]} embeddings")
        if np.unique(rows).size != rows.size:
            raise ValueError("release() needs unique rows (one embedding per record)")
        self._ready()
        setting = self.setting
        if setting is None:  # pragma: no cover  (_ready sets it or raises)
            raise ConfigError(f"party {self.party!r}: no noise calibration")
        if self.config.randomized_response:
            return self._release_response(out, rows, inputs)
        if self.config.release_once:
            return self._release_once(out, rows)
        self._check_budget(rows)
        if not self._stream_claimed:
            self._claim_stream()
        t = self.config.clip
        if self.config.normalize:  # the whole radius t for every record
            z = afe.normalize_to_sphere(out.float(), t)
        else:
            z = afe.clip_norm(out.float(), t)  # line 6, Eq. 2
        watch = self.observer is not None and out.requires_grad  # training batches only
        figures: dict[str, float] = {}
        if watch:
            norms = torch.linalg.vector_norm(out.detach().float(), dim=-1)
            figures["clipped"] = float((norms > t).float().mean())
            if out.shape[0] >= 2:
                figures["spread"] = float(torch.pdist(z.detach()).max()) / (2.0 * t)
        if self.config.rescale:  # lines 7-8, Eqs. 3-5
            # Δ̃ is a statistic of the batch, detached: no gradient flows through it (the paper
            # does not say; Eq. 6's KL term is the one meant to shape the distances' law)
            d = afe.pairwise_distances(z.detach(), generator=self._aux)
            estimate = afe.sensitivity_estimate(d, self.rescale_sigmas)
            before = z
            z = afe.rescale(z, t, estimate, cap=self.config.rescale_cap)
            if watch:
                figures["estimate"] = float(estimate) / (2.0 * t)
                scale = float(torch.linalg.vector_norm(before.detach()).clamp_min(1e-12))
                figures["factor"] = float(torch.linalg.vector_norm(z.detach())) / scale
        noise = self._gaussian(tuple(z.shape))  # line 9: N(0, 4σ²t²)
        released = z.detach() + noise
        # write-ahead: the release is counted (and on disk, with a state directory) before the
        # caller can send it; if that fails nothing is sent
        self.budget.record(setting, rows)
        self.counts[rows] += 1
        if watch and self.observer is not None:
            self.observer("release", figures)
        return z, released

    def _release_once(self, out: torch.Tensor, rows: npt.NDArray[np.int64]
                      ) -> tuple[torch.Tensor, torch.Tensor]:
        """``release-once``: records released before get their cached release again (the same
        vector: post-processing, no further privacy cost); new ones are released (and counted)
        once. The cache lives with this run's object: a new run releases anew, and its budget
        counts that."""
        if self._cache is None:
            self._cache = torch.zeros(self.n_rows, out.shape[1])
            self._cached = np.zeros(self.n_rows, dtype=bool)
        cached = self._cached
        new = ~cached[rows]
        if new.any():
            fresh = rows[new]
            self._check_budget(fresh)
            z = afe.normalize_to_sphere(out.detach()[torch.from_numpy(np.flatnonzero(new))]
                                        .float(), self.config.clip)
            noise = self._gaussian(tuple(z.shape))
            if not self._stream_claimed:
                self._claim_stream()
            setting = self.setting
            if setting is not None:
                self.budget.record(setting, fresh)
            self.counts[fresh] += 1
            self._cache[torch.from_numpy(fresh)] = z + noise
            cached[fresh] = True
        released = self._cache[torch.from_numpy(rows)].clone()
        return out.detach(), released

    @property
    def quantiser(self) -> str:
        """The quantiser of ``randomized-response`` for this party's rows."""
        fields = self.code_fields
        return self.config.quantiser_for(len(fields) if fields is not None else None)

    def quantise(self, inputs: torch.Tensor) -> npt.NDArray[np.int64]:
        """The code of each preprocessed row (before randomized response): a pure function of
        the row, the public settings and the layout (the attacks of §4.3 simulate the release
        with it)."""
        k = self.config.codes
        bits = k.bit_length() - 1
        if self.quantiser == "fields":
            if not self.code_fields:
                raise ConfigError(f"party {self.party!r}: the fields quantiser needs the "
                                  "preprocessed row's layout (fit the preprocessing first)")
            return rr.field_codes(inputs, self.code_fields, bits)
        if self._planes is None or self._planes.shape[0] != max(inputs.shape[1], 1):
            self._planes = rr.simhash_planes(inputs.shape[1], bits, self._plane_seed)
        return rr.simhash_codes(inputs, self._planes)

    def _release_response(self, out: torch.Tensor, rows: npt.NDArray[np.int64],
                          inputs: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """``randomized-response``: each record's code (:meth:`quantise`), released once by k-ary
        randomized response; repeats get the same code back (post-processing). What is sent
        is the code's one-hot (width k); ``out`` is not used (nothing flows back)."""
        if inputs is None or inputs.shape[0] != len(rows):
            raise ConfigError(f"party {self.party!r}: randomized response needs the records' "
                              "feature rows (the bottom model's input)")
        k = self.config.codes
        new = self._codes[rows] < 0
        if new.any():
            fresh = rows[new]
            self._check_budget(fresh)
            codes = self.quantise(inputs[torch.from_numpy(np.flatnonzero(new))])
            epsilon = self.calibration.epsilon if self.calibration is not None else 0.0
            if not self._stream_claimed:
                self._claim_stream()
            released = rr.randomized_response(codes, k, epsilon, self._noise)
            if self.setting is not None:  # write-ahead, as every release
                self.budget.record(self.setting, fresh)
            self.counts[fresh] += 1
            self._codes[fresh] = released
        return out.detach(), rr.one_hot(self._codes[rows], k)

    # --- Algorithm 1, lines 16-18 -------------------------------------------------------------

    def local_loss(self, z: torch.Tensor, grad: torch.Tensor) -> torch.Tensor | None:
        """α·L_KL (Eq. 6, rescale) + β·L_CL (Eqs. 7-8, adjust) on the batch ``z``, or None."""
        terms: list[torch.Tensor] = []
        cfg = self.config
        figures: dict[str, float] = {}
        if cfg.rescale and cfg.alpha > 0 and z.shape[0] >= 3:
            kl = afe.kl_regulariser(torch.pdist(z), generator=self._aux)
            figures["kl"] = float(kl.detach())
            terms.append(cfg.alpha * kl)
        if cfg.adjust and cfg.beta > 0 and z.shape[0] >= 2:
            clusters = cfg.fcm_clusters or self.classes
            if not clusters or clusters < 2:
                raise ConfigError(f"party {self.party!r}: distribution adjusting needs the "
                                  "number of clusters (`privacy.fcm_clusters`, or a "
                                  "classification task whose classes the primary announces)")
            u = afe.fuzzy_cmeans(grad, clusters, generator=self._aux)  # line 16, Eq. 7
            cl = afe.contrastive_loss(z, u.to(z.dtype), cfg.fcm_threshold)
            figures["confident"] = float((u.max(dim=1).values >= cfg.fcm_threshold)
                                         .to(torch.float64).mean())
            figures["cl"] = float(cl.detach())
            terms.append(cfg.beta * cl)
        if figures and self.observer is not None:
            self.observer("local_loss", figures)
        if not terms:
            return None
        total = terms[0]
        for term in terms[1:]:
            total = total + term
        return total

    # --- ledger and state ----------------------------------------------------------------------

    def report(self) -> dict[str, Any]:
        """This party's ledger entry (keyword arguments of ``Ledger.add_protection``)."""
        cfg = self.config
        if cfg.randomized_response:
            return self._mark(self._report_response())
        budget = self.budget
        sigma = self.sigma  # budget first: calibrates now if nothing was released yet
        calibration = self.calibration
        per_release = calibration.epsilon if calibration is not None else cfg.release_epsilon
        # The guarantee covers every release of the party's data (this run's and earlier
        # ones'); for a first run on the data it is this run's figures.
        totals = budget.totals
        m = int(totals.max(initial=0))
        eps_total = budget.max_epsilon(self.delta)
        p2 = rescale_p2(self.rescale_sigmas) if cfg.rescale else 1.0
        d_prime = delta_prime(self.delta, P1, p2)
        # Rescaling's Δ̃ holds with probability p1·p2 per release; a union bound over the
        # record's m releases adds m(1 − p1 p2) to the composed δ (more cautious than
        # composing Thm 3.6's δ' = δ/(p1 p2)).
        delta_total = self.delta + budget.max_failure()
        params = {
            "mode": cfg.embeddings,
            "calibration": calibration.method if calibration is not None else None,
            "t": cfg.clip, "sigma": sigma, "noise_std": self.noise_std,
            "alpha": cfg.alpha if cfg.rescale else None,
            "beta": cfg.beta if cfg.adjust else None,
            "fcm_clusters": (cfg.fcm_clusters or self.classes) if cfg.adjust else None,
            "fcm_threshold": cfg.fcm_threshold if cfg.adjust else None,
            "rescale_sigmas": self.rescale_sigmas if cfg.rescale else None,
            "rescale_cap": cfg.rescale_cap if cfg.rescale else None,
            "noise": self.noise_kind, "budget": cfg.spending_limit,
            "total_epsilon": cfg.total_epsilon,
        }
        guarantee: dict[str, Any] = {
            "epsilon_per_release": per_release, "delta": self.delta, "delta_prime": d_prime,
            "p1": P1 if cfg.rescale else None, "p2": p2 if cfg.rescale else None,
            **self._counted(eps_total, delta_total), "accountant": ACCOUNTANT,
        }
        earlier = int(totals.sum()) - int(self.counts.sum())
        how = (f"σ was calibrated so that the worst-case record ends at ε = "
               f"{cfg.total_epsilon:g} (δ = {cfg.delta:g}) after at most "
               f"{self.planned['max_releases'] if self.planned else 0} planned releases; "
               if cfg.budget_first else "")
        explanation = (f"{explain_epsilon(eps_total, delta_total)}. Every embedding party "
                       f"{self.party!r} sent was "
                       + ("scaled to norm" if cfg.normalize else "clipped to norm")
                       + f" {cfg.clip:g} and noised (std {self.noise_std:.3g}); {how}each "
                       f"release costs ε = {per_release:.3g} at δ = {self.delta:g}, and its "
                       f"most-released record was sent {m} times"
                       + (" (counting earlier runs on the same data)." if earlier > 0 else "."))
        return self._mark({"kind": "embedding-dp", "party": self.party,
                           "applies_to": "embeddings", "params": params,
                           "guarantee": guarantee, "explanation": explanation})

    def _mark(self, entry: dict[str, Any]) -> dict[str, Any]:
        """A reproducible source's entry says first that it is not private."""
        if self.noise_kind == REPRODUCIBLE:
            entry["guarantee"] = {**entry["guarantee"], "private": False}
            entry["explanation"] = (f"{NOT_PRIVATE.upper()}: {describe(REPRODUCIBLE)}. "
                                    "Otherwise: " + entry["explanation"])
        return entry

    def _counted(self, eps_total: float, delta_total: float) -> dict[str, Any]:
        """The ledger's release counts and composed total, the same for every mode (budget
        first: also what the calibration planned against what the run spent)."""
        budget = self.budget
        totals = budget.totals
        m = int(totals.max(initial=0))
        out: dict[str, Any] = {
            "max_releases": m, "max_links_per_record": self.max_links,
            "records_released": int((totals > 0).sum()), "releases_total": int(totals.sum()),
            "run_max_releases": self.max_releases, "run_releases_total": int(self.counts.sum()),
            "settings_used": sum(1 for j in range(len(budget.settings))
                                 if budget.counts[j].any()),
            "epsilon_total": eps_total, "delta_total": delta_total,
            "scope": "per record of this party's data, over every release of it since its "
                     "operator last reset the budget (all runs and sessions; composition of "
                     "every release)",
        }
        if self.planned is not None:
            out["planned"] = dict(self.planned)
            out["spent"] = {"epsilon": eps_total, "delta": delta_total, "max_releases": m}
        return out

    def _report_response(self) -> dict[str, Any]:
        """The ledger entry of ``randomized-response``: the mechanism, k, ε, the release count
        and the plan; pure ε-DP unless the data also had Gaussian releases."""
        cfg = self.config
        self._ready()
        budget = self.budget
        k = cfg.codes
        eps = self.calibration.epsilon if self.calibration is not None else 0.0
        keep = rr.keep_probability(eps, k) if eps > 0 else 1.0 / k
        detail = self._quantiser_detail()
        totals = budget.totals
        m = int(totals.max(initial=0))
        gaussian = any(not s.response and bool(budget.counts[j].any())
                       for j, s in enumerate(budget.settings))
        eps_total = budget.max_epsilon(self.delta)
        delta_total = (self.delta + budget.max_failure()) if gaussian else 0.0
        params = {
            "mode": cfg.embeddings, "calibration": RESPONSE_CALIBRATION,
            "mechanism": "k-ary randomized response", "code_bits": k.bit_length() - 1,
            "k": k, "keep_probability": keep,
            "quantiser": self.quantiser, "quantiser_detail": detail,
            "sigma": 0.0, "noise_std": 0.0,
            "noise": self.noise_kind, "budget": cfg.spending_limit,
            "total_epsilon": cfg.total_epsilon,
        }
        guarantee: dict[str, Any] = {
            "epsilon_per_release": eps, "delta_per_release": 0.0, "delta": self.delta,
            **self._counted(eps_total, delta_total),
            "accountant": "closed form ln((k−1)p/(1−p)); dp-accounting PLD "
                          "(randomized response, Gaussian) with basic composition for "
                          "several releases",
        }
        explanation = (f"{explain_epsilon(eps_total, delta_total)}. Party {self.party!r} "
                       f"sent, for each record, one code of {k} ({detail}), "
                       "released once by randomized response: the true "
                       f"code with probability {keep:.4g}, else one of the other {k - 1} "
                       f"uniformly (ε = {eps:.4g}, δ = 0); every later request got the same "
                       f"release back, and its most-released record was released {m} "
                       "times" + (" (counting earlier runs on the same data)."
                                  if int(totals.sum()) > int(self.counts.sum()) else "."))
        return {"kind": "embedding-dp", "party": self.party, "applies_to": "embeddings",
                "params": params, "guarantee": guarantee, "explanation": explanation}

    def _quantiser_detail(self) -> str:
        bits = self.config.codes.bit_length() - 1
        if self.quantiser == "fields":
            fields = self.code_fields or ()
            share = rr.field_bits(len(fields), bits) if fields else ()
            return (f"fields: {bits} bits shared between its {len(fields)} columns as "
                    f"{list(share)}; numeric values cut at N(0, 1) quantiles, categories "
                    "by training frequency")
        return (f"SimHash: signs of the preprocessed features' projections onto {bits} "
                "seeded Gaussian directions (data-independent)")

    def state_dict(self) -> dict[str, Any]:
        if self.config.randomized_response:
            # the released codes travel with the state: a resumed run answers from them
            return {"settings": self.config.public_settings(), "counts": self.counts.copy(),
                    "classes": self.classes, "max_links": self.max_links, "plan": self.plan,
                    "calibration": None,
                    "response": None if self.calibration is None else {
                        "epsilon": self.calibration.epsilon, "planned": self.planned,
                        "plane_seed": self._plane_seed,
                        "code_fields": None if self.code_fields is None else [
                            [f.start, f.width, None if f.ranks is None else list(f.ranks)]
                            for f in self.code_fields]},
                    "codes": self._codes.copy(),
                    "noise": self._noise_state(), "aux": self._aux.get_state()}
        return {"settings": self.config.public_settings(), "counts": self.counts.copy(),
                "classes": self.classes, "max_links": self.max_links, "plan": self.plan,
                "calibration": None if self.calibration is None or not self.config.budget_first
                else {"sigma": self.calibration.sigma, "epsilon": self.calibration.epsilon,
                      "delta": self.delta, "rescale_sigmas": self.rescale_sigmas,
                      "planned": self.planned},
                "noise": self._noise_state(), "aux": self._aux.get_state()}

    def _noise_state(self) -> dict[str, Any] | None:
        """A reproducible stream's position (a resumed run continues it); a secret stream's
        key is never written: its replays after a resume are counted as new releases."""
        return self._noise.state() if self._seed_given else None

    def load_state_dict(self, state: dict[str, Any]) -> None:
        counts = np.asarray(state["counts"], dtype=np.int64)
        if counts.shape != self.counts.shape:
            raise ConfigError(f"party {self.party!r}: saved release counts are for "
                              f"{counts.size} records, the party has {self.counts.size}")
        # never forget releases: keep the larger count of memory and file (the data's counts
        # too: a checkpoint written before the budget file existed still counts)
        self.counts = np.maximum(self.counts, counts)
        saved = state.get("calibration")
        response = state.get("response")
        if self.config.randomized_response and response is not None:
            if state.get("plan") is not None:
                self.plan = check_plan(state["plan"], self.party)
            self._plane_seed = int(response["plane_seed"])
            saved_fields = response.get("code_fields")
            if saved_fields is not None:  # a resumed run codes new records the same way
                self.code_fields = tuple(
                    rr.CodeField(int(a), int(w), None if r is None else tuple(int(v) for v in r))
                    for a, w, r in saved_fields)
            self.planned = response.get("planned")
            self._set_response(float(response["epsilon"]))
            codes = np.asarray(state["codes"], dtype=np.int64)
            if codes.shape == self._codes.shape:
                self._codes = codes.copy()
        elif self.config.budget_first and saved is not None:
            # a resumed run keeps the σ it was calibrated with (its own releases since are
            # this run's plan being spent, not an earlier run's)
            if state.get("plan") is not None:
                self.plan = check_plan(state["plan"], self.party)
            self.delta = float(saved["delta"])
            self.rescale_sigmas = float(saved["rescale_sigmas"])
            self.planned = saved.get("planned")
            self._set_calibration(Calibration(float(saved["sigma"]), "total-epsilon (PLD)",
                                              float(saved["epsilon"]), self.delta))
        self._ready()
        if self.setting is not None:
            self.budget.merge(self.setting, counts)
        self.classes = state.get("classes", self.classes)
        self.max_links = int(state.get("max_links", self.max_links))
        saved_noise = state.get("noise")
        if isinstance(saved_noise, torch.Tensor):  # an older checkpoint's generator state
            saved_noise = {"kind": REPRODUCIBLE, "torch": saved_noise}
        if self._seed_given and isinstance(saved_noise, Mapping) \
                and saved_noise.get("kind") == REPRODUCIBLE:
            self._noise.set_state(dict(saved_noise))
            self._stream_claimed = True  # resuming continues the checkpoint's stream
        self._aux.set_state(state["aux"])
