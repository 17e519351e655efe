"""The engine a :class:`~vflink.engine.base.ComputeConfig` names.

A module of its own so that neither implementation imports the other's factory: ``base``
defines the interface, ``local`` and ``rayengine`` implement it, and only this module knows
both, so there is no import cycle.
"""

from __future__ import annotations

from vflink.engine.base import ComputeConfig, Engine

__all__ = ["get_engine"]


def get_engine(config: ComputeConfig | None = None) -> Engine:
    """The engine ``config`` names (local by default); Ray is imported only for ``"ray"``."""
    config = config or ComputeConfig()
    if config.engine == "ray":
        from vflink.engine.rayengine import RayEngine
        return RayEngine(config)
    from vflink.engine.local import LocalEngine
    return LocalEngine(config)
