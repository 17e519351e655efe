"""The protocol declarations and the session engine (docs/security.md).

The declarations are checked for consistency with the parties that enforce them and with the
README; the engine is checked rule by rule against small hand-made protocols (the oracle is the
table itself: a message is admitted iff a row allows it).
"""

from __future__ import annotations

import importlib.util
import inspect
import re
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vflink.errors import PolicyViolation, ProtocolError
from vflink.parties import CoordinatorParty, SecondaryParty
from vflink.parties.policy import SENDERS
from vflink.protocol.messages import MESSAGE_TYPES, Message
from vflink.protocol.sessions import (
    PROTOCOLS,
    Chunked,
    ProtocolSpec,
    SessionLimits,
    SessionTable,
    Step,
    at_least,
    at_most,
    describe,
    equal,
    new_session_name,
    purpose_of,
)

ROOT = Path(__file__).resolve().parents[3]
SECURITY = ROOT / "docs" / "security.md"
GEN_REF = ROOT / "docs" / "gen_ref.py"


@dataclass(frozen=True)
class Open(Message):
    kind: ClassVar[str] = "t_open"
    session: str
    items: tuple[int, ...] = ()


@dataclass(frozen=True)
class Next(Message):
    kind: ClassVar[str] = "t_next"
    session: str
    items: tuple[int, ...] = ()


@dataclass(frozen=True)
class Close(Message):
    kind: ClassVar[str] = "t_close"
    session: str


TOY = ProtocolSpec(
    name="toy", title="toy", receiver="secondary", key="session",
    states=("new", "one", "done"), initial="new", final=("done",),
    steps=(Step("t_open", ("primary",), ("new",), "one", opens=True,
                commits=(("n", "items"),)),
           Step("t_next", ("primary",), ("one",), None, times=2,
                bounds=(equal("items", "n"),)),
           Step("t_close", ("primary",), ("one",), "done")))


def table(now: list[float] | None = None, **limits: float) -> SessionTable:
    clock = (lambda: now[0]) if now is not None else (lambda: 0.0)
    return SessionTable("bank", "secondary", SessionLimits(**limits),  # type: ignore[arg-type]
                        protocols=(TOY,), clock=clock)


def step(t: SessionTable, sender: str, message: Message, role: str | None = "primary") -> None:
    admission = t.admit(sender, role, message)
    assert admission is not None
    t.done(admission, message)


def test_a_protocol_runs_in_order_and_a_finished_session_is_immutable() -> None:
    t = table()
    step(t, "p", Open(session="s", items=(1, 2, 3)))
    with pytest.raises(ProtocolError, match=r"toy protocol, state 'one': t_open refused"):
        t.admit("p", "primary", Open(session="s"))
    step(t, "p", Next(session="s", items=(4, 5, 6)))
    step(t, "p", Close(session="s"))
    for msg in (Next(session="s", items=(1, 2, 3)), Close(session="s"), Open(session="s")):
        with pytest.raises(ProtocolError, match=r"immutable.*session.finished"):
            t.admit("p", "primary", msg)


def test_sizes_are_bound_to_the_commitments_of_earlier_rounds() -> None:
    t = table()
    step(t, "p", Open(session="s", items=(1, 2)))
    for items in ((1,), (1, 2, 3)):
        with pytest.raises(ProtocolError, match=r"items has \d elements; len\(items\) = n "
                                                r"\(n = 2\).*session.bound-size"):
            t.admit("p", "primary", Next(session="s", items=items))


def test_counts_senders_and_openers() -> None:
    t = table()
    with pytest.raises(ProtocolError, match=r"state 'new': t_next refused.*session.state"):
        t.admit("p", "primary", Next(session="s", items=()))
    step(t, "p", Open(session="s", items=(1,)))
    step(t, "p", Next(session="s", items=(1,)))
    step(t, "p", Next(session="s", items=(2,)))
    with pytest.raises(ProtocolError, match=r"already received 2 time\(s\).*session.repeated"):
        t.admit("p", "primary", Next(session="s", items=(3,)))
    with pytest.raises(PolicyViolation, match="belongs to other parties"):
        t.admit("q", "primary", Close(session="s"))  # two-party: only its opener
    with pytest.raises(PolicyViolation, match="only a primary party"):
        t.admit("p", "secondary", Open(session="t"))


