"""The gRPC transport over loopback (127.0.0.1 only, ports picked by the OS), with mutual TLS."""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import torch

from vflink.errors import (
    ConfigError,
    DataError,
    PeerUnavailable,
    ProtocolError,
    TransportError,
    UnknownNameError,
    VflinkError,
)
from vflink.protocol import (
    PROTOCOL_VERSION,
    Ack,
    Backward,
    Embeddings,
    Forward,
    Hello,
    Message,
    Snapshot,
)
from vflink.transport import InProcessHub, TrafficCounter, Transcript
from vflink.transport.grpc import (
    GrpcChannel,
    GrpcServer,
    PeerAddress,
    TlsConfig,
    create_dev_pki,
    load_tls,
    message_to_proto,
)
from vflink.transport.grpc._wire import CALL, EXCHANGE, ORIGIN_KEY, pb

pytestmark = pytest.mark.network

LOOPBACK = "127.0.0.1"
MiB = 1024 * 1024


class Secondary:
    """Answers like a secondary party: embeddings for Forward, Ack otherwise."""

    def __init__(self, width: int = 32) -> None:
        self.width = width
        self.seen: list[tuple[str, str]] = []

    def handle(self, sender: str, message: Message) -> Message:
        self.seen.append((sender, message.kind))
        if isinstance(message, Hello):
            return Hello(party="bank", role="secondary")
        if isinstance(message, Forward):
            gen = torch.Generator().manual_seed(message.batch_id)
            emb = torch.randn(len(message.rows), self.width, generator=gen)
            return Embeddings(batch_id=message.batch_id, embeddings=emb,
                              inverse=np.arange(len(message.rows), dtype=np.int64))
        if isinstance(message, Backward):
            return Ack(info={"grad_norm": float(message.grad.norm())})
        if isinstance(message, Snapshot):
            raise DataError(f"column 'income' has text in row 7 ({message.tag})")
        return Ack()


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("pki")
    create_dev_pki(d, ["primary", "bank", "coordinator", "intruder"])
    create_dev_pki(d / "other", ["primary"])
    return d


@pytest.fixture
def serve(pki: Path) -> Iterator[Callable[..., GrpcServer]]:
    servers: list[GrpcServer] = []

    def start(handler: Any, *, name: str = "bank", allowed: tuple[str, ...] = ("primary",),
              **kwargs: Any) -> GrpcServer:
        tls = None if kwargs.get("insecure") else TlsConfig.for_party(pki, name)
        server = GrpcServer(name, handler, f"{LOOPBACK}:0", tls, set(allowed), **kwargs)
        servers.append(server)
        return server.start()

    yield start
    for server in servers:
        server.stop(grace=None)


@pytest.fixture
def connect(pki: Path) -> Iterator[Callable[..., GrpcChannel]]:
    channels: list[GrpcChannel] = []

    def open_(server: GrpcServer | int, *, name: str = "primary", peer: str = "bank",
              tls: TlsConfig | None = None, **kwargs: Any) -> GrpcChannel:
        port = server if isinstance(server, int) else server.port
        if tls is None and not kwargs.get("insecure"):
            tls = TlsConfig.for_party(pki, name)
        channel = GrpcChannel(name, {peer: PeerAddress(LOOPBACK, port)}, tls, **kwargs)
        channels.append(channel)
        return channel

    yield open_
    for channel in channels:
        channel.close()


def exchange(channel: Any) -> list[Message]:
    """The same little training-like exchange, over any channel."""
    rows = np.array([3, 1, 4, 1, 5], dtype=np.int64)
    return [
        channel.request("bank", Hello(party="primary", role="primary"), Hello),
        channel.request("bank", Forward(batch_id=7, rows=rows, train=True), Embeddings),
        channel.request("bank", Backward(batch_id=7, grad=torch.ones(5, 32)), Ack),
    ]


