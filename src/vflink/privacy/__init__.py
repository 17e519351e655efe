"""Protections of what crosses the boundary and their accounting (VFL-AFE, FedSim Thm 1).

Pure maths (clipping, noise calibration, accountant adapters) lives here; the stateful wrapper
on what a secondary sends lives with the parties. The run-level privacy ledger's schema is
:mod:`vflink.privacy.ledger`.
"""

from __future__ import annotations

from vflink.privacy.ledger import LEDGER_FILE, LEDGER_VERSION, Ledger, explain_epsilon

__all__ = ["LEDGER_FILE", "LEDGER_VERSION", "Ledger", "explain_epsilon"]
