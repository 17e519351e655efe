"""Server side of the gRPC transport: :class:`GrpcServer` serves one party's handler.

Every call is checked before its message is even read: the TLS client certificate must have been
issued by the federation's CA (enforced by the TLS handshake), must name one party consistently
(CN = DNS SAN), and that party must be in ``allowed_peers``; the sender claimed in the envelope
must then be that same party. Refusals end the call with PERMISSION_DENIED and are logged.

Handler calls are serialised by default: party state (models, optimisers, pending batches) is not
thread-safe. A handler with a true ``thread_safe`` attribute is called concurrently.

One request cannot take the party down, and one peer cannot take it from the others.
At most ``max_workers`` calls are worked on at once (a bounded pool of handler slots), and each
authenticated peer holds at most its share of them (``peer_calls``; by default an equal share
among the peers allowed to call), counted from the moment its call arrives, so one peer that
opens streams and sends nothing fills only its own share. A further call is refused at once with
RESOURCE_EXHAUSTED (the caller sees :class:`~vflink.errors.PeerUnavailable`, "busy") instead of
queueing without end. A streamed request takes a handler slot only once its first chunk has
arrived, and must then arrive at a minimum rate: no gap between its chunks (the first
included) longer than ``receive_timeout_s``, and all of it within that grace plus its announced
size at ``min_receive_bytes_per_s``; a request that trickles is cancelled and its thread
freed.

Calls to the serialised handler are handed over between peers in turn (:class:`FairLock`): a
peer with many calls waiting does not get the handler before a peer with one. A handler whose
``concurrent(message)`` says so (a party's set-protocol chunks, whose work touches only their own
session) runs beside the serialised ones, one such call per peer at a time, so a long chunk of
one peer delays no other peer's calls; the CPU is shared between peers by the system's
scheduler. A call waiting for its turn waits at most until its caller's deadline, and stops
waiting when the caller gives up. The handler runs inside a :func:`vflink._cancel.work_scope`
holding the caller's deadline and whether the caller is still there, so long loops stop at their
next :func:`~vflink._cancel.checkpoint` once the caller has gone (the work a message may cause is
the party's own limit, checked by the party). Worker threads beyond the slots are kept in reserve
for :class:`Health` requests, which the server answers itself, without the handler or its lock,
within milliseconds even while a maximal request runs.

Errors go back as gRPC statuses the client translates (:mod:`.channel`): a malformed or
oversized message → INVALID_ARGUMENT; a vflink error raised by the handler → its class names and
stable code in trailing metadata (a ProtocolError as INVALID_ARGUMENT, others
FAILED_PRECONDITION) with only its boundary message (:mod:`vflink.protocol.boundary`: which
check failed, never a value, a path or another exception's text); any other exception →
INTERNAL with an incident id. Full texts and traces stay in this party's log. The server keeps
serving after any of them.

The server counts nothing: the calling channel counts both directions of each call.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Iterator
from concurrent import futures
from typing import NoReturn

import grpc

from vflink._cancel import work_scope
from vflink.errors import Cancelled, ConfigError, ProtocolError, TransportError, VflinkError
from vflink.protocol.boundary import boundary_error, error_code
from vflink.protocol.channel import MessageHandler
from vflink.protocol.messages import Ack, Health, Message
from vflink.transport.grpc._wire import (
    CODE_KEY,
    DEFAULT_CHUNK_BYTES,
    DEFAULT_MAX_MESSAGE_BYTES,
    ERROR_KEY,
    GRPC_FRAME_LIMIT,
    ORIGIN_KEY,
    SERVICE,
    check_sizes,
    error_chain,
    iter_chunks,
    pb,
    read_chunks,
)
from vflink.transport.grpc.channel import split_host_port
from vflink.transport.grpc.serde import envelope_from_bytes, message_from_proto, message_to_proto
from vflink.transport.grpc.tls import TlsConfig, party_material

__all__ = ["FairLock", "GrpcServer", "PeerLanes"]

log = logging.getLogger(__name__)

# gRPC carries status details in a header; keep them well below header size limits.
_MAX_DETAILS = 4000
#: Worker threads kept beside the handler slots: they answer Health requests and refuse
#: calls beyond the slots, so neither waits behind a long call.
RESERVED_WORKERS = 2
#: How often a call waiting for the serialised handler checks that its caller still waits.
_WAIT_POLL_S = 0.2


def _clip(text: str) -> str:
    return text if len(text) <= _MAX_DETAILS else text[:_MAX_DETAILS] + " [...]"


class FairLock:
    """A lock handed over between peers in turn.

    A waiter takes a ticket (:meth:`enter`) and waits for it (:meth:`wait`, which may be called
    again after a timeout without losing its place). When the holder releases, the lock goes to
    the first waiting ticket of the *next* peer in rotation after the peer that held it, so a
    peer with many calls queued gets one turn per round like a peer with one. Within a peer,
    tickets are served in arrival order.
    """

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._queues: dict[str, deque[object]] = {}  # insertion order = rotation order
        self._owner: object | None = None
        self._last: str | None = None
        self._held = False

    def enter(self, peer: str) -> object:
        ticket = object()
        with self._cv:
            self._queues.setdefault(peer, deque()).append(ticket)
            if not self._held:
                self._hand_over()
        return ticket

    def wait(self, ticket: object, timeout: float) -> bool:
        """True once ``ticket`` holds the lock (within ``timeout`` seconds)."""
        with self._cv:
            return self._cv.wait_for(lambda: self._owner is ticket, timeout=max(0.0, timeout))

    def leave(self, ticket: object) -> None:
        """Give up a ticket that is still waiting (its caller went away)."""
        with self._cv:
            if self._owner is ticket:  # it was handed the lock in the meantime: pass it on
                self.release_locked()
                return
            for peer, queue in list(self._queues.items()):
                if ticket in queue:
                    queue.remove(ticket)
                    if not queue:
                        del self._queues[peer]

    def release(self) -> None:
        with self._cv:
            self.release_locked()

    def release_locked(self) -> None:
        self._owner = None
        self._held = False
        self._hand_over()

    def _hand_over(self) -> None:
        if not self._queues:
            return
        peers = list(self._queues)
        start = 0
        if self._last in peers:  # the peer after the last holder, in rotation
            start = (peers.index(self._last) + 1) % len(peers)
        peer = peers[start]
        queue = self._queues[peer]
        self._owner = queue.popleft()
        if not queue:
            del self._queues[peer]
        else:  # this peer goes to the back of the rotation
            self._queues[peer] = self._queues.pop(peer)
        self._last = peer
        self._held = True
        self._cv.notify_all()


class PeerLanes:
    """One lane per peer: at most one concurrent call of each peer runs at a time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lanes: dict[str, threading.Lock] = {}

    def lane(self, peer: str) -> threading.Lock:
        with self._lock:
            return self._lanes.setdefault(peer, threading.Lock())