def test_a_failed_handler_leaves_the_state_as_it_was() -> None:
    t = table()
    admission = t.admit("p", "primary", Open(session="s", items=(1,)))
    assert admission is not None
    t.failed(admission)  # the handler refused: the session it opened is gone again
    assert t.get("toy", "s") is None
    step(t, "p", Open(session="s", items=(1,)))
    admission = t.admit("p", "primary", Next(session="s", items=(9,)))
    assert admission is not None
    t.failed(admission)  # not counted: two more are still allowed
    step(t, "p", Next(session="s", items=(1,)))
    step(t, "p", Next(session="s", items=(1,)))


def test_names_count_limit_and_expiry() -> None:
    now = [0.0]
    t = table(now, max_sessions=2, ttl_s=10)
    for bad in ("", "x" * 201, "../up", "a/b", " lead", 7):
        with pytest.raises(ProtocolError, match="session.name"):
            t.admit("p", "primary", Open(session=bad))  # type: ignore[arg-type]
    step(t, "p", Open(session="a", items=()))
    step(t, "p", Open(session="b", items=()))
    with pytest.raises(PolicyViolation, match=r"holds 2 sessions.*limit.sessions"):
        t.admit("p", "primary", Open(session="c"))
    step(t, "p", Close(session="a"))  # a finished session makes room
    step(t, "p", Open(session="c", items=()))
    with pytest.raises(ProtocolError, match="immutable"):  # ... but its name stays used
        t.admit("p", "primary", Open(session="a"))
    now[0] = 11.0  # b and c expire unused
    step(t, "p", Open(session="d", items=()))
    assert t.get("toy", "b") is None and t.get("toy", "c") is None


@settings(max_examples=200, deadline=None)
@given(n=st.integers(0, 5), sizes=st.lists(st.integers(0, 7), max_size=6))
def test_the_engine_admits_exactly_what_the_table_allows(n: int, sizes: list[int]) -> None:
    t = table()
    step(t, "p", Open(session="s", items=tuple(range(n))))
    accepted = 0
    for m in sizes:
        allowed = m == n and accepted < 2
        try:
            step(t, "p", Next(session="s", items=tuple(range(m))))
        except ProtocolError:
            assert not allowed
        else:
            assert allowed
            accepted += 1


def test_bounds_describe_themselves() -> None:
    assert equal("a", "n").text() == "len(a) = n"
    assert at_most("u", "n", "m").text() == "len(u) ≤ n + m"
    assert at_least("u", "n", "m", largest=True).text() == "max(n, m) ≤ len(u)"


def test_session_names_are_fresh_per_run_and_keep_their_purpose() -> None:
    a, b = new_session_name("soft"), new_session_name("soft")
    assert a != b and purpose_of(a) == purpose_of(b) == "soft"


@pytest.mark.parametrize("party, role", [(SecondaryParty, "secondary"),
                                         (CoordinatorParty, "coordinator")])
def test_every_declared_message_has_a_handler_and_a_message_type(party: type,
                                                                  role: str) -> None:
    specs = [p for p in PROTOCOLS if p.receiver == role]
    assert specs
    for spec in specs:
        assert spec.initial in spec.states and set(spec.final) <= set(spec.states)
        for s in spec.steps:
            assert s.kind in MESSAGE_TYPES, s.kind
            assert callable(getattr(party, f"on_{s.kind}", None)), s.kind
            assert set(s.source) <= set(spec.states) and (
                s.target is None or s.target in spec.states), (spec.name, s)
            for bound in s.bounds:
                fields = inspect.signature(MESSAGE_TYPES[s.kind]).parameters
                assert bound.field in fields, (s.kind, bound.field)


