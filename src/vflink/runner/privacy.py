"""What a run does with the secondaries' embedding protection (VFL-AFE): checks and reports.

Kept out of ``runner/train.py``: the protection itself lives with the secondary
(:mod:`vflink.parties.privacy`); the runner only refuses impossible settings and collects each
secondary's own ledger entries into ``RunResult.extra`` (``protections`` for privacy.json,
``privacy`` for metrics.json).
"""

from __future__ import annotations

from typing import Any

from vflink.errors import ConfigError
from vflink.parties import PrimaryParty
from vflink.privacy.config import PrivacyConfig
from vflink.types import Task

__all__ = ["check_privacy_task", "privacy_extra"]


def check_privacy_task(privacy: PrivacyConfig, task: Task) -> None:
    """Distribution adjusting (§3.3) clusters gradients into classes: classification only."""
    if privacy.adjust and not task.is_classification:
        raise ConfigError(f"`privacy.embeddings = \"{privacy.embeddings}\"` uses distribution "
                          "adjusting (VFL-AFE §3.3), which needs a classification task; this "
                          f"run's task is {task.value}: use \"vanilla\" or \"rescale\"")


def privacy_extra(primary: PrimaryParty) -> dict[str, Any]:
    """Each secondary's report: ledger entries, and the same figures keyed by party."""
    entries = primary.privacy_reports()
    figures = {e["party"]: {"kind": e["kind"], **e["params"], **e["guarantee"]}
               for e in entries}
    return {"protections": entries, "privacy": figures}
