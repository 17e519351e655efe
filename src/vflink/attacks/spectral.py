"""The spectral attack (FLORIST App. C; Tran, Li & Madry 2018, "Spectral signatures in backdoor
attacks", Lemma 3.1): tell synthetic rows from real ones by their projection on the top
singular vector of the centred mini-batch.

App. C, per mini-batch: estimate μ_F (the batch mean) and v (the top singular vector of the
centred batch), score every row by |⟨x − μ_F, v⟩|, and take the AUC of these scores at telling
synthetic rows from real ones. A passive party attacks the gradients it receives (rows with
synthetic labels); the active party attacks the embeddings it receives joined with the labels
(rows with synthetic features). The batch AUCs are averaged (Tables 1-2).

Two readings of the projection, both computed by the attacker without any ground truth:

``outlier``
    App. C's |⟨x − μ_F, v⟩| (Lemma 1): synthetic rows are the outliers. Lemma 1 needs the
    synthetic fraction ε < 1/2. At ε = 1/2 two clusters sit at ±Δ/2 on v and the absolute
    value cannot separate them, whatever Δ: this is what FLORIST's α = β = 0.5 tables measure.
``two-cluster``
    The signed ⟨x − μ_F, v⟩: the paper calls the spectral attack "a 2-clustering outlier
    detection algorithm" (§3), and along v the two clusters lie on either side of μ_F for every
    ε. The sign of a singular vector is arbitrary, so the attacker keeps one orientation over
    the run: each batch's v is flipped to agree with the running sum of the previous batches'
    oriented vectors (:func:`aligned_projections`).

Either reading splits the rows into two groups; *naming* the groups (which one is synthetic)
is one bit more. The reported attack AUC is therefore the AUC of telling the two apart,
``max(A, 1 - A)`` of the batch-averaged AUC A of each reading, and the stronger reading's
value: leakage is measured by the best attack the auditor runs. The one bit is what Li et al.
(2022, by FLORIST's group) give their cosine attack as a "hint" (one known example), and it
is taken once per run, never per batch, so chance stays at 0.5 (a per-batch choice would
report about 0.53 for identical distributions in batches of 256). The oriented values are kept
in ``details`` (below 0.5 means the synthetic rows score *lower*, e.g. ``fea-random``'s rows
sit closer to the batch mean than real ones).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from vflink._checks import check_choice, raise_if
from vflink.attacks.base import ATTACKS, AttackResult, AttackView
from vflink.errors import ConfigError
from vflink.metrics.attacks import auc_verdict
from vflink.metrics.functional import auc

__all__ = ["STATISTICS", "SpectralAttack", "aligned_projections", "spectral_projection",
           "spectral_scores"]

#: The two readings of the projection on the top singular vector (module docstring).
STATISTICS = ("outlier", "two-cluster")


def spectral_projection(rows: npt.ArrayLike) -> tuple[npt.NDArray[np.float64],
                                                      npt.NDArray[np.float64]]:
    """⟨x − μ, v⟩ per row and v, the top right singular vector of the centred rows (App. C:
    μ_F and v estimated from the mini-batch). v is zero when the rows do not vary."""
    x = np.asarray(rows, dtype=np.float64)
    if x.ndim == 1:
        x = x[:, None]
    centred = x - x.mean(axis=0, keepdims=True)
    if len(x) < 2 or not np.any(centred):
        return np.zeros(len(x)), np.zeros(x.shape[1])
    _, _, vt = np.linalg.svd(centred, full_matrices=False)
    return centred @ vt[0], vt[0]


def spectral_scores(rows: npt.ArrayLike) -> npt.NDArray[np.float64]:
    """App. C's outlier score |⟨x − μ, v⟩| per row (Lemma 1)."""
    return np.abs(spectral_projection(rows)[0])


def aligned_projections(x: npt.NDArray[np.float64], batches: Sequence[npt.NDArray[np.int64]]
                        ) -> npt.NDArray[np.float64]:
    """Signed ⟨x − μ_F, v⟩ per row, batch by batch, with one orientation of v for the run.

    Each batch's v is flipped to point the way of the running sum of the previous batches'
    oriented vectors (the first batch fixes it), so a cluster that stays on one side of the
    batch mean keeps its sign from batch to batch. Uses nothing but the rows.
    """
    out = np.zeros(len(x))
    reference = np.zeros(x.shape[1])
    for b in batches:
        proj, v = spectral_projection(x[b])
        if float(v @ reference) < 0.0:
            proj, v = -proj, -v
        reference = reference + v
        out[b] = proj
    return out


