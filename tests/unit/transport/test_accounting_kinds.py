"""Per-(kind, sender, receiver) counts add up to the per-direction counts."""

from __future__ import annotations

import numpy as np

from vflink.protocol import Ack, Forward, payload_nbytes
from vflink.transport import TrafficCounter


def test_kind_counts_sum_to_direction_counts() -> None:
    counter = TrafficCounter()
    fwd = Forward(batch_id=1, rows=np.arange(5), train=True)
    counter.add("primary", "bank", fwd)
    counter.add("bank", "primary", Ack())
    before = counter.kinds()
    counter.add("primary", "bank", fwd)
    counter.add("primary", "bank", Ack())
    kinds = counter.kinds()
    snap = counter.snapshot()
    for direction, total in snap.items():
        s, r = direction.split("->")
        mine = [k for k in kinds if k["sender"] == s and k["receiver"] == r]
        assert sum(k["messages"] for k in mine) == total["messages"]
        assert sum(k["bytes"] for k in mine) == total["bytes"]
    delta = TrafficCounter.kinds_delta(kinds, before)
    assert {(d["kind"], d["messages"]) for d in delta} == {("forward", 1), ("ack", 1)}
    fwd_entry = next(d for d in delta if d["kind"] == "forward")
    assert fwd_entry["bytes"] == payload_nbytes(fwd)
