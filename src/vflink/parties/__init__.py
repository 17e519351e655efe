"""Parties: primary, secondary and coordinator, composing algorithms over a Channel."""

from __future__ import annotations

from vflink.parties.coordinator import CoordinatorParty
from vflink.parties.primary import PrimaryParty, TrainingPlan
from vflink.parties.secondary import SecondaryParty

__all__ = ["CoordinatorParty", "PrimaryParty", "SecondaryParty", "TrainingPlan"]
