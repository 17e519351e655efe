"""Models: bottom MLPs, the primary's SplitNN/FedSim model, aggregators and optimisers."""

from __future__ import annotations

from vflink.models.lamb import Lamb
from vflink.models.merge import (
    AGGREGATORS,
    Aggregator,
    AggregatorConfig,
    aggregator_names,
    build_aggregator,
)
from vflink.models.mlp import build_mlp, build_optimizer, seeded_init
from vflink.models.spec import BottomSpec
from vflink.models.splitnn import SplitNNPrimary

__all__ = [
    "AGGREGATORS",
    "Aggregator",
    "AggregatorConfig",
    "BottomSpec",
    "Lamb",
    "SplitNNPrimary",
    "aggregator_names",
    "build_aggregator",
    "build_mlp",
    "build_optimizer",
    "seeded_init",
]
