"""Client side of the gRPC transport: :class:`GrpcChannel`, a :class:`Channel` over the network.

A call serialises the message into an ``Envelope`` (:mod:`.serde`), streams it to the peer in
chunks below gRPC's 4 MiB frame limit, and reassembles the reply the same way. Every call has a
deadline. Failures are translated at this boundary (ARCHITECTURE.md, convention 7):

* the peer's handler raised a vflink error → the same class with its message (rebuilt from the
  class names in the trailing metadata, never unpickled);
* UNAVAILABLE / DEADLINE_EXCEEDED → :class:`PeerUnavailable` naming the peer and host:port
  (this includes TLS handshakes that fail, e.g. an untrusted or mis-named certificate);
  RESOURCE_EXHAUSTED (the peer works on as many calls as it allows) → ``PeerUnavailable``,
  "busy";
* INVALID_ARGUMENT → :class:`ProtocolError` with the server's message;
* anything else (e.g. PERMISSION_DENIED: this party is not allowed to call that peer) →
  :class:`TransportError`.

Accounting mirrors the in-process transport: the request is counted (and recorded) as it is
sent, the reply once it arrived, both with ``payload_nbytes``. (A request refused by the
network or the peer's transport has no in-process counterpart; it is counted as sent.)
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import grpc
import grpc.experimental

from vflink.errors import ConfigError, PeerUnavailable, ProtocolError, TransportError, VflinkError
from vflink.protocol.boundary import mark_public
from vflink.protocol.channel import Channel
from vflink.protocol.messages import Message
from vflink.transport.accounting import TrafficCounter, Transcript
from vflink.transport.grpc._wire import (
    CALL,
    CODE_KEY,
    DEFAULT_CHUNK_BYTES,
    DEFAULT_DEADLINE_S,
    DEFAULT_MAX_MESSAGE_BYTES,
    ERROR_KEY,
    EXCHANGE,
    GRPC_FRAME_LIMIT,
    check_sizes,
    iter_chunks,
    read_chunks,
    remote_error,
)
from vflink.transport.grpc.serde import envelope_from_bytes, message_from_proto, message_to_proto
from vflink.transport.grpc.tls import TlsConfig, party_material

__all__ = ["GrpcChannel", "PeerAddress", "split_host_port"]

log = logging.getLogger(__name__)


def split_host_port(text: str) -> tuple[str, int]:
    """``"host:port"`` or ``"[v6addr]:port"`` → ``(host, port)`` (ConfigError if malformed)."""
    if not isinstance(text, str):
        raise ConfigError(f"an address must be a 'host:port' string, got {type(text).__name__}")
    host, sep, port = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit():
        raise ConfigError(f"address {text!r} must look like 'host:port' (e.g. '127.0.0.1:50051')")
    return host, int(port)


def _join(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclass(frozen=True)
class PeerAddress:
    """Where a peer listens. Use :meth:`parse` for ``"host:port"`` strings."""

    host: str
    port: int

    def __post_init__(self) -> None:
        problems = []
        if not isinstance(self.host, str) or not self.host or any(c.isspace() for c in self.host):
            problems.append(f"`host` must be a non-empty host name or IP address, "
                            f"got {self.host!r}")
        if isinstance(self.port, bool) or not isinstance(self.port, int) \
                or not 1 <= self.port <= 65535:
            problems.append(f"`port` must be an int in [1, 65535], got {self.port!r}")
        if problems:
            raise ConfigError("; ".join(problems), problems)

    @classmethod
    def parse(cls, text: str) -> PeerAddress:
        host, port = split_host_port(text)
        return cls(host, port)

    @property
    def target(self) -> str:
        """The gRPC target string, ``host:port``."""
        return _join(self.host, self.port)

    def __str__(self) -> str:
        return self.target


def _check_deadline(deadline_s: object) -> float:
    if isinstance(deadline_s, bool) or not isinstance(deadline_s, (int, float)) \
            or not 0 < deadline_s < float("inf"):
        raise ConfigError(f"`deadline_s` must be a finite number > 0, got {deadline_s!r}")
    return float(deadline_s)


class GrpcChannel(Channel):
    """A party's connection to its peers over gRPC, mutually authenticated with TLS.

    Args:
        name: this party's name; with TLS it must be the identity in ``tls``'s certificate.
        peers: where each peer listens (``PeerAddress`` or ``"host:port"``). The peer's
            certificate must name it: the peer name is pinned as the expected server identity.
        tls: this party's CA/certificate/key. ``None`` only together with ``insecure=True``.
        insecure: plaintext, unauthenticated connections, for local experiments only.
        deadline_s: deadline of every call, transfer of request and reply included.
        counter, transcript: accounting, as in :class:`~vflink.transport.InProcessHub` (a new
            counter by default); both directions of this channel's calls are counted here.
        chunk_bytes: payload bytes per gRPC message when streaming a large message.
        max_message_bytes: hard cap on one serialised request or reply.
    """

    def __init__(self, name: str, peers: Mapping[str, PeerAddress | str], tls: TlsConfig | None,
                 *, insecure: bool = False, deadline_s: float = DEFAULT_DEADLINE_S,
                 counter: TrafficCounter | None = None, transcript: Transcript | None = None,
                 chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> None:
        super().__init__(name)
        if not isinstance(name, str) or not name:
            raise ConfigError(f"channel `name` must be a non-empty party name, got {name!r}")
        self.deadline_s = _check_deadline(deadline_s)
        check_sizes(chunk_bytes, max_message_bytes)
        self.chunk_bytes = chunk_bytes
        self.max_message_bytes = max_message_bytes
        self.peers: dict[str, PeerAddress] = {
            peer: addr if isinstance(addr, PeerAddress) else PeerAddress.parse(addr)
            for peer, addr in peers.items()}
        self._credentials: grpc.ChannelCredentials | None = None
        material = party_material(name, tls, insecure=insecure, what="channel")
        if material is not None:
            self._credentials = grpc.ssl_channel_credentials(
                root_certificates=material.ca_pem, private_key=material.key_pem,
                certificate_chain=material.cert_pem)
        else:
            log.warning("party %r: plaintext gRPC channel: traffic is neither encrypted nor "
                        "authenticated; use this for local experiments only", name)
        self.insecure = insecure
        self.counter = counter if counter is not None else TrafficCounter()
        self.transcript = transcript
        self._lock = threading.Lock()
        self._channels: dict[str, grpc.Channel] = {}
        self._stubs: dict[str, tuple[Any, Any]] = {}
        self._closed = False

    # -- connections -----------------------------------------------------------------------

    def _stubs_for(self, peer: str) -> tuple[Any, Any]:
        with self._lock:
            if self._closed:
                raise TransportError(f"channel of party {self.name!r} is closed")
            stub = self._stubs.get(peer)
            if stub is None:
                target = self.peers[peer].target
                options: list[tuple[str, Any]] = [
                    ("grpc.max_send_message_length", GRPC_FRAME_LIMIT),
                    ("grpc.max_receive_message_length", GRPC_FRAME_LIMIT),
                    # Parties connect directly; an HTTP proxy from the environment must not
                    # silently sit between two organisations.
                    ("grpc.enable_http_proxy", 0),
                    # Read streamed replies in the calling thread: without it every call pays
                    # a thread hand-off, ~2 ms on loopback, several times the call itself.
                    (grpc.experimental.ChannelOptions.SingleThreadedUnaryStream, 1),
                    # A peer that starts late is retried within seconds, not gRPC's 2 min.
                    ("grpc.max_reconnect_backoff_ms", 5000),
                ]
                if self._credentials is not None:
                    # Pin the peer's identity: the server certificate must carry the peer
                    # name as DNS SAN, whatever host or IP we dial.
                    options.append(("grpc.ssl_target_name_override", peer))
                    channel = grpc.secure_channel(target, self._credentials, options=options)
                else:
                    channel = grpc.insecure_channel(target, options=options)
                stub = (channel.unary_stream(CALL), channel.stream_stream(EXCHANGE))
                self._channels[peer] = channel
                self._stubs[peer] = stub
            return stub

    def close(self) -> None:
        with self._lock:
            self._closed = True
            channels, self._channels, self._stubs = list(self._channels.values()), {}, {}
        for channel in channels:
            channel.close()

    def __enter__(self) -> GrpcChannel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- calls -----------------------------------------------------------------------------

    def _count(self, sender: str, receiver: str, message: Message) -> None:
        self.counter.add(sender, receiver, message)
        if self.transcript is not None:
            self.transcript.add(sender, receiver, message)

    def call(self, peer: str, message: Message) -> Message:
        if peer not in self.peers:
            raise PeerUnavailable(peer, f"no address configured for it (known peers: "
                                        f"{', '.join(sorted(self.peers)) or 'none'})")
        address = self.peers[peer]
        correlation_id = uuid.uuid4().hex
        data = message_to_proto(message, sender=self.name,
                                correlation_id=correlation_id).SerializeToString()
        if len(data) > self.max_message_bytes:
            raise ProtocolError(f"{message.kind} to {peer!r} is {len(data)} bytes on the wire, "
                                f"over the limit of {self.max_message_bytes} bytes")
        call_stub, exchange_stub = self._stubs_for(peer)
        # Counted as it is sent, like the in-process hub counts before delivering: with nested
        # calls (a handler calling a third party) a shared transcript keeps the same order.
        self._count(self.name, peer, message)
        chunks = iter_chunks(data, self.chunk_bytes)
        responses = None
        try:
            if len(data) <= self.chunk_bytes:
                responses = call_stub(next(chunks), timeout=self.deadline_s)
            else:
                responses = exchange_stub(chunks, timeout=self.deadline_s)
            raw = read_chunks(responses, self.max_message_bytes, f"reply from {peer!r}")
        except grpc.RpcError as err:
            raise self._translate(peer, address, message, err) from None
        except ProtocolError:
            if responses is not None:
                responses.cancel()
            raise
        envelope = envelope_from_bytes(raw)
        reply = message_from_proto(envelope)
        if envelope.sender != peer:
            raise ProtocolError(f"reply from {peer!r} claims to come from {envelope.sender!r}")
        if envelope.correlation_id != correlation_id:
            raise ProtocolError(f"reply from {peer!r} answers another call "
                                f"({envelope.correlation_id!r}, expected {correlation_id!r})")
        self._count(peer, self.name, reply)
        return reply

    def _hint(self, peer: str, details: str) -> str:
        # gRPC reports most TLS failures as a closed socket; say what to check.
        if "Hostname Verification" in details:
            return (f"the certificate of the server at that address does not name {peer!r}: "
                    "is the address right?")
        if self.insecure:
            return ("is the peer running there, and is it a plaintext server too "
                    "(insecure=True on both sides)?")
        return ("is the peer running there, does it use TLS, and do both parties have "
                "certificates from the same CA?")

    def _translate(self, peer: str, address: PeerAddress, message: Message,
                   err: grpc.RpcError) -> VflinkError:
        code: grpc.StatusCode | None = err.code() if hasattr(err, "code") else None
        details = (err.details() if hasattr(err, "details") else None) or ""
        trailing = dict(err.trailing_metadata() or ()) if hasattr(err, "trailing_metadata") \
            else {}
        chain = trailing.get(ERROR_KEY)
        if isinstance(chain, str):
            rebuilt = remote_error(chain, f"{details} (reported by peer {peer!r})")
            if rebuilt is not None:
                # the peer's boundary message: a party may pass it on to its own caller
                code = trailing.get(CODE_KEY)
                return mark_public(rebuilt, code if isinstance(code, str) else None)
        name = code.name if code is not None else "UNKNOWN"
        if code is grpc.StatusCode.DEADLINE_EXCEEDED:
            return PeerUnavailable(peer, f"no answer within the {self.deadline_s:g} s deadline "
                                         f"at {address} ({name}: {details})")
        if code is grpc.StatusCode.RESOURCE_EXHAUSTED:
            # the peer works on as many calls as its policy allows: not down, busy
            return PeerUnavailable(peer, f"busy at {address} ({name}: {details})")
        if code is grpc.StatusCode.UNAVAILABLE:
            return PeerUnavailable(peer, f"cannot connect at {address} ({name}: {details}); "
                                         f"{self._hint(peer, details)}")
        if code is grpc.StatusCode.INVALID_ARGUMENT:
            return ProtocolError(f"peer {peer!r} at {address} rejected {message.kind}: {details}")
        if code in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED):
            return TransportError(f"peer {peer!r} at {address} refused the call from "
                                  f"{self.name!r} ({name}): {details}")
        return TransportError(f"call to peer {peer!r} at {address} failed ({name}): {details}")
