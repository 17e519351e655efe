"""The ``[privacy]`` section: differentially private embeddings (VFL-AFE, Mi et al. 2023).

::

    [privacy]
    embeddings = "afe"     # off | vanilla | rescale | adjust | afe (Table 2)
    epsilon = 2.0          # per release of one record's embedding (Lemma 3.3 / analytic Gaussian)
    delta = 1e-2           # per release (§4.1 fixes δ = 1e-2)
    clip = 1.0             # t of Eq. 2
    alpha = 0.1            # weight of the KL regulariser, Eq. 6 (rescale, afe)
    beta = 0.1             # weight of the contrastive loss, Eq. 8 (adjust, afe)
    fcm_clusters = 2       # C of Eq. 7 (default: the number of classes the primary announces)
    fcm_threshold = 0.7    # c: confidence below which a soft label is ignored (§3.3)
    rescale_sigmas = 3.0   # Eq. 5: Δ̃ = μh + 3σh, p2 = Φ(3) ≈ 0.9987
    rescale_cap = false    # true: cap Δ̃ at 2t so rescaling never shrinks (not in the paper)
    secure_rng = false     # noise from the operating system's secure source
    seed = 0               # noise seed (the secondary's own; never sent to the primary)
    budget = 50.0          # optional: total ε of any record over the run

The same table may appear in a secondary's party file (``vflink serve``): the secondary then
adds the noise with its own settings and refuses a run that expects others.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vflink._checks import check_choice, check_float, check_int, raise_if

__all__ = ["MODES", "PUBLIC_SETTINGS", "PrivacyConfig"]

#: Table 2 of VFL-AFE: vanilla (§3.1), +R (§3.2), +D (§3.3), both (VFL-AFE).
MODES = ("off", "vanilla", "rescale", "adjust", "afe")

#: Settings the primary may know and must agree on (never the noise seed or generator).
PUBLIC_SETTINGS = ("embeddings", "epsilon", "delta", "clip", "alpha", "beta", "fcm_clusters",
                   "fcm_threshold", "rescale_sigmas", "rescale_cap", "budget")


@dataclass(frozen=True, kw_only=True)
class PrivacyConfig:
    """Differential privacy on the embeddings every secondary sends (VFL-AFE Algorithm 1)."""

    embeddings: str = "off"
    epsilon: float = 2.0
    delta: float = 1e-2
    clip: float = 1.0
    alpha: float = 0.1
    beta: float = 0.1
    fcm_clusters: int | None = None
    fcm_threshold: float = 0.7
    rescale_sigmas: float = 3.0
    #: a departure from Eq. 4 (off by default): cap Δ̃ at the ball's diameter 2t
    rescale_cap: bool = False
    secure_rng: bool = False
    seed: int | None = None
    budget: float | None = None

    def __post_init__(self) -> None:
        problems: list[str] = []
        check_choice(problems, "privacy.embeddings", self.embeddings, MODES)
        check_float(problems, "privacy.epsilon", self.epsilon, min=0.0, min_exclusive=True)
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
        if not isinstance(self.secure_rng, bool):
            problems.append(f"`privacy.secure_rng` must be true or false, got "
                            f"{self.secure_rng!r}")
        if self.seed is not None:
            check_int(problems, "privacy.seed", self.seed, min=0)
            if self.secure_rng is True:
                problems.append("`privacy.seed` has no effect with `privacy.secure_rng = true` "
                                "(the noise comes from the operating system): remove one")
        check_float(problems, "privacy.budget", self.budget, min=0.0, min_exclusive=True,
                    allow_none=True)
        if (self.budget is not None and isinstance(self.budget, (int, float))
                and isinstance(self.epsilon, (int, float)) and 0 < self.budget < self.epsilon):
            problems.append(f"`privacy.budget` ({self.budget}) is below the ε of a single release "
                            f"(`privacy.epsilon` = {self.epsilon}): nothing could be released")
        raise_if(problems, "[privacy] section")

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
