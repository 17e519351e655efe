"""Parties: primary, secondary and coordinator, composing algorithms over a Channel.

Exports load on first use, so that linkage (the coordinator and :mod:`.link_peer`) does not
import torch and scikit-learn, which only training needs.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["CoordinatorParty", "PrimaryParty", "SecondaryParty", "TrainingPlan"]

_HOME = {"CoordinatorParty": "coordinator", "PrimaryParty": "primary",
         "TrainingPlan": "primary", "SecondaryParty": "secondary"}


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'vflink.parties' has no attribute {name!r}")
    return getattr(importlib.import_module(f"vflink.parties.{home}"), name)
