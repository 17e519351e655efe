"""``--resume`` is bound to its run: a checkpoint records what the run was, and a resume with
anything different is refused, naming what changed.

The primary's checkpoint carries the resolved run configuration (seed, algorithm, data,
alignment, model, training) and the fingerprint of the primary's own table; every secondary's
checkpoint carries the fingerprint of its own table, compared by that party when it loads
(only whether it changed crosses the boundary, see ``SecondaryParty.on_load_state``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vflink.data.fingerprint import frame_fingerprint
from vflink.data.table import PartyTable
from vflink.errors import ConfigError, DataError
from vflink.models.statefile import read_state_header
from vflink.runfiles.config import RunConfig, config_to_dict

__all__ = ["check_resume", "config_changes", "run_fingerprint"]


def run_fingerprint(config: RunConfig, primary: PartyTable) -> dict[str, Any]:
    """What a checkpoint records about its run (JSON-able). Not where it computes: [compute]
    does not change results (tested on both engines), so a run may resume on another
    engine."""
    resolved = config_to_dict(config)
    resolved.pop("compute", None)
    return {"config": resolved, "data": {primary.name: frame_fingerprint(primary.frame)}}


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: value}


def config_changes(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """One line per setting that differs, e.g. ``seed changed from 0 to 7``."""
    old, new = _flatten(before), _flatten(after)
    lines = []
    for key in sorted(set(old) | set(new)):
        if key not in old:
            lines.append(f"{key} was added (now {new[key]!r})")
        elif key not in new:
            lines.append(f"{key} was removed (was {old[key]!r})")
        elif old[key] != new[key]:
            lines.append(f"{key} changed from {old[key]!r} to {new[key]!r}")
    return lines


def check_resume(config: RunConfig, primary_dir: Path, primary: PartyTable,
                 checkpoint: str) -> None:
    """Refuse to resume from the checkpoint in ``primary_dir`` if the run changed.

    Reads only the checkpoint's JSON file, before any alignment work. Raises
    :class:`ConfigError` listing every changed setting, or :class:`DataError` if the primary's
    data changed; the interrupted run is left as it was.
    """
    doc = read_state_header(primary_dir, checkpoint, kind="primary")
    saved = doc["state"].get("run") if isinstance(doc["state"], dict) else None
    if not isinstance(saved, dict):
        raise DataError(f"{primary_dir}: the checkpoint does not record its run's configuration; "
                        "it cannot be resumed safely")
    now = run_fingerprint(config, primary)
    changes = config_changes(saved.get("config", {}), now["config"])
    if changes:
        raise ConfigError("cannot resume: the run's configuration differs from the interrupted "
                          "run's: " + "; ".join(changes) + " (resume with the same settings, "
                          "or start a new run without --resume)", changes)
    if saved.get("data") != now["data"]:
        raise DataError(f"cannot resume: the data of party {primary.name!r} changed since the "
                        "checkpoint (resume with the same data, or start a new run without "
                        "--resume)")
