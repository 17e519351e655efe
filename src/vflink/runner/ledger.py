"""Write a run's privacy ledger (``privacy.json``, schema in :mod:`vflink.privacy.ledger`).

Protections report their ledger entries in ``RunResult.extra["protections"]`` (a list of dicts
shaped like :meth:`Ledger.add_protection`'s arguments); this module turns a finished run into
the ledger file, so no protection writes files of its own.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from vflink.privacy.ledger import LEDGER_FILE, Ledger

if TYPE_CHECKING:
    from vflink.runner.train import RunResult

__all__ = ["build_run_ledger", "write_run_ledger"]


def build_run_ledger(result: RunResult) -> Ledger:
    """The ledger of one finished run: every protection the run's parties reported."""
    ledger = Ledger()
    for entry in result.extra.get("protections", []):
        ledger.add_protection(**entry)
    return ledger


def write_run_ledger(run_dir: Path, result: RunResult) -> Path:
    path = Path(run_dir) / LEDGER_FILE
    build_run_ledger(result).write(path)
    return path
