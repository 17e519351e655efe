"""The privacy settings that make the primary's label noise seeded or secret: secret by
default (:mod:`vflink.randomness`), seeded from the run seed (what a secondary receives) or
from ``labels_seed`` only behind ``[privacy] reproducible_noise``. Tests of the white-box
attacks name the two cases, not the keys."""

from __future__ import annotations

from typing import Any

#: label noise seeded from the run seed (or from ``labels_seed``): regenerable, not private
SEEDED: dict[str, Any] = {"reproducible_noise": True}
#: label noise from the operating system: nothing a peer holds regenerates it (the default)
SECRET: dict[str, Any] = {}


def seeded(**privacy: Any) -> dict[str, Any]:
    """``privacy`` with the label noise seeded (e.g. ``labels_seed = 7``)."""
    return {**SEEDED, **privacy}


def secret(**privacy: Any) -> dict[str, Any]:
    """``privacy`` with the label noise secret."""
    return {**SECRET, **privacy}
