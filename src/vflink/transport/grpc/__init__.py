"""gRPC transport: the same party messages as in-process, across hosts, with mutual TLS.

* :class:`GrpcChannel` — a party's client :class:`~vflink.protocol.Channel` to its peers;
* :class:`GrpcServer` — serves a party's :class:`~vflink.protocol.MessageHandler`;
* :class:`TlsConfig` / :func:`load_tls` / :func:`create_dev_pki` — party identities;
* :func:`message_to_proto` / :func:`message_from_proto` — the wire serde (``vflink.proto``,
  package ``vflink.v1``).
"""

from __future__ import annotations

from vflink.transport.grpc._wire import (
    DEFAULT_CHUNK_BYTES,
    DEFAULT_DEADLINE_S,
    DEFAULT_MAX_MESSAGE_BYTES,
)
from vflink.transport.grpc.channel import GrpcChannel, PeerAddress
from vflink.transport.grpc.serde import message_from_proto, message_to_proto
from vflink.transport.grpc.server import GrpcServer
from vflink.transport.grpc.tls import TlsConfig, TlsMaterial, create_dev_pki, load_tls

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "DEFAULT_DEADLINE_S",
    "DEFAULT_MAX_MESSAGE_BYTES",
    "GrpcChannel",
    "GrpcServer",
    "PeerAddress",
    "TlsConfig",
    "TlsMaterial",
    "create_dev_pki",
    "load_tls",
    "message_from_proto",
    "message_to_proto",
]
