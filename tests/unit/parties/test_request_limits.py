"""A request cannot cause unbounded work: sizes a protocol allows are capped by the
party's own policy and refused before any work, on every transport; malformed work parameters
are a validation message, not an internal error; Health is answered."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from vflink._cancel import work_scope
from vflink.alignment.groups import get_group
from vflink.data import PartySchema, PartyTable
from vflink.errors import ConfigError, PolicyViolation, ProtocolError, VflinkError
from vflink.parties import SecondaryParty
from vflink.parties.policy import PartyPolicy
from vflink.protocol import (
    Ack,
    BlockingKey,
    EncodingSpec,
    FieldEncoding,
    Health,
    Message,
    ShareEncodings,
    ShareFieldEncodings,
)
from vflink.protocol.messages import (
    MAX_CHUNK_ROWS,
    PsiRound1,
    PsuChunk,
    PsuFetch,
    PsuRound1,
    SetupPrivacy,
)
from vflink.protocol.sessions import DATA_ALIGNMENT
from vflink.transport import InProcessHub
from vflink.transport.grpc import GrpcChannel, GrpcServer, create_dev_pki
from vflink.transport.grpc.tls import TlsConfig

POLICY = PartyPolicy(max_set_elements=1000, max_bloom_bits=2048, max_bloom_hashes=64,
                     max_bloom_centres=1024)


def bank() -> SecondaryParty:
    frame = pd.DataFrame({"id": [f"k{i}" for i in range(20)],
                          "name": [f"Alice{i} Smith" for i in range(20)],
                          "income": np.linspace(1.0, 2.0, 20)})
    schema = PartySchema(name="bank", role="secondary", key=("id",), identifiers=("name",),
                         numeric=("income",))
    party = SecondaryParty(PartyTable.from_frame(schema, frame, "bank.csv"),
                           InProcessHub().channel("bank"), secret=b"s" * 32, policy=POLICY)
    party.roles = {"primary": "primary", "bank": "secondary", "coordinator": "coordinator"}
    # session "s" passed key confirmation (as in the tester's runs): the limits, not the
    # confirmation, must stop what follows
    party.sessions.open(DATA_ALIGNMENT, "s", opener="primary", state="open").data[
        "confirmed"] = True
    return party


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("pki")
    create_dev_pki(d, ["primary", "bank"])
    return d


@pytest.fixture(params=["inprocess", "grpc"])
def call(request: pytest.FixtureRequest, pki: Path) -> Iterator[Callable[[Message], Message]]:
    """``call(message)``: the primary's request to a fresh bank, over the transport."""
    party = bank()
    if request.param == "inprocess":
        hub = InProcessHub()
        hub.register("bank", party)
        yield lambda m: hub.channel("primary").call("bank", m)
        return
    server = GrpcServer("bank", party, "127.0.0.1:0", TlsConfig.for_party(pki, "bank"),
                        {"primary"}).start()
    channel = GrpcChannel("primary", {"bank": f"127.0.0.1:{server.port}"},
                          TlsConfig.for_party(pki, "primary"), deadline_s=30)
    try:
        yield lambda m: channel.call("bank", m)
    finally:
        channel.close()
        server.stop(grace=None)


def refusal(call: Callable[[Message], Message], message: Message) -> VflinkError:
    started = time.monotonic()
    with pytest.raises(VflinkError) as info:
        call(message)
    # liveness bound only: refused before any work (the work would take seconds)
    assert time.monotonic() - started < 5.0
    return info.value


def _bloom(kind: str = "string", **params: Any) -> EncodingSpec:
    low, high = ((0.0,), (1.0,)) if kind == "numeric" else ((), ())
    return EncodingSpec(encoder="bloom", kind=kind, params=params, low=low, high=high)


@pytest.mark.network
def test_oversized_psu_and_psi_rounds_are_refused_before_work(call: Any) -> None:
    g = get_group("ristretto255", workers=1)
    over = np.tile(g.hash_to_group([b"x"]), (POLICY.max_set_elements + 1, 1))
    n = POLICY.max_set_elements
    # the announced total is capped in round 1 (the lists follow in chunks)
    for message in (PsuRound1(session="p", group="ristretto255", n_a=n + 1, chunk_rows=n),
                    PsiRound1(session="q", group="ristretto255", reveal="both", n_a=n + 1,
                              chunk_rows=n)):
        err = refusal(call, message)
        assert isinstance(err, PolicyViolation), err
        assert getattr(err, "code", None) == "limit.set-elements"
        assert "policy.max_set_elements" in str(err) and "1001" in str(err)
    # so is the chunk size
    err = refusal(call, PsuRound1(session="p", group="ristretto255", n_a=n,
                                  chunk_rows=MAX_CHUNK_ROWS + 1))
    assert getattr(err, "code", None) == "limit.chunk", err
    # at the cap the round runs (the oracle: one reply element per element sent)
    call(PsuRound1(session="p", group="ristretto255", n_a=n, chunk_rows=n))
    call(PsuChunk(session="p", stream="a_s1", index=0, total=n, elements=over[:n]))
    reply = call(PsuFetch(session="p", stream="a_s1t1", index=0))
    assert len(reply.elements) == n  # type: ignore[attr-defined]


