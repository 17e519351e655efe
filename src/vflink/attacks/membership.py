"""Membership inference with shadow models (Shokri et al. 2017) on released embeddings.

VFL-AFE §4.3, Table 1: the primary (which receives a secondary's embeddings and knows the
labels) asks whether a record was in the secondary's training data. Following Shokri et al.,
the attacker trains ``shadow_models`` copies of the secondary's pipeline on auxiliary records
from the same distribution (half "in", half "out" for each shadow), with the secondary's
public release mechanism (clip, rescale, noise: the privacy ledger states them), and learns
one attack classifier per class (Shokri et al. §V) on what the model makes of a released
embedding → in/out. Applied to what the victim released for candidate records, it scores
membership.

"What the model makes of it": the primary holds the top model, so it can turn every received
embedding into class probabilities (``extra["posteriors"]``), which mean the same thing for a
shadow model and for the victim; raw embeddings do not (each model's embedding space has its own
random geometry, so an attack model trained on shadows' embeddings does not transfer, as the
tests show). Without ``posteriors`` the attack falls back to raw embeddings.

View: ``embeddings`` (n, d) released for the candidates; ``extra``: ``labels`` (n,) of the
candidates, ``posteriors`` (n, C) of the primary's model on them, ``shadow_features`` (m, p)
and ``shadow_labels`` (m,) auxiliary records, ``classes`` (C), optional ``mechanism``
{clip, noise_std, rescale, normalize, response_k, response_epsilon} and ``shadow_bottom`` (a
fixed :class:`vflink.attacks._shadow.CodeBottom` for ``randomized-response``: the shadows then
train only their heads, on the victim's preprocessed features). Truth: ``{"membership": 0/1
per candidate}``. Reported as attack accuracy (Table 1) and AUC.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt
import torch
from sklearn.ensemble import HistGradientBoostingClassifier

from vflink._checks import check_int, raise_if
from vflink.attacks._shadow import (
    Release,
    released_embeddings,
    released_posteriors,
    train_split_model,
)
from vflink.attacks.base import ATTACKS, AttackResult, AttackView
from vflink.errors import ConfigError
from vflink.metrics.functional import accuracy, auc

__all__ = ["ShadowMembershipInference"]


@dataclass(frozen=True, kw_only=True)
class ShadowMembershipInference:
    """Shokri et al.'s shadow-model membership inference on a secondary's embeddings."""

    name: ClassVar[str] = "membership-shadow"
    summary: ClassVar[str] = ("membership inference with shadow models (Shokri et al. 2017) "
                              "on released embeddings (VFL-AFE §4.3, Table 1)")
    needs: ClassVar[frozenset[str]] = frozenset({"embeddings", "extra"})
    role: ClassVar[str] = "primary"

    shadow_models: int = 4
    hidden: tuple[int, ...] = (128,)
    cut_dim: int | None = None
    epochs: int = 30
    batch_size: int = 64
    seed: int = 0

    def __post_init__(self) -> None:
        problems: list[str] = []
        check_int(problems, "shadow_models", self.shadow_models, min=1)
        check_int(problems, "epochs", self.epochs, min=1)
        check_int(problems, "batch_size", self.batch_size, min=1)
        check_int(problems, "seed", self.seed, min=0)
        if self.cut_dim is not None:
            check_int(problems, "cut_dim", self.cut_dim, min=1)
        raise_if(problems, f"{self.name} parameters")

    def _shadow_data(self, view: AttackView, posteriors: bool) -> tuple[list[npt.NDArray[Any]],
                                                        list[npt.NDArray[Any]],
                                                        list[npt.NDArray[Any]]]:
        """Released embeddings, labels and in/out targets of every shadow model."""
        extra = view.extra
        x = np.asarray(extra["shadow_features"], dtype=np.float32)
        y = np.asarray(extra["shadow_labels"], dtype=np.int64)
        classes = int(extra.get("classes", int(y.max()) + 1))
        release = Release.from_extra(extra)
        cut = self.cut_dim or int(np.asarray(view.embeddings).shape[1])
        rng = np.random.default_rng(self.seed)
        feats, labels, targets = [], [], []
        for k in range(self.shadow_models):
            order = rng.permutation(len(x))
            half = len(x) // 2
            inside, outside = order[:half], order[half:2 * half]
            model = train_split_model(x[inside], y[inside], classes=classes, release=release,
                                      hidden=self.hidden, cut_dim=cut, epochs=self.epochs,
                                      batch_size=self.batch_size, seed=self.seed * 1000 + k,
                                      bottom=extra.get("shadow_bottom"))
            gen = torch.Generator().manual_seed(self.seed * 1000 + k + 500)
            both = np.concatenate([inside, outside])
            make = released_posteriors if posteriors else released_embeddings
            feats.append(make(model, x[both], release, gen))
            labels.append(y[both])
            targets.append(np.r_[np.ones(half), np.zeros(half)])
        return feats, labels, targets

    def infer(self, view: AttackView) -> npt.NDArray[np.float64]:
        """P(member) for every candidate of ``view.embeddings``."""
        view.require(self.needs, self.name)
        for key in ("labels", "shadow_features", "shadow_labels"):
            if key not in view.extra:
                raise ConfigError(f"attack {self.name!r} needs extra[{key!r}]")
        posteriors = view.extra.get("posteriors")
        emb = np.asarray(posteriors if posteriors is not None else view.embeddings,
                         dtype=np.float64)
        cand_y = np.asarray(view.extra["labels"], dtype=np.int64)
        feats, labels, targets = self._shadow_data(view, posteriors is not None)
        f, lab, tgt = np.concatenate(feats), np.concatenate(labels), np.concatenate(targets)
        scores = np.full(len(emb), 0.5)
        # one attack model per class (Shokri et al. §V): membership looks different per class
        for c in np.unique(cand_y):
            train = lab == c
            where = cand_y == c
            if train.sum() < 10 or len(np.unique(tgt[train])) < 2:
                continue
            clf = HistGradientBoostingClassifier(max_iter=100, random_state=self.seed)
            clf.fit(f[train], tgt[train])
            scores[where] = clf.predict_proba(emb[where])[:, 1]
        return scores

    def evaluate(self, view: AttackView, truth: Mapping[str, Any]) -> AttackResult:
        member = np.asarray(truth["membership"], dtype=np.int64)
        scores = self.infer(view)
        acc = accuracy(member, scores)
        area = auc(member, scores)
        explanation = (f"a party that receives {view.party!r}'s embeddings and trains "
                       f"{self.shadow_models} shadow models tells members of the training data "
                       f"from other records with accuracy {acc:.1%} (50 % is guessing)")
        return AttackResult(attack=self.name, party=view.party,
                            metrics={"accuracy": acc, "auc": area}, explanation=explanation,
                            params={"shadow_models": self.shadow_models, "epochs": self.epochs,
                                    "hidden": list(self.hidden), "seed": self.seed},
                            details={"candidates": int(len(member)),
                                     "members": int(member.sum())})


ATTACKS.add(ShadowMembershipInference.name, ShadowMembershipInference)
