"""Wire conversion of protocol messages: ``message_to_proto`` / ``message_from_proto``.

The only place where messages become bytes (ARCHITECTURE.md, convention 2). It is generic:
a message is encoded field by field from ``dataclasses.fields`` and the runtime values, so a
message added to :data:`vflink.protocol.MESSAGE_TYPES` travels without any change here.

Decoding is strict, because the bytes come from another organisation: the protocol version must
match; the kind must be registered; every field of the dataclass must be present exactly once and
no other; each value must have the declared type (from the dataclass annotations, e.g. an
``int64`` array for ``npt.NDArray[np.int64]``); arrays must have an allowed dtype and exactly
``prod(shape) * itemsize`` bytes; nested dataclasses must be messages or listed in
:data:`vflink.protocol.PAYLOAD_TYPES`. Any violation raises :class:`ProtocolError` naming the
field path (``alignment_views.views[0].primary_index``). The encoder checks the same
annotations, so a party that builds a malformed message learns it before anything is sent.

Numbers: Python ints travel as 64-bit ints and floats as doubles; numpy scalars are accepted
and arrive as the corresponding Python scalars. Enum fields travel by value and are rebuilt from
the field's annotation. Arrays and tensors travel as C-order
little-endian bytes with dtype and shape; received ones are writable, CPU, and (tensors)
do not require grad.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import math
import sys
import types
import typing
from typing import Any

import numpy as np
import torch
from google.protobuf.message import DecodeError

from vflink.errors import ProtocolError, VflinkError
from vflink.protocol.messages import MESSAGE_TYPES, PAYLOAD_TYPES, PROTOCOL_VERSION, Message
from vflink.transport.grpc._wire import pb

__all__ = [
    "MAX_DEPTH",
    "NUMPY_DTYPES",
    "TORCH_DTYPES",
    "envelope_from_bytes",
    "message_from_proto",
    "message_to_proto",
    "value_from_proto",
    "value_to_proto",
]

log = logging.getLogger(__name__)

#: Deepest nesting of containers/dataclasses accepted (messages nest two or three levels).
MAX_DEPTH = 16
_MAX_NDIM = 32
#: Largest extent of one dimension, and of the product of the non-zero extents: a shape like
#: [0, 2**63+5] announces no bytes yet overflows numpy and torch.
_MAX_EXTENT = 2**48
_INT64 = (-(2**63), 2**63 - 1)

#: Array dtypes that may travel, by wire name. Object, string and structured dtypes never do.
NUMPY_DTYPES: dict[str, np.dtype[Any]] = {
    name: np.dtype(name) for name in (
        "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
        "float16", "float32", "float64")
}
TORCH_DTYPES: dict[str, torch.dtype] = {
    "bool": torch.bool, "int8": torch.int8, "int16": torch.int16, "int32": torch.int32,
    "int64": torch.int64, "uint8": torch.uint8, "float16": torch.float16,
    "bfloat16": torch.bfloat16, "float32": torch.float32, "float64": torch.float64,
}
_TORCH_NAMES = {v: k for k, v in TORCH_DTYPES.items()}
_PAYLOAD_NAMES = {cls: name for name, cls in PAYLOAD_TYPES.items()}


# --- declared types ---------------------------------------------------------------------------


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    hints = _HINTS.get(cls)
    if hints is None:
        try:
            # the messages module imports torch only for type checkers (linkage does not load it)
            hints = typing.get_type_hints(cls, localns={"torch": torch})
        except Exception as exc:  # an annotation that cannot be resolved at run time
            log.warning("cannot resolve the annotations of %s (%s); its field types are not "
                        "checked on the wire", cls.__name__, exc)
            hints = {}
        _HINTS[cls] = hints
    return hints


def _describe(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return f"numpy array of {value.dtype}"
    if isinstance(value, torch.Tensor):
        return f"tensor of {value.dtype}"
    return type(value).__name__


def _type_name(hint: Any) -> str:
    if hint is type(None) or hint is None:
        return "None"
    if isinstance(hint, type):
        return hint.__name__
    return str(hint).replace("typing.", "").replace("numpy.", "np.")


def _conforms(value: Any, hint: Any) -> bool:
    """Does ``value`` match the annotation ``hint``? Unknown typing constructs match anything."""
    if hint is Any or hint is object:
        return True
    if hint is None or hint is type(None):
        return value is None
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is typing.Union or origin is types.UnionType:
        return any(_conforms(value, arm) for arm in args)
    if hint is bool:
        return isinstance(value, (bool, np.bool_))
    if hint is int:
        return isinstance(value, (int, np.integer)) and not isinstance(value, bool)
    if hint is float:  # an int is acceptable where a float is expected (PEP 484)
        return isinstance(value, (int, float, np.integer, np.floating)) \
            and not isinstance(value, bool)
    if origin is typing.Literal:
        return value in args
    if origin is tuple:
        if not isinstance(value, tuple):
            return False
        if not args:
            return True
        if len(args) == 2 and args[1] is Ellipsis:
            return all(_conforms(v, args[0]) for v in value)
        return len(args) == len(value) and all(_conforms(v, a) for v, a in zip(value, args))
    if origin is list:
        return isinstance(value, list) and (not args or all(_conforms(v, args[0]) for v in value))
    if origin is dict:
        if not isinstance(value, dict):
            return False
        if not args:
            return True
        return all(_conforms(k, args[0]) and _conforms(v, args[1]) for k, v in value.items())
    if origin is np.ndarray:
        if not isinstance(value, np.ndarray):
            return False
        dtype_args = typing.get_args(args[1]) if len(args) == 2 else ()
        scalar = dtype_args[0] if dtype_args else Any
        return scalar is Any or (isinstance(scalar, type) and issubclass(scalar, np.generic)
                                 and np.issubdtype(value.dtype, scalar))
    if isinstance(hint, type):
        return isinstance(value, hint)
    return True


def _coerce_enum(value: Any, hint: Any, path: str) -> Any:
    """Rebuild an enum field (sent by value) from its annotation, e.g. ``X`` or ``X | None``."""
    arms = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) \
        else (hint,)
    enums = [a for a in arms if isinstance(a, type) and issubclass(a, enum.Enum)]
    if value is None or not enums or any(isinstance(value, e) for e in enums):
        return value
    for arm in enums:
        try:
            return arm(value)
        except ValueError:
            continue
    if _conforms(value, hint):  # a non-enum arm of the union takes it as it is
        return value
    valid = ", ".join(repr(m.value) for e in enums for m in e)
    raise ProtocolError(f"{path}: {value!r} is not a valid {_type_name(hint)}; valid: {valid}")


def _check(value: Any, hint: Any, path: str) -> None:
    if not _conforms(value, hint):
        raise ProtocolError(f"{path}: expected {_type_name(hint)}, got {_describe(value)}")


# --- arrays -----------------------------------------------------------------------------------


def _to_little(raw: bytes, itemsize: int) -> bytes:
    # The wire is little-endian; swap only on big-endian hosts (a no-op on x86/ARM).
    if sys.byteorder == "little" or itemsize == 1:
        return raw
    return np.frombuffer(raw, dtype=f">u{itemsize}").astype(f"<u{itemsize}").tobytes()


def _from_little(raw: bytes, itemsize: int) -> bytearray:
    # bytearray: received arrays and tensors must be writable (torch.frombuffer warns on
    # read-only buffers, and a party may update what it receives in place).
    if sys.byteorder == "little" or itemsize == 1:
        return bytearray(raw)
    return bytearray(np.frombuffer(raw, dtype=f"<u{itemsize}").astype(f">u{itemsize}").tobytes())


def _array_to_proto(arr: np.ndarray, out: Any, path: str) -> None:
    if arr.dtype.name not in NUMPY_DTYPES or arr.dtype.fields is not None:
        raise ProtocolError(f"{path}: numpy dtype {arr.dtype} cannot travel; allowed: "
                            f"{', '.join(NUMPY_DTYPES)}")
    native = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("="))
    out.dtype = arr.dtype.name
    out.shape.extend(arr.shape)
    out.data = _to_little(native.tobytes(), arr.dtype.itemsize)


def _tensor_to_proto(tensor: torch.Tensor, out: Any, path: str) -> None:
    name = _TORCH_NAMES.get(tensor.dtype)
    if name is None or tensor.layout != torch.strided:
        raise ProtocolError(f"{path}: tensor of {tensor.dtype} ({tensor.layout}) cannot travel; "
                            f"allowed dense dtypes: {', '.join(TORCH_DTYPES)}")
    t = tensor.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:  # numpy has no bfloat16: move its bits as int16
        t = t.view(torch.int16)
    out.dtype = name
    out.shape.extend(tensor.shape)
    out.data = _to_little(t.resolve_conj().resolve_neg().numpy().tobytes(), t.element_size())


def _shape_and_buffer(arr: Any, itemsize: int, path: str) -> tuple[tuple[int, ...], bytearray]:
    shape = tuple(int(d) for d in arr.shape)
    if len(shape) > _MAX_NDIM:
        raise ProtocolError(f"{path}: {len(shape)} dimensions (at most {_MAX_NDIM})")
    if any(d > _MAX_EXTENT for d in shape) or math.prod(max(d, 1) for d in shape) > _MAX_EXTENT:
        raise ProtocolError(f"{path}: shape {shape} is too large (at most {_MAX_EXTENT} per "
                            "dimension and in total)")
    count = math.prod(shape)
    if count * itemsize != len(arr.data):
        raise ProtocolError(f"{path}: {len(arr.data)} bytes do not match shape {shape} of "
                            f"{arr.dtype} ({count * itemsize} bytes expected)")
    buf = _from_little(arr.data, itemsize)
    if arr.dtype == "bool" and buf and int(np.frombuffer(buf, dtype=np.uint8).max()) > 1:
        raise ProtocolError(f"{path}: bool array holds bytes other than 0 and 1")
    return shape, buf


def _array_from_proto(arr: Any, path: str) -> np.ndarray:
    dtype = NUMPY_DTYPES.get(arr.dtype)
    if dtype is None:
        raise ProtocolError(f"{path}: unknown array dtype {arr.dtype!r}; allowed: "
                            f"{', '.join(NUMPY_DTYPES)}")
    shape, buf = _shape_and_buffer(arr, dtype.itemsize, path)
    return np.frombuffer(buf, dtype=dtype).reshape(shape)


def _tensor_from_proto(arr: Any, path: str) -> torch.Tensor:
    dtype = TORCH_DTYPES.get(arr.dtype)
    if dtype is None:
        raise ProtocolError(f"{path}: unknown tensor dtype {arr.dtype!r}; allowed: "
                            f"{', '.join(TORCH_DTYPES)}")
    shape, buf = _shape_and_buffer(arr, dtype.itemsize, path)
    if not buf:  # torch.frombuffer refuses an empty buffer
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(buf, dtype=dtype).reshape(shape)


# --- values -----------------------------------------------------------------------------------


def value_to_proto(value: Any, out: Any, path: str = "value", depth: int = 0) -> None:
    """Write ``value`` into the ``Value`` message ``out`` (ProtocolError if it cannot travel)."""
    if depth > MAX_DEPTH:
        raise ProtocolError(f"{path}: nested deeper than {MAX_DEPTH} levels")
    if isinstance(value, enum.Enum):  # by value; the receiver rebuilds it from the annotation
        value_to_proto(value.value, out, path, depth)
    elif value is None:
        out.none = True
    elif isinstance(value, (bool, np.bool_)):
        out.bool_value = bool(value)
    elif isinstance(value, (int, np.integer)):
        if not _INT64[0] <= int(value) <= _INT64[1]:
            raise ProtocolError(f"{path}: int {value} does not fit in 64 bits")
        out.int_value = int(value)
    elif isinstance(value, (float, np.floating)):
        out.float_value = float(value)
    elif isinstance(value, str):
        try:
            out.str_value = value
        except ValueError as exc:  # e.g. lone surrogates: not valid UTF-8
            raise ProtocolError(f"{path}: string is not valid Unicode text: {exc}") from exc
    elif isinstance(value, (bytes, bytearray)):
        out.bytes_value = bytes(value)
    elif isinstance(value, np.ndarray):
        _array_to_proto(value, out.ndarray, path)
    elif isinstance(value, torch.Tensor):
        _tensor_to_proto(value, out.tensor, path)
    elif isinstance(value, (tuple, list)):
        seq = out.tuple_value if isinstance(value, tuple) else out.list_value
        seq.SetInParent()  # an empty sequence must still select its oneof arm
        for i, item in enumerate(value):
            value_to_proto(item, seq.items.add(), f"{path}[{i}]", depth + 1)
    elif isinstance(value, dict):
        out.dict_value.SetInParent()
        for key, item in value.items():
            if not isinstance(key, str):
                raise ProtocolError(f"{path}: dict keys must be str, got {_describe(key)}")
            entry = out.dict_value.entries.add()
            entry.key = key
            value_to_proto(item, entry.value, f"{path}[{key!r}]", depth + 1)
    elif isinstance(value, Message):
        if MESSAGE_TYPES.get(value.kind) is not type(value):
            raise ProtocolError(f"{path}: {type(value).__name__} is not a registered message")
        _record_to_proto(value, value.kind, out.message, path, depth)
    elif dataclasses.is_dataclass(value) and type(value) in _PAYLOAD_NAMES:
        _record_to_proto(value, _PAYLOAD_NAMES[type(value)], out.payload, path, depth)
    else:
        raise ProtocolError(f"{path}: a {_describe(value)} cannot travel (not a message field "
                            "type, nor a dataclass listed in PAYLOAD_TYPES)")


def _fields_to_proto(obj: Any, fields: Any, path: str, depth: int) -> None:
    """Each init field of dataclass ``obj``, type-checked, appended to repeated ``fields``."""
    hints = _hints(type(obj))
    for f in dataclasses.fields(obj):
        if not f.init:
            continue
        value = getattr(obj, f.name)
        fpath = f"{path}.{f.name}"
        _check(value, hints.get(f.name, Any), fpath)
        field = fields.add()
        field.name = f.name
        value_to_proto(value, field.value, fpath, depth + 1)


def _record_to_proto(obj: Any, type_name: str, out: Any, path: str, depth: int) -> None:
    out.type = type_name
    out.SetInParent()
    _fields_to_proto(obj, out.fields, path, depth)


def value_from_proto(v: Any, path: str = "value", depth: int = 0) -> Any:
    """Decode a ``Value`` message (ProtocolError on anything malformed)."""
    if depth > MAX_DEPTH:
        raise ProtocolError(f"{path}: nested deeper than {MAX_DEPTH} levels")
    which = v.WhichOneof("value")
    if which is None:
        raise ProtocolError(f"{path}: empty value (no type set)")
    if which == "none":
        if not v.none:
            raise ProtocolError(f"{path}: malformed None")
        return None
    if which == "bool_value":
        return bool(v.bool_value)
    if which == "int_value":
        return int(v.int_value)
    if which == "float_value":
        return float(v.float_value)
    if which == "str_value":
        return str(v.str_value)
    if which == "bytes_value":
        return bytes(v.bytes_value)
    if which == "ndarray":
        return _array_from_proto(v.ndarray, path)
    if which == "tensor":
        return _tensor_from_proto(v.tensor, path)
    if which in ("tuple_value", "list_value"):
        items = [value_from_proto(item, f"{path}[{i}]", depth + 1)
                 for i, item in enumerate(getattr(v, which).items)]
        return tuple(items) if which == "tuple_value" else items
    if which == "dict_value":
        out: dict[str, Any] = {}
        for entry in v.dict_value.entries:
            if entry.key in out:
                raise ProtocolError(f"{path}: duplicate dict key {entry.key!r}")
            out[entry.key] = value_from_proto(entry.value, f"{path}[{entry.key!r}]", depth + 1)
        return out
    if which == "message":
        cls: type | None = MESSAGE_TYPES.get(v.message.type)
        if cls is None:
            raise ProtocolError(f"{path}: unknown message kind {v.message.type!r}")
        return _record_from_proto(v.message, cls, path, depth)
    if which == "payload":
        cls = PAYLOAD_TYPES.get(v.payload.type)
        if cls is None:
            raise ProtocolError(f"{path}: {v.payload.type!r} is not an allowed payload type; "
                                f"allowed: {', '.join(sorted(PAYLOAD_TYPES))}")
        return _record_from_proto(v.payload, cls, path, depth)
    raise ProtocolError(f"{path}: unsupported value type {which!r}")  # a newer .proto


def _record_from_proto(rec: Any, cls: type, path: str, depth: int) -> Any:
    expected = [f.name for f in dataclasses.fields(cls) if f.init]
    hints = _hints(cls)
    values: dict[str, Any] = {}
    for field in rec.fields:
        name = field.name
        if name not in expected:
            raise ProtocolError(f"{path}: unknown field {name!r} for {cls.__name__} (fields: "
                                f"{', '.join(expected) or 'none'})")
        if name in values:
            raise ProtocolError(f"{path}: field {name!r} given twice")
        fpath = f"{path}.{name}"
        hint = hints.get(name, Any)
        value = _coerce_enum(value_from_proto(field.value, fpath, depth + 1), hint, fpath)
        _check(value, hint, fpath)
        values[name] = value
    missing = [n for n in expected if n not in values]
    if missing:
        raise ProtocolError(f"{path}: {cls.__name__} is missing field(s) {', '.join(missing)}")
    try:
        return cls(**values)
    except (VflinkError, TypeError, ValueError) as exc:  # the dataclass's own validation
        raise ProtocolError(f"{path}: invalid {cls.__name__}: {exc}") from exc


# --- envelopes --------------------------------------------------------------------------------


def message_to_proto(message: Message, *, sender: str, correlation_id: str = "") -> Any:
    """The ``Envelope`` carrying ``message`` from ``sender``."""
    if not isinstance(message, Message):
        raise ProtocolError(f"{type(message).__name__} is not a protocol message")
    if MESSAGE_TYPES.get(message.kind) is not type(message):
        raise ProtocolError(f"{type(message).__name__} (kind {message.kind!r}) is not registered "
                            "in MESSAGE_TYPES")
    env = pb.Envelope(protocol_version=PROTOCOL_VERSION, kind=message.kind, sender=sender,
                      correlation_id=correlation_id)
    _fields_to_proto(message, env.fields, message.kind, 0)
    return env


def message_from_proto(envelope: Any) -> Message:
    """The message in ``envelope``, strictly checked (see the module docstring)."""
    if envelope.protocol_version != PROTOCOL_VERSION:
        raise ProtocolError(f"protocol version mismatch: the peer speaks version "
                            f"{envelope.protocol_version}, this vflink speaks {PROTOCOL_VERSION}")
    cls = MESSAGE_TYPES.get(envelope.kind)
    if cls is None:
        raise ProtocolError(f"unknown message kind {envelope.kind!r}")
    return _record_from_proto(envelope, cls, envelope.kind, 1)  # type: ignore[no-any-return]


def envelope_from_bytes(data: bytes) -> Any:
    """Parse a serialised ``Envelope`` (ProtocolError if the bytes are not one)."""
    try:
        return pb.Envelope.FromString(data)
    except DecodeError as exc:
        raise ProtocolError(f"malformed envelope ({len(data)} bytes): {exc}") from exc
