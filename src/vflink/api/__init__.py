"""The Python API: a few documented calls for notebooks and scripts.

=====================  =========================================================================
:func:`link`           private fuzzy top-K soft linkage of two tables (``vflink link``)
:func:`align`          exact keys, PSI or PSU between two tables (``vflink align``)
:func:`train`          one training run, written to a run directory (``vflink train``)
:func:`audit`          an empirical ε lower bound of a run's label protection (``vflink audit``)
:class:`Run`           a run directory: metrics, history, privacy ledger, predict, attack, report
=====================  =========================================================================

Each call is a thin layer over the functions the matching command runs, so the same inputs
give the same outputs; the CLI calls these functions too. Everything is re-exported from
:mod:`vflink` (``vflink.link(...)``). Imports are lazy: ``vflink.link`` loads neither torch
nor scikit-learn.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vflink.api._align import Matches, align
    from vflink.api._link import Links, link
    from vflink.api._run import Run, audit, train

__all__ = ["Links", "Matches", "Run", "align", "audit", "link", "train"]

_HOME = {"Links": "_link", "link": "_link", "Matches": "_align", "align": "_align",
         "Run": "_run", "audit": "_run", "train": "_run"}


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'vflink.api' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"vflink.api.{home}"), name)
    globals()[name] = value
    return value
