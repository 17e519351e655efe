"""The encoder contract and the registry of encoders by name (ARCHITECTURE.md, convention 5).

An encoder turns one party's raw identifier column(s) into what the search compares: float
vectors (``"raw"``), normalised strings (``"string"``) or packed Bloom filters (``"bloom"``).
Both parties must build their encoder from the same parameters (fit statistics, normalisation,
Bloom secret), so parameters are passed in explicitly rather than learnt from one side's data.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from vflink.registry import Registry

__all__ = ["ENCODERS", "Encoder", "make_encoder"]


@runtime_checkable
class Encoder(Protocol):
    """Encodes identifiers; ``metric`` names the distance its output is meant for."""

    @property
    def metric(self) -> str: ...

    def encode(self, values: Any) -> Any: ...


#: Encoder factories by name: ``"raw"``, ``"string"``, ``"bloom"``.
ENCODERS: Registry[Callable[..., Encoder]] = Registry("encoder")


def make_encoder(name: str, /, **params: Any) -> Encoder:
    """Build the encoder registered as ``name`` with keyword parameters ``params``."""
    return ENCODERS.get(name)(**params)