@pytest.mark.parametrize("role", ["secondary", "coordinator"])
def test_every_handled_peer_message_is_declared(role: str) -> None:
    """A handler whose message no protocol declares would run with no session check."""
    party = {"secondary": SecondaryParty, "coordinator": CoordinatorParty}[role]
    declared = {s.kind for p in PROTOCOLS if p.receiver == role for s in p.steps}
    handled = {name[3:] for name in dir(party) if name.startswith("on_")}
    assert handled - declared == {"hello", "health"}  # lifecycle: no session
    assert set(SENDERS[role]) <= declared


def test_the_docs_draw_every_protocol_as_declared() -> None:
    """The security page's state tables are the declarations, rendered at every docs build
    (docs/gen_ref.py): they cannot drift from what the parties enforce."""
    text = SECURITY.read_text(encoding="utf-8")
    assert "<!-- vflink:sessions -->" in text
    spec = importlib.util.spec_from_file_location("gen_ref", GEN_REF)
    assert spec is not None and spec.loader is not None
    gen_ref = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen_ref)
    rendered = gen_ref.render(text)
    assert re.sub(r"^#### ", "### ", describe(), flags=re.M).strip() in rendered  # a level up
    for p in PROTOCOLS:
        assert f"`{p.name}`" in rendered


# --- chunked lists ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Begin(Message):
    kind: ClassVar[str] = "c_begin"
    session: str
    n: int
    chunk_rows: int


@dataclass(frozen=True)
class Part(Message):
    kind: ClassVar[str] = "c_part"
    session: str
    stream: str
    index: int
    total: int
    elements: tuple[int, ...]


CHUNKY = ProtocolSpec(
    name="chunky", title="chunky", receiver="secondary", key="session",
    states=("new", "up", "done"), initial="new", final=("done",),
    steps=(Step("c_begin", ("primary",), ("new",), "up", opens=True,
                commits=(("n", "n"), ("chunk", "chunk_rows"))),
           Step("c_part", ("primary",), ("up",), "done", times=None, when=("stream", ("up",)),
                chunk=Chunked("up"), bounds=(equal("total", "n"),))))


def part(index: int, n: int, total: int = 5, stream: str = "up") -> Part:
    return Part(session="s", stream=stream, index=index, total=total,
                elements=tuple(range(n)))


@given(chunk=st.integers(1, 6), n=st.integers(0, 12),
       moves=st.lists(st.tuples(st.sampled_from(["next", "repeat", "skip"]),
                                st.integers(-1, 8), st.sampled_from([0, 1, -1])),
                      max_size=12))
@settings(max_examples=200, deadline=None)
def test_chunks_are_admitted_iff_in_order_within_the_limit_and_the_total(
        chunk: int, n: int, moves: list[tuple[str, int, int]]) -> None:
    """The oracle: a chunk is admitted iff it is the next one, holds 1..chunk elements (or is
    the one empty chunk of an empty list), stays within the committed total, and its list is
    still open."""
    t = SessionTable("bank", "secondary", protocols=(CHUNKY,))
    step(t, "p", Begin(session="s", n=n, chunk_rows=chunk))
    chunks = rows = 0
    closed = False
    for how, size, total_delta in moves:
        idx = {"next": chunks, "repeat": chunks - 1, "skip": chunks + 1}[how]
        size = min(chunk, n - rows) if size < 0 else size
        msg = part(idx, size, max(0, n + total_delta))
        ok = (not closed and idx == chunks and size <= chunk and rows + size <= n
              and msg.total == n and (size > 0 or (n == 0 and chunks == 0)))
        if ok:
            step(t, "p", msg)
            chunks, rows = chunks + 1, rows + size
            closed = rows == n
        else:
            with pytest.raises(ProtocolError):
                t.admit("p", "primary", msg)
    s = t.get("chunky", "s")
    assert s is not None and (s.state == "done") == closed


def test_a_chunk_while_another_of_its_list_is_handled_is_refused() -> None:
    t = SessionTable("bank", "secondary", protocols=(CHUNKY,))
    step(t, "p", Begin(session="s", n=4, chunk_rows=2))
    first = t.admit("p", "primary", part(0, 2, 4))
    assert first is not None
    # the same chunk again, concurrently: both would pass the order check otherwise
    with pytest.raises(ProtocolError, match="still being handled"):
        t.admit("p", "primary", part(0, 2, 4))
    t.done(first, part(0, 2, 4))
    with pytest.raises(ProtocolError, match="repeats"):
        t.admit("p", "primary", part(0, 2, 4))
    failed = t.admit("p", "primary", part(1, 2, 4))
    assert failed is not None
    t.failed(failed)  # a failed handler frees the list for a retry
    step(t, "p", part(1, 2, 4))
    with pytest.raises(ProtocolError, match="refused"):
        t.admit("p", "primary", part(2, 1, 4))  # the list is closed (here: the session)


