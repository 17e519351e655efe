"""The one contract every attack follows (ARCHITECTURE.md, convention 10).

An attack says **what it needs** (which party's view: the embeddings the primary received, the
gradients a secondary received, the similarities the primary received, alignment indices), its
**parameters** (a frozen dataclass, validated at construction), and offers
``infer(view) -> scores``: one score per attacked item (a record, a row, a pair), higher meaning
"more likely positive" (a member, a positive label, a synthetic row...). Scoring the scores
against evaluation-only ground truth uses :mod:`vflink.metrics` (AUC, accuracy, MSE), so
leakage metrics live with the other metrics.

Attacks are pure algorithms: they never import ``protocol``, ``parties`` or ``transport``. The
runner (``vflink attack``) loads what one party recorded into an :class:`AttackView`, runs the
attack, and appends its :class:`AttackResult` to the run's privacy ledger.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from vflink._checks import from_table
from vflink.errors import ConfigError
from vflink.registry import Registry

__all__ = ["ATTACKS", "VIEW_FIELDS", "AttackResult", "AttackView", "Attack", "get_attack"]

#: What a party can have received and recorded; ``Attack.needs`` names a subset of these.
VIEW_FIELDS = ("embeddings", "gradients", "similarities", "indices", "features", "extra")


@dataclass(frozen=True)
class AttackView:
    """What one party saw (and, for ``features``, holds itself): the attacker's knowledge.

    ``party`` is the attacker. Arrays are row-aligned with ``ids`` where that makes sense
    (e.g. ``gradients[i]`` is the gradient the secondary received for its row ``ids[i]``).
    ``extra`` carries small attack-specific inputs (μ0 and σ0 of a linkage, Bloom-filter
    parameters, auxiliary samples), never another party's private data.
    """

    party: str
    role: str
    ids: npt.NDArray[np.int64] | None = None
    embeddings: npt.NDArray[np.floating[Any]] | None = None
    gradients: npt.NDArray[np.floating[Any]] | None = None
    similarities: npt.NDArray[np.floating[Any]] | None = None
    indices: npt.NDArray[np.int64] | None = None
    features: npt.NDArray[np.floating[Any]] | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    def require(self, needs: frozenset[str], attack: str) -> None:
        """Raise a clear error when a field the attack needs was not recorded."""
        missing = sorted(n for n in needs if n != "extra" and getattr(self, n) is None)
        if missing:
            raise ConfigError(f"attack {attack!r} needs {', '.join(missing)} from party "
                              f"{self.party!r}, which the run did not record (run with "
                              "[evaluation] record = true)")


@dataclass(frozen=True)
class AttackResult:
    """One attack's outcome, as appended to the privacy ledger.

    ``metrics`` are the figures (e.g. ``{"auc": 0.93}``); ``explanation`` is one plain sentence
    for a non-specialist ("a secondary party can tell ... with AUC 0.93, close to certain").
    """

    attack: str
    party: str
    metrics: dict[str, float]
    explanation: str
    params: dict[str, Any] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"attack": self.attack, "party": self.party, "metrics": self.metrics,
                "explanation": self.explanation, "params": self.params, "details": self.details}


@runtime_checkable
class Attack(Protocol):
    """An attack: ``name``, one-line ``summary``, ``needs`` (a subset of :data:`VIEW_FIELDS`),
    the attacker ``role`` (``"primary"`` or ``"secondary"``), and ``infer``.

    ``evaluate`` scores ``infer``'s output against evaluation-only ``truth`` (labels, true
    matches, membership...) with :mod:`vflink.metrics` and returns an :class:`AttackResult`.
    """

    name: ClassVar[str]
    summary: ClassVar[str]
    needs: ClassVar[frozenset[str]]
    role: ClassVar[str]

    def infer(self, view: AttackView) -> npt.NDArray[np.float64]: ...

    def evaluate(self, view: AttackView, truth: Mapping[str, Any]) -> AttackResult: ...


#: name → attack class; constructed with its parameters as keyword arguments.
ATTACKS: Registry[type[Attack]] = Registry("attack")


def is_population_attack(name: str) -> bool:
    """Whether attack ``name`` reads the task (what features and a few known labels predict
    of every record) rather than one record's secret from what was sent: its class says so
    (``population = True``); no label guarantee bounds such an attack. An unknown name (a
    result recorded by another version) is not one."""
    return name in ATTACKS and bool(getattr(ATTACKS.get(name), "population", False))


def get_attack(name: str, **params: Any) -> Attack:
    """Build a registered attack with its parameters (an unknown name lists the valid ones;
    an unknown parameter, the attack's parameters)."""
    cls = ATTACKS.get(name)
    if dataclasses.is_dataclass(cls):
        return from_table(cls, params, f"attack {name!r}", what=f"--param of attack {name!r}")
    return cls(**params)
