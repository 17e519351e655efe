"""The privacy settings that make the primary's label noise seeded or secret, in this version's
terms: seeded from the run seed (what a secondary receives) unless the secure source is asked
for, or, where ``[privacy] reproducible_noise`` exists, secret unless that switch is on. Tests
of the white-box attacks name the two cases, not the keys."""

from __future__ import annotations

from typing import Any

from vflink.privacy.config import PrivacyConfig

_SWITCH = "reproducible_noise" in PrivacyConfig.__dataclass_fields__

#: label noise seeded from the run seed (or from ``labels_seed``): regenerable
SEEDED: dict[str, Any] = {"reproducible_noise": True} if _SWITCH else {}
#: label noise from the operating system: nothing a peer holds regenerates it
SECRET: dict[str, Any] = {} if _SWITCH else {"labels_secure_rng": True}


def seeded(**privacy: Any) -> dict[str, Any]:
    """``privacy`` with the label noise seeded (e.g. ``labels_seed = 7``)."""
    return {**SEEDED, **privacy}


def secret(**privacy: Any) -> dict[str, Any]:
    """``privacy`` with the label noise secret."""
    return {**SECRET, **privacy}