def test_every_limit_is_per_peer() -> None:
    """One peer's abandoned sessions fill its own share only; its finished sessions make room
    for each other, never another peer's; idle unfinished ones expire in minutes."""
    now = [0.0]
    t = table(now, max_sessions=3, ttl_s=300, max_finished_per_peer=2)
    dropped: list[str] = []
    t.on_drop = lambda s: dropped.append(s.name)
    for i in range(3):
        step(t, "mallory", Open(session=f"m{i}", items=()))
    with pytest.raises(PolicyViolation, match=r"holds 3 sessions of 'mallory'.*limit.sessions"):
        t.admit("mallory", "primary", Open(session="m3"))
    for i in range(3):  # another peer is not affected
        step(t, "alice", Open(session=f"a{i}", items=()))
        step(t, "alice", Close(session=f"a{i}"))
    # alice's finished sessions: her own two most recent are kept, the oldest made room
    assert dropped == ["a0"] and t.get("toy", "a0") is None
    assert t.get("toy", "a1") is not None and t.get("toy", "a2") is not None
    for i in range(3):  # mallory finishing sessions never evicts alice's
        step(t, "mallory", Close(session=f"m{i}"))
    assert t.get("toy", "a1") is not None and t.get("toy", "a2") is not None
    step(t, "mallory", Open(session="idle", items=()))
    now[0] = 299.0
    step(t, "alice", Open(session="busy", items=()))  # touched: not idle
    now[0] = 301.0
    step(t, "alice", Next(session="busy", items=()))  # progress keeps it
    assert t.get("toy", "idle") is None and "idle" in dropped  # no progress for 300 s
    assert t.get("toy", "busy") is not None
    assert t.get("toy", "a1") is not None  # finished ones do not expire


def test_a_session_whose_handler_failed_ends_at_once_when_its_protocol_says_so() -> None:
    ending = ProtocolSpec(
        name="toy", title="toy", receiver="secondary", key="session",
        states=("new", "one", "done"), initial="new", final=("done",), steps=TOY.steps,
        ends_on_failure=True)
    t = SessionTable("bank", "secondary", SessionLimits(max_sessions=1),
                     protocols=(ending,))
    dropped: list[str] = []
    t.on_drop = lambda s: dropped.append(s.name)
    step(t, "p", Open(session="s", items=(1,)))
    admission = t.admit("p", "primary", Next(session="s", items=(1,)))
    assert admission is not None
    t.failed(admission)
    assert t.get("toy", "s") is None and dropped == ["s"]
    step(t, "p", Open(session="s2", items=(1,)))  # its share is free again at once


def test_a_finished_session_kept_on_disk_is_restored() -> None:
    from vflink.protocol.sessions import Session

    t = table(max_finished_per_peer=1)
    kept = {"old": Session(TOY, "old", "p", "done", 0.0, 0.0)}
    t.restore = lambda spec, name, peer: kept.get(name) if peer in (None, "p") else None
    s = t.get("toy", "old")
    assert s is kept["old"] and s.finished
    with pytest.raises(ProtocolError, match="immutable"):  # a restored name stays used
        t.admit("p", "primary", Open(session="old"))
    with pytest.raises(PolicyViolation, match="other parties"):  # it is in memory now
        t.admit("q", "primary", Next(session="old", items=()))
    t2 = table()
    t2.restore = lambda spec, name, peer: kept.get(name) if peer in (None, "p") else None
    with pytest.raises(ProtocolError, match="no session 'old' is open|allowed in this state"):
        t2.admit("q", "primary", Next(session="old", items=()))  # another peer: not reloaded
    assert t2.sessions() == []
