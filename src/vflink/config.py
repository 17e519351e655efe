"""Configuration entry points.

The frozen, validated config dataclasses live next to what they configure (``PartySchema`` in
``vflink.data``, ``BottomSpec`` in ``vflink.models``, the run file in ``vflink.runfiles.config``);
shared validation helpers are in ``vflink._checks``. This module names the file-format version.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from vflink.errors import ConfigError

__all__ = ["CONFIG_VERSION", "read_toml"]

#: Version of the TOML run-file format; files carry ``version = 1``.
CONFIG_VERSION = 1


def read_toml(path: Path, what: str = "config file") -> dict[str, Any]:
    """Parse a TOML file, with errors that name the file (missing, unreadable, invalid)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path.absolute()}: {what} not found")
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the {what}: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
