"""How long a session lives, and what its opener is told when it is gone.

An honest driver that computes for longer than the idle expiry used to find its session gone
and be told ``state 'new': psu_chunk refused``; a hostile one must still not hold its share for
ever. The oracle is the rule itself: a session lives while messages (a keepalive included)
arrive within ``ttl_s``, never beyond ``max_life_s``, never dies under a running handler, and
its opener's late message says why it ended.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import pytest

from vflink.errors import ProtocolError
from vflink.protocol.messages import Message, PsiRound1, PsuRound1, SetProgress
from vflink.protocol.sessions import (
    PSI,
    PSU,
    TRAINING,
    ProtocolSpec,
    SessionLimits,
    SessionTable,
    Step,
    run_key,
)


@dataclass(frozen=True)
class Open(Message):
    kind: ClassVar[str] = "l_open"
    session: str


@dataclass(frozen=True)
class Ping(Message):
    kind: ClassVar[str] = "l_ping"
    session: str


@dataclass(frozen=True)
class Close(Message):
    kind: ClassVar[str] = "l_close"
    session: str


LIFE = ProtocolSpec(
    name="life", title="life", receiver="secondary", key="session",
    states=("new", "open", "done"), initial="new", final=("done",),
    steps=(Step("l_open", ("primary",), ("new",), "open", opens=True),
           Step("l_ping", ("primary",), ("open",), None, times=None),
           Step("l_close", ("primary",), ("open",), "done")))


def table(now: list[float], **limits: float) -> SessionTable:
    return SessionTable("bank", "secondary", SessionLimits(**limits),  # type: ignore[arg-type]
                        protocols=(LIFE,), clock=lambda: now[0])


def step(t: SessionTable, message: Message, sender: str = "primary") -> None:
    admission = t.admit(sender, "primary", message)
    assert admission is not None
    t.done(admission, message)


def test_an_expired_session_is_reported_as_expired_to_its_opener_only() -> None:
    now = [0.0]
    t = table(now, ttl_s=10.0)
    step(t, Open(session="s"))
    now[0] = 11.0
    t.admit("other", "primary", Open(session="x"))  # any admission expires idle sessions
    with pytest.raises(ProtocolError) as info:
        t.admit("primary", "primary", Ping(session="s"))
    assert getattr(info.value, "code", None) == "session.ended"
    assert "expired" in str(info.value) and "policy.session_ttl_s" in str(info.value)
    # another peer asking for the name learns nothing of it
    with pytest.raises(ProtocolError) as other:
        t.admit("other", "primary", Ping(session="s"))
    assert "expired" not in str(other.value)
    assert getattr(other.value, "code", None) != "session.ended"
    # a new run under a fresh name works as ever
    step(t, Open(session="s2"))


def test_a_keepalive_holds_a_session_only_up_to_its_life_limit() -> None:
    now = [0.0]
    t = table(now, ttl_s=10.0, max_life_s=100.0)
    step(t, Open(session="s"))
    for _ in range(11):  # a message every 9 s keeps it within the idle time, to 99 s
        now[0] += 9.0
        step(t, Ping(session="s"))
    now[0] += 9.0  # 108 s: past its life, however often it pinged
    with pytest.raises(ProtocolError, match=r"max_session_s.*session\.ended"):
        t.admit("primary", "primary", Ping(session="s"))


def test_no_session_expires_under_a_running_handler() -> None:
    now = [0.0]
    t = table(now, ttl_s=10.0)
    step(t, Open(session="s"))
    running = t.admit("primary", "primary", Ping(session="s"))  # a long handler starts
    assert running is not None
    now[0] = 60.0
    t.admit("other", "primary", Open(session="x"))  # others' messages arrive meanwhile
    t.done(running, Ping(session="s"))  # it finishes: the session is still there
    step(t, Close(session="s"))


def test_set_progress_belongs_to_psu_and_psi_alike() -> None:
    now = [0.0]
    t = SessionTable("bank", "secondary", SessionLimits(), protocols=(PSU, PSI),
                     clock=lambda: now[0])
    assert t.governs("set_progress")
    # no session: a progress message opens nothing
    with pytest.raises(ProtocolError, match=r"set_progress refused.*session\.state"):
        t.admit("primary", "primary", SetProgress(session="psi@1", stream="a_s", done=1))
    opened = {"psu@1": PsuRound1(session="psu@1", group="ristretto255", n_a=5, chunk_rows=5),
              "psi@1": PsiRound1(session="psi@1", group="ristretto255", reveal="both", n_a=5,
                                 chunk_rows=5)}
    for name, round1 in opened.items():
        step(t, round1)
        stream = "a_s1" if name.startswith("psu") else "a_s"
        admission = t.admit("primary", "primary", SetProgress(session=name, stream=stream,
                                                               done=1))
        assert admission is not None and admission.session.protocol.name == name[:3]
        now[0] += 1.0
        t.done(admission, SetProgress(session=name, stream=stream, done=1))
        assert admission.session.touched == now[0]  # a sign of life
    # only the list the session waits for: PSI's state a_s is no PSU list
    with pytest.raises(ProtocolError, match=r"session\.state"):
        t.admit("primary", "primary", SetProgress(session="psi@1", stream="union", done=2))


def test_each_run_of_each_peer_is_a_session_and_a_peer_makes_room_only_with_its_own() -> None:
    from vflink.models.spec import BottomSpec
    from vflink.protocol.messages import Forward, SetupBottom

    now = [0.0]
    t = SessionTable("bank", "secondary", SessionLimits(max_runs_per_peer=2),
                     protocols=(TRAINING,), clock=lambda: now[0])
    spec = BottomSpec(hidden=(4,), out_dim=2)
    for run in ("a", "b"):
        now[0] += 1
        step(t, SetupBottom(spec=spec, run=run))
    now[0] += 1
    step(t, SetupBottom(spec=spec, run="z"), sender="primary2")  # another peer's run
    now[0] += 1
    step(t, SetupBottom(spec=spec, run="c"))  # the peer's third: its oldest ("a") goes
    names = sorted(s.name for s in t.sessions("training"))
    assert names == sorted([run_key("primary", "b"), run_key("primary", "c"),
                            run_key("primary2", "z")])
    with pytest.raises(ProtocolError) as info:  # the dropped run is told why
        t.admit("primary", "primary", Forward(batch_id=1, rows=np.arange(1), train=False,
                                               run="a"))
    assert "policy.max_training_runs" in str(info.value)
    with pytest.raises(ProtocolError, match=r"run\.name"):
        t.admit("primary", "primary", SetupBottom(spec=spec, run="../x"))
