"""Each party enforces its own policy, tested in-process and over gRPC on loopback.

The network suite against real `vflink serve` processes is tests/integration/test_hostile_peers.py;
here the same party objects answer both an in-process hub and a GrpcServer in this process, so
the parity of the two transports is checked message by message.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from vflink.data import PartySchema, PartyTable
from vflink.errors import (
    ConfigError,
    DataError,
    PeerUnavailable,
    PolicyViolation,
    ProtocolError,
    TransportError,
    VflinkError,
)
from vflink.linkage import tau_for_sigma
from vflink.models.spec import BottomSpec
from vflink.parties import CoordinatorParty, SecondaryParty
from vflink.parties.guard import bottom_parameters, check_values
from vflink.parties.policy import PartyPolicy
from vflink.parties.privacy import EmbeddingProtection
from vflink.privacy.config import PrivacyConfig
from vflink.protocol import (
    Ack,
    AlignmentReady,
    AlignmentViews,
    Backward,
    EncodingSpec,
    FitPreprocessing,
    Forward,
    IdentifierEncodings,
    SetupBottom,
    ShareEncodings,
    ShareKeys,
    Snapshot,
    SoftLink,
)
from vflink.protocol.boundary import boundary_error, error_code, is_boundary, refuse
from vflink.protocol.messages import (
    FieldComparison,
    FieldEncodings,
    FieldLink,
    SaveState,
    UnionSetup,
)
from vflink.protocol.sessions import SessionLimits, SessionTable
from vflink.runfiles.config import AlignmentConfig, DataConfig, RunConfig, parse_config
from vflink.runfiles.party import load_party_config
from vflink.runner.federation import run_policy
from vflink.transport import InProcessHub
from vflink.transport.grpc import GrpcChannel, GrpcServer, PeerAddress, create_dev_pki
from vflink.transport.grpc.tls import TlsConfig

NAMES = [f"Alice{i} Margaret Smith" for i in range(30)]
ROLES = {"primary": "primary", "bank": "secondary", "coordinator": "coordinator"}


def bank_table() -> PartyTable:
    frame = pd.DataFrame({"id": [f"k{i}" for i in range(30)], "name": NAMES,
                          "income": np.linspace(1000.5, 9000.25, 30)})
    schema = PartySchema(name="bank", role="secondary", key=("id",), identifiers=("name",),
                         numeric=("income",))
    return PartyTable.from_frame(schema, frame, "/very/private/path/bank.csv")


class Federation:
    """A coordinator and the bank behind an in-process hub; the same objects can be served."""

    def __init__(self, policy: PartyPolicy | None = None) -> None:
        self.hub = InProcessHub()
        self.coordinator = CoordinatorParty("coordinator", seed=0)
        self.bank = SecondaryParty(bank_table(), self.hub.channel("bank"), secret=b"s" * 32)
        for party in (self.coordinator, self.bank):
            party.roles = ROLES
            if policy is not None:
                party.policy = policy
        self.hub.register("coordinator", self.coordinator)
        self.hub.register("bank", self.bank)

    def channel(self, name: str = "primary") -> Any:
        return self.hub.channel(name)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("pki")
    create_dev_pki(d, ["primary", "bank", "coordinator"])
    return d


@pytest.fixture(params=["inprocess", "grpc"])
def transport(request: pytest.FixtureRequest, pki: Path
              ) -> Iterator[Callable[[Federation, str], Any]]:
    """``connect(fed, name)``: a channel of party ``name`` to the bank and the coordinator."""
    servers: list[GrpcServer] = []
    channels: list[GrpcChannel] = []
    served: dict[int, dict[str, PeerAddress]] = {}

    def connect(fed: Federation, name: str = "primary") -> Any:
        if request.param == "inprocess":
            return fed.channel(name)
        addresses = served.get(id(fed))
        if addresses is None:
            addresses = served[id(fed)] = {}
            for party_name, party in (("bank", fed.bank), ("coordinator", fed.coordinator)):
                server = GrpcServer(party_name, party, "127.0.0.1:0",
                                    TlsConfig.for_party(pki, party_name),
                                    {"primary", "bank", "coordinator"}).start()
                servers.append(server)
                addresses[party_name] = PeerAddress("127.0.0.1", server.port)
            # the bank reaches the coordinator over gRPC too
            bank_channel = GrpcChannel("bank", {"coordinator": addresses["coordinator"]},
                                       TlsConfig.for_party(pki, "bank"))
            fed.bank.channel = bank_channel
            channels.append(bank_channel)
        channel = GrpcChannel(name, addresses, TlsConfig.for_party(pki, name))
        channels.append(channel)
        return channel

    yield connect
    for c in channels:
        c.close()
    for s in servers:
        s.stop(grace=None)


def _no_data(exc: BaseException) -> None:
    text = str(exc)
    assert not any(n in text for n in NAMES) and "Alice" not in text, text
    assert "/very/private" not in text and "Traceback" not in text, text


@pytest.mark.network
def test_raw_identifiers_refused_by_default_and_the_coordinator_gets_nothing(
        transport: Any) -> None:
    fed = Federation()
    ch = transport(fed)
    with pytest.raises(PolicyViolation, match=r"only as keyed Bloom filters.*policy.identif"):
        ch.call("bank", ShareEncodings(session="s", coordinator="coordinator",
                                       spec=EncodingSpec(encoder="raw", kind="numeric")))
    assert fed.coordinator._sessions == {}  # nothing was sent to the coordinator


@pytest.mark.network
def test_a_data_error_crosses_without_its_cell_values(transport: Any) -> None:
    # A raw numeric spec on a column of names used to quote the name back to the peer.
    fed = Federation(PartyPolicy(identifiers="any"))
    ch = transport(fed)
    with pytest.raises(DataError) as info:
        ch.call("bank", ShareEncodings(session="s", coordinator="coordinator",
                                       spec=EncodingSpec(encoder="raw", kind="numeric")))
    _no_data(info.value)
    assert "[data-error]" in str(info.value) and "share_encodings" in str(info.value)


@pytest.mark.network
def test_roles_are_checked_at_every_handler(transport: Any) -> None:
    fed = Federation()
    ch = transport(fed, "coordinator")  # authenticated, but not the primary
    for message in (SetupBottom(spec=BottomSpec()), Forward(batch_id=1, rows=np.zeros(1,
                                                                                       np.int64),
                                                             train=True),
                    Backward(batch_id=1, grad=torch.zeros(1, 1)), Snapshot(tag="t")):
        with pytest.raises(PolicyViolation, match=r"only a primary party may send it.*\[role"):
            ch.call("bank", message)
    forger = transport(fed, "bank")
    forger.call("coordinator", IdentifierEncodings(session="s", encoder="string",
                                                   values=("a",)))
    with pytest.raises(PolicyViolation, match=r"\[role"):
        forger.call("coordinator", SoftLink(session="s", secondaries=("primary",),
                                            metric="levenshtein", top_k=1, sigma=0.0))


def test_digests_and_encodings_go_to_the_coordinator_only() -> None:
    fed = Federation()
    fed.hub.register("primary", fed.coordinator)  # a primary that would collect them itself
    ch = fed.channel()
    for message in (ShareKeys(session="s", coordinator="primary"),
                    ShareEncodings(session="s", coordinator="primary", spec=EncodingSpec(
                        encoder="bloom", kind="string")),
                    AlignmentReady(session="s", coordinator="primary")):
        with pytest.raises(PolicyViolation, match=r"role.destination"):
            ch.call("bank", message)
    assert fed.coordinator._sessions == {}


def _link_session(fed: Federation, ch: Any, session: str = "s") -> None:
    fed.coordinator.roles = ROLES
    ch.call("coordinator", IdentifierEncodings(session=session, encoder="string",
                                               values=("alice smith", "bob jones", "carol")))
    fed.coordinator.handle("bank", IdentifierEncodings(
        session=session, encoder="string", values=("alice smyth", "bob jones", "karol", "dan")))


@pytest.mark.network
def test_the_coordinator_enforces_its_noise_minimum(transport: Any) -> None:
    fed = Federation()
    ch = transport(fed)
    _link_session(fed, ch)
    for noise in ({}, {"sigma": 0.0}, {"tau": 1.0}):
        with pytest.raises(PolicyViolation, match=r"policy.noise"):
            ch.call("coordinator", SoftLink(session="s", secondaries=("bank",),
                                            metric="levenshtein", top_k=2, **noise))
    fed.coordinator.policy = PartyPolicy(min_sigma=0.5)
    with pytest.raises(PolicyViolation, match=r"policy.noise"):
        ch.call("coordinator", SoftLink(session="s", secondaries=("bank",),
                                        metric="levenshtein", top_k=2, sigma=0.4))
    views = ch.call("coordinator", SoftLink(session="s", secondaries=("bank",),
                                            metric="levenshtein", top_k=2, sigma=0.5))
    assert isinstance(views, AlignmentViews) and views.views[0].meta["sigma"] == 0.5
    # exact links carry no distance information: no noise needed
    _link_session(fed, ch, "e")
    ch.call("coordinator", SoftLink(session="e", secondaries=("bank",), metric="levenshtein",
                                    top_k=1, mode="exact"))


@pytest.mark.network
def test_repeated_releases_of_one_link_are_bounded_together(transport: Any) -> None:
    """Averaging n releases of one link (fresh noise each) leaves noise σ/√n: the coordinator
    refuses the release whose combined Theorem 2 bound would pass max_combined_tau, exactly
    where the formula says, and stores nothing of it."""
    fed = Federation(PartyPolicy(max_combined_tau=0.5))
    ch = transport(fed)
    precision, released = 0.0, 0
    for n in range(1, 40):
        session = f"r{n}"
        _link_session(fed, ch, session)
        request = SoftLink(session=session, secondaries=("bank",), metric="levenshtein",
                           top_k=2, sigma=0.5)
        lk = fed.coordinator._sessions["r1"].linkages["bank"] if released else None
        if lk is not None:
            precision_next = precision + 1.0 / (lk.sigma * lk.sigma0) ** 2
            combined = tau_for_sigma(1.0 / (math.sqrt(precision_next) * lk.sigma0), lk.sigma0)
            if combined > 0.5:
                with pytest.raises(PolicyViolation, match=r"policy.combined_noise"):
                    ch.call("coordinator", request)
                assert fed.coordinator._sessions[session].alignments == {}
                break
        views = ch.call("coordinator", request)
        meta = views.views[0].meta
        assert meta["tau"] < 0.5
        precision += 1.0 / (meta["sigma"] * meta["sigma0"]) ** 2
        released += 1
    assert 2 <= released < 39  # refused, after more than one release
    # exact links carry no distance information: never counted
    _link_session(fed, ch, "e")
    ch.call("coordinator", SoftLink(session="e", secondaries=("bank",), metric="levenshtein",
                                    top_k=1, mode="exact"))
    assert PartyPolicy().max_combined_tau == 0.25
    assert PartyPolicy.permissive().max_combined_tau == 1.0


def test_a_tau_request_is_checked_against_the_achieved_bound() -> None:
    fed = Federation(PartyPolicy(max_tau=0.9))
    ch = fed.channel()
    _link_session(fed, ch)
    # σ given directly but tiny: Theorem 2 gives τ ≈ 1 > 0.9 → refused after the search,
    # before anything is stored or returned
    with pytest.raises(PolicyViolation, match=r"gives sigma = 1e-06 and tau = 1"):
        ch.call("coordinator", SoftLink(session="s", secondaries=("bank",),
                                        metric="levenshtein", top_k=2, sigma=1e-6))
    assert fed.coordinator._sessions["s"].alignments == {}


@pytest.mark.parametrize("roles", [None, {"primary": "data", "bank": "data"}])
def test_unconfigured_coordinator_binds_sessions_to_their_opener(
        roles: dict[str, str] | None) -> None:
    # None: built without roles; "data": a party file that lists callers without their roles
    coordinator = CoordinatorParty("coordinator", seed=0)
    coordinator.roles = roles
    coordinator.handle("primary", IdentifierEncodings(session="s", encoder="string",
                                                      values=("a", "b")))
    coordinator.handle("bank", IdentifierEncodings(session="s", encoder="string",
                                                   values=("a", "c")))
    with pytest.raises(PolicyViolation, match="only the party that opened session 's'"):
        coordinator.handle("bank", SoftLink(session="s", secondaries=("primary",),
                                            metric="levenshtein", top_k=1, tau=0.99))
    views = coordinator.handle("primary", SoftLink(session="s", secondaries=("bank",),
                                                   metric="levenshtein", top_k=1, sigma=1.0))
    assert isinstance(views, AlignmentViews)
    with pytest.raises(ProtocolError, match="already linked"):
        coordinator.handle("bank", IdentifierEncodings(session="s", encoder="string",
                                                       values=("x",)))
    with pytest.raises(PolicyViolation, match=r"belongs to other parties|\[role\]"):
        coordinator.handle("eve", IdentifierEncodings(session="s", encoder="string",
                                                      values=("x",)))
    # a linked session is final, also for its primary: a new run opens a new session
    with pytest.raises(ProtocolError, match=r"already linked and immutable.*session.finished"):
        coordinator.handle("primary", IdentifierEncodings(session="s", encoder="string",
                                                          values=("q",)))
    coordinator.handle("primary", IdentifierEncodings(session="s2", encoder="string",
                                                      values=("q",)))


def test_coordinator_sessions_are_limited_and_expire() -> None:
    coordinator = CoordinatorParty("coordinator")
    coordinator.roles = ROLES
    coordinator.policy = PartyPolicy(max_sessions=3, session_ttl_s=60)
    now = [0.0]
    coordinator.sessions = SessionTable(coordinator.name, coordinator.role, SessionLimits(
        max_sessions=3, ttl_s=60), clock=lambda: now[0])
    for i in range(3):
        coordinator.handle("primary", IdentifierEncodings(session=f"s{i}", encoder="string",
                                                          values=("a",)))
    with pytest.raises(PolicyViolation, match=r"holds 3 sessions.*limit.sessions"):
        coordinator.handle("primary", IdentifierEncodings(session="s3", encoder="string",
                                                          values=("a",)))
    now[0] = 61.0  # all three expire unused
    coordinator.handle("primary", IdentifierEncodings(session="s3", encoder="string",
                                                      values=("a",)))
    assert sorted(coordinator._sessions) == ["s3"]


def _trained_bank(policy: PartyPolicy | None = None) -> tuple[SecondaryParty, Any]:
    fed = Federation(policy)
    ch = fed.channel()
    fed.bank.set_linked_rows(np.arange(30), peer="primary")  # an alignment with the primary
    ch.call("bank", SetupBottom(spec=BottomSpec(hidden=(8,), out_dim=4, seed=1)))
    ch.call("bank", FitPreprocessing(rows=np.arange(30)))
    return fed.bank, ch


def test_pending_forwards_are_limited_and_expire(monkeypatch: pytest.MonkeyPatch) -> None:
    bank, ch = _trained_bank(PartyPolicy(max_pending_batches=3, pending_ttl_s=10))
    now = [100.0]
    monkeypatch.setattr("vflink.parties.guard.time.monotonic", lambda: now[0])
    rows = np.arange(30, dtype=np.int64)
    for b in range(3):
        ch.call("bank", Forward(batch_id=b, rows=rows, train=True))
    ch.call("bank", Forward(batch_id=2, rows=rows, train=True))  # a retry replaces itself
    with pytest.raises(PolicyViolation, match=r"3 training batches.*limit.pending-batches"):
        ch.call("bank", Forward(batch_id=3, rows=rows, train=True))
    ch.call("bank", Forward(batch_id=3, rows=rows, train=False))  # evaluation holds nothing
    now[0] = 111.0
    ch.call("bank", Forward(batch_id=4, rows=rows, train=True))  # the old ones expired
    run = bank.training_run("primary")
    assert run is not None and sorted(run.pending) == [4]


def test_snapshot_tags_are_limited() -> None:
    bank, ch = _trained_bank(PartyPolicy(max_snapshots=2))
    ch.call("bank", Snapshot(tag="a"))
    ch.call("bank", Snapshot(tag="b"))
    ch.call("bank", Snapshot(tag="a"))  # replacing a tag is fine
    with pytest.raises(PolicyViolation, match="limit.snapshots"):
        ch.call("bank", Snapshot(tag="c"))


def test_wrong_gradients_leave_the_batch_for_a_retry_that_applies_once() -> None:
    bank, ch = _trained_bank()
    ref, ref_ch = _trained_bank()
    rows = np.arange(10, dtype=np.int64)
    emb = ch.call("bank", Forward(batch_id=7, rows=rows, train=True)).embeddings
    ref_ch.call("bank", Forward(batch_id=7, rows=rows, train=True))
    for grad, code in ((torch.full_like(emb, math.nan), "value.finite"),
                       (torch.full_like(emb, 1e7), "value.range"),
                       (torch.ones(3, 4), "backward.shape")):
        with pytest.raises(ProtocolError, match=rf"\[{code}\]"):
            ch.call("bank", Backward(batch_id=7, grad=grad))
    good = Backward(batch_id=7, grad=torch.ones_like(emb))
    assert ch.call("bank", good) == Ack()
    assert ch.call("bank", good) == Ack(info={"duplicate": 1.0})
    ref_ch.call("bank", good)
    got, want = bank.training_run("primary"), ref.training_run("primary")
    assert got is not None and got.model is not None
    assert want is not None and want.model is not None
    assert all(torch.equal(a, b) for a, b in zip(got.model.parameters(),
                                                 want.model.parameters()))


def test_huge_bottom_models_are_refused_before_building() -> None:
    bank, ch = _trained_bank()
    with pytest.raises(PolicyViolation, match="limit.model-size"):
        ch.call("bank", SetupBottom(spec=BottomSpec(hidden=(50_000, 50_000))))
    assert bottom_parameters(BottomSpec(hidden=(3,), out_dim=2), 4) == (4 + 1) * 3 + (3 + 1) * 2


@pytest.mark.network
def test_union_setup_is_checked_against_the_secondarys_own_limits(transport: Any) -> None:
    fed = Federation()
    ch = transport(fed)
    union = UnionSetup(session="psu", spec=BottomSpec(hidden=(50_000, 50_000)),
                       features="fea-sampling", fit_uids=np.arange(3, dtype=np.int64))
    with pytest.raises(PolicyViolation, match="limit.model-size"):
        ch.call("bank", union)
    # a party that protects its embeddings (VFL-AFE) will not release unprotected ones
    fed.bank.protection = EmbeddingProtection("bank", 30, PrivacyConfig(embeddings="afe"), 0)
    with pytest.raises(PolicyViolation, match="protects its embeddings"):
        ch.call("bank", dataclasses.replace(union, spec=BottomSpec(hidden=(8,), out_dim=4)))


def test_check_values() -> None:
    check_values(torch.tensor([1.0, -2.0]), party="p", what="x", max_abs=2.0)
    check_values(np.array([np.nan, 1.0]), party="p", what="x", max_abs=2.0, allow_nan=True)
    with pytest.raises(ProtocolError, match="value.finite"):
        check_values(np.array([np.nan, 1.0]), party="p", what="x", max_abs=2.0)
    with pytest.raises(ProtocolError, match="value.finite"):
        check_values(torch.tensor([math.inf]), party="p", what="x", max_abs=2.0)
    with pytest.raises(ProtocolError, match="value.range"):
        check_values(torch.tensor([3.0]), party="p", what="x", max_abs=2.0)


def test_boundary_errors() -> None:
    err = refuse(PolicyViolation, "no", code="x.y", detail="/local/path")
    assert is_boundary(err) and str(err) == "no [x.y]" and error_code(err) == "x.y"
    assert boundary_error(err, "p", "k") is err
    data = boundary_error(DataError("row 3 holds 'Alice'"), "bank", "forward")
    assert isinstance(data, DataError) and "Alice" not in str(data)
    assert error_code(data) == "data-error" and is_boundary(data)
    internal = boundary_error(RuntimeError("/etc/secret"), "bank", "forward")
    assert type(internal) is VflinkError and "secret" not in str(internal)
    assert "internal error in party 'bank'" in str(internal) and "incident" in str(internal)
    peer = boundary_error(PeerUnavailable("coordinator", "at 10.0.0.1:5"), "bank", "x")
    assert isinstance(peer, TransportError) and "10.0.0.1" not in str(peer)
    config = boundary_error(ConfigError("bad /path"), "bank", "x")
    assert isinstance(config, ConfigError) and "/path" not in str(config)


def test_run_policy_defaults_follow_the_run_file() -> None:
    cfg = RunConfig(data=DataConfig(dataset="sklearn-small"),
                    alignment=AlignmentConfig(method="soft", privacy="off"))
    assert run_policy(cfg).identifiers == "any" and not run_policy(cfg).requires_noise
    strict = parse_config({"version": 1, "data": {"dataset": "sklearn-small"},
                           "alignment": {"method": "soft", "sigma": 0.3},
                           "policy": {"min_sigma": 0.2}})
    assert run_policy(strict) == PartyPolicy(min_sigma=0.2)
    assert run_policy(strict).identifiers == "bloom"
    with pytest.raises(ConfigError, match=r"(?s)2 problems.*raw identifiers.*requires noise"):
        parse_config({"version": 1, "data": {"dataset": "sklearn-small"},
                      "alignment": {"method": "soft", "privacy": "off"}, "policy": {}})
    with pytest.raises(ConfigError, match=r"policy.identifiers.*got 'raw'"):
        parse_config({"version": 1, "data": {"dataset": "sklearn-small"},
                      "policy": {"identifiers": "raw"}})


def test_party_file_policy_and_roles(tmp_path: Path) -> None:
    base = ('version = 1\n[party]\nname = "bank"\nrole = "secondary"\nlisten = "127.0.0.1:1"\n'
            'dataset = "sklearn-small"\n[peers.coordinator]\naddress = "127.0.0.1:2"\n'
            'role = "coordinator"\n[security]\ninsecure = true\n')
    p = tmp_path / "bank.toml"
    p.write_text(base + 'allowed = ["boss"]\n[policy]\nidentifiers = "any"\n'
                        'max_pending_batches = 2\n')
    cfg = load_party_config(p)
    assert cfg.roles["boss"] == "primary" and cfg.roles["coordinator"] == "coordinator"
    assert cfg.policy == PartyPolicy(identifiers="any", max_pending_batches=2)
    p.write_text(base + 'allowed = ["a", "b"]\n')
    with pytest.raises(ConfigError, match="must say which is its primary"):
        load_party_config(p)
    p.write_text(base + 'allowed = ["a", "b"]\nroles = { a = "primary", b = "secondary" }\n'
                        '[policy]\nmax_tau = 2\nbogus = 1\n')
    with pytest.raises(ConfigError, match=r"\[policy\] has unknown key\(s\) \['bogus'\]"):
        load_party_config(p)
    p.write_text(base + 'allowed = ["a", "b"]\nroles = { a = "primary", b = "secondary" }\n'
                        '[policy]\nmax_tau = 2\n')
    with pytest.raises(ConfigError, match=r"policy.max_tau"):
        load_party_config(p)


@given(st.lists(st.one_of(st.just(0), st.integers(0, 2**64 - 1)), min_size=1, max_size=6))
def test_hostile_shapes_are_protocol_errors(shape: list[int]) -> None:
    from vflink.protocol import PROTOCOL_VERSION
    from vflink.transport.grpc._wire import pb
    from vflink.transport.grpc.serde import message_from_proto

    env = pb.Envelope(protocol_version=PROTOCOL_VERSION, kind="backward", sender="primary")
    f = env.fields.add()
    f.name = "batch_id"
    f.value.int_value = 1
    g = env.fields.add()
    g.name = "grad"
    g.value.tensor.dtype = "float32"
    g.value.tensor.shape.extend(shape)
    g.value.tensor.data = b""
    try:
        message = message_from_proto(env)
    except ProtocolError:
        return
    assert math.prod(shape) == 0 and isinstance(message, Backward)  # a valid empty tensor


def test_saved_states_a_peer_names_are_limited(tmp_path: Path) -> None:
    """A primary names the files SaveState writes: their number is bounded (disk)."""
    fed = Federation(PartyPolicy(max_saved_states=3))
    fed.bank.out_dir = tmp_path
    ch = fed.channel()
    fed.bank.set_linked_rows(np.arange(30), peer="primary")
    ch.call("bank", SetupBottom(spec=BottomSpec(hidden=(8,), out_dim=4, seed=1)))
    ch.call("bank", FitPreprocessing(rows=np.arange(30)))
    for i in range(3):
        ch.call("bank", SaveState(name=f"s{i}"))
    with pytest.raises(PolicyViolation, match="limit.saved-states"):
        ch.call("bank", SaveState(name="s3"))
    ch.call("bank", SaveState(name="s1"))  # an existing name is replaced, as before
    # a served party keeps each peer's states in that peer's own folder
    assert sorted(p.name for p in (tmp_path / "peers" / "primary").glob("*.json")) == [
        "s0.json", "s1.json", "s2.json"]


@pytest.mark.network
def test_comparison_levels_are_capped_and_refused_in_the_coordinators_words(
        transport: Any) -> None:
    """A Fellegi-Sunter field with 127 or more levels crashed the coordinator's handler
    (int8 levels); a levels list beyond the cap, or not decreasing similarities, is refused
    before any work, saying what a levels list may be."""
    fed = Federation()
    ch = transport(fed)
    session = "fields-levels"
    ch.request("coordinator", FieldEncodings(session=session, encoders=("bloom",),
                                             values=(np.zeros((3, 8), dtype=np.uint8),)), Ack)

    def link(levels: tuple[float, ...]) -> Any:
        return ch.call("coordinator", FieldLink(
            session=session, secondaries=("bank",), top_k=1, tau=0.99, model="fellegi-sunter",
            fields=(FieldComparison(metric="hamming", levels=levels),)))

    for levels, why in ((tuple(np.linspace(0.995, 0.005, 200)), "1 to 32 similarity"),
                        (tuple(np.linspace(0.99, 0.01, 127)), "1 to 32 similarity"),
                        ((0.5, 0.7), "strictly decreasing"), ((1.5,), "in (0, 1)")):
        with pytest.raises(ProtocolError) as info:
            link(levels)
        text = str(info.value)
        assert "[link.levels]" in text and why in text and "internal" not in text, text
    # a list within the cap passes the check (the link then waits for the bank's encodings)
    with pytest.raises(VflinkError) as info:
        link(tuple(np.linspace(0.95, 0.05, 32)))
    assert "link.levels" not in str(info.value)


def test_linked_rows_are_served_and_rows_outside_the_table_refused() -> None:
    """A secondary remembers the rows an alignment links (a missing link, −1, links none)
    and refuses one that names a row outside its table, negative or past its end."""
    fed = Federation()
    bank = fed.bank
    n = len(bank.table)
    bank.set_linked_rows(np.array([[3, -1], [0, n - 1], [3, 3]]), peer="primary")
    assert np.flatnonzero(bank.served["primary"]).tolist() == [0, 3, n - 1]
    for bad in ([0, n], [-2, 1], [-1, n + 7]):
        with pytest.raises(ProtocolError, match=rf"rows outside \[0, {n}\)"):
            bank.set_linked_rows(np.array(bad), peer="primary")
    bank.set_linked_rows(np.array([-1, -1]), peer="other")
    assert not bank.served["other"].any()


def test_linked_rows_of_a_large_alignment_are_checked_in_every_piece() -> None:
    """Millions of links are counted in pieces, one thread per core: a row outside the table
    in any piece (the last one's last link included) is still refused."""
    from vflink._threads import PASS_MIN

    fed = Federation()
    bank = fed.bank
    n = len(bank.table)
    full = np.random.default_rng(3).integers(0, n, 2 * PASS_MIN)
    full[full == 5] = 4  # a row no link names
    holes = full.copy()
    holes[::7] = -1  # missing links
    for idx in (full, holes):
        bank.set_linked_rows(idx, peer="primary")
        want = np.zeros(n, dtype=bool)
        want[idx[idx >= 0]] = True
        assert np.array_equal(bank.served["primary"], want) and not want[5]
        for value in (n, -2):
            bad = idx.copy()
            bad[-1] = value
            with pytest.raises(ProtocolError, match=rf"rows outside \[0, {n}\)"):
                bank.set_linked_rows(bad, peer="primary")


def test_a_partys_session_table_calls_its_own_drop_hook_and_holds_no_cycle() -> None:
    import gc
    import weakref

    from vflink.parties.base import Party

    dropped: list[Any] = []

    class Keeper(Party):
        def _session_dropped(self, session: Any) -> None:  # an override, as setalign's
            dropped.append(session)

    party = Keeper("keeper")
    assert party.sessions.on_drop is not None
    party.sessions.on_drop("a session")
    assert dropped == ["a session"]
    gone = weakref.ref(party)
    gc.disable()
    try:
        del party  # its table calls it back through a weak reference: no cycle
        assert gone() is None
    finally:
        gc.enable()
