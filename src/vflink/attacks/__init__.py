"""Attacks that measure what still leaks (FedSim §5, VFL-AFE §4.3, FLORIST App. C).

Every attack follows one contract (:mod:`vflink.attacks.base`) and is registered by name in
:data:`ATTACKS`.
"""

from __future__ import annotations

# Registering modules (one line each): importing them adds their attacks to ATTACKS.
from vflink.attacks import greedy as _greedy  # noqa: E402,F401  (greedy-similarity)
from vflink.attacks import label_clustering as _label_clustering  # noqa: E402,F401
from vflink.attacks import label_leakage as _label_leakage  # noqa: E402,F401  (label-*)
from vflink.attacks import model_completion as _model_completion  # noqa: E402,F401
from vflink.attacks import whitebox as _whitebox  # noqa: E402,F401  (white-box label attacks)
from vflink.attacks.base import (
    ATTACKS,
    Attack,
    AttackResult,
    AttackView,
    get_attack,
    is_population_attack,
)
from vflink.attacks.inversion import DecoderInversion, inversion_grid_png
from vflink.attacks.membership import ShadowMembershipInference
from vflink.attacks.spectral import SpectralAttack, spectral_scores

__all__ = ["ATTACKS", "Attack", "AttackResult", "AttackView", "DecoderInversion",
           "ShadowMembershipInference", "SpectralAttack", "get_attack", "inversion_grid_png",
           "is_population_attack", "spectral_scores"]
