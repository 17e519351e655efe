"""Models: bottom MLPs, the primary's SplitNN/FedSim model, aggregators and optimisers.

Exports load on first use: :mod:`vflink.models.spec` is imported by the protocol's messages,
and linkage (which never builds a model) should not pay for importing torch.
"""

from __future__ import annotations

import importlib
from typing import Any

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

_HOME = {
    "AGGREGATORS": "merge", "Aggregator": "merge", "AggregatorConfig": "merge",
    "aggregator_names": "merge", "build_aggregator": "merge", "BottomSpec": "spec",
    "Lamb": "lamb", "SplitNNPrimary": "splitnn", "build_mlp": "mlp", "build_optimizer": "mlp",
    "seeded_init": "mlp",
}


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'vflink.models' has no attribute {name!r}")
    return getattr(importlib.import_module(f"vflink.models.{home}"), name)
