"""Hostile peers with valid certificates against real `vflink serve` processes.

Authenticated but curious peers (FedSim §5, FLORIST's threat model): each served party must
enforce its own policy whatever the others send. One coordinator and one secondary run as
`vflink serve` processes on loopback, with certificates from `vflink certs`; the tests play the
primary (its certificate) and a forger holding the secondary's certificate.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pandas as pd
import pytest
import torch

from tests.helpers.network import free_port, start_process, stop_processes
from vflink.alignment._dh import key_bytes
from vflink.alignment.confirm import new_nonce
from vflink.alignment.groups import get_group
from vflink.cli.main import main
from vflink.errors import PolicyViolation, ProtocolError, VflinkError
from vflink.models.spec import BottomSpec
from vflink.parties import SecondaryParty
from vflink.parties.linking import encode_identifiers, send_key_tag
from vflink.parties.setalign import SetAlignmentDriver
from vflink.protocol import (
    PROTOCOL_VERSION,
    Ack,
    AlignmentReady,
    AlignmentViews,
    Backward,
    ConfirmKey,
    Embeddings,
    EncodingSpec,
    FetchAlignment,
    FitPreprocessing,
    Forward,
    Hello,
    IdentifierEncodings,
    KeyDigests,
    LoadState,
    MatchKeys,
    Message,
    Restore,
    SaveState,
    SetupBottom,
    ShareEncodings,
    ShareKeys,
    Snapshot,
    SoftLink,
)
from vflink.protocol.messages import FieldComparison, FieldEncodings, FieldLink
from vflink.protocol.sessions import new_session_name
from vflink.runfiles.party import load_party_config, party_table
from vflink.transport import InProcessHub
from vflink.transport.grpc import GrpcChannel, TlsConfig, load_tls
from vflink.transport.grpc._wire import CALL, CODE_KEY, pb

pytestmark = pytest.mark.network

N_ROWS = 3000
SECRET = "hostile-peer-test-secret-0123456789"
SPEC = BottomSpec(hidden=(256,), out_dim=16, seed=11)
BLOOM = EncodingSpec(encoder="bloom", kind="string", params={})


@dataclass
class Federation:
    tmp: Path
    certs: Path
    state: Path
    csv: Path
    secondary_file: Path
    procs: dict[str, subprocess.Popen[bytes]]
    addresses: dict[str, str]
    secrets: list[str]  # every cell of the secondary's table, as text

    def channel(self, name: str = "primary") -> GrpcChannel:
        return GrpcChannel(name, self.addresses, TlsConfig.for_party(self.certs, name),
                           deadline_s=30)

    def rss(self, party: str) -> int:
        status = Path(f"/proc/{self.procs[party].pid}/status").read_text()
        return int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1)) * 1024  # type: ignore[union-attr]


def secondary_frame(n: int) -> pd.DataFrame:
    rng = np.random.default_rng(4)
    return pd.DataFrame({
        "id": [f"IDQX{i:05d}" for i in range(n)],
        "name": [f"Zelda{i}Quixote Marwick{i % 97}" for i in range(n)],
        "x1": np.round(rng.normal(1000, 300, n), 6) + 0.123457,
        "x2": np.round(rng.normal(-50, 9, n), 6) + 0.654321,
    })


@pytest.fixture(scope="module")
def fed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Federation]:
    tmp = tmp_path_factory.mktemp("hostile")
    certs = tmp / "certs"
    assert main(["certs", "--out", str(certs), "--parties",
                 "primary,secondary,coordinator"]) == 0
    frame = secondary_frame(N_ROWS)
    csv = tmp / "secondary_private_table.csv"
    frame.to_csv(csv, index=False)
    ports = {"coordinator": free_port(), "secondary": free_port()}
    addresses = {k: f"127.0.0.1:{v}" for k, v in ports.items()}
    state = tmp / "state" / "secondary"
    coordinator = tmp / "coordinator.toml"
    coordinator.write_text(
        f'version = 1\n[party]\nname = "coordinator"\nrole = "coordinator"\n'
        f'listen = "{addresses["coordinator"]}"\n'
        f'[security]\ntls_dir = "{certs}"\nallowed = ["primary", "secondary"]\n'
        f'roles = {{ primary = "primary", secondary = "secondary" }}\n'
        f'[policy]\nmax_sessions = 6\n')
    secondary = tmp / "secondary.toml"
    secondary.write_text(
        f'version = 1\n[party]\nname = "secondary"\nrole = "secondary"\n'
        f'listen = "{addresses["secondary"]}"\nstate_dir = "{state}"\ndeadline_s = 20\n'
        f'[party.table]\npath = "{csv}"\nkey = ["id"]\nidentifiers = ["name"]\n'
        f'numeric = ["x1", "x2"]\n'
        f'[peers.coordinator]\naddress = "{addresses["coordinator"]}"\nrole = "coordinator"\n'
        f'[security]\ntls_dir = "{certs}"\nallowed = ["primary"]\n')
    old = os.environ.get("VFLINK_SECRET")
    os.environ["VFLINK_SECRET"] = SECRET
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        procs["coordinator"] = start_process(coordinator, tmp / "coordinator.log")
        procs["secondary"] = start_process(secondary, tmp / "secondary.log")
        secrets = [str(v) for col in frame.columns for v in frame[col]]
        yield Federation(tmp, certs, state, csv, secondary, procs, addresses, secrets)
    finally:
        stop_processes(procs.values())
        if old is None:
            os.environ.pop("VFLINK_SECRET", None)
        else:
            os.environ["VFLINK_SECRET"] = old


def refused(fed: Federation, call: Any) -> VflinkError:
    """The error a hostile call gets, checked to reveal no table value and no local path."""
    with pytest.raises(VflinkError) as info:
        call()
    text = str(info.value)
    assert "Traceback" not in text and 'File "' not in text, text
    for local in (str(fed.tmp), str(fed.state), str(fed.csv), os.getcwd(), "/proc/", "/usr/"):
        assert local not in text, (local, text)
    leaked = [v for v in fed.secrets if v in text]
    assert not leaked, (leaked[:5], text)
    return info.value


def test_raw_identifiers_are_refused_and_nothing_reaches_the_coordinator(fed: Federation
                                                                         ) -> None:
    with fed.channel() as ch:
        for spec in (EncodingSpec(encoder="raw", kind="numeric"),
                     EncodingSpec(encoder="string", kind="string")):
            err = refused(fed, lambda spec=spec: ch.call("secondary", ShareEncodings(
                session="s-raw", coordinator="coordinator", spec=spec)))
            assert isinstance(err, PolicyViolation) and "policy.identifiers" in str(err)
        # the primary's own submission opens the session; the secondary sent nothing to it
        ch.request("coordinator", IdentifierEncodings(
            session="s-raw", encoder="string", values=("a b", "c d")), Ack)
        err = refused(fed, lambda: ch.call("coordinator", SoftLink(
            session="s-raw", secondaries=("secondary",), metric="levenshtein", top_k=1,
            sigma=1.0)))
        assert "session.incomplete" in str(err) and "'secondary'" in str(err)
    log = (fed.tmp / "secondary.log").read_text()
    assert "policy.identifiers" in log  # refusals are logged where they happen


def _bloom_session(fed: Federation, ch: GrpcChannel, session: str) -> None:
    """The legitimate start of a soft linkage: primary and secondary submit Bloom filters."""
    mine = secondary_frame(40).assign(name=lambda f: f["name"].str.replace("Zelda", "Zeldo"))
    values = encode_identifiers(mine, ["name"], BLOOM, SECRET.encode())
    # key confirmation first: the secondary aligns only with a proven secret
    nonce = new_nonce()
    send_key_tag(ch, "coordinator", SECRET.encode(), party="primary", session=session,
                 nonce=nonce)
    ack = ch.request("secondary", ConfirmKey(session=session, nonce=nonce,
                                             coordinator="coordinator"), Ack)
    assert ack.info["confirmed"] == 1.0
    ch.request("coordinator", IdentifierEncodings(session=session, encoder="bloom",
                                                  values=values), Ack)
    ch.request("secondary", ShareEncodings(session=session, coordinator="coordinator",
                                           spec=BLOOM), Ack)


def test_role_forgery_and_noise_below_policy_are_refused(fed: Federation) -> None:
    with fed.channel() as ch, fed.channel("secondary") as forger:
        _bloom_session(fed, ch, "s-forge")
        # a forgery: the secondary's certificate asks for the primary's view
        err = refused(fed, lambda: forger.call("coordinator", SoftLink(
            session="s-forge", secondaries=("primary",), metric="hamming", top_k=2,
            sigma=0.0)))
        assert isinstance(err, PolicyViolation) and "[role" in str(err)
        refused(fed, lambda: forger.call("coordinator", MatchKeys(
            session="s-forge", secondaries=("primary",))))
        # the primary cannot ask for noise-free similarities either (coordinator's policy)
        for noise in ({"sigma": 0.0}, {}, {"tau": 1.0}):
            err = refused(fed, lambda noise=noise: ch.call("coordinator", SoftLink(
                session="s-forge", secondaries=("secondary",), metric="hamming", top_k=2,
                **noise)))
            assert isinstance(err, PolicyViolation) and "policy.noise" in str(err)
        refused(fed, lambda: ch.call("coordinator", SoftLink(
            session="s-forge", secondaries=("secondary",), metric="hamming", top_k=10**9,
            tau=0.999)))
        # a request within the policy works, and similarities go to the primary only
        views = ch.request("coordinator", SoftLink(
            session="s-forge", secondaries=("secondary",), metric="hamming", top_k=2,
            tau=0.999), AlignmentViews)
        assert views.views[0].similarity is not None
        assert views.views[0].meta["tau"] <= 0.999 + 1e-9
        view = forger.call("coordinator", FetchAlignment(session="s-forge"))
        assert view.similarity is None  # type: ignore[attr-defined]
        # the linked session is bound to its parties: the forger cannot resubmit into it
        refused(fed, lambda: forger.call("coordinator", IdentifierEncodings(
            session="s-forge", encoder="bloom", values=np.zeros((2, 8), dtype=np.uint8))))


def _raw_call(fed: Federation, party: str, envelope: Any) -> grpc.RpcError:
    m = load_tls(TlsConfig.for_party(fed.certs, "primary"))
    creds = grpc.ssl_channel_credentials(m.ca_pem, m.key_pem, m.cert_pem)
    data = envelope.SerializeToString()
    chunk = pb.Chunk(total_size=len(data), data=data).SerializeToString()
    with grpc.secure_channel(fed.addresses[party], creds,
                             options=[("grpc.ssl_target_name_override", party)]) as channel:
        with pytest.raises(grpc.RpcError) as info:
            list(channel.unary_stream(CALL)(chunk, timeout=10))
    return info.value


@pytest.mark.parametrize("shape", [(0, 2**63 + 5), (2**64 - 1, 0), (0,) * 3 + (2**62,)])
def test_hostile_tensor_shapes_are_a_clean_protocol_error(fed: Federation,
                                                          shape: tuple[int, ...]) -> None:
    env = pb.Envelope(protocol_version=PROTOCOL_VERSION, kind="backward", sender="primary")
    f = env.fields.add()
    f.name = "batch_id"
    f.value.int_value = 1
    g = env.fields.add()
    g.name = "grad"
    g.value.tensor.dtype = "float32"
    g.value.tensor.shape.extend(shape)
    g.value.tensor.data = b""
    err = _raw_call(fed, "secondary", env)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = err.details() or ""
    assert "too large" in details and "Traceback" not in details and "torch" not in details
    assert str(fed.tmp) not in details


def test_bad_requests_reveal_no_values_or_paths(fed: Federation) -> None:
    bad: list[tuple[str, Message]] = [
        ("secondary", LoadState(name="missing-checkpoint.pt")),
        ("secondary", LoadState(name="../../etc/passwd")),
        ("secondary", SaveState(name="x.pt")),
        ("secondary", Forward(batch_id=1, rows=np.array([0, 1]), train=True)),
        ("secondary", FitPreprocessing(rows=np.array([0]))),
        ("secondary", Restore(tag="nope")),
        ("secondary", Backward(batch_id=99, grad=torch.zeros(2, 16))),
        ("secondary", ShareKeys(session="k", coordinator="nowhere")),
        ("secondary", ShareKeys(session="k", coordinator="primary")),  # "send them to me"
        ("secondary", ShareEncodings(session="k", coordinator="primary", spec=BLOOM)),
        ("secondary", AlignmentReady(session="never-opened", coordinator="coordinator")),
        ("secondary", Hello(party="primary", role="primary", version=99)),
        ("secondary", KeyDigests(session="k", digests=np.zeros((1, 32), dtype=np.uint8))),
        ("secondary", SetupBottom(spec=BottomSpec(hidden=(100_000, 100_000)))),
        ("coordinator", FetchAlignment(session="never-opened")),
        ("coordinator", MatchKeys(session="never-opened", secondaries=("secondary",))),
        ("coordinator", KeyDigests(session="k", digests=np.zeros((3, 7), dtype=np.uint8))),
        ("coordinator", SoftLink(session="never-opened", secondaries=("secondary",),
                                 metric="hamming", top_k=2, tau=0.99, scale=(0.0, -1.0))),
    ]
    with fed.channel() as ch:
        codes = []
        for party, message in bad:
            err = refused(fed, lambda party=party, message=message: ch.call(party, message))
            codes.append(getattr(err, "code", None))
        assert all(codes), list(zip([m.kind for _, m in bad], codes))
        # the party keeps serving
        assert isinstance(ch.call("secondary", Hello(party="primary", role="primary")), Hello)


def test_a_200_level_field_is_refused_in_the_coordinators_words(fed: Federation) -> None:
    """A Fellegi-Sunter field of 127 levels or more crashed the coordinator's handler (an
    OverflowError in int8 levels): now a clear refusal, and the coordinator keeps serving."""
    with fed.channel() as ch:
        session = new_session_name("fields")
        ch.request("coordinator", FieldEncodings(session=session, encoders=("bloom",),
                                                 values=(np.zeros((4, 8), dtype=np.uint8),)),
                   Ack)
        err = refused(fed, lambda: ch.call("coordinator", FieldLink(
            session=session, secondaries=("secondary",), top_k=1, tau=0.99,
            model="fellegi-sunter", fields=(FieldComparison(
                metric="hamming", levels=tuple(np.linspace(0.995, 0.005, 200))),))))
        assert isinstance(err, ProtocolError) and "[link.levels]" in str(err)
        assert "1 to 32 similarity thresholds" in str(err) and "internal" not in str(err)
        assert isinstance(ch.call("coordinator", Hello(party="primary", role="primary")), Hello)


def reference_party(fed: Federation) -> SecondaryParty:
    """The same secondary in this process, fed only the legitimate messages (the oracle)."""
    party = SecondaryParty(party_table(load_party_config(fed.secondary_file)),
                           InProcessHub().channel("secondary"))
    party.roles = {"primary": "primary"}
    party.set_linked_rows(np.arange(N_ROWS), peer="primary")  # as align_with_psi gives it
    return party


def align_with_psi(ch: GrpcChannel) -> str:
    """An honest alignment of the primary with the served secondary (ECDH PSI over every key
    it holds), so that the secondary serves its rows to the primary (no alignment, no rows)."""
    keys = key_bytes(secondary_frame(N_ROWS)[["id"]], ("id",), who="primary")
    session = new_session_name("psi")
    SetAlignmentDriver(keys, ch, get_group("ristretto255")).psi("secondary", session,
                                                                reveal="both")
    ch.request("secondary", AlignmentReady(session=session, coordinator="coordinator"), Ack)
    return session


def test_poisoned_and_misshaped_gradients_are_refused_and_a_retry_applies_once(
        fed: Federation) -> None:
    rows = np.arange(0, 64, dtype=np.int64)
    ref = reference_party(fed)
    legit = [SetupBottom(spec=SPEC), FitPreprocessing(rows=np.arange(N_ROWS)),
             Forward(batch_id=1001, rows=rows, train=True)]
    with fed.channel() as ch:
        align_with_psi(ch)
        for m in legit:
            got, want = ch.call("secondary", m), ref.handle("primary", m)
        assert isinstance(got, Embeddings) and isinstance(want, Embeddings)
        assert torch.allclose(got.embeddings, want.embeddings, atol=1e-6)
        shape = tuple(got.embeddings.shape)
        poisoned = [torch.full(shape, float("nan")), torch.full(shape, 3e38),
                    torch.full(shape, float("inf")), torch.ones(shape[0] + 1, shape[1]),
                    torch.ones(shape).to(torch.int64)]
        expected = ["value.finite", "value.range", "value.finite", "backward.shape",
                    "backward.dtype"]
        for grad, code in zip(poisoned, expected):
            err = refused(fed, lambda grad=grad: ch.call("secondary", Backward(batch_id=1001,
                                                                                grad=grad)))
            assert f"[{code}" in str(err) and getattr(err, "code", None) == code
        good = Backward(batch_id=1001, grad=torch.linspace(-1, 1, shape[0] * shape[1])
                        .reshape(shape))
        assert ch.request("secondary", good, Ack).info == {}  # applied now, exactly once
        assert ch.request("secondary", good, Ack).info == {"duplicate": 1.0}
        ref.handle("primary", good)
        nxt = Forward(batch_id=1002, rows=rows, train=False)
        after, want_after = ch.call("secondary", nxt), ref.handle("primary", nxt)
    assert torch.isfinite(after.embeddings).all()  # type: ignore[attr-defined]
    assert not torch.allclose(after.embeddings, got.embeddings)  # type: ignore[attr-defined]
    # same state as a party that only ever saw the legitimate messages
    assert torch.allclose(after.embeddings, want_after.embeddings,  # type: ignore[attr-defined]
                          atol=1e-5)


def test_state_stays_bounded_under_repeated_hostile_sequences(fed: Federation) -> None:
    with fed.channel() as ch:
        align_with_psi(ch)
        ch.request("secondary", SetupBottom(spec=SPEC), Ack)
        ch.request("secondary", FitPreprocessing(rows=np.arange(N_ROWS)), Ack)
        all_rows = np.arange(N_ROWS, dtype=np.int64)
        ch.request("secondary", Forward(batch_id=1, rows=all_rows, train=False), Embeddings)
        start = {p: fed.rss(p) for p in fed.procs}
        codes = set()
        for i in range(300):  # training forwards that never get their Backward
            try:
                ch.call("secondary", Forward(batch_id=10_000 + i, rows=all_rows, train=True))
            except PolicyViolation as exc:
                codes.add(getattr(exc, "code", None))
        for i in range(40):  # snapshot tags and coordinator sessions that never end
            for party, message in (("secondary", Snapshot(tag=f"tag-{i}")),
                                   ("coordinator", IdentifierEncodings(
                                       session=f"flood-{i}", encoder="bloom",
                                       values=np.zeros((20_000, 64), dtype=np.uint8)))):
                try:
                    ch.call(party, message)
                except PolicyViolation as exc:
                    codes.add(getattr(exc, "code", None))
        end = {p: fed.rss(p) for p in fed.procs}
    assert codes == {"limit.pending-batches", "limit.snapshots", "limit.sessions"}
    for party in fed.procs:
        assert end[party] <= 1.5 * start[party], (party, start[party], end[party])


@pytest.mark.slow
def test_error_codes_travel_in_metadata(fed: Federation) -> None:
    with fed.channel() as ch:  # a training session in which Restore reaches its handler
        align_with_psi(ch)
        ch.request("secondary", SetupBottom(spec=SPEC), Ack)
        ch.request("secondary", FitPreprocessing(rows=np.arange(N_ROWS)), Ack)
    env = pb.Envelope(protocol_version=PROTOCOL_VERSION, kind="restore", sender="primary")
    f = env.fields.add()
    f.name = "tag"
    f.value.str_value = "no-such-tag"
    r = env.fields.add()
    r.name = "run"
    r.value.str_value = ""
    err = _raw_call(fed, "secondary", env)
    trailing = dict(err.trailing_metadata() or ())
    assert trailing[CODE_KEY] == "protocol-error"
    assert "the details are in that party's log" in (err.details() or "")


@pytest.mark.slow
def test_unexpected_errors_stay_in_the_servers_log(fed: Federation) -> None:
    fed.state.mkdir(parents=True, exist_ok=True)
    (fed.state / "corrupt.pt").write_bytes(b"\x80\x04 not a checkpoint")  # a damaged file
    with fed.channel() as ch:
        err = refused(fed, lambda: ch.call("secondary", LoadState(name="corrupt.pt")))
        assert isinstance(ch.call("secondary", Hello(party="primary", role="primary")), Hello)
    incident = re.search(r"incident ([0-9a-f]+)", str(err))
    if incident is not None:  # an internal error: its trace is in the server's log only
        log = (fed.tmp / "secondary.log").read_text()
        assert incident.group(1) in log and "Traceback" in log
        # and in the incident file the message names (its name only: the path is local)
        name = f"vflink-incident-{incident.group(1)}.log"
        assert name in str(err) and str(fed.tmp) not in str(err)
        trace = Path(os.environ["VFLINK_LOG_DIR"]) / name
        assert trace.is_file() and "Traceback" in trace.read_text()