@pytest.mark.network
def test_bloom_work_parameters_are_capped_and_validated(call: Any) -> None:
    over = [(_bloom(num_hashes=65), "limit.bloom-hashes"),
            (_bloom(filter_bits=4096), "limit.bloom-bits"),
            (_bloom("numeric", n_centres=4096, threshold=0.1), "limit.bloom-bits"),
            (_bloom("numeric", n_centres=1032), "limit.bloom-centres"),
            # geographic filters: grid tokens x hashes per record
            (_bloom("geo", directions=1000, filter_bits=2048), "limit.bloom-hashes"),
            (_bloom(num_hashes=200_000), "limit.bloom-hashes")]  # the tester's 11.7 s request
    for spec, code in over:
        err = refusal(call, ShareEncodings(session="s", coordinator="coordinator", spec=spec))
        assert isinstance(err, PolicyViolation) and getattr(err, "code", None) == code, \
            (spec, err)
    malformed = [(_bloom(num_hashs=3), "num_hashs"), (_bloom(num_hashes=0), "num_hashes"),
                 (_bloom("numeric", n_centres=12), "n_centres"),
                 (_bloom("geo", qgram=2), "qgram"), (_bloom("sound"), "kind")]
    for spec, named in malformed:
        err = refusal(call, ShareEncodings(session="s", coordinator="coordinator", spec=spec))
        # a validation message naming the parameter, not an internal error
        assert isinstance(err, ProtocolError), (spec, err)
        assert getattr(err, "code", None) == "encoding.params" and named in str(err), err
        assert "internal" not in str(err)
    # the same checks for every field of a field request
    field_err = refusal(call, ShareFieldEncodings(
        session="s", coordinator="coordinator",
        fields=(FieldEncoding(columns=("name",), spec=_bloom(num_hashs=3)),)))
    assert getattr(field_err, "code", None) == "encoding.params"


@pytest.mark.network
def test_negative_prefix_and_class_counts_are_refused(call: Any) -> None:
    field = FieldEncoding(columns=("name",), spec=_bloom())
    err = refusal(call, ShareFieldEncodings(session="s", coordinator="coordinator",
                                            fields=(field,),
                                            blocking=(BlockingKey(column="name", prefix=-1),)))
    assert isinstance(err, ProtocolError) and getattr(err, "code", None) == "blocking.prefix"
    err = refusal(call, ShareFieldEncodings(session="s", coordinator="coordinator",
                                            fields=(field,) * 33))
    assert isinstance(err, PolicyViolation) and getattr(err, "code", None) == "limit.fields"
    for classes in (-5, 10**9):
        err = refusal(call, SetupPrivacy(settings={}, classes=classes))
        assert isinstance(err, ProtocolError) and getattr(err, "code", None) == \
            "privacy.classes", err


@pytest.mark.network
def test_health_is_answered_by_any_allowed_peer(call: Any) -> None:
    reply = call(Health())
    assert isinstance(reply, Ack) and reply.info["busy"] == 0.0


def test_policy_limits_are_validated() -> None:
    with pytest.raises(ConfigError) as info:
        PartyPolicy(max_set_elements=0, max_bloom_bits=-1, max_concurrent_calls=0)
    text = str(info.value)
    assert "max_set_elements" in text and "max_bloom_bits" in text
    assert "max_concurrent_calls" in text
    # the defaults admit what honest runs use (default Bloom, geo and numeric filters)
    p = PartyPolicy()
    for spec in (_bloom(), _bloom("geo"), _bloom("numeric"),
                 _bloom("numeric", resolution=1e-4)):
        p.check_encoding("bank", spec)


def test_a_round_that_cannot_finish_within_the_callers_deadline_is_refused_upfront() -> None:
    party = bank()
    g = get_group("ristretto255", workers=1)
    n = POLICY.max_set_elements
    a_s1 = np.tile(g.hash_to_group([b"x"]), (n, 1))
    with work_scope(limit_s=60.0):
        party.handle("primary", PsuRound1(session="p", group="ristretto255", n_a=n,
                                          chunk_rows=n))
    message = PsuChunk(session="p", stream="a_s1", index=0, total=n, elements=a_s1)
    # 1,000 exponentiations in this chunk: half the least time they can take is left
    least = get_group("ristretto255").min_seconds(n)
    with work_scope(limit_s=least / 2), pytest.raises(PolicyViolation) as info:
        party.handle("primary", message)
    assert getattr(info.value, "code", None) == "limit.work" and "deadline" in str(info.value)
    assert party.set_alignment("p") is None  # nothing was finished


def test_pending_union_forwards_are_bounded() -> None:
    from vflink.alignment._dh import key_bytes
    from vflink.models.spec import BottomSpec
    from vflink.parties.setalign import SetAlignmentDriver
    from vflink.protocol.messages import UnionForward, UnionSetup

    party = bank()
    hub = InProcessHub()
    hub.register("bank", party)
    channel = hub.channel("primary")
    keys = key_bytes(pd.DataFrame({"id": [f"k{i}" for i in range(10, 30)]}), ["id"])
    SetAlignmentDriver(keys, channel, get_group("ristretto255", workers=1)).psu("bank", "u")
    channel.call("bank", UnionSetup(session="u", spec=BottomSpec(hidden=(4,), out_dim=2),
                                    features="fea-sampling",
                                    fit_uids=np.arange(30, dtype=np.int64)))
    uids = np.arange(8, dtype=np.int64)
    for batch in range(POLICY.max_pending_batches):  # forwards that never get a Backward
        channel.call("bank", UnionForward(batch_id=batch, uids=uids, train=True))
    with pytest.raises(PolicyViolation) as info:
        channel.call("bank", UnionForward(batch_id=99, uids=uids, train=True))
    assert getattr(info.value, "code", None) == "limit.pending-batches"
    run = party.training_run("primary")
    assert run is not None and len(run.pending) == POLICY.max_pending_batches
    # evaluation forwards keep nothing pending and are still answered
    channel.call("bank", UnionForward(batch_id=100, uids=uids, train=False))
