"""The privacy ledger: one versioned record per run of what crossed the boundary, how it was
protected, and what attacks still learned (``privacy.json`` in the run directory).

Shape (``version`` 1)::

    {
      "version": 1,
      "messages": [      # one entry per (kind, sender, receiver)
        {"kind": "embeddings", "sender": "bank", "receiver": "hospital", "stage": "training",
         "count": 420, "bytes": 1720320, "protection": "embedding-dp",
         "explanation": "..."}],
      "protections": [   # one entry per protection a party applied
        {"kind": "embedding-dp", "party": "bank", "applies_to": "embeddings",
         "params": {...}, "guarantee": {"epsilon": 3.1, "delta": 1e-5, ...},
         "explanation": "..."}],
      "attacks": [       # AttackResult.to_json(), appended by `vflink attack`
        {"attack": "label-norm", "party": "bank", "metrics": {"auc": 0.93}, ...}]
    }

Every figure carries an ``explanation``: a plain sentence for a non-specialist
(:func:`explain_epsilon`). Protections and attacks from later work are added as new ``kind``
values, never as new top-level keys, so readers of version 1 keep working.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vflink._files import atomic_write_json, read_json_file
from vflink.errors import DataError

__all__ = ["LEDGER_FILE", "LEDGER_VERSION", "Ledger", "explain_epsilon"]

LEDGER_VERSION = 1
LEDGER_FILE = "privacy.json"


def explain_epsilon(epsilon: float | None, delta: float | None = None) -> str:
    """A plain sentence on what a differential-privacy ε (at δ) means to a non-specialist."""
    if epsilon is None or (isinstance(epsilon, float) and math.isnan(epsilon)):
        return "no differential-privacy guarantee applies"
    at = f" (δ = {delta:.0e})" if delta else ""
    if math.isinf(epsilon) or epsilon > 50:
        return (f"ε = {epsilon:.3g}{at}: no meaningful differential-privacy guarantee; treat "
                "what was released as visible to the receiver")
    if epsilon > 10:
        return (f"ε = {epsilon:.3g}{at}: a weak guarantee; an observer can become much more "
                "confident about an individual record")
    if epsilon > 1:
        return (f"ε = {epsilon:.3g}{at}: a moderate guarantee; an observer's odds about any one "
                f"record change by at most a factor {math.exp(epsilon):.3g}")
    return (f"ε = {epsilon:.3g}{at}: a strong guarantee; an observer's odds about any one record "
            f"change by at most a factor {math.exp(epsilon):.3g}")


@dataclass
class Ledger:
    """In-memory ledger; :meth:`write` stores it atomically as JSON."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    protections: list[dict[str, Any]] = field(default_factory=list)
    attacks: list[dict[str, Any]] = field(default_factory=list)

    def add_message(self, *, kind: str, sender: str, receiver: str, stage: str, count: int,
                    nbytes: int, protection: str, explanation: str) -> None:
        self.messages.append({"kind": kind, "sender": sender, "receiver": receiver,
                              "stage": stage, "count": int(count), "bytes": int(nbytes),
                              "protection": protection, "explanation": explanation})

    def add_protection(self, *, kind: str, party: str, applies_to: str,
                       params: dict[str, Any], guarantee: dict[str, Any],
                       explanation: str) -> None:
        self.protections.append({"kind": kind, "party": party, "applies_to": applies_to,
                                 "params": params, "guarantee": guarantee,
                                 "explanation": explanation})

    def add_attack(self, result: dict[str, Any]) -> None:
        self.attacks.append(dict(result))

    def to_json(self) -> dict[str, Any]:
        return {"version": LEDGER_VERSION, "messages": self.messages,
                "protections": self.protections, "attacks": self.attacks}

    @classmethod
    def from_json(cls, data: Any, *, source: str = "privacy ledger") -> Ledger:
        if not isinstance(data, dict) or data.get("version") != LEDGER_VERSION:
            version = data.get("version") if isinstance(data, dict) else None
            raise DataError(f"{source}: not a version-{LEDGER_VERSION} privacy ledger "
                            f"(version {version!r})")
        return cls(messages=list(data.get("messages", [])),
                   protections=list(data.get("protections", [])),
                   attacks=list(data.get("attacks", [])))

    @classmethod
    def read(cls, path: Path) -> Ledger:
        path = Path(path)
        if not os.path.lexists(path):
            raise DataError(f"{path}: no privacy ledger")
        # a regular file inside its run directory, within size and depth limits (vflink._files)
        data = read_json_file(path.parent, path.name)
        return cls.from_json(data, source=str(path))

    def write(self, path: Path) -> None:
        atomic_write_json(Path(path), self.to_json(), indent=2, default=float)
