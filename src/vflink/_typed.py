"""Typed readers for files read back from a directory someone else may have made.

:mod:`vflink._files` makes sure such a file is a regular file inside its directory, within size
and nesting limits. This module makes sure its *content* has the types the reader is written
for, before any of it is used: JSON is checked against a small schema (:class:`Obj`,
:class:`ListOf`, :class:`MapOf`, scalars), and arrays in ``.npz`` files against their expected
dtype kind and number of dimensions, an object (pickled) array being refused from its header,
without unpickling. A mismatch raises the caller's error type (``DataError`` by default, exit 2
in the CLI) naming the file and the key, e.g. ``metrics.json: key "metrics.test.auc": expected
a number, got str``.

Schemas describe what a reader uses; keys a schema does not name are left as they are (files
carry more than one reader needs), unless the schema says ``extra=False``.
"""

from __future__ import annotations

import io
import math
import zipfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from vflink._files import (
    MAX_FILE_BYTES,
    ErrorType,
    read_data_file,
    read_json_file,
)
from vflink.errors import DataError

__all__ = [
    "ANY",
    "NUMERIC",
    "Arr",
    "Bool",
    "Int",
    "ListOf",
    "MapOf",
    "Num",
    "Obj",
    "Opt",
    "Spec",
    "Str",
    "load_arrays",
    "read_typed_json",
    "typed",
]


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


class _Mismatch(Exception):
    def __init__(self, path: str, expected: str, value: Any) -> None:
        super().__init__(path)
        self.path, self.expected, self.value = path, expected, value


def _join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


class Spec:
    """A JSON value's expected type."""

    what = "a value"

    def check(self, value: Any, path: str) -> Any:
        raise NotImplementedError


class _Any(Spec):
    what = "any value"

    def check(self, value: Any, path: str) -> Any:
        return value


#: any JSON value (a key whose content the reader does not use)
ANY: Spec = _Any()


@dataclass(frozen=True)
class Str(Spec):
    what: str = "a string"

    def check(self, value: Any, path: str) -> Any:
        if not isinstance(value, str):
            raise _Mismatch(path, self.what, value)
        return value


@dataclass(frozen=True)
class Bool(Spec):
    what: str = "a boolean"

    def check(self, value: Any, path: str) -> Any:
        if not isinstance(value, bool):
            raise _Mismatch(path, self.what, value)
        return value


@dataclass(frozen=True)
class Int(Spec):
    """A whole number (a float with no fraction is accepted as written by JSON encoders)."""

    min: int | None = None
    what: str = "an integer"

    def check(self, value: Any, path: str) -> Any:
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise _Mismatch(path, self.what, value)
        if self.min is not None and value < self.min:
            raise _Mismatch(path, f"an integer ≥ {self.min}", value)
        return value


@dataclass(frozen=True)
class Num(Spec):
    """A number; ``finite`` refuses NaN and infinities (JSON's ``NaN`` extension)."""

    finite: bool = False
    what: str = "a number"

    def check(self, value: Any, path: str) -> Any:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _Mismatch(path, self.what, value)
        if self.finite and not math.isfinite(value):
            raise _Mismatch(path, "a finite number", value)
        return value


@dataclass(frozen=True)
class Opt(Spec):
    """``inner`` or null."""

    inner: Spec

    @property
    def what(self) -> str:  # type: ignore[override]
        return f"{self.inner.what} or null"

    def check(self, value: Any, path: str) -> Any:
        return None if value is None else self.inner.check(value, path)


@dataclass(frozen=True)
class ListOf(Spec):
    item: Spec

    @property
    def what(self) -> str:  # type: ignore[override]
        return f"a list of {self.item.what}"

    def check(self, value: Any, path: str) -> Any:
        if not isinstance(value, list):
            raise _Mismatch(path, self.what, value)
        return [self.item.check(v, _join(path, i)) for i, v in enumerate(value)]


@dataclass(frozen=True)
class MapOf(Spec):
    """An object whose every value is ``value`` (keys are strings in JSON)."""

    value: Spec

    @property
    def what(self) -> str:  # type: ignore[override]
        return f"an object of {self.value.what}"

    def check(self, value: Any, path: str) -> Any:
        if not isinstance(value, dict):
            raise _Mismatch(path, self.what, value)
        return {k: self.value.check(v, _join(path, k)) for k, v in value.items()}


@dataclass(frozen=True)
class Obj(Spec):
    """An object with the keys ``required`` (each of its type) and ``optional`` ones."""

    required: Mapping[str, Spec] = field(default_factory=dict)
    optional: Mapping[str, Spec] = field(default_factory=dict)
    extra: bool = True
    what: str = "an object"

    def check(self, value: Any, path: str) -> Any:
        if not isinstance(value, dict):
            raise _Mismatch(path, self.what, value)
        out = dict(value)
        for key, spec in self.required.items():
            if key not in value:
                raise _Mismatch(_join(path, key), spec.what, _MISSING)
            out[key] = spec.check(value[key], _join(path, key))
        for key, spec in self.optional.items():
            if key in value:
                out[key] = spec.check(value[key], _join(path, key))
        if not self.extra:
            unknown = sorted(set(value) - set(self.required) - set(self.optional))
            if unknown:
                raise _Mismatch(_join(path, unknown[0]), "no such key", value[unknown[0]])
        return out


