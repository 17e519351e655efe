"""The spectral attack (FLORIST App. C; Tran, Li & Madry 2018, "Spectral signatures in backdoor
attacks", Lemma 3.1): tell synthetic rows from real ones by their projection on the top
singular vector of the centred batch.

Per mini-batch, score each row by |⟨x − μ_F, v⟩| with μ_F the batch mean and v the top right
singular vector of the centred batch. A passive party attacks the gradients it receives (rows
with synthetic labels); the active party attacks its received embeddings joined with the
labels (rows with synthetic features). The AUC of these scores at predicting "synthetic",
averaged over batches, is the paper's attack AUC (Tables 1-2).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from vflink.attacks.base import ATTACKS, AttackResult, AttackView
from vflink.errors import ConfigError
from vflink.metrics.functional import auc

__all__ = ["SpectralAttack", "spectral_scores"]


def spectral_scores(rows: npt.ArrayLike) -> npt.NDArray[np.float64]:
    """|⟨x − μ, v⟩| per row, v the top singular vector of the centred rows."""
    x = np.asarray(rows, dtype=np.float64)
    if x.ndim == 1:
        x = x[:, None]
    centred = x - x.mean(axis=0, keepdims=True)
    if len(x) < 2 or not np.any(centred):
        return np.zeros(len(x))
    _, _, vt = np.linalg.svd(centred, full_matrices=False)
    return np.abs(centred @ vt[0])


@dataclass(frozen=True)
class SpectralAttack:
    """Spectral outlier scores per batch.

    ``view.extra["batches"]``: a sequence of index arrays (rows of ``view.gradients`` or
    ``view.embeddings`` forming one mini-batch); without it the whole view is one batch.
    ``target = "gradients"`` (the passive party's view) or ``"embeddings"`` (the active
    party's; ``view.extra["labels"]`` are joined to the embeddings as App. C does).
    """

    name: ClassVar[str] = "spectral"
    summary: ClassVar[str] = "tell synthetic rows from real ones by their spectral signature"
    needs: ClassVar[frozenset[str]] = frozenset({"extra"})
    role: ClassVar[str] = "either"
    target: str = "gradients"

    def __post_init__(self) -> None:
        if self.target not in ("gradients", "embeddings"):
            raise ConfigError(f"`target` must be gradients or embeddings, got {self.target!r}")

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

    def infer(self, view: AttackView) -> npt.NDArray[np.float64]:
        x = self._rows(view)
        scores = np.zeros(len(x))
        for b in self._batches(view, len(x)):
            scores[b] = spectral_scores(x[b])
        return scores

    def evaluate(self, view: AttackView, truth: Mapping[str, Any]) -> AttackResult:
        """AUC per batch of the scores against ``truth["synthetic"]`` (bool per row),
        averaged over the batches that hold both real and synthetic rows."""
        synthetic = np.asarray(truth["synthetic"], dtype=bool)
        scores = self.infer(view)
        aucs = [auc(synthetic[b], scores[b]) for b in self._batches(view, len(scores))
                if 0 < synthetic[b].sum() < len(b)]
        value = float(np.mean(aucs)) if aucs else float("nan")
        who = "passive party (gradients)" if self.target == "gradients" else \
            "active party (embeddings and labels)"
        return AttackResult(
            attack=self.name, party=view.party, metrics={"auc": value},
            explanation=(f"the {who} tells synthetic rows from real ones with AUC "
                         f"{value:.3f} (0.5 = chance, 1 = certain)"),
            params={"target": self.target}, details={"batches": len(aucs)})


ATTACKS.add(SpectralAttack.name, SpectralAttack)  # type: ignore[arg-type]
