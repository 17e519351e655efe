"""Configuration entry points.

The frozen, validated config dataclasses live next to what they configure (``PartySchema`` in
``vflink.data``, ``BottomSpec`` in ``vflink.models``, the run file in ``vflink.runner.config``);
shared validation helpers are in ``vflink._checks``. This module names the file-format version.
"""

from __future__ import annotations

__all__ = ["CONFIG_VERSION"]

#: Version of the TOML run-file format; files carry ``version = 1``.
CONFIG_VERSION = 1
