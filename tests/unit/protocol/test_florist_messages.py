"""The FLORIST messages cross the gRPC serde unchanged (strictly typed fields)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from vflink.models.spec import BottomSpec
from vflink.protocol.messages import (
    MESSAGE_TYPES,
    Message,
    PsiRound1,
    PsiRound1Reply,
    PsiRound2,
    PsuRound1,
    PsuRound1Reply,
    PsuRound2,
    PsuRound2Reply,
    PsuRound3,
    UnionForward,
    UnionSetup,
)
from vflink.transport.grpc.serde import envelope_from_bytes, message_from_proto, message_to_proto


def el(n: int, w: int = 32) -> np.ndarray:
    return np.random.default_rng(n).integers(0, 256, size=(n, w), dtype=np.uint8)


MESSAGES: list[Message] = [
    PsuRound1(session="psu", group="ristretto255", a_s1=el(3)),
    PsuRound1Reply(a_s1t1=el(3), p_t1=el(0)),
    PsuRound2(session="psu", p_s1t1=el(2), union_s123t1=el(4), a_s2=el(3)),
    PsuRound2Reply(union=el(4), a_s2t123=el(3), p_t2=el(2)),
    PsuRound3(session="psu", p_s123t2=el(2, 256)),
    PsiRound1(session="psi", group="modp2048", reveal="both", a_s=el(2, 256)),
    PsiRound1Reply(a_st=el(2, 256), p_t=el(5, 256)),
    PsiRound2(session="psi", p_ts=el(5)),
    UnionSetup(session="psu", spec=BottomSpec(hidden=(8,), out_dim=4), features="fea-sampling",
               fit_uids=np.arange(5, dtype=np.int64)),
    UnionForward(batch_id=3, uids=np.array([4, 1], dtype=np.int64), train=True),
]


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: m.kind)
def test_round_trip(message: Message) -> None:
    assert MESSAGE_TYPES[message.kind] is type(message)
    wire = message_to_proto(message, sender="primary").SerializeToString()
    back = message_from_proto(envelope_from_bytes(wire))
    assert type(back) is type(message)
    for f in dataclasses.fields(message):
        a, b = getattr(message, f.name), getattr(back, f.name)
        if isinstance(a, np.ndarray):
            assert a.dtype == b.dtype and (a == b).all() and a.shape == b.shape
        else:
            assert a == b
