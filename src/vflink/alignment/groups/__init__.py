"""Prime-order groups for the Diffie-Hellman set protocols (FLORIST PSU, ECDH PSI), by name.

``ristretto255`` (libsodium) is the fast default; ``modp2048`` (the paper's QR(Z_p*) with the
RFC 3526 safe prime, via GMP) is the reference twin. Both satisfy :class:`Group`.
"""

from __future__ import annotations

from collections.abc import Callable

from vflink.alignment.groups.base import Elements, Group, default_workers
from vflink.alignment.groups.modp import Modp2048
from vflink.alignment.groups.ristretto import Ristretto255
from vflink.registry import Registry
from vflink.types import Compute

__all__ = ["GROUPS", "Elements", "Group", "default_workers", "get_group"]

GROUPS: Registry[Callable[..., Group]] = Registry("group")
GROUPS.add("ristretto255", Ristretto255)
GROUPS.add("modp2048", Modp2048)


def get_group(name: str, *, workers: int | None = None, compute: Compute | None = None
              ) -> Group:
    """A fresh group object (``UnknownNameError`` lists the valid names); with ``compute``,
    its large batches run as that engine's tasks."""
    return GROUPS.get(name)(workers=workers, compute=compute)
