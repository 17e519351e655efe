"""Passive model completion (Fu et al., "Label Inference Attacks Against Vertical Federated
Learning", USENIX Security 2022, §4.1).

A secondary keeps its trained bottom model after the run. With the labels of a handful of its
records (bought, public, or its own customers'), it puts a small head on the bottom model's
outputs, trains the head on those known labels and predicts the label of every other record.
Training shaped the bottom model to separate the primary's classes, so this works even when no
gradient leaks anything by itself.

The head is a logistic regression on the standardised bottom outputs (scikit-learn); Fu et al.
fine-tune with the semi-supervised MixMatch, which the supervised head here leaves out (a
weaker, simpler attacker). The same head on the secondary's raw (preprocessed) features with
the same known labels is reported beside it (``auc_features_only``): what the features alone
tell. The difference is what training put into the bottom model; label protection can only
remove that part (label DP protects each record's label, not what the population lets anyone
learn from a few labels).

What the attack needs (``AttackView.features``): the bottom model's outputs for the secondary's
rows (``extra["feature_rows"]`` their row ids) and ``extra["raw_features"]`` the preprocessed
rows; ``vflink attack`` builds both from the secondary's saved model and its own table.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from vflink._checks import check_int, raise_if
from vflink.attacks.base import ATTACKS, AttackResult, AttackView
from vflink.attacks.label_leakage import explain_auc, labelled_rows
from vflink.errors import ConfigError, DataError
from vflink.metrics.functional import auc

__all__ = ["ModelCompletionAttack", "complete"]


def _head_predictions(x: npt.NDArray[np.float64], known: npt.NDArray[np.int64],
                      y_known: npt.NDArray[np.int64], seed: int) -> npt.NDArray[np.float64]:
    """Class probabilities of every row of ``x`` from a logistic regression trained on the
    rows ``known`` with labels ``y_known``."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    scaler = StandardScaler().fit(x[known])
    head = LogisticRegression(max_iter=1000, random_state=seed)
    head.fit(scaler.transform(x[known]), y_known)
    proba = head.predict_proba(scaler.transform(x))
    out = np.zeros((len(x), int(y_known.max()) + 1))
    out[:, head.classes_] = proba
    return out


def _pick_known(y: npt.NDArray[np.int64], n_known: int, rng: np.random.Generator
                ) -> npt.NDArray[np.int64]:
    """``n_known`` labelled rows, at least one of each class (the attacker's few labels)."""
    classes = np.unique(y)
    first = np.array([rng.choice(np.flatnonzero(y == c)) for c in classes], dtype=np.int64)
    rest = np.setdiff1d(np.arange(len(y)), first)
    more = rng.choice(rest, size=max(min(n_known, len(y) - 1) - len(first), 0), replace=False)
    return np.sort(np.concatenate([first, more]).astype(np.int64))


def complete(features: npt.NDArray[np.float64], y: npt.NDArray[np.int64], n_known: int,
             seed: int) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
    """The known rows and every row's class probabilities from the completed model."""
    known = _pick_known(y, n_known, np.random.default_rng(seed))
    return known, _head_predictions(features, known, y[known], seed)


def _score(y: npt.NDArray[np.int64], proba: npt.NDArray[np.float64],
           rest: npt.NDArray[np.bool_]) -> dict[str, float]:
    if proba.shape[1] <= 2:
        positive = proba[:, 1] if proba.shape[1] == 2 else np.zeros(len(y))
        return {"auc": auc(y[rest], positive[rest])}
    return {"accuracy": float(np.mean(proba[rest].argmax(axis=1) == y[rest]))}


@ATTACKS.register("label-completion")
@dataclass(frozen=True, kw_only=True)
class ModelCompletionAttack:
    """Fu et al.'s passive model completion with ``known`` labelled records."""

    known: int = 40
    seed: int = 0
    name: ClassVar[str] = "label-completion"
    summary: ClassVar[str] = ("a secondary recovers the primary's labels from a few known "
                              "labels and its own trained bottom model (Fu et al., USENIX "
                              "Security 2022)")
    needs: ClassVar[frozenset[str]] = frozenset({"features"})
    role: ClassVar[str] = "secondary"
    #: it reads the task (what the features and a few known labels predict of every record),
    #: not one record's label from what was sent: no label guarantee bounds it (it reads as
    #: much from features alone; ``auc_features_only``), so none is stated for it
    population: ClassVar[bool] = True

    def __post_init__(self) -> None:
        problems: list[str] = []
        check_int(problems, "known", self.known, min=2)  # labelled records
        check_int(problems, "seed", self.seed, min=0)
        raise_if(problems, f"{self.name} parameters")

    def _rows(self, view: AttackView) -> npt.NDArray[np.int64]:
        view.require(self.needs, self.name)
        n = len(np.asarray(view.features))
        rows = np.asarray(view.extra.get("feature_rows", np.arange(n)), dtype=np.int64)
        if len(rows) != n:
            raise DataError(f"{self.name}: {len(rows)} row ids for {n} feature rows")
        return rows

    def infer(self, view: AttackView) -> npt.NDArray[np.float64]:
        """Scores need known labels: :meth:`evaluate` draws them from the truth."""
        raise ConfigError(f"attack {self.name!r} needs a few known labels: run it with "
                          "`vflink attack` (which draws them from the run's truth)")

    def evaluate(self, view: AttackView, truth: Mapping[str, Any]) -> AttackResult:
        rows = self._rows(view)
        labelled, y = labelled_rows(truth, rows, self.name)
        x = np.asarray(view.features, dtype=np.float64)[labelled]
        if len(y) <= self.known or np.unique(y).size < 2:
            raise DataError(f"{self.name}: {len(y)} labelled records of "
                            f"{np.unique(y).size} class(es); it needs more than "
                            f"{self.known} of at least two classes")
        known, proba = complete(x, y, self.known, self.seed)
        rest = np.ones(len(y), dtype=bool)
        rest[known] = False
        metrics = _score(y, proba, rest)
        raw = view.extra.get("raw_features")
        if raw is not None:
            raw_x = np.asarray(raw, dtype=np.float64)[labelled]
            baseline = _score(y, _head_predictions(raw_x, known, y[known], self.seed), rest)
            metrics.update({f"{k}_features_only": v for k, v in baseline.items()})
        metrics.update(known=float(len(known)), rows=float(rest.sum()))
        who = f"The secondary party {view.party!r}"
        what = (f"the primary's labels from {len(known)} known labels and its own trained "
                "bottom model")
        if "auc" in metrics:
            explanation = explain_auc(metrics["auc"], who, what)
        else:
            explanation = (f"{who} can tell {what} with accuracy {metrics['accuracy']:.1%}")
        if "auc_features_only" in metrics:
            explanation += (f"; its raw features alone give AUC "
                            f"{metrics['auc_features_only']:.3f}")
        return AttackResult(attack=self.name, party=view.party, metrics=metrics,
                            explanation=explanation,
                            params={"known": self.known, "seed": self.seed},
                            details={"reference": "Fu et al., USENIX Security 2022, §4.1 "
                                                  "(passive model completion; supervised "
                                                  "head, no MixMatch)"})
