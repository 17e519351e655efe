"""Attacks that measure what still leaks (FedSim §5, VFL-AFE §4.3, FLORIST App. C).

Every attack follows one contract (:mod:`vflink.attacks.base`) and is registered by name in
:data:`ATTACKS`.
"""

from __future__ import annotations

from vflink.attacks.base import ATTACKS, Attack, AttackResult, AttackView, get_attack
from vflink.attacks.spectral import SpectralAttack, spectral_scores

__all__ = ["ATTACKS", "Attack", "AttackResult", "AttackView", "SpectralAttack", "get_attack",
           "spectral_scores"]
