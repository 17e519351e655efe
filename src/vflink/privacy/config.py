"""The ``[privacy]`` section: differentially private embeddings (VFL-AFE, Mi et al. 2023).

::

    [privacy]
    embeddings = "afe"     # off | vanilla | rescale | adjust | afe (Table 2) | normalized | ...
    total_epsilon = 4.0    # budget first: ε of the worst-case record over the whole run ...
    delta = 1e-5           # ... at this δ; σ is calibrated from the run's plan
    epsilon = 2.0          # or per release (the paper's form; not with total_epsilon)
    delta = 1e-2           # per release (§4.1 fixes δ = 1e-2)
    reserve_releases = 0   # with total_epsilon: releases kept for after training (predict, attacks)
    clip = 1.0             # t of Eq. 2
    alpha = 0.1            # weight of the KL regulariser, Eq. 6 (rescale, afe)
    beta = 0.1             # weight of the contrastive loss, Eq. 8 (adjust, afe)
    fcm_clusters = 2       # C of Eq. 7 (default: the number of classes the primary announces)
    fcm_threshold = 0.7    # c: confidence below which a soft label is ignored (§3.3)
    rescale_sigmas = 3.0   # Eq. 5: Δ̃ = μh + 3σh, p2 = Φ(3) ≈ 0.9987
    rescale_cap = false    # true: cap Δ̃ at 2t so rescaling never shrinks (not in the paper)
    code_bits = 8          # randomized-response: k = 2^code_bits codes (default 8)
    quantiser = "auto"     # randomized-response: auto | fields | simhash
    reproducible_noise = false   # true: every protective draw is seeded (NOT private: whoever
                           # knows the seed regenerates the noise); for simulations only
    seed = 0               # with reproducible_noise only: the embedding noise seed (default:
                           # from the run's seed; a served secondary must give it)
    budget = 50.0          # optional: total ε of any record over the run (= total_epsilon when
                           # that is set)
    labels = "dp"          # the primary's labels on the backward gradients: off | max-norm |
                           # marvell | dp | rr-prior (default: dp at ε = 8, one release, on a
                           # binary task, off on others; docs/how-to/label-protection.md)
    labels_total_epsilon = 4.0   # dp: ε of each label over the run (budget first); rr-prior: ε
    labels_delta = 1e-5    # dp: δ of the composition
    labels_clip = 1.0      # dp, regression: the per-record gradient is clipped to [−C, C]
    labels_marvell_power = 4.0   # marvell: noise power P = s·‖ḡ₁ − ḡ₀‖² per batch (Li et al. §4)
    labels_denoise = "posterior" # dp: train on the posterior of each label given all its
                           # releases so far (classification; the default, except with
                           # reproducible_noise), or "none": each release as drawn
    labels_releases = 1    # dp with the posterior: each label released this many times (the
                           # first epochs; later ones train on the posterior; default: one
                           # release per epoch)
    labels_seed = 0        # with reproducible_noise only: the label-noise seed (default: from
                           # the run's seed)
    labels_refit = true    # dp, rr-prior: after the last gradient has gone, the primary refits
                           # its own layers on its clean labels (nothing more is sent; its
                           # final model is then not label-DP: false keeps it so; default:
                           # true, false with reproducible_noise)

Every protective draw (the noise on embeddings and on gradients, randomized response, the
similarity noise, union training's synthetic rows and labels) is secret by default: a ChaCha20
stream keyed by the operating system (:mod:`vflink.randomness`). ``reproducible_noise = true``
is the one switch that seeds them instead, so that a simulation repeats its figures; the
ledger, the summary line and the report then say "not private: the noise can be regenerated".

Budget first: with ``total_epsilon`` the per-release ε is derived. The primary announces the
run's plan (epochs, batches, evaluation passes) and each secondary bounds, from its own links,
how often each record can be released, then calibrates σ so that its worst-case record ends at
(``total_epsilon``, ``delta``) exactly (:func:`vflink.privacy.accounting.calibrate_total`);
the same figure is its budget, so a run that asks for more releases than planned stops before
the release that would pass it.

The same table may appear in a secondary's party file (``vflink serve``): the secondary then
adds the noise with its own settings and refuses a run that expects others.

The ``labels*`` keys protect the other direction: the gradients the *primary* sends back carry
its labels (Li et al., ICLR 2022). They are the primary's own settings, never announced to a
secondary (not in :data:`PUBLIC_SETTINGS`), and apply wherever the primary sends gradients
(:mod:`vflink.privacy.label_protection`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from vflink._checks import check_choice, check_float, check_int, raise_if
from vflink.types import Task

__all__ = ["DEFAULT_CODE_BITS", "DEFAULT_EPSILON", "DEFAULT_LABELS", "DEFAULT_LABELS_EPSILON",
           "DEFAULT_PROTECTION_EPSILON", "DEFAULT_PROTECTION_RELEASES",
           "DEFAULT_MARVELL_POWER", "LABEL_MODES", "MAX_CODE_BITS", "MODES", "PUBLIC_SETTINGS",
           "QUANTISERS", "RETIRED_KEYS", "PrivacyConfig"]

#: Table 2 of VFL-AFE: vanilla (§3.1), +R (§3.2), +D (§3.3), both (VFL-AFE); and the
#: departures from the paper (:data:`vflink.privacy.afe.VARIANTS`): ``normalized`` scales every
#: embedding onto the clipping sphere before noising, so each uses the whole ball from the
#: first step; ``release-once`` releases each record's (normalized) embedding once and answers
#: every later request with that same release (post-processing: no further privacy cost),
#: its bottom model left untrained (a seeded random projection), so each record costs one
#: Gaussian release for the whole run; ``randomized-response`` quantises each record's
#: (preprocessed) feature row with a seeded, data-independent SimHash into one of
#: k = 2^``code_bits`` codes and releases the code once by k-ary randomized response at the
#: run's ``total_epsilon`` (pure ε-DP; :mod:`vflink.privacy.randomized_response`), the primary
#: receiving its one-hot.
MODES = ("off", "vanilla", "rescale", "adjust", "afe", "normalized", "release-once",
         "randomized-response")

#: The quantisers of ``randomized-response`` (:mod:`vflink.privacy.randomized_response`):
#: ``fields`` codes each column of the row, ``simhash`` projects the whole row on seeded
#: hyperplanes; ``auto`` (the default) takes ``fields`` when the row has at most 2·b columns
#: (so at least half of them get a bit) and ``simhash`` for wider rows such as images.
QUANTISERS = ("auto", "fields", "simhash")

#: b of ``randomized-response`` when ``code_bits`` is not given: chosen by measurement on the
#: Adult curve (docs/how-to/privacy.md).
DEFAULT_CODE_BITS = 8
#: k = 2^b codes: the one-hot the primary receives has k columns per record, so b is bounded
#: (2^12 = 4096 columns of float32 is 16 KiB per record per release already).
MAX_CODE_BITS = 12

#: Per-release ε when neither ``epsilon`` nor ``total_epsilon`` is given.
DEFAULT_EPSILON = 2.0

#: How the primary protects its labels on the gradients it sends back
#: (:mod:`vflink.privacy.label_protection`): ``max-norm`` (Li et al., ICLR 2022, the
#: heuristic: every gradient of a batch gets the expected norm of the batch's largest),
#: ``marvell`` (Li et al. §4: an optimised per-batch Gaussian perturbation with a bound on the
#: leak AUC), ``dp`` (Gaussian noise on each record's loss gradient at the logits, composed over
#: the run: (ε, δ)-label-DP of every backward message and of the primary's model), ``rr-prior``
#: (Ghazi et al., NeurIPS 2021: labels randomised once before training, ε-label-DP).
LABEL_MODES = ("off", "max-norm", "marvell", "dp", "rr-prior")
#: ``labels`` when not given, on a binary task: chosen from the measurements of
#: docs/how-to/label-protection.md ("The default"): ``dp`` with the posterior, the one mode
#: that holds every attack there (the white-box ones included) within a limit it states, at a
#: measured cost in test AUC. A multi-class or regression task keeps the labels ``off``
#: unless the run names a mode (its cost there is not measured).
DEFAULT_LABELS = "dp"
#: ``labels_total_epsilon`` when not given (``dp`` and ``rr-prior`` named by the run)
DEFAULT_LABELS_EPSILON = 4.0
#: The default protection (no ``labels`` key, a binary task): ``dp`` at this ε (δ =
#: ``labels_delta``), each label released once (``labels_releases``), trained on through its
#: posterior, the primary's own layers refit on its clean labels after the last gradient
#: (``labels_refit``): the point of the measured trade-off that keeps the test AUC within 0.03
#: of the unprotected run's on the rare-label tasks and small tables while holding every
#: attack within the limit it states (docs/how-to/label-protection.md, "The default"). A run
#: that names ``labels = "dp"`` gets DEFAULT_LABELS_EPSILON, one release per epoch: naming the
#: mode asks for privacy first.
DEFAULT_PROTECTION_EPSILON = 8.0
#: releases per label of the default protection (``None``: one per epoch)
DEFAULT_PROTECTION_RELEASES: int | None = 1
#: ``labels_marvell_power`` when not given: s of P = s·‖ḡ₁ − ḡ₀‖² (Li et al. §4)
DEFAULT_MARVELL_POWER = 4.0

#: Keys of earlier versions, and what to write instead (a file that still has one is refused
#: with this sentence: silently ignoring them would leave a reader believing what they said).
RETIRED_KEYS = {
    "secure_rng": "`privacy.secure_rng` is gone: every protective draw is secret by default "
                  "now (the operating system's CSPRNG); remove it (`privacy.reproducible_noise "
                  "= true` is the only way to seed the noise, for simulations)",
    "labels_secure_rng": "`privacy.labels_secure_rng` is gone: the label noise is secret by "
                         "default now (the operating system's CSPRNG); remove it "
                         "(`privacy.reproducible_noise = true` is the only way to seed it)",
}

#: Settings the primary may know and must agree on (never the noise seed or generator).
PUBLIC_SETTINGS = ("embeddings", "epsilon", "total_epsilon", "reserve_releases", "delta",
                   "clip", "alpha", "beta", "fcm_clusters", "fcm_threshold", "rescale_sigmas",
                   "rescale_cap", "budget", "code_bits", "quantiser")



def label_mode_for(named: str | None, task: Task | None) -> str:
    """The label mode a run of ``task`` uses: the one named, else DEFAULT_LABELS on a binary
    task and ``off`` on others."""
    if named is not None:
        return named
    return DEFAULT_LABELS if task is Task.BINARY else "off"

@dataclass(frozen=True, kw_only=True)
class PrivacyConfig:
    """Differential privacy on the embeddings every secondary sends (VFL-AFE Algorithm 1)."""

    #: keys of earlier versions, refused with what to write instead (``_checks.from_table``)
    RETIRED_KEYS: ClassVar[dict[str, str]] = RETIRED_KEYS

    embeddings: str = "off"
    #: per release (the paper's form); ``None``: derived from ``total_epsilon``, else 2.0
    epsilon: float | None = None
    #: ε of the worst-case record over the run (budget first); ``None``: per-release form
    total_epsilon: float | None = None
    #: with ``total_epsilon``: releases per record kept in the budget beyond the training run
    reserve_releases: int = 0
    delta: float = 1e-2
    clip: float = 1.0
    alpha: float = 0.1
    beta: float = 0.1
    fcm_clusters: int | None = None
    fcm_threshold: float = 0.7
    rescale_sigmas: float = 3.0
    #: a departure from Eq. 4 (off by default): cap Δ̃ at the ball's diameter 2t
    rescale_cap: bool = False
    #: the one switch that seeds every protective draw (not private: the noise can be
    #: regenerated by whoever knows the seed); ``False``: secret, :mod:`vflink.randomness`
    reproducible_noise: bool = False
    #: with ``reproducible_noise`` only: the embedding noise seed (``None``: from the run seed)
    seed: int | None = None
    budget: float | None = None
    #: ``randomized-response`` only: k = 2^code_bits codes (``None``: DEFAULT_CODE_BITS)
    code_bits: int | None = None
    #: ``randomized-response`` only: the quantiser (``None``: ``auto``, see QUANTISERS)
    quantiser: str | None = None
    #: the primary's protection of its labels on the gradients it sends (LABEL_MODES;
    #: ``None``: DEFAULT_LABELS on a binary task, ``off`` on others, :meth:`label_mode`)
    labels: str | None = None
    #: ``dp``: ε of each record's label over the run (budget first); ``rr-prior``: ε of the
    #: one randomised release (``None``: DEFAULT_LABELS_EPSILON)
    labels_total_epsilon: float | None = None
    #: ``dp``: δ of the composed guarantee
    labels_delta: float = 1e-5
    #: ``dp``, regression: each record's loss gradient is clipped to [−C, C] (sensitivity 2C)
    labels_clip: float = 1.0
    #: ``marvell``: s of the per-batch noise power P = s·‖ḡ₁ − ḡ₀‖² (``None``: the default)
    labels_marvell_power: float | None = None
    #: with ``reproducible_noise`` only: the label noise seed (``None``: from the run's seed)
    labels_seed: int | None = None
    #: ``dp``: how the primary uses its releases: ``"posterior"`` (the posterior mean of each
    #: record's gradient given all its releases so far: post-processing; the default on a
    #: classification task) or ``"none"`` (each release as drawn; regression always, and the
    #: default with ``reproducible_noise``, whose published figures used each release so)
    labels_denoise: str | None = None
    #: ``dp`` with the posterior: how many times each record's label is released in a run
    #: (the first epochs; later epochs train on the posterior of those releases alone, no new
    #: release). ``None``: one release per epoch. The same ε buys the same evidence either way
    #: (m Gaussian releases of multiplier σ are one of σ/√m); fewer releases give it all to
    #: the first epoch.
    labels_releases: int | None = None
    #: ``dp``, ``rr-prior``: once training has sent its last gradient, the primary refits its
    #: own parameters (its bottom model, top and merge) on its clean training labels over the
    #: embeddings of the final evaluation, which it receives in any case: no message is added
    #: or changed, so what every secondary receives keeps its guarantee, and the primary's
    #: final model is not label-DP (docs/how-to/label-protection.md, "The refit"). ``None``:
    #: on, except with ``reproducible_noise`` (whose published figures had no refit).
    labels_refit: bool | None = None

    def __post_init__(self) -> None:
        problems: list[str] = []
        check_choice(problems, "privacy.embeddings", self.embeddings, MODES)
        check_float(problems, "privacy.epsilon", self.epsilon, min=0.0, min_exclusive=True,
                    allow_none=True)
        check_float(problems, "privacy.total_epsilon", self.total_epsilon, min=0.0,
                    min_exclusive=True, allow_none=True)
        check_int(problems, "privacy.reserve_releases", self.reserve_releases, min=0)
        if self.epsilon is not None and self.total_epsilon is not None:
            problems.append("give `privacy.total_epsilon` (the run's total, per-release ε "
                            "derived) or `privacy.epsilon` (per release), not both")
        if (self.total_epsilon is not None and self.budget is not None
                and self.budget != self.total_epsilon):
            problems.append(f"`privacy.budget` ({self.budget}) differs from "
                            f"`privacy.total_epsilon` ({self.total_epsilon}), which is the "
                            "budget: remove `budget`")
        check_float(problems, "privacy.delta", self.delta, min=0.0, max=1.0, min_exclusive=True)
        if isinstance(self.delta, (int, float)) and self.delta == 1.0:
            problems.append("`privacy.delta` must be < 1, got 1.0")
        check_float(problems, "privacy.clip", self.clip, min=0.0, min_exclusive=True)
        check_float(problems, "privacy.alpha", self.alpha, min=0.0)
        check_float(problems, "privacy.beta", self.beta, min=0.0)
        if self.fcm_clusters is not None:
            check_int(problems, "privacy.fcm_clusters", self.fcm_clusters, min=2)
        check_float(problems, "privacy.fcm_threshold", self.fcm_threshold, min=0.0, max=1.0,
                    min_exclusive=True)
        check_float(problems, "privacy.rescale_sigmas", self.rescale_sigmas, min=0.0,
                    min_exclusive=True)
        if not isinstance(self.rescale_cap, bool):
            problems.append(f"`privacy.rescale_cap` must be true or false, got "
                            f"{self.rescale_cap!r}")
        if not isinstance(self.reproducible_noise, bool):
            problems.append(f"`privacy.reproducible_noise` must be true or false, got "
                            f"{self.reproducible_noise!r}")
        for key in ("seed", "labels_seed"):
            value = getattr(self, key)
            if value is None:
                continue
            check_int(problems, f"privacy.{key}", value, min=0)
            if self.reproducible_noise is not True:
                problems.append(f"`privacy.{key}` seeds the noise, which is secret unless "
                                "`privacy.reproducible_noise = true` (not private: whoever knows "
                                "the seed regenerates the noise); remove it, or turn the switch "
                                "on for a simulation")
        check_float(problems, "privacy.budget", self.budget, min=0.0, min_exclusive=True,
                    allow_none=True)
        if (self.budget is not None and isinstance(self.budget, (int, float))
                and self.total_epsilon is None and isinstance(self.release_epsilon, (int, float))
                and 0 < self.budget < self.release_epsilon):
            problems.append(f"`privacy.budget` ({self.budget}) is below the ε of a single release "
                            f"(`privacy.epsilon` = {self.release_epsilon}): nothing could be "
                            "released")
        if self.code_bits is not None:
            check_int(problems, "privacy.code_bits", self.code_bits, min=1, max=MAX_CODE_BITS)
            if self.embeddings != "randomized-response":
                problems.append(f"`privacy.code_bits` only applies to `privacy.embeddings = "
                                f"\"randomized-response\"`, got {self.embeddings!r}: remove it")
        if self.quantiser is not None:
            check_choice(problems, "privacy.quantiser", self.quantiser, QUANTISERS)
            if self.embeddings != "randomized-response":
                problems.append(f"`privacy.quantiser` only applies to `privacy.embeddings = "
                                f"\"randomized-response\"`, got {self.embeddings!r}: remove it")
        if self.embeddings == "randomized-response":
            if self.total_epsilon is None:
                problems.append("`privacy.embeddings = \"randomized-response\"` releases each "
                                "record once at the run's total ε: give "
                                "`privacy.total_epsilon` (not `privacy.epsilon`)")
            if self.reserve_releases != 0:
                problems.append("`privacy.reserve_releases` has no effect with "
                                "`privacy.embeddings = \"randomized-response\"` (every later "
                                "request gets the one release back): remove it")
        self._check_labels(problems)
        raise_if(problems, "[privacy] section")

    def _check_labels(self, problems: list[str]) -> None:
        """The primary's label settings (each given only where its mode reads it)."""
        if self.labels is not None:
            check_choice(problems, "privacy.labels", self.labels, LABEL_MODES)
        check_float(problems, "privacy.labels_total_epsilon", self.labels_total_epsilon,
                    min=0.0, min_exclusive=True, allow_none=True)
        check_float(problems, "privacy.labels_delta", self.labels_delta, min=0.0, max=1.0,
                    min_exclusive=True)
        if isinstance(self.labels_delta, (int, float)) and self.labels_delta == 1.0:
            problems.append("`privacy.labels_delta` must be < 1, got 1.0")
        check_float(problems, "privacy.labels_clip", self.labels_clip, min=0.0,
                    min_exclusive=True)
        check_float(problems, "privacy.labels_marvell_power", self.labels_marvell_power,
                    min=0.0, min_exclusive=True, allow_none=True)
        mode = self.labels if self.labels is not None else DEFAULT_LABELS
        if self.labels_total_epsilon is not None and mode not in ("dp", "rr-prior"):
            problems.append(f"`privacy.labels_total_epsilon` applies to `privacy.labels = "
                            f"\"dp\"` or `\"rr-prior\"`, got {mode!r}: remove it")
        if self.labels_denoise is not None:
            check_choice(problems, "privacy.labels_denoise", self.labels_denoise,
                         ("posterior", "none"))
            if mode != "dp":
                problems.append(f"`privacy.labels_denoise` applies to `privacy.labels = "
                                f"\"dp\"`, got {mode!r}: remove it")
        if self.labels_releases is not None:
            check_int(problems, "privacy.labels_releases", self.labels_releases, min=1)
            if mode != "dp" or self.labels_denoise == "none":
                problems.append(f"`privacy.labels_releases` applies to `privacy.labels = "
                                f"\"dp\"` with `labels_denoise = \"posterior\"` (the epochs "
                                f"after the last release train on the posterior of the "
                                f"releases), got labels = {mode!r}, labels_denoise = "
                                f"{self.labels_denoise!r}: remove it")
        if self.labels_refit is not None:
            if not isinstance(self.labels_refit, bool):
                problems.append(f"`privacy.labels_refit` must be true or false, got "
                                f"{self.labels_refit!r}")
            elif self.labels_refit and mode not in ("dp", "rr-prior"):
                problems.append(f"`privacy.labels_refit` applies to `privacy.labels = \"dp\"` "
                                f"or `\"rr-prior\"` (the modes whose primary trains on "
                                f"protected labels), got {mode!r}: remove it")
        if self.labels_marvell_power is not None and mode != "marvell":
            problems.append(f"`privacy.labels_marvell_power` applies to `privacy.labels = "
                            f"\"marvell\"`, got {mode!r}: remove it")

    @property
    def label_epsilon(self) -> float:
        """ε of the labels (``dp``: the run's total; ``rr-prior``: the one release)."""
        if self.labels_total_epsilon is not None:
            return float(self.labels_total_epsilon)
        return DEFAULT_PROTECTION_EPSILON if self.labels is None else DEFAULT_LABELS_EPSILON

    @property
    def marvell_power(self) -> float:
        """s of Marvell's power constraint P = s·‖ḡ₁ − ḡ₀‖²."""
        return (float(self.labels_marvell_power) if self.labels_marvell_power is not None
                else DEFAULT_MARVELL_POWER)

    @property
    def protects_labels(self) -> bool:
        """The primary may protect its labels on the gradients it sends (``labels`` not off;
        the default's mode depends on the task: :meth:`label_mode`)."""
        return self.labels != "off"

    def label_mode(self, task: Task | None) -> str:
        """The mode a run of ``task`` uses (:func:`label_mode_for`)."""
        return label_mode_for(self.labels, task)

    def label_settings(self) -> dict[str, Any]:
        """The primary's own label settings (its training plan carries them; never sent);
        ``mode`` is ``None`` for the task's default (resolved by the party, which knows its
        task: :func:`vflink.privacy.label_protection.resolve_settings`). ``seed`` is the
        explicit ``labels_seed`` (reproducible noise only); the run fills in the one it
        derives."""
        return {"mode": self.labels, "epsilon": self.label_epsilon,
                "delta": float(self.labels_delta), "clip": float(self.labels_clip),
                "marvell_power": self.marvell_power, "seed": self.labels_seed,
                "denoise": (self.labels_denoise if self.labels is not None
                            or self.labels_denoise is not None else "posterior"),
                "releases": self.label_releases, "refit": self.label_refit}

    @property
    def label_refit(self) -> bool:
        """``dp``, ``rr-prior``: the primary refits its own layers on its clean labels after
        the last gradient has gone (``labels_refit``; default on, off with
        ``reproducible_noise``)."""
        if self.labels_refit is not None:
            return bool(self.labels_refit)
        return not self.reproducible_noise

    @property
    def label_releases(self) -> int | None:
        """``dp``: releases of each label in a run (``None``: one per epoch); the default
        protection releases each label DEFAULT_PROTECTION_RELEASES times (``None``: one per
        epoch), unless it uses each release as drawn."""
        if self.labels_releases is not None:
            return int(self.labels_releases)
        if self.labels is None and self.labels_denoise != "none":
            return DEFAULT_PROTECTION_RELEASES
        return None

    @property
    def budget_first(self) -> bool:
        """σ is calibrated from ``total_epsilon`` and the run's plan."""
        return self.total_epsilon is not None

    @property
    def release_epsilon(self) -> float:
        """The per-release ε of the paper's form (``epsilon``, default 2.0)."""
        return float(self.epsilon) if self.epsilon is not None else DEFAULT_EPSILON

    @property
    def spending_limit(self) -> float | None:
        """The ε no record may pass: ``total_epsilon`` or ``budget``."""
        return self.total_epsilon if self.total_epsilon is not None else self.budget

    @property
    def normalize(self) -> bool:
        """Scale every embedding onto the clipping sphere before noising."""
        return self.embeddings in ("normalized", "release-once")

    @property
    def release_once(self) -> bool:
        """One release per record for the run, repeated from a cache."""
        return self.embeddings == "release-once"

    @property
    def randomized_response(self) -> bool:
        """Each record's quantised code released once by k-ary randomized response."""
        return self.embeddings == "randomized-response"

    @property
    def codes(self) -> int:
        """k, the number of codes (``randomized-response``)."""
        bits = self.code_bits if self.code_bits is not None else DEFAULT_CODE_BITS
        return 2 ** min(int(bits), MAX_CODE_BITS)

    def quantiser_for(self, n_columns: int | None) -> str:
        """The quantiser used on rows of ``n_columns`` columns (``None``: unknown layout)."""
        choice = self.quantiser or "auto"
        if choice != "auto":
            return choice
        bits = self.codes.bit_length() - 1
        return "fields" if n_columns is not None and 1 <= n_columns <= 2 * bits else "simhash"

    def cut_width(self, cut_dim: int) -> int:
        """The width of what each secondary sends: k (the code's one-hot) with
        ``randomized-response``, the model's ``cut_dim`` otherwise."""
        return self.codes if self.randomized_response else int(cut_dim)

    @property
    def enabled(self) -> bool:
        return self.embeddings != "off"

    @property
    def rescale(self) -> bool:
        """Adaptive rescaling (§3.2, Eqs. 3-6) is on."""
        return self.embeddings in ("rescale", "afe")

    @property
    def adjust(self) -> bool:
        """Distribution adjusting (§3.3, Eqs. 7-8) is on: classification only."""
        return self.embeddings in ("adjust", "afe")

    def public_settings(self) -> dict[str, Any]:
        """What the primary announces and a secondary checks (no seed, no generator)."""
        return {k: getattr(self, k) for k in PUBLIC_SETTINGS}

    @classmethod
    def from_public(cls, settings: dict[str, Any]) -> PrivacyConfig:
        unknown = sorted(set(settings) - set(PUBLIC_SETTINGS))
        if unknown:
            raise_if([f"unknown privacy setting(s) {unknown}; known: {list(PUBLIC_SETTINGS)}"],
                     "privacy settings")
        return cls(**settings)
