"""Models: bottom MLPs, aggregation models and their hyperparameter specs."""

from __future__ import annotations

from vflink.models.mlp import build_mlp, build_optimizer, seeded_init
from vflink.models.spec import BottomSpec

__all__ = ["BottomSpec", "build_mlp", "build_optimizer", "seeded_init"]