def test_mtls_call_counts_like_in_process(serve: Any, connect: Any) -> None:
    hub = InProcessHub(transcript=Transcript())
    hub.register("bank", Secondary())
    expected = exchange(hub.channel("primary"))

    handler = Secondary()
    server = serve(handler)
    channel = connect(server, transcript=Transcript(), counter=TrafficCounter())
    got = exchange(channel)

    assert handler.seen == [("primary", "hello"), ("primary", "forward"),
                            ("primary", "backward")]
    assert got[0] == expected[0]
    assert torch.equal(got[1].embeddings, expected[1].embeddings)  # type: ignore[attr-defined]
    assert got[2] == expected[2]
    assert channel.counter.snapshot() == hub.counter.snapshot()
    assert channel.counter.snapshot()["bank->primary"]["bytes"] > 5 * 32 * 4
    assert [(r.sender, r.receiver, r.message.kind) for r in channel.transcript.records] == \
        [(r.sender, r.receiver, r.message.kind) for r in hub.transcript.records]  # type: ignore[union-attr]


def test_large_messages_are_streamed_in_chunks(serve: Any, connect: Any) -> None:
    server = serve(Secondary(width=6 * MiB // 4 // 1024))  # 1024 rows -> 6 MiB of float32
    channel = connect(server)
    reply = channel.request("bank", Forward(batch_id=1, rows=np.arange(1024), train=False),
                            Embeddings)
    assert reply.embeddings.shape == (1024, 1536) and reply.embeddings.nbytes == 6 * MiB
    gen = torch.Generator().manual_seed(1)
    assert torch.equal(reply.embeddings, torch.randn(1024, 1536, generator=gen))
    big_grad = torch.full((1024, 1536), 0.5)  # and a 6 MiB request
    ack = channel.request("bank", Backward(batch_id=1, grad=big_grad), Ack)
    assert ack.info["grad_norm"] == pytest.approx(float(big_grad.norm()))
    snap = channel.counter.snapshot()
    assert snap["bank->primary"]["bytes"] > 6 * MiB and snap["primary->bank"]["bytes"] > 6 * MiB


def test_oversized_messages_are_refused_and_the_server_keeps_serving(
        serve: Any, connect: Any) -> None:
    server = serve(Secondary(), max_message_bytes=MiB)
    channel = connect(server)
    with pytest.raises(ProtocolError, match=r"exceeds the limit of 1048576 bytes"):
        channel.call("bank", Backward(batch_id=1, grad=torch.zeros(2 * MiB // 4)))
    with pytest.raises(ProtocolError, match="reply .* over the limit"):  # reply too big to send
        channel.call("bank", Forward(batch_id=1, rows=np.arange(9000), train=False))
    small = connect(server, max_message_bytes=4096)
    with pytest.raises(ProtocolError, match="over the limit of 4096 bytes"):  # never sent
        small.call("bank", Backward(batch_id=1, grad=torch.zeros(2048)))
    with pytest.raises(ProtocolError, match="reply from 'bank'.*exceeds the limit of 4096"):
        small.call("bank", Forward(batch_id=1, rows=np.arange(64), train=False))
    assert isinstance(channel.call("bank", Hello(party="primary", role="primary")), Hello)


def test_certificate_from_another_ca_is_refused(serve: Any, connect: Any, pki: Path,
                                                tmp_path: Path) -> None:
    server = serve(Secondary())
    # The intruder trusts our CA (so it would accept the server) but presents a certificate
    # from its own CA, for a name that is allowed.
    both = tmp_path / "both.pem"
    both.write_bytes((pki / "ca.pem").read_bytes() + (pki / "other" / "ca.pem").read_bytes())
    foreign = TlsConfig(ca=both, cert=pki / "other" / "primary.pem",
                        key=pki / "other" / "primary.key")
    channel = connect(server, tls=foreign, deadline_s=5)
    with pytest.raises(TransportError, match=r"'bank'.*127\.0\.0\.1"):
        channel.call("bank", Hello(party="primary", role="primary"))
    assert isinstance(connect(server).call("bank", Hello(party="primary", role="primary")), Hello)


def test_party_not_allowed_is_refused_and_logged(serve: Any, connect: Any,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    handler = Secondary()
    server = serve(handler)
    channel = connect(server, name="intruder")
    with caplog.at_level(logging.WARNING, logger="vflink.transport.grpc"):
        with pytest.raises(TransportError, match="refused the call.*PERMISSION_DENIED.*"
                                                 "'intruder' is not allowed to call 'bank'"):
            channel.call("bank", Hello(party="intruder", role="primary"))
    assert "refused a call from 'intruder'" in caplog.text
    assert handler.seen == []
    assert "bank->intruder" not in channel.counter.snapshot()  # sent, but no reply


def test_server_identity_is_pinned(serve: Any, connect: Any) -> None:
    server = serve(Secondary())
    # The bank's server answers at this address, but the client expects the coordinator there.
    channel = connect(server, peer="coordinator", deadline_s=5)
    with pytest.raises(PeerUnavailable, match="'coordinator'.*127.0.0.1"):
        channel.call("coordinator", Hello(party="primary", role="primary"))


def raw_channel(pki: Path, server: GrpcServer, name: str = "primary") -> grpc.Channel:
    m = load_tls(TlsConfig.for_party(pki, name))
    creds = grpc.ssl_channel_credentials(m.ca_pem, m.key_pem, m.cert_pem)
    return grpc.secure_channel(f"{LOOPBACK}:{server.port}", creds,
                               options=[("grpc.ssl_target_name_override", server.name)])


def chunk(data: bytes, total: int | None = None) -> bytes:
    return pb.Chunk(total_size=len(data) if total is None else total,  # type: ignore[no-any-return]
                    data=data).SerializeToString()


def test_sender_must_match_the_certificate(serve: Any, pki: Path,
                                           caplog: pytest.LogCaptureFixture) -> None:
    handler = Secondary()
    server = serve(handler, allowed=("primary", "coordinator"))
    forged = message_to_proto(Hello(party="coordinator", role="coordinator"),
                              sender="coordinator").SerializeToString()
    with raw_channel(pki, server) as ch:
        with pytest.raises(grpc.RpcError) as info:
            list(ch.unary_stream(CALL)(chunk(forged), timeout=5))
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "claims to come from 'coordinator'" in info.value.details()
    assert "claims to come from 'coordinator'" in caplog.text
    assert handler.seen == []


def _envelope_bytes(kind: str, **fields: Callable[[Any], None]) -> bytes:
    env = pb.Envelope(protocol_version=PROTOCOL_VERSION, kind=kind, sender="primary")
    for name, fill in fields.items():
        field = env.fields.add()
        field.name = name
        fill(field.value)
    return env.SerializeToString()  # type: ignore[no-any-return]


def _tensor(dtype: str, shape: tuple[int, ...], data: bytes) -> Callable[[Any], None]:
    def fill(v: Any) -> None:
        v.tensor.dtype = dtype
        v.tensor.shape.extend(shape)
        v.tensor.data = data
    return fill


def _int(n: int) -> Callable[[Any], None]:
    return lambda v: setattr(v, "int_value", n)


@pytest.mark.parametrize(("chunks", "error"), [
    ([chunk(b"\xff\xfe garbage")], "malformed envelope"),
    ([chunk(_envelope_bytes("drop_tables"))], "unknown message kind 'drop_tables'"),
    ([chunk(_envelope_bytes("backward", batch_id=_int(1),
                            grad=_tensor("float128", (2,), b"\0" * 32)))],
     "backward.grad: unknown tensor dtype 'float128'"),
    ([chunk(_envelope_bytes("backward", batch_id=_int(1),
                            grad=_tensor("float32", (4, 4), b"\0" * 60)))],
     "backward.grad: 60 bytes do not match shape (4, 4) of float32"),
    ([chunk(b"\x0a\x02hi", total=100)], "truncated message, 4 of the announced 100 bytes"),
    ([b"\xff not a chunk"], "chunk 0 is not a valid Chunk"),
])
def test_malformed_requests_are_rejected_and_the_server_keeps_serving(
        serve: Any, connect: Any, pki: Path, chunks: list[bytes], error: str) -> None:
    handler = Secondary()
    server = serve(handler)
    with raw_channel(pki, server) as ch:
        for call in (lambda: list(ch.unary_stream(CALL)(chunks[0], timeout=5)),
                     lambda: list(ch.stream_stream(EXCHANGE)(iter(chunks), timeout=5))):
            with pytest.raises(grpc.RpcError) as info:
                call()
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert error in info.value.details()
            assert dict(info.value.trailing_metadata())[ORIGIN_KEY] == "transport"
    assert handler.seen == []
    assert isinstance(connect(server).call("bank", Hello(party="primary", role="primary")), Hello)


def test_unreachable_peer_is_unavailable_within_the_deadline(connect: Any) -> None:
    with socket.socket() as sock:  # bound but not listening: connections are refused
        sock.bind((LOOPBACK, 0))
        port = sock.getsockname()[1]
        channel = connect(port, deadline_s=2.0)
        start = time.monotonic()
        with pytest.raises(PeerUnavailable, match=rf"'bank'.*127\.0\.0\.1:{port}") as info:
            channel.call("bank", Hello(party="primary", role="primary"))
        assert time.monotonic() - start < 2.5
    assert info.value.peer == "bank"
    with pytest.raises(PeerUnavailable, match="'nobody'.*no address configured"):
        channel.call("nobody", Hello(party="primary", role="primary"))


def test_slow_peer_hits_the_deadline(serve: Any, connect: Any) -> None:
    class Slow:
        def handle(self, sender: str, message: Message) -> Message:
            time.sleep(0.6)
            return Ack()

    server = serve(Slow())
    channel = connect(server, deadline_s=0.2)
    with pytest.raises(PeerUnavailable, match=r"'bank'.*0\.2 s deadline.*127\.0\.0\.1"):
        channel.call("bank", Hello(party="primary", role="primary"))


def test_remote_errors_arrive_as_the_same_kind(serve: Any, connect: Any) -> None:
    class Failing(Secondary):
        def handle(self, sender: str, message: Message) -> Message:
            if isinstance(message, Hello) and message.role == "config":
                raise UnknownNameError("metric", "cosine", ["euclidean", "hamming"])
            if isinstance(message, Hello) and message.role == "crash":
                raise RuntimeError("secret row: alice, 52, 81000")
            if isinstance(message, Hello) and message.role == "junk":
                return "not a message"  # type: ignore[return-value]
            return super().handle(sender, message)

    hub = InProcessHub()
    hub.register("bank", Failing())
    server = serve(Failing())
    channel = connect(server)
    for ch in (hub.channel("primary"), channel):
        # the class and its code cross the boundary; the text (a cell value) stays in the log
        with pytest.raises(DataError, match=r"DataError in party 'bank' while handling "
                                            r"snapshot \[data-error\]") as data_info:
            ch.call("bank", Snapshot(tag="t1"))
        assert "income" not in str(data_info.value) and "row 7" not in str(data_info.value)
    assert channel.counter.snapshot() == hub.counter.snapshot()  # request counted, no reply
    with pytest.raises(ConfigError, match=r"UnknownNameError in party 'bank'.*\[unknown-name"):
        channel.call("bank", Hello(party="primary", role="config"))
    with pytest.raises(VflinkError, match=r"internal error in party 'bank'.*incident") as info:
        channel.call("bank", Hello(party="primary", role="crash"))
    assert "alice" not in str(info.value)  # exception texts stay in the peer's log
    with pytest.raises(ProtocolError, match="answered str, which is not a protocol message"):
        channel.call("bank", Hello(party="primary", role="junk"))
    assert isinstance(channel.call("bank", Hello(party="primary", role="primary")), Hello)


def test_handler_calls_are_serialised(serve: Any, connect: Any) -> None:
    class Counting:
        def __init__(self) -> None:
            self.active = self.peak = 0
            self.lock = threading.Lock()

        def handle(self, sender: str, message: Message) -> Message:
            with self.lock:
                self.active += 1
                self.peak = max(self.peak, self.active)
            time.sleep(0.05)
            with self.lock:
                self.active -= 1
            return Ack()

    handler = Counting()
    channel = connect(serve(handler))
    threads = [threading.Thread(target=channel.call, args=("bank", Snapshot(tag=str(i))))
               for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert handler.peak == 1


def test_plaintext_needs_the_flag_on_both_sides(serve: Any, connect: Any, pki: Path,
                                                caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(ConfigError, match="needs a TLS configuration.*insecure=True"):
        GrpcServer("bank", Secondary(), f"{LOOPBACK}:0", None, {"primary"})
    with pytest.raises(ConfigError, match="needs a TLS configuration.*insecure=True"):
        GrpcChannel("primary", {"bank": f"{LOOPBACK}:1"}, None)
    with pytest.raises(ConfigError, match="either `tls` or `insecure=True`"):
        GrpcChannel("primary", {"bank": f"{LOOPBACK}:1"}, TlsConfig.for_party(pki, "primary"),
                    insecure=True)

    tls_server = serve(Secondary())
    plain_client = connect(tls_server, insecure=True, deadline_s=5)
    assert "plaintext gRPC channel" in caplog.text
    with pytest.raises(PeerUnavailable, match="'bank'.*127.0.0.1"):
        plain_client.call("bank", Hello(party="primary", role="primary"))

    plain_server = serve(Secondary(), insecure=True)
    assert "plaintext gRPC server" in caplog.text
    with pytest.raises(PeerUnavailable):
        connect(plain_server, deadline_s=5).call("bank", Hello(party="primary", role="primary"))
    reply = connect(plain_server, insecure=True).call("bank",
                                                      Hello(party="primary", role="primary"))
    assert reply == Hello(party="bank", role="secondary")
    with pytest.raises(TransportError, match="PERMISSION_DENIED.*'stranger' is not allowed"):
        connect(plain_server, name="stranger", insecure=True).call(
            "bank", Hello(party="stranger", role="primary"))


def test_configuration_is_checked(pki: Path) -> None:
    with pytest.raises(ConfigError, match="identifies party 'primary', but this channel is"):
        GrpcChannel("bank", {}, TlsConfig.for_party(pki, "primary"))
    with pytest.raises(ConfigError, match="identifies party 'primary', but this server is"):
        GrpcServer("bank", Secondary(), f"{LOOPBACK}:0", TlsConfig.for_party(pki, "primary"),
                   {"primary"})
    with pytest.raises(ConfigError, match="`allowed_peers` is empty"):
        GrpcServer("bank", Secondary(), f"{LOOPBACK}:0", TlsConfig.for_party(pki, "bank"), set())
    with pytest.raises(ConfigError, match="must look like 'host:port'"):
        PeerAddress.parse("localhost")
    with pytest.raises(ConfigError, match=r"`port` must be an int in \[1, 65535\]"):
        PeerAddress(LOOPBACK, 70000)
    with pytest.raises(ConfigError, match="`deadline_s` must be a finite number > 0"):
        GrpcChannel("primary", {}, TlsConfig.for_party(pki, "primary"), deadline_s=0)
    with pytest.raises(ConfigError, match="`chunk_bytes` must be an int in"):
        GrpcChannel("primary", {}, TlsConfig.for_party(pki, "primary"), chunk_bytes=8 * MiB)
    assert PeerAddress.parse("[::1]:50051").target == "[::1]:50051"


def test_port_in_use_is_an_error(serve: Any, pki: Path) -> None:
    first = serve(Secondary())
    second = GrpcServer("bank", Secondary(), f"{LOOPBACK}:{first.port}",
                        TlsConfig.for_party(pki, "bank"), {"primary"})
    with pytest.raises(TransportError, match="cannot listen on"):
        second.start()
    second.stop()


def test_nested_calls_are_recorded_in_the_in_process_order(serve: Any, connect: Any,
                                                           pki: Path) -> None:
    class Relay:
        """The bank answers a Hello only after telling the coordinator (a nested call)."""

        def __init__(self) -> None:
            self.channel: Any = None

        def handle(self, sender: str, message: Message) -> Message:
            self.channel.request("coordinator", Snapshot(tag="relayed"), Ack)
            return Ack(info={"relayed": 1.0})

    class Coordinator:
        def handle(self, sender: str, message: Message) -> Message:
            return Ack()

    hub = InProcessHub(transcript=Transcript())
    relay = Relay()
    hub.register("bank", relay)
    hub.register("coordinator", Coordinator())
    relay.channel = hub.channel("bank")
    hub.channel("primary").request("bank", Hello(party="primary", role="primary"), Ack)

    transcript, counter = Transcript(), TrafficCounter()
    coordinator = serve(Coordinator(), name="coordinator", allowed=("bank",))
    relay = Relay()
    relay.channel = connect(coordinator, name="bank", peer="coordinator",
                            transcript=transcript, counter=counter)
    bank = serve(relay)
    connect(bank, transcript=transcript, counter=counter).request(
        "bank", Hello(party="primary", role="primary"), Ack)

    def order(t: Transcript) -> list[tuple[str, str, str]]:
        return [(r.sender, r.receiver, r.message.kind) for r in t.records]

    assert order(transcript) == order(hub.transcript)  # type: ignore[arg-type]
    assert counter.snapshot() == hub.counter.snapshot()