class _Missing:
    pass


_MISSING = _Missing()


def typed(value: Any, spec: Spec, *, source: str, error: ErrorType = DataError) -> Any:
    """``value`` checked against ``spec`` (``source`` names it in errors)."""
    try:
        return spec.check(value, "")
    except _Mismatch as m:
        got = "nothing (the key is missing)" if m.value is _MISSING else _kind(m.value)
        where = f'key "{m.path}"' if m.path else "its top level"
        raise error(f"{source}: {where}: expected {m.expected}, got {got}") from None


def read_typed_json(root: Path | str, relative: Path | str, spec: Spec, *,
                    error: ErrorType = DataError) -> Any:
    """``root/relative`` parsed as JSON (:func:`vflink._files.read_json_file`) and checked
    against ``spec``."""
    value = read_json_file(root, relative, error=error)
    return typed(value, spec, source=str(Path(root) / relative), error=error)


@dataclass(frozen=True)
class Arr:
    """An array's expected dtype kinds (numpy's ``dtype.kind`` letters: ``"f"`` float,
    ``"iu"`` integers, ``"b"`` boolean) and number of dimensions (None: any)."""

    kinds: str
    ndim: int | tuple[int, ...] | None = None

    @property
    def what(self) -> str:
        names = {"f": "float", "i": "signed integer", "u": "unsigned integer", "b": "boolean",
                 "c": "complex", "U": "text", "S": "bytes"}
        kinds = " or ".join(names.get(k, k) for k in self.kinds)
        dims = "" if self.ndim is None else (
            f", {self.ndim}-d" if isinstance(self.ndim, int)
            else f", {' or '.join(map(str, self.ndim))}-d")
        return f"a {kinds} array{dims}"

    def accepts(self, dtype: np.dtype[Any], ndim: int) -> bool:
        if dtype.kind not in self.kinds:
            return False
        if self.ndim is None:
            return True
        return ndim in ((self.ndim,) if isinstance(self.ndim, int) else self.ndim)


def _header(zf: zipfile.ZipFile, member: str) -> tuple[tuple[int, ...], np.dtype[Any]]:
    """Shape and dtype of one ``.npy`` member, read from its header only."""
    with zf.open(member) as fh:
        version = np.lib.format.read_magic(fh)
        if version == (1, 0):
            shape, _, dtype = np.lib.format.read_array_header_1_0(fh)
        elif version == (2, 0):
            shape, _, dtype = np.lib.format.read_array_header_2_0(fh)
        else:
            raise ValueError(f"unsupported .npy format version {version}")
    return tuple(int(n) for n in shape), dtype


#: what an array of a run directory may hold when its reader names no kind: numbers
NUMERIC = Arr("biuf")


def load_arrays(root: Path | str, relative: Path | str,
                spec: Mapping[str, Arr] | None = None, *, required: Iterable[str] = (),
                default: Arr | None = NUMERIC, max_bytes: int = MAX_FILE_BYTES,
                error: ErrorType = DataError) -> dict[str, npt.NDArray[Any]]:
    """The arrays of the ``.npz`` file ``root/relative``, each checked before it is loaded.

    Every member's header is read first: an object (pickled) array is refused without being
    unpickled, naming its key, and so is one whose dtype kind or number of dimensions is not
    what ``spec`` says for that key (``default`` for keys it does not name: numbers).
    ``required`` keys must be present.
    """
    source = str(Path(root) / relative)
    data = read_data_file(root, relative, max_bytes=max_bytes, error=error)
    try:
        zf = zipfile.ZipFile(io.BytesIO(data))
    except zipfile.BadZipFile:
        raise error(f"{source}: not an .npz archive (expected numpy's zip of arrays)") from None
    out: dict[str, npt.NDArray[Any]] = {}
    with zf:
        for member in zf.namelist():
            key = member[:-4] if member.endswith(".npy") else member
            try:
                shape, dtype = _header(zf, member)
            except (ValueError, OSError, zipfile.BadZipFile, EOFError) as exc:
                raise error(f"{source}: key {key!r}: not a readable array ({exc})") from None
            if dtype.hasobject:
                raise error(f"{source}: key {key!r}: holds Python objects (dtype {dtype}); "
                            "only numeric arrays are read, and nothing is unpickled")
            want = (spec or {}).get(key, default)
            if want is not None and not want.accepts(dtype, len(shape)):
                raise error(f"{source}: key {key!r}: expected {want.what}, got {dtype} of "
                            f"shape {shape}")
            try:
                with zf.open(member) as fh:
                    out[key] = np.lib.format.read_array(fh, allow_pickle=False)
            except (ValueError, OSError, EOFError) as exc:
                raise error(f"{source}: key {key!r}: not a readable array ({exc})") from None
    missing = sorted(set(required) - set(out))
    if missing:
        raise error(f"{source}: key {missing[0]!r}: missing (expected "
                    f"{(spec or {}).get(missing[0], Arr('fiub')).what})")
    return out
