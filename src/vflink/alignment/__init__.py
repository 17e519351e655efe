"""Alignment: exact keyed-hash matching (and, later, PSI/PSU)."""

from __future__ import annotations

from vflink.alignment.exact import exact_alignment, key_digests, match_digests, normalise_key

__all__ = ["exact_alignment", "key_digests", "match_digests", "normalise_key"]
