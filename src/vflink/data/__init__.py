"""Party data: schemas, loading with validation, and per-party preprocessing."""

from __future__ import annotations

from vflink.data.schema import PartySchema
from vflink.data.table import PartyTable, load_table

__all__ = ["PartySchema", "PartyTable", "load_table"]
