"""State files that are data, never code: tensors as safetensors, the rest as versioned JSON.

A party's saved state ``NAME`` in a directory is a pair of files::

    NAME.<digest>.safetensors   every tensor (parameters, optimiser moments, dropout RNG states)
    NAME.json                   {"format": "vflink-state", "version": 1, "kind": ...,
                                 "tensors": "NAME.<digest>.safetensors", "sha256": ...,
                                 "state": <the rest, tensors replaced by references>}

The weights file is named after its content and written first; the JSON file, written to a
temporary name and renamed, is the commit point: it names the weights file and its SHA-256, so
a crash at any moment leaves either the old complete pair or the new one, and a truncated or
swapped weights file is detected on load. Nothing is ever loaded with pickle (ARCHITECTURE.md:
"model and state files are data, never code"), so a run directory received from someone else
cannot execute code.

Optimiser ``state_dict``s are nested dicts of tensors and scalars with integer keys and tuples;
:func:`encode_tree` flattens them into (JSON tree, tensors) losslessly and :func:`decode_tree`
restores them.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vflink._files import MAX_JSON_BYTES, atomic_write_bytes, loads_json, read_data_file
from vflink.errors import DataError

__all__ = [
    "STATE_FORMAT",
    "STATE_VERSION",
    "StateFileError",
    "decode_tree",
    "encode_tree",
    "load_state",
    "read_state_header",
    "remove_state",
    "save_state",
    "state_exists",
    "state_json_path",
]

STATE_FORMAT = "vflink-state"
#: Version of the state-file format; a file of another version is refused with a clear error.
STATE_VERSION = 1

_TENSOR, _NDARRAY, _TUPLE, _ITEMS = "$tensor", "$ndarray", "$tuple", "$items"
_MARKERS = (_TENSOR, _NDARRAY, _TUPLE, _ITEMS)


class StateFileError(DataError):
    """A state file is missing, truncated, corrupt, or from another format version.

    ``reason`` says which, without the file's path: what a party may tell a peer about its
    own state file (no local path crosses the boundary).
    """

    def __init__(self, message: str, reason: str = "unusable") -> None:
        super().__init__(message)
        self.reason = reason


def _bad(path: Path, detail: str) -> StateFileError:
    return StateFileError(f"{path}: truncated or not a vflink state file ({detail})",
                          "truncated or not a vflink state file")


# --- the tree codec ----------------------------------------------------------------------------

def encode_tree(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """A JSON-able copy of ``obj``; its tensors and arrays move into ``tensors``.

    Supports dicts (any scalar keys), lists, tuples, tensors, numpy arrays and scalars, and JSON
    scalars. Tuples and non-string keys are tagged so :func:`decode_tree` restores them exactly.
    """
    if isinstance(obj, torch.Tensor):
        key = f"t{len(tensors)}"
        # safetensors refuses views that share memory: store an owned, contiguous copy
        tensors[key] = obj.detach().cpu().contiguous().clone()
        return {_TENSOR: key}
    if isinstance(obj, np.ndarray):
        key = f"t{len(tensors)}"
        tensors[key] = torch.from_numpy(np.ascontiguousarray(obj).copy())
        return {_NDARRAY: key}
    if isinstance(obj, np.generic):
        return obj.item()
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, tuple):
        return {_TUPLE: [encode_tree(v, tensors) for v in obj]}
    if isinstance(obj, list):
        return [encode_tree(v, tensors) for v in obj]
    if isinstance(obj, Mapping):
        if all(isinstance(k, str) and k not in _MARKERS for k in obj):
            return {k: encode_tree(v, tensors) for k, v in obj.items()}
        return {_ITEMS: [[encode_tree(k, tensors), encode_tree(v, tensors)]
                         for k, v in obj.items()]}
    raise TypeError(f"cannot store a {type(obj).__name__} in a state file")


def decode_tree(obj: Any, tensors: Mapping[str, torch.Tensor]) -> Any:
    """The inverse of :func:`encode_tree`; raises ``KeyError``/``TypeError`` on a bad tree."""
    if isinstance(obj, list):
        return [decode_tree(v, tensors) for v in obj]
    if isinstance(obj, dict):
        if len(obj) == 1:
            (tag, value), = obj.items()
            if tag == _TENSOR:
                return tensors[value]
            if tag == _NDARRAY:
                return tensors[value].numpy()
            if tag == _TUPLE:
                return tuple(decode_tree(v, tensors) for v in value)
            if tag == _ITEMS:
                return {_hashable(decode_tree(k, tensors)): decode_tree(v, tensors)
                        for k, v in value}
        return {k: decode_tree(v, tensors) for k, v in obj.items()}
    return obj


def _hashable(key: Any) -> Any:
    if isinstance(key, list):
        raise TypeError("a list cannot be a dict key")
    return key


# --- files -------------------------------------------------------------------------------------

def _split(root: Path, name: str) -> tuple[Path, str]:
    path = Path(root) / name
    return path.parent, path.name


def state_json_path(root: Path, name: str) -> Path:
    """The commit file of state ``name`` under ``root`` (``NAME.json``)."""
    directory, stem = _split(root, name)
    return directory / f"{stem}.json"


def _weights_pattern(stem: str) -> re.Pattern[str]:
    return re.compile(re.escape(stem) + r"\.[0-9a-f]{16}\.safetensors")


def state_exists(root: Path, name: str) -> bool:
    return state_json_path(root, name).is_file()


def _write_atomic(path: Path, data: bytes) -> None:
    atomic_write_bytes(path, data, fsync=True)


def save_state(root: Path, name: str, state: Mapping[str, Any], *, kind: str) -> Path:
    """Write ``state`` as the pair ``NAME.json`` + ``NAME.<digest>.safetensors`` (atomically).

    Returns the JSON file's path. Older weights files of the same name are removed once the new
    pair is committed.
    """
    from safetensors.torch import save

    directory, stem = _split(root, name)
    directory.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, torch.Tensor] = {}
    tree = encode_tree(dict(state), tensors)
    blob = save(tensors, metadata={"format": STATE_FORMAT, "version": str(STATE_VERSION)})
    digest = hashlib.sha256(blob).hexdigest()
    weights = f"{stem}.{digest[:16]}.safetensors"
    _write_atomic(directory / weights, blob)
    doc = {"format": STATE_FORMAT, "version": STATE_VERSION, "kind": kind,
           "tensors": weights, "sha256": digest, "state": tree}
    target = directory / f"{stem}.json"
    _write_atomic(target, (json.dumps(doc, indent=1) + "\n").encode("utf-8"))
    pattern = _weights_pattern(stem)
    for old in directory.glob(f"{stem}.*.safetensors"):
        if old.name != weights and pattern.fullmatch(old.name):
            old.unlink(missing_ok=True)
    return target


def remove_state(root: Path, name: str) -> None:
    """Delete state ``name`` (its JSON file first, so no half pair looks committed)."""
    directory, stem = _split(root, name)
    (directory / f"{stem}.json").unlink(missing_ok=True)
    pattern = _weights_pattern(stem)
    for old in directory.glob(f"{stem}.*.safetensors"):
        if pattern.fullmatch(old.name):
            old.unlink(missing_ok=True)


def read_state_header(root: Path, name: str, *, kind: str | None = None) -> dict[str, Any]:
    """The parsed and checked JSON file of state ``name`` (its tensors are not read)."""
    path = state_json_path(root, name)
    if not os.path.lexists(path):
        legacy = path.with_name(path.name[:-len(".json")] + ".pt")
        if legacy.is_file():
            raise StateFileError(
                f"{legacy}: a state file in the old pickle format, which vflink no longer "
                "loads (a pickle can run code); train the run again with this version",
                "in the old pickle format")
        raise StateFileError(f"{path}: state file not found", "not found")
    # a regular file inside its folder (never a planted link), within size and depth limits
    raw = read_data_file(path.parent, path.name, max_bytes=MAX_JSON_BYTES,
                         error=lambda msg: StateFileError(msg, "not a readable regular file"))
    if not raw.strip():
        raise _bad(path, "the file is empty")
    doc = loads_json(raw, source=str(path), error=lambda msg: StateFileError(
        f"{msg} (truncated or not a vflink state file)", "truncated or not a vflink state file"))
    if not isinstance(doc, dict) or doc.get("format") != STATE_FORMAT:
        raise _bad(path, f"no \"format\": \"{STATE_FORMAT}\" field")
    version = doc.get("version")
    if version != STATE_VERSION:
        raise StateFileError(f"{path}: a vflink state file of format version {version!r}; this "
                             f"version of vflink reads version {STATE_VERSION}",
                             "from another format version")
    if kind is not None and doc.get("kind") != kind:
        raise StateFileError(f"{path}: holds the state of a {doc.get('kind')!r}, expected a "
                             f"{kind!r}", "holds another kind of party's state")
    for field in ("tensors", "sha256", "state"):
        if field not in doc:
            raise _bad(path, f"no {field!r} field")
    if not isinstance(doc["tensors"], str) or not _weights_pattern(
            path.name[:-len(".json")]).fullmatch(doc["tensors"]):
        raise _bad(path, "invalid weights file name")
    return doc


def load_state(root: Path, name: str, *, kind: str | None = None) -> dict[str, Any]:
    """Read state ``name``: the JSON tree with every tensor restored.

    Raises :class:`StateFileError` naming the file when it is missing, empty, truncated,
    corrupt, of another format version or of another kind of party.
    """
    from safetensors import SafetensorError
    from safetensors.torch import load

    doc = read_state_header(root, name, kind=kind)
    directory, _ = _split(root, name)
    weights = directory / doc["tensors"]
    if not os.path.lexists(weights):
        raise _bad(weights, "the weights file named by "
                   f"{state_json_path(root, name).name} is missing")
    blob = read_data_file(directory, doc["tensors"], error=lambda msg: StateFileError(
        msg, "not a readable regular file"))
    if hashlib.sha256(blob).hexdigest() != doc["sha256"]:
        raise _bad(weights, "its SHA-256 does not match the one recorded when it was written")
    try:
        tensors = load(blob)
    except (SafetensorError, ValueError) as exc:
        raise _bad(weights, str(exc)) from None
    try:
        state = decode_tree(doc["state"], tensors)
    except (KeyError, TypeError, ValueError) as exc:
        raise _bad(state_json_path(root, name), f"bad state tree: {exc}") from None
    if not isinstance(state, dict):
        raise _bad(state_json_path(root, name), "the state is not a table")
    return state
