"""Label leakage from cut-layer gradients (Li et al., "Label Leakage and Protection in
Two-party Split Learning", ICLR 2022, §3).

A secondary (non-label) party receives, per training batch, the gradient of the loss with
respect to the embeddings it sent. For a binary task with a sigmoid output,
g_i = (p_i − y_i) · ∂z_i/∂h_i, so

* **norm scoring** (§3.1): ‖g_i‖ is |p_i − y_i| times a factor shared by similar examples; on
  an imbalanced task the model gives every record a small p, so positives (|1 − p| large) have
  larger gradients than negatives (|p| small);
* **direction scoring** (§3.2): the sign of p_i − y_i flips between classes while ∂z/∂h points
  roughly the same way, so gradients of one class are aligned with each other and opposite to
  the other class. Li et al. use the cosine with a gradient whose label the attacker knows; we
  stay label-free: the reference is the batch's largest-norm gradient, and the sign is chosen
  so that the smaller of the two clusters (positives are the minority) scores high.

Scores are compared within a batch (the model changes between batches); the AUC is the
size-weighted mean of per-batch AUCs (:func:`vflink.metrics.attacks.grouped_auc`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from vflink.attacks.base import ATTACKS, AttackResult, AttackView
from vflink.errors import ConfigError, DataError
from vflink.metrics.attacks import auc_verdict, grouped_auc
from vflink.metrics.functional import auc

__all__ = ["LabelDirectionAttack", "LabelNormAttack", "direction_scores", "explain_auc",
           "labelled_rows", "matched_accuracy", "norm_scores"]


def norm_scores(gradients: npt.ArrayLike) -> npt.NDArray[np.float64]:
    """‖g_i‖₂ per row (Li et al. §3.1)."""
    g = np.asarray(gradients, dtype=np.float64).reshape(len(np.asarray(gradients)), -1)
    return np.asarray(np.linalg.norm(g, axis=1), dtype=np.float64)


def direction_scores(gradients: npt.ArrayLike, batch: npt.ArrayLike
                     ) -> npt.NDArray[np.float64]:
    """cos(g_i, g_ref) per row, g_ref the largest-norm gradient of row i's batch (§3.2),
    signed so that the minority side of each batch scores high."""
    g = np.asarray(gradients, dtype=np.float64)
    g = g.reshape(len(g), -1)
    b = np.asarray(batch)
    norms = np.linalg.norm(g, axis=1)
    out = np.zeros(len(g), dtype=np.float64)
    for key in np.unique(b):
        idx = np.flatnonzero(b == key)
        ref = g[idx[np.argmax(norms[idx])]]
        ref_norm = float(np.linalg.norm(ref))
        denom = norms[idx] * ref_norm
        with np.errstate(invalid="ignore", divide="ignore"):
            cos = np.where(denom > 0, g[idx] @ ref / np.where(denom > 0, denom, 1.0), 0.0)
        # Label-free orientation: positives are the minority class (the imbalanced tasks of
        # Li et al. §5), so the cluster on the reference's side must be the smaller one.
        if np.sum(cos > 0) > np.sum(cos < 0):
            cos = -cos
        out[idx] = cos
    return out


def explain_auc(value: float, who: str, what: str) -> str:
    """A plain sentence on what a leak AUC means: its distance from 0.5 and its direction
    (:func:`vflink.metrics.attacks.auc_verdict`)."""
    if np.isnan(value):
        return f"{who}: no AUC could be measured (too few labelled rows of both classes)"
    return (f"{who} can tell {what} with AUC {value:.3f} (0.5 = chance; 0 and 1 are both "
            f"certain): {auc_verdict(value)}")


def _over_training(y: npt.NDArray[Any], scores: npt.NDArray[np.float64],
                   batch: npt.NDArray[Any], parts: int = 10) -> list[dict[str, Any]]:
    """The leak AUC along training: the recorded batches in up to ``parts`` consecutive groups
    (Li et al. follow it per iteration; it falls as the model grows confident)."""
    out = []
    for chunk in np.array_split(np.unique(batch), min(parts, len(np.unique(batch)))):
        if chunk.size == 0:
            continue
        m = np.isin(batch, chunk)
        value, _ = grouped_auc(y[m], scores[m], batch[m])
        out.append({"first_batch": int(chunk[0]), "last_batch": int(chunk[-1]),
                    "auc": value})
    return out


def labelled_rows(truth: Mapping[str, Any], ids: npt.NDArray[np.int64], attack: str
                  ) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.int64]]:
    """Which of the attacker's rows ``ids`` have a label in the evaluation-only ``truth``, and
    those labels (a class index per known row)."""
    if "labels__rows" not in truth:
        raise ConfigError(f"attack {attack!r} is scored against the primary's labels, "
                          "which this run did not store as evaluation-only ground truth "
                          "(a classification task run with [evaluation] record = true)")
    rows = np.asarray(truth["labels__rows"], dtype=np.int64)
    values = np.asarray(truth["labels__values"], dtype=np.int64)
    ids = np.asarray(ids, dtype=np.int64)
    pos = np.minimum(np.searchsorted(rows, ids), max(len(rows) - 1, 0))
    known = (rows[pos] == ids) if len(rows) else np.zeros(len(ids), bool)
    return known, values[pos][known]


def matched_accuracy(y: npt.NDArray[np.int64], clusters: npt.NDArray[np.int64],
                     batch: npt.NDArray[Any]) -> float:
    """The accuracy of cluster ids as labels, each batch's clusters named by the one-to-one
    mapping to classes that fits the truth best (Hungarian; an upper bound on an attacker who
    must name the clusters from a few known labels)."""
    from scipy.optimize import linear_sum_assignment

    hits = 0
    for key in np.unique(batch):
        m = batch == key
        # one code per value seen as a cluster or a class, then the batch's contingency table
        _, codes = np.unique(np.concatenate([clusters[m], y[m]]), return_inverse=True)
        n = int(m.sum())
        size = int(codes.max()) + 1
        table = np.zeros((size, size), dtype=np.int64)
        np.add.at(table, (codes[:n], codes[n:]), 1)
        r, c = linear_sum_assignment(-table)
        hits += int(table[r, c].sum())
    return hits / len(y) if len(y) else float("nan")


class _LabelAttack:
    needs: ClassVar[frozenset[str]] = frozenset({"gradients"})
    role: ClassVar[str] = "secondary"
    name: ClassVar[str]
    summary: ClassVar[str]
    reference: ClassVar[str] = "Li et al., ICLR 2022, §3"

    def _scores(self, gradients: npt.NDArray[Any], batch: npt.NDArray[Any]
                ) -> npt.NDArray[np.float64]:
        raise NotImplementedError

    def _clusters(self, gradients: npt.NDArray[Any], batch: npt.NDArray[Any], k: int
                  ) -> npt.NDArray[np.int64] | None:
        """Cluster ids per row into ``k`` groups per batch (multi-class), or ``None`` when the
        attack reads binary labels only."""
        return None

    def _batch(self, view: AttackView) -> npt.NDArray[Any]:
        g = np.asarray(view.gradients)
        batch = np.asarray(view.extra.get("batch", np.zeros(len(g), dtype=np.int64)))
        if len(batch) != len(g):
            raise DataError(f"{self.name}: {len(batch)} batch ids for {len(g)} gradients")
        return batch

    def infer(self, view: AttackView) -> npt.NDArray[np.float64]:
        view.require(self.needs, self.name)
        return self._scores(np.asarray(view.gradients), self._batch(view))

    def evaluate(self, view: AttackView, truth: Mapping[str, Any]) -> AttackResult:
        view.require(self.needs, self.name)
        known, y = labelled_rows(truth, np.asarray(view.ids, dtype=np.int64), self.name)
        classes = np.unique(y)
        who = f"The secondary party {view.party!r}"
        if classes.size > 2:
            return self._evaluate_classes(view, known, y, int(classes.max()) + 1, who)
        scores = self.infer(view)
        s = scores[known]
        batch = self._batch(view)[known]
        per_batch, used = grouped_auc(y, s, batch)
        pooled = auc(y, s)
        positive_rate = float(np.mean(y == 1)) if len(y) else float("nan")
        return AttackResult(
            attack=self.name, party=view.party,
            metrics={"auc": per_batch, "auc_pooled": pooled, "rows": float(len(y)),
                     "batches": float(used), "positive_rate": positive_rate},
            explanation=explain_auc(per_batch, who,
                                    "the primary's positive labels from the gradients it "
                                    "received"),
            params=self._params(),
            details={"reference": self.reference,
                     "scoring": "per-batch AUC, size-weighted mean over training batches",
                     "auc_over_training": _over_training(y, s, batch)})

    def _params(self) -> dict[str, Any]:
        return {}

    def _evaluate_classes(self, view: AttackView, known: npt.NDArray[np.bool_],
                          y: npt.NDArray[np.int64], k: int, who: str) -> AttackResult:
        batch = self._batch(view)
        clusters = self._clusters(np.asarray(view.gradients)[known], batch[known], k)
        if clusters is None:
            raise ConfigError(f"attack {self.name!r} recovers binary labels; this task has "
                              f"{np.unique(y).size} classes (the clustering attacks read "
                              "multi-class labels)")
        accuracy = matched_accuracy(y, clusters, batch[known])
        majority = float(np.bincount(y).max() / len(y)) if len(y) else float("nan")
        return AttackResult(
            attack=self.name, party=view.party,
            metrics={"accuracy": accuracy, "majority": majority, "rows": float(len(y)),
                     "classes": float(k)},
            explanation=(f"{who} can tell the primary's classes from the gradients it received "
                         f"with accuracy {accuracy:.1%} (always guessing the most frequent "
                         f"class: {majority:.1%})"),
            params=self._params(),
            details={"reference": self.reference,
                     "scoring": "each batch's clusters named by the best one-to-one mapping "
                                "to the true classes (an upper bound)"})


@ATTACKS.register("label-norm")
@dataclass(frozen=True, kw_only=True)
class LabelNormAttack(_LabelAttack):
    """Norm scoring: larger gradient norm ⇒ more likely a positive label (Li et al. §3.1)."""

    name: ClassVar[str] = "label-norm"
    summary: ClassVar[str] = ("a secondary recovers the primary's binary labels from the norms "
                              "of the gradients it receives (Li et al., ICLR 2022)")

    def _scores(self, gradients: npt.NDArray[Any], batch: npt.NDArray[Any]
                ) -> npt.NDArray[np.float64]:
        return norm_scores(gradients)


@ATTACKS.register("label-direction")
@dataclass(frozen=True, kw_only=True)
class LabelDirectionAttack(_LabelAttack):
    """Direction scoring: cosine with the batch's largest-norm gradient (Li et al. §3.2)."""

    name: ClassVar[str] = "label-direction"
    summary: ClassVar[str] = ("a secondary recovers the primary's binary labels from the "
                              "directions of the gradients it receives (Li et al., ICLR 2022)")

    def _scores(self, gradients: npt.NDArray[Any], batch: npt.NDArray[Any]
                ) -> npt.NDArray[np.float64]:
        return direction_scores(gradients, batch)
