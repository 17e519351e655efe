"""The FLORIST messages cross the gRPC serde unchanged (strictly typed fields)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from vflink.models.spec import BottomSpec
from vflink.protocol.messages import (
    MESSAGE_TYPES,
    Message,
    PsiChunk,
    PsiFetch,
    PsiRound1,
    PsuChunk,
    PsuFetch,
    PsuRound1,
    SetChunk,
    UnionForward,
    UnionSetup,
)
from vflink.transport.grpc.serde import envelope_from_bytes, message_from_proto, message_to_proto


def el(n: int, w: int = 32) -> np.ndarray:
    return np.random.default_rng(n).integers(0, 256, size=(n, w), dtype=np.uint8)


MESSAGES: list[Message] = [
    PsuRound1(session="psu", group="ristretto255", n_a=3, chunk_rows=2),
    PsuChunk(session="psu", stream="a_s1", index=1, total=3, elements=el(1)),
    PsuFetch(session="psu", stream="p_t1", index=0),
    SetChunk(stream="union", index=0, elements=el(0)),
    PsiRound1(session="psi", group="modp2048", reveal="both", n_a=2, chunk_rows=100),
    PsiChunk(session="psi", stream="a_s", index=0, total=2, elements=el(2, 256)),
    PsiFetch(session="psi", stream="a_st", index=0),
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