class GrpcServer:
    """Serves ``handler`` (one party) to the peers in ``allowed_peers``.

    Args:
        name: this party's name; with TLS it must be the identity in ``tls``'s certificate.
        handler: answers messages (``handle(sender, message) -> Message``).
        listen: ``"host:port"`` to bind; port 0 picks a free port (see :attr:`port`).
        tls: this party's CA/certificate/key; ``None`` only together with ``insecure=True``.
        allowed_peers: party names that may call; anyone else is refused.
        insecure: plaintext and unauthenticated (the envelope's sender is taken on trust),
            for local experiments only.
        max_message_bytes: hard cap on one serialised request or reply.
        chunk_bytes: payload bytes per gRPC message when streaming a large reply.
        max_workers: calls worked on at once (handler slots; a streamed call takes one when
            its first chunk has arrived); a further call is refused as busy. The server runs
            :data:`RESERVED_WORKERS` more threads for Health requests and refusals.
        thread_safe: call the handler concurrently; default: the handler's ``thread_safe``
            attribute, else False (calls are serialised, except those the handler's
            ``concurrent(message)`` names, one per peer at a time).
        peer_calls: calls one peer may have in progress at once (arriving, waiting or worked
            on); ``None``: an equal share of ``max_workers`` among ``allowed_peers``.
        receive_timeout_s: a streamed request's chunks (its first one included) must each
            arrive within this of the one before.
        min_receive_bytes_per_s: ... and the whole request at this rate at least.
    """

    def __init__(self, name: str, handler: MessageHandler, listen: str, tls: TlsConfig | None,
                 allowed_peers: Collection[str], *, insecure: bool = False,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
                 chunk_bytes: int = DEFAULT_CHUNK_BYTES, max_workers: int = 4,
                 thread_safe: bool | None = None, peer_calls: int | None = None,
                 receive_timeout_s: float = 10.0,
                 min_receive_bytes_per_s: float = 256 * 1024) -> None:
        if not isinstance(name, str) or not name:
            raise ConfigError(f"server `name` must be a non-empty party name, got {name!r}")
        if not callable(getattr(handler, "handle", None)):
            raise ConfigError(f"server `handler` must have a handle(sender, message) method, "
                              f"got {type(handler).__name__}")
        self._host, port = split_host_port(listen)
        if not 0 <= port <= 65535:
            raise ConfigError(f"listen port must be in [0, 65535], got {port}")
        if isinstance(allowed_peers, str) or not all(
                isinstance(p, str) and p for p in allowed_peers):
            raise ConfigError(f"`allowed_peers` must be a collection of party names, "
                              f"got {allowed_peers!r}")
        if not allowed_peers:
            raise ConfigError(f"server {name!r}: `allowed_peers` is empty, nobody could call")
        check_sizes(chunk_bytes, max_message_bytes)
        if isinstance(max_workers, bool) or not isinstance(max_workers, int) or max_workers < 1:
            raise ConfigError(f"`max_workers` must be an int >= 1, got {max_workers!r}")
        if peer_calls is not None and (isinstance(peer_calls, bool)
                                       or not isinstance(peer_calls, int) or peer_calls < 1):
            raise ConfigError(f"`peer_calls` must be an int >= 1 or None, got {peer_calls!r}")
        for label, value in (("receive_timeout_s", receive_timeout_s),
                             ("min_receive_bytes_per_s", min_receive_bytes_per_s)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ConfigError(f"`{label}` must be a number > 0, got {value!r}")
        self._credentials: grpc.ServerCredentials | None = None
        material = party_material(name, tls, insecure=insecure, what="server")
        if material is not None:
            # require_client_auth: the handshake itself rejects clients without a certificate
            # from our CA; the identity check per call below does the rest.
            self._credentials = grpc.ssl_server_credentials(
                [(material.key_pem, material.cert_pem)], root_certificates=material.ca_pem,
                require_client_auth=True)
        self.name = name
        self.handler = handler
        self.listen = listen
        self.allowed_peers = frozenset(allowed_peers)
        self.insecure = insecure
        self.max_message_bytes = max_message_bytes
        self.chunk_bytes = chunk_bytes
        self.max_workers = max_workers
        self.thread_safe = bool(getattr(handler, "thread_safe", False)) \
            if thread_safe is None else thread_safe
        concurrent = getattr(handler, "concurrent", None)
        self._concurrent: Callable[[Message], bool] | None = \
            concurrent if callable(concurrent) else None
        self.peer_calls = peer_calls if peer_calls is not None else \
            max(1, max_workers // max(1, len(self.allowed_peers)))
        self.receive_timeout_s = float(receive_timeout_s)
        self.min_receive_bytes_per_s = float(min_receive_bytes_per_s)
        self._requested_port = port
        self._handler_lock = FairLock()
        self._lanes = PeerLanes()
        self._slots = threading.BoundedSemaphore(max_workers)
        self._count_lock = threading.Lock()
        self._active = 0  # calls holding a slot
        self._handling = 0  # calls inside the handler
        self._per_peer: dict[str, int] = {}  # calls of each peer in progress (any phase)
        self._server: grpc.Server | None = None
        self._port: int | None = None

    # -- lifecycle -------------------------------------------------------------------------

    @property
    def port(self) -> int:
        """The bound port (after :meth:`start`), also when ``listen`` asked for port 0."""
        if self._port is None:
            raise TransportError(f"server {self.name!r} is not started")
        return self._port

    @property
    def address(self) -> str:
        """``host:port`` that peers can use to reach this server (after :meth:`start`)."""
        return f"[{self._host}]:{self.port}" if ":" in self._host else f"{self._host}:{self.port}"

    def start(self) -> GrpcServer:
        if self._server is not None:
            raise TransportError(f"server {self.name!r} is already started")
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=self.max_workers + RESERVED_WORKERS,
                                       thread_name_prefix=f"vflink-{self.name}"),
            # calls beyond the threads queue in gRPC for a moment (a refusal or a health
            # answer frees a thread in milliseconds); far beyond, gRPC refuses them itself
            maximum_concurrent_rpcs=4 * (self.max_workers + RESERVED_WORKERS),
            handlers=[grpc.method_handlers_generic_handler(
                SERVICE, {"Call": grpc.unary_stream_rpc_method_handler(self._call),
                          "Exchange": grpc.stream_stream_rpc_method_handler(self._exchange)})],
            options=[
                ("grpc.max_send_message_length", GRPC_FRAME_LIMIT),
                ("grpc.max_receive_message_length", GRPC_FRAME_LIMIT),
                # Without this, Linux lets two servers share a port silently: a second party
                # would steal half the connections instead of failing to start.
                ("grpc.so_reuseport", 0),
            ])
        try:
            if self._credentials is not None:
                port = server.add_secure_port(self.listen, self._credentials)
            else:
                log.warning("party %r: plaintext gRPC server on %s: callers are not "
                            "authenticated and traffic is not encrypted; use this for local "
                            "experiments only", self.name, self.listen)
                port = server.add_insecure_port(self.listen)
        except RuntimeError as exc:
            raise TransportError(f"server {self.name!r} cannot listen on {self.listen}: "
                                 f"{exc}") from exc
        if not port:
            raise TransportError(f"server {self.name!r} cannot listen on {self.listen} "
                                 "(address in use or not local?)")
        server.start()
        self._server, self._port = server, port
        log.info("party %r serving on %s (peers: %s)", self.name, self.address,
                 ", ".join(sorted(self.allowed_peers)))
        return self

    def stop(self, grace: float | None = 1.0) -> None:
        """Stop serving; calls in flight get ``grace`` seconds to finish."""
        server, self._server = self._server, None
        if server is not None:
            server.stop(grace).wait()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the server stops (True) or ``timeout`` passes (False)."""
        server = self._server
        if server is None:
            return True
        return bool(server.wait_for_termination(timeout))

    def __enter__(self) -> GrpcServer:
        if self._server is None:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- calls -----------------------------------------------------------------------------

    def _refuse(self, context: grpc.ServicerContext, who: str, reason: str) -> NoReturn:
        log.warning("party %r refused a call from %s (%s): %s", self.name, who, context.peer(),
                    reason)
        context.abort(grpc.StatusCode.PERMISSION_DENIED, reason)
        raise TransportError("grpc's context.abort returned")  # it raises  # pragma: no cover

    def _fail(self, context: grpc.ServicerContext, code: grpc.StatusCode, exc: VflinkError,
              origin: str) -> NoReturn:
        context.set_trailing_metadata(((ERROR_KEY, error_chain(exc)), (ORIGIN_KEY, origin),
                                       (CODE_KEY, error_code(exc))))
        context.abort(code, _clip(str(exc)))
        raise TransportError("grpc's context.abort returned")  # it raises  # pragma: no cover

    def _authenticate(self, context: grpc.ServicerContext) -> str | None:
        """The caller's party name from its TLS certificate (None when insecure)."""
        if self.insecure:
            return None
        auth = context.auth_context()
        if auth.get("transport_security_type") != [b"ssl"]:
            self._refuse(context, "an unauthenticated caller", "the connection is not TLS")
        cns = auth.get("x509_common_name", [])
        if len(cns) != 1:
            self._refuse(context, "an unidentified caller",
                         "the client certificate must carry exactly one common name")
        identity = cns[0].decode("utf-8", "replace")
        if cns[0] not in auth.get("x509_subject_alternative_name", []):
            self._refuse(context, repr(identity), "the client certificate's common name is not "
                                                  "among its subject alternative names")
        if identity not in self.allowed_peers:
            self._refuse(context, repr(identity),
                         f"party {identity!r} is not allowed to call {self.name!r}")
        return identity

    def _decode(self, envelope: object) -> Message:
        try:
            return message_from_proto(envelope)
        except ProtocolError:
            raise
        except Exception as exc:  # a decoding failure serde did not foresee: never a trace
            log.exception("party %r could not decode a request", self.name)
            raise ProtocolError("malformed request: it could not be decoded") from exc

    # -- load --------------------------------------------------------------------------------

    def _arrive(self, context: grpc.ServicerContext, peer: str) -> None:
        """Count a call of ``peer`` from its first moment, or refuse it at once when the peer
        already has its share of calls in progress (whatever the other peers do)."""
        with self._count_lock:
            held = self._per_peer.get(peer, 0)
            if held < self.peer_calls:
                self._per_peer[peer] = held + 1
                return
        log.warning("party %r: %s already has %d calls in progress (its share): refused a call "
                    "(%s)", self.name, peer, held, context.peer())
        context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                      f"party {self.name!r} is busy for {peer}: {held} of its calls are in "
                      f"progress (its share of {self.max_workers}, "
                      "policy.max_concurrent_calls); retry later")

    def _depart(self, peer: str) -> None:
        with self._count_lock:
            left = self._per_peer.get(peer, 1) - 1
            if left > 0:
                self._per_peer[peer] = left
            else:
                self._per_peer.pop(peer, None)

    def _enter(self, context: grpc.ServicerContext, who: str) -> None:
        """Take a handler slot, or refuse the call at once as busy."""
        if not self._slots.acquire(blocking=False):
            log.warning("party %r is busy (%d calls in progress): refused a call from %s (%s)",
                        self.name, self.max_workers, who, context.peer())
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                          f"party {self.name!r} is busy: {self.max_workers} calls in progress "
                          "(its limit, policy.max_concurrent_calls); retry later")
        with self._count_lock:
            self._active += 1

    def _leave(self) -> None:
        with self._count_lock:
            self._active -= 1
        self._slots.release()

    def health(self) -> Ack:
        """This server's answer to a :class:`Health` request: its load, no party state."""
        with self._count_lock:
            active, handling = self._active, self._handling
        return Ack(info={"busy": float(handling > 0), "active": float(active),
                         "slots": float(self.max_workers)})

    # -- calls -----------------------------------------------------------------------------

    def _call(self, chunk: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
        identity = self._authenticate(context)
        # A single-chunk request is already here: a Health request is answered from the
        # reserved threads without a slot; anything else counts against its peer's share and
        # takes a slot first.
        envelope, sender, message = self._receive(iter((chunk,)), identity, context)
        if isinstance(message, Health):
            yield from self._reply(self.health(), sender, envelope, context)
            return
        self._arrive(context, sender)
        try:
            self._enter(context, repr(sender))
            try:
                reply = self._handle(sender, message, context)
            finally:
                self._leave()
        finally:
            self._depart(sender)
        yield from self._reply(reply, sender, envelope, context)

    def _exchange(self, chunks: Iterator[bytes], context: grpc.ServicerContext
                  ) -> Iterator[bytes]:
        identity = self._authenticate(context)
        # A streamed request holds its thread while it transfers: it counts against its
        # peer's share at once, takes a slot only once its first chunk is here, and must keep
        # arriving at the minimum rate (a watchdog cancels it otherwise).
        peer = identity if identity else "an unauthenticated caller"
        self._arrive(context, peer)
        try:
            watch = _ReceiveWatch(self, context, peer)
            try:
                stream = watch.chunks(chunks)
                try:
                    first = next(stream, None)
                except grpc.RpcError:  # cancelled while waiting (by the watchdog or caller)
                    first = None
                    if not watch.expired:
                        raise
                if watch.expired:
                    self._receive_failed(context, watch)
                self._enter(context, repr(peer))
                try:
                    envelope, sender, message = self._receive(
                        stream if first is None else _prepend(first, stream), identity,
                        context, watch)
                    watch.stop()
                    reply = self.health() if isinstance(message, Health) \
                        else self._handle(sender, message, context)
                finally:
                    self._leave()
            finally:
                watch.stop()
        finally:
            self._depart(peer)
        yield from self._reply(reply, sender, envelope, context)

    def _receive_failed(self, context: grpc.ServicerContext, watch: _ReceiveWatch) -> NoReturn:
        log.warning("party %r: a request from %s (%s) did not arrive at the minimum rate "
                    "(each chunk within %g s, all at %g bytes/s): cancelled", self.name,
                    watch.peer, context.peer(), self.receive_timeout_s,
                    self.min_receive_bytes_per_s)
        context.abort(grpc.StatusCode.DEADLINE_EXCEEDED,
                      f"party {self.name!r}: the request did not arrive in time (each "
                      f"chunk within {self.receive_timeout_s:g} s, all of it at "
                      f"{self.min_receive_bytes_per_s:g} bytes/s at least)")
        raise TransportError("grpc's context.abort returned")  # it raises  # pragma: no cover

    def _receive(self, chunks: Iterator[bytes], identity: str | None,
                 context: grpc.ServicerContext, watch: _ReceiveWatch | None = None
                 ) -> tuple[object, str, Message]:
        """Read, authorise and decode one request: (envelope, sender, message)."""
        try:
            envelope = envelope_from_bytes(read_chunks(
                chunks, self.max_message_bytes, f"request to {self.name!r}"))
            sender = envelope.sender
            if identity is not None and sender != identity:
                self._refuse(context, repr(identity),
                             f"the message claims to come from {sender!r}, but the caller's "
                             f"certificate identifies {identity!r}")
            if identity is None and sender not in self.allowed_peers:
                self._refuse(context, repr(sender),
                             f"party {sender!r} is not allowed to call {self.name!r}")
            message = self._decode(envelope)
        except grpc.RpcError:
            # the request stream was cancelled under us: by the watchdog (say why) or by the
            # caller (nothing to answer)
            if watch is not None and watch.expired:
                self._receive_failed(context, watch)
            raise
        except ProtocolError as exc:
            if watch is not None and watch.expired:
                self._receive_failed(context, watch)
            log.warning("party %r rejected a malformed request from %s (%s): %s", self.name,
                        identity or "?", context.peer(), exc)
            self._fail(context, grpc.StatusCode.INVALID_ARGUMENT, exc, "transport")
        return envelope, sender, message

    def _reply(self, reply: Message, sender: str, envelope: object,
               context: grpc.ServicerContext) -> Iterator[bytes]:
        try:
            data = message_to_proto(reply, sender=self.name,
                                    correlation_id=envelope.correlation_id  # type: ignore[attr-defined]
                                    ).SerializeToString()
            if len(data) > self.max_message_bytes:
                raise ProtocolError(f"the reply {reply.kind} of {self.name!r} is {len(data)} "
                                    f"bytes, over the limit of {self.max_message_bytes}")
        except ProtocolError as exc:
            log.error("party %r cannot send its reply to %r: %s", self.name, sender, exc)
            self._fail(context, grpc.StatusCode.INTERNAL, exc, "handler")
        yield from iter_chunks(data, self.chunk_bytes)

    def _gave_up(self, context: grpc.ServicerContext) -> float | None:
        """Abort a call whose caller gave up while it waited; else its remaining time."""
        remaining = context.time_remaining()
        if not context.is_active() or (remaining is not None and remaining <= 0):
            # A call whose caller gave up (deadline, cancel) while it queued must not be
            # applied now: the caller treats it as failed and may retry it.
            context.abort(grpc.StatusCode.CANCELLED, "the caller gave up before the call ran")
        return remaining

    def _acquire_handler(self, context: grpc.ServicerContext, peer: str) -> None:
        """Wait for the serialised handler, in turn with the other peers, while the caller
        waits (at most its deadline)."""
        ticket = self._handler_lock.enter(peer)
        try:
            while True:
                remaining = self._gave_up(context)
                wait = _WAIT_POLL_S if remaining is None else min(_WAIT_POLL_S, remaining)
                if self._handler_lock.wait(ticket, max(wait, 0.001)):
                    return
        except BaseException:
            self._handler_lock.leave(ticket)
            raise

    def _acquire_lane(self, context: grpc.ServicerContext, lane: threading.Lock) -> None:
        """Wait for the peer's own lane (its previous concurrent call to finish)."""
        while True:
            remaining = self._gave_up(context)
            wait = _WAIT_POLL_S if remaining is None else min(_WAIT_POLL_S, remaining)
            if lane.acquire(timeout=max(wait, 0.001)):
                return

    def _handle(self, sender: str, message: Message, context: grpc.ServicerContext) -> Message:
        concurrent = self._concurrent is not None and bool(self._concurrent(message))
        serialised = not self.thread_safe and not concurrent
        lane = self._lanes.lane(sender) if concurrent and not self.thread_safe else None
        if serialised:
            self._acquire_handler(context, sender)
        elif lane is not None:
            self._acquire_lane(context, lane)
        try:
            if not context.is_active():
                context.abort(grpc.StatusCode.CANCELLED, "the caller gave up before the call ran")
            started = time.monotonic()
            with self._count_lock:
                self._handling += 1
            try:
                # the caller's deadline is the call's work limit; long loops check it and
                # whether the caller still waits (vflink._cancel.checkpoint)
                with work_scope(limit_s=context.time_remaining(), is_active=context.is_active,
                                what=f"{message.kind} from {sender!r}"):
                    reply = self.handler.handle(sender, message)
            except Exception as exc:
                if isinstance(exc, Cancelled):
                    log.warning("party %r stopped work on %s from %r after %.1f s: %s",
                                self.name, message.kind, sender, time.monotonic() - started, exc)
                    context.abort(grpc.StatusCode.CANCELLED, "the caller gave up; the work "
                                                             "was stopped")
                if isinstance(exc, VflinkError):
                    log.warning("party %r: handler failed on %s from %r: %s", self.name,
                                message.kind, sender, exc)
                # Only the boundary message leaves (a party's handler already reduced it;
                # another handler's error is reduced here); an unexpected exception's trace
                # is logged with its incident id.
                public = boundary_error(exc, self.name, message.kind)
                if not isinstance(exc, VflinkError):
                    code = grpc.StatusCode.INTERNAL
                elif isinstance(exc, ProtocolError):
                    code = grpc.StatusCode.INVALID_ARGUMENT
                else:
                    code = grpc.StatusCode.FAILED_PRECONDITION
                self._fail(context, code, public, "handler")
            finally:
                with self._count_lock:
                    self._handling -= 1
        finally:
            if serialised:
                self._handler_lock.release()
            elif lane is not None:
                lane.release()
        if not isinstance(reply, Message):
            self._fail(context, grpc.StatusCode.INTERNAL,
                       ProtocolError(f"party {self.name!r} answered {type(reply).__name__}, "
                                     "which is not a protocol message"), "handler")
        return reply


def _prepend(first: bytes, rest: Iterator[bytes]) -> Iterator[bytes]:
    yield first
    yield from rest


class _ReceiveWatch:
    """The minimum rate of one streamed request: a timer cancels the call when no chunk has
    arrived for the server's ``receive_timeout_s`` (the first one included), or the whole
    request has not arrived within that grace plus its announced size at
    ``min_receive_bytes_per_s``."""

    def __init__(self, server: GrpcServer, context: grpc.ServicerContext, peer: str) -> None:
        self.server, self.context, self.peer = server, context, peer
        self.expired = False
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self._stopped = False
        self._last = time.monotonic()  # when the last chunk arrived (or the call began)
        self._deadline = self._last + server.receive_timeout_s
        self._schedule()

    def _due(self) -> float:
        """The earlier of the idle limit and the whole request's limit; it only moves later
        (chunks arrive, the first one fixes the request's limit), so one timer, re-set when it
        fires early, serves the whole call: no thread per chunk."""
        return min(self._deadline, self._last + self.server.receive_timeout_s)

    def _schedule(self) -> None:
        with self._lock:
            if self._stopped:
                return
            self._timer = threading.Timer(max(0.0, self._due() - time.monotonic()),
                                          self._check)
            self._timer.daemon = True
            self._timer.start()

    def _check(self) -> None:
        if time.monotonic() >= self._due():
            self._expire()
        else:
            self._schedule()

    def _expire(self) -> None:
        self.expired = True
        self.context.cancel()

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

    def chunks(self, chunks: Iterator[bytes]) -> Iterator[bytes]:
        """``chunks``, each one's arrival noted for the timer (the first fixes the whole
        request's limit from its announced size)."""
        for index, raw in enumerate(chunks):
            if index == 0:
                try:
                    total = int(pb.Chunk.FromString(raw).total_size)
                except Exception:  # read_chunks refuses it with its own message
                    total = 0
                self._deadline = time.monotonic() + self.server.receive_timeout_s \
                    + total / self.server.min_receive_bytes_per_s
            self._last = time.monotonic()
            yield raw
