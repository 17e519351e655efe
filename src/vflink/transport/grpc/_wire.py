"""Wire plumbing shared by client and server: the proto module, chunking, error metadata.

The protobuf classes are generated from ``vflink.proto`` when this module is imported
(``grpc.protos``, which runs protoc from grpcio-tools in memory), so no generated ``_pb2.py`` is
kept in the repository and the .proto file is the single source of the wire format.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from vflink import errors
from vflink.errors import ConfigError, ProtocolError, VflinkError

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "DEFAULT_DEADLINE_S",
    "DEFAULT_MAX_MESSAGE_BYTES",
    "CALL",
    "CODE_KEY",
    "ERROR_KEY",
    "EXCHANGE",
    "GRPC_FRAME_LIMIT",
    "MAX_CHUNK_BYTES",
    "ORIGIN_KEY",
    "SERVICE",
    "check_sizes",
    "error_chain",
    "iter_chunks",
    "pb",
    "read_chunks",
    "remote_error",
]

_PROTO = "vflink/transport/grpc/vflink.proto"
_LOAD_LOCK = threading.Lock()


def _load_proto() -> ModuleType:
    # grpc_tools finds the .proto through sys.path; the directory that holds the `vflink`
    # package is normally on it, but not for every install layout (e.g. some editable
    # installs), so add it for the duration of the load if needed.
    root = str(Path(__file__).resolve().parents[3])
    with _LOAD_LOCK:
        added = not any(os.path.isfile(os.path.join(p, _PROTO)) for p in sys.path if p)
        if added:
            sys.path.append(root)
        try:
            return grpc.protos(_PROTO)  # type: ignore[no-any-return]
        except NotImplementedError as exc:  # raised by grpc when grpcio-tools is missing
            raise ImportError("vflink's gRPC transport needs grpcio-tools to load its .proto "
                              "at run time: pip install grpcio-tools") from exc
        finally:
            if added:
                sys.path.remove(root)


#: The protobuf classes of ``vflink.proto`` (package ``vflink.v1``).
pb: Any = _load_proto()

SERVICE = "vflink.v1.Party"
CALL = f"/{SERVICE}/Call"
EXCHANGE = f"/{SERVICE}/Exchange"

#: gRPC's default maximum message size; every gRPC message we send (one chunk) stays below it.
GRPC_FRAME_LIMIT = 4 * 1024 * 1024
#: Largest allowed chunk payload: leaves room for the Chunk's own framing under the limit.
MAX_CHUNK_BYTES = 3 * 1024 * 1024
DEFAULT_CHUNK_BYTES = 1024 * 1024
#: Hard cap on one serialised message (request or reply), whatever the number of chunks.
DEFAULT_MAX_MESSAGE_BYTES = 512 * 1024 * 1024
DEFAULT_DEADLINE_S = 60.0

#: Trailing-metadata keys by which a server reports a vflink error: the class names of the
#: error from most to least specific (``"DataError,VflinkError"``), and whether it came from the
#: party's handler or from the transport itself (decoding, size limits).
ERROR_KEY = "vflink-error"
ORIGIN_KEY = "vflink-error-origin"
#: The error's stable code (``vflink.protocol.boundary.error_code``), e.g. ``policy.noise``.
CODE_KEY = "vflink-error-code"


def check_sizes(chunk_bytes: object, max_message_bytes: object) -> None:
    """Validate the chunking settings shared by client and server (ConfigError)."""
    problems = []
    if isinstance(chunk_bytes, bool) or not isinstance(chunk_bytes, int) \
            or not 1 <= chunk_bytes <= MAX_CHUNK_BYTES:
        problems.append(f"`chunk_bytes` must be an int in [1, {MAX_CHUNK_BYTES}], "
                        f"got {chunk_bytes!r}")
    if isinstance(max_message_bytes, bool) or not isinstance(max_message_bytes, int) \
            or max_message_bytes < 1:
        problems.append(f"`max_message_bytes` must be an int >= 1, got {max_message_bytes!r}")
    if problems:
        raise ConfigError("; ".join(problems), problems)


def iter_chunks(data: bytes, chunk_bytes: int) -> Iterator[bytes]:
    """Serialised ``Chunk`` messages carrying ``data``; the first one announces the total."""
    view = memoryview(data)
    yield pb.Chunk(total_size=len(data), data=bytes(view[:chunk_bytes])).SerializeToString()
    for start in range(chunk_bytes, len(data), chunk_bytes):
        yield pb.Chunk(data=bytes(view[start:start + chunk_bytes])).SerializeToString()


def read_chunks(chunks: Iterable[bytes], max_bytes: int, what: str) -> bytes:
    """Reassemble a message from serialised ``Chunk`` messages, enforcing ``max_bytes``.

    The announced size is checked before anything is buffered, so an oversized message costs
    the receiver one chunk, not the whole message.
    """
    parts: list[bytes] = []
    total = received = 0
    for index, raw in enumerate(chunks):
        try:
            chunk = pb.Chunk.FromString(raw)
        except DecodeError as exc:
            raise ProtocolError(f"{what}: chunk {index} is not a valid Chunk: {exc}") from exc
        if index == 0:
            total = int(chunk.total_size)
            if total == 0:
                raise ProtocolError(f"{what}: the first chunk does not announce the message size")
            if total > max_bytes:
                raise ProtocolError(f"{what}: message of {total} bytes exceeds the limit of "
                                    f"{max_bytes} bytes")
        elif chunk.total_size:
            raise ProtocolError(f"{what}: chunk {index} announces a size again")
        received += len(chunk.data)
        if received > total:
            raise ProtocolError(f"{what}: received more than the announced {total} bytes")
        parts.append(chunk.data)
    if not parts:
        raise ProtocolError(f"{what}: empty stream, no message")
    if received != total:
        raise ProtocolError(f"{what}: truncated message, {received} of the announced {total} "
                            "bytes arrived")
    return b"".join(parts)


def error_chain(exc: VflinkError) -> str:
    """Names of the ``vflink.errors`` classes of ``exc``, most specific first."""
    names = [c.__name__ for c in type(exc).__mro__
             if isinstance(c, type) and issubclass(c, VflinkError)
             and getattr(errors, c.__name__, None) is c]
    return ",".join(names)


# A remote party's own unreachable peer is not the caller's peer: reporting it as
# PeerUnavailable would make the caller think (and maybe retry as if) its direct peer is down.
_NOT_REBUILT = frozenset({"PeerUnavailable"})


def remote_error(chain: str, message: str) -> VflinkError | None:
    """Rebuild an error reported by a peer from its class-name chain (no pickle: only classes of
    ``vflink.errors`` that take a single message are built; others fall back to a parent)."""
    for name in chain.split(","):
        cls = getattr(errors, name.strip(), None)
        if name in _NOT_REBUILT or not (isinstance(cls, type) and issubclass(cls, VflinkError)):
            continue
        try:
            return cls(message)
        except TypeError:  # a constructor with other arguments (e.g. UnknownNameError)
            continue
    return None
