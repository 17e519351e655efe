"""Alignment: exact keyed-hash matching, ECDH PSI and private set union (FLORIST).

Exports load on first use, so light modules of the package (e.g. the FLORIST strategy names
that `vflink --help` lists) do not pull in pandas.
"""

from __future__ import annotations

from typing import Any

__all__ = ["exact_alignment", "key_digests", "match_digests", "normalise_key"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from vflink.alignment import exact

        return getattr(exact, name)
    raise AttributeError(f"module 'vflink.alignment' has no attribute {name!r}")