@dataclass(frozen=True)
class SpectralAttack:
    """Spectral scores per batch (App. C), in the ``outlier`` and ``two-cluster`` readings.

    ``view.extra["batches"]``: a sequence of index arrays (rows of ``view.gradients`` or
    ``view.embeddings`` forming one mini-batch, in the order they crossed); without it the
    whole view is one batch. ``target = "gradients"`` (the passive party's view) or
    ``"embeddings"`` (the active party's; ``view.extra["labels"]`` are joined to the embeddings
    as App. C does). ``statistic`` is the reading :meth:`infer` returns; :meth:`evaluate`
    scores both.
    """

    name: ClassVar[str] = "spectral"
    summary: ClassVar[str] = "tell synthetic rows from real ones by their spectral signature"
    needs: ClassVar[frozenset[str]] = frozenset({"extra"})
    role: ClassVar[str] = "either"
    target: str = "gradients"
    statistic: str = "outlier"

    def __post_init__(self) -> None:
        problems: list[str] = []
        check_choice(problems, "target", self.target, ("gradients", "embeddings"))
        check_choice(problems, "statistic", self.statistic, STATISTICS)
        raise_if(problems, f"{self.name} parameters")

    def _rows(self, view: AttackView) -> npt.NDArray[np.float64]:
        data = getattr(view, self.target)
        if data is None:
            raise ConfigError(f"the spectral attack on {self.target} needs them recorded")
        x = np.asarray(data, dtype=np.float64).reshape(len(data), -1)
        labels = view.extra.get("labels")
        if self.target == "embeddings" and labels is not None:
            x = np.concatenate([x, np.asarray(labels, dtype=np.float64).reshape(-1, 1)], axis=1)
        return x

    def _batches(self, view: AttackView, n: int) -> list[npt.NDArray[np.int64]]:
        batches = view.extra.get("batches")
        if batches is None:
            return [np.arange(n, dtype=np.int64)]
        return [np.asarray(b, dtype=np.int64) for b in batches]

    def _scores(self, statistic: str, x: npt.NDArray[np.float64],
                batches: list[npt.NDArray[np.int64]]) -> npt.NDArray[np.float64]:
        if statistic == "two-cluster":
            return aligned_projections(x, batches)
        scores = np.zeros(len(x))
        for b in batches:
            scores[b] = spectral_scores(x[b])
        return scores

    def infer(self, view: AttackView) -> npt.NDArray[np.float64]:
        x = self._rows(view)
        return self._scores(self.statistic, x, self._batches(view, len(x)))

    def evaluate(self, view: AttackView, truth: Mapping[str, Any]) -> AttackResult:
        """Per reading: the AUC of the scores against ``truth["synthetic"]`` (bool per row) in
        each batch that holds both real and synthetic rows, averaged over those batches, then
        taken in the better of its two namings (module docstring). ``auc`` is the stronger
        reading's."""
        synthetic = np.asarray(truth["synthetic"], dtype=bool)
        x = self._rows(view)
        batches = self._batches(view, len(x))
        mixed = [b for b in batches if 0 < synthetic[b].sum() < len(b)]
        oriented: dict[str, float] = {}
        for statistic in STATISTICS:
            scores = self._scores(statistic, x, batches)
            aucs = [auc(synthetic[b], scores[b]) for b in mixed]
            oriented[statistic] = float(np.mean(aucs)) if aucs else float("nan")
        either = {s: max(a, 1.0 - a) for s, a in oriented.items()}
        best = max(STATISTICS, key=lambda s: either[s] if not np.isnan(either[s]) else -1.0)
        value = either[best]
        who = "passive party (gradients)" if self.target == "gradients" else \
            "active party (embeddings and labels)"
        return AttackResult(
            attack=self.name, party=view.party,
            metrics={"auc": value, **{f"auc_{s.replace('-', '_')}": a
                                      for s, a in either.items()}},
            explanation=(f"the {who} tells synthetic rows from real ones with AUC "
                         f"{value:.3f} (0.5 = chance, 1 = certain; the better of both "
                         f"namings): {auc_verdict(value)}"),
            params={"target": self.target, "statistic": self.statistic},
            details={"batches": len(mixed), "best": best,
                     "oriented_auc": oriented})


ATTACKS.add(SpectralAttack.name, SpectralAttack)  # type: ignore[arg-type]
