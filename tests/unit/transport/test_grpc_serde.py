"""The gRPC serde: generated round trips of every registered message, and strict decoding."""

from __future__ import annotations

import dataclasses
import math
import struct
import types
import typing
from typing import Any, ClassVar

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from vflink.errors import ProtocolError
from vflink.models.spec import ACTIVATIONS, OPTIMIZERS, BottomSpec
from vflink.protocol import (
    MESSAGE_TYPES,
    PAYLOAD_TYPES,
    PROTOCOL_VERSION,
    Ack,
    AlignmentView,
    AlignmentViews,
    Backward,
    Embeddings,
    Forward,
    Hello,
    IdentifierEncodings,
    Message,
    SetupBottom,
    payload_nbytes,
)
from vflink.transport.grpc import message_from_proto, message_to_proto
from vflink.transport.grpc._wire import pb
from vflink.transport.grpc.serde import MAX_DEPTH, NUMPY_DTYPES, envelope_from_bytes
from vflink.types import Task

# --- strategies generated from the dataclass annotations --------------------------------------

_SHAPES = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5)
_TENSOR_DTYPES = ("float32", "float32", "float64", "float16", "bfloat16", "int64", "uint8", "bool")


def arrays(dtype: Any = None) -> st.SearchStrategy[np.ndarray]:
    dtypes = st.just(np.dtype(dtype)) if dtype is not None \
        else st.sampled_from(sorted(NUMPY_DTYPES)).map(np.dtype)
    return dtypes.flatmap(lambda dt: hnp.arrays(dt, _SHAPES))


def tensors() -> st.SearchStrategy[torch.Tensor]:
    def build(name: str) -> st.SearchStrategy[torch.Tensor]:
        if name == "bfloat16":
            return hnp.arrays(np.float32, _SHAPES).map(
                lambda a: torch.from_numpy(a).to(torch.bfloat16))
        return hnp.arrays(np.dtype(name), _SHAPES).map(torch.from_numpy)
    return st.sampled_from(_TENSOR_DTYPES).flatmap(build)


def bottom_specs() -> st.SearchStrategy[BottomSpec]:
    # BottomSpec validates its values; draw from its valid ranges.
    return st.builds(
        BottomSpec, hidden=st.lists(st.integers(1, 512), max_size=3).map(tuple),
        out_dim=st.integers(1, 64), activation=st.sampled_from(ACTIVATIONS),
        dropout=st.floats(0.0, 0.95), optimizer=st.sampled_from(OPTIMIZERS),
        lr=st.floats(1e-6, 1.0), weight_decay=st.floats(0.0, 1.0),
        seed=st.integers(0, 2**63 - 1))


TYPE_OVERRIDES: dict[type, st.SearchStrategy[Any]] = {BottomSpec: bottom_specs()}


def strategy_for(hint: Any) -> st.SearchStrategy[Any]:
    if hint in TYPE_OVERRIDES:
        return TYPE_OVERRIDES[hint]
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is type(None) or hint is None:
        return st.none()
    if hint is Any:  # e.g. ledger entries (PrivacyReport): plain JSON-like values
        return st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1),
                         st.floats(allow_nan=False), st.text(max_size=8))
    if origin is typing.Union or origin is types.UnionType:
        return st.one_of([strategy_for(a) for a in args])
    if hint is bool:
        return st.booleans()
    if hint is int:
        return st.integers(-(2**63), 2**63 - 1)
    if hint is float:
        return st.floats()
    if hint is str:
        return st.text(max_size=12)
    if hint is bytes:
        return st.binary(max_size=96)
    if origin is tuple:
        assert len(args) == 2 and args[1] is Ellipsis, hint
        return st.lists(strategy_for(args[0]), max_size=3).map(tuple)
    if origin is dict:
        return st.dictionaries(strategy_for(args[0]), strategy_for(args[1]), max_size=3)
    if origin is np.ndarray:
        scalar = typing.get_args(args[1])[0]
        return arrays(None if scalar is Any else scalar)
    if hint is torch.Tensor:
        return tensors()
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return dataclass_strategy(hint)
    raise AssertionError(f"no strategy for {hint!r}: extend the test with the new field type")


def dataclass_strategy(cls: type) -> st.SearchStrategy[Any]:
    hints = typing.get_type_hints(cls, localns={"torch": torch})  # messages import it lazily
    fields = {f.name: strategy_for(hints[f.name]) for f in dataclasses.fields(cls) if f.init}
    return st.fixed_dictionaries(fields).map(lambda kw: cls(**kw))


# --- exact comparison -------------------------------------------------------------------------


def tensor_bytes(t: torch.Tensor) -> bytes:
    if t.numel() == 0:
        return b""
    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def assert_same(a: Any, b: Any, path: str = "msg") -> None:
    """Equal type and value, bit for bit for floats and array bytes (NaN, -0.0 included)."""
    assert type(a) is type(b), f"{path}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, np.ndarray):
        assert (a.dtype, a.shape) == (b.dtype, b.shape), path
        assert a.tobytes() == b.tobytes(), path
        assert b.flags.writeable, path
    elif isinstance(a, torch.Tensor):
        assert (a.dtype, a.shape) == (b.dtype, b.shape), path
        assert tensor_bytes(a) == tensor_bytes(b), path
        assert not b.requires_grad, path
    elif isinstance(a, float):
        assert struct.pack("<d", a) == struct.pack("<d", b) or (math.isnan(a) and math.isnan(b)), \
            f"{path}: {a!r} != {b!r}"
    elif isinstance(a, (tuple, list)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{path}[{i}]")
    elif isinstance(a, dict):
        assert list(a) == list(b), path  # order kept too
        for k in a:
            assert_same(a[k], b[k], f"{path}[{k!r}]")
    elif dataclasses.is_dataclass(a):
        for f in dataclasses.fields(a):
            assert_same(getattr(a, f.name), getattr(b, f.name), f"{path}.{f.name}")
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def wire_round_trip(message: Message, sender: str = "primary") -> Message:
    data = message_to_proto(message, sender=sender, correlation_id="c1").SerializeToString()
    envelope = envelope_from_bytes(data)
    assert (envelope.sender, envelope.correlation_id) == (sender, "c1")
    return message_from_proto(envelope)


# --- round trips ------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", sorted(MESSAGE_TYPES))
@given(data=st.data())
def test_every_message_round_trips(kind: str, data: st.DataObject) -> None:
    message = data.draw(dataclass_strategy(MESSAGE_TYPES[kind]), label=kind)
    decoded = wire_round_trip(message)
    assert_same(message, decoded)
    assert payload_nbytes(decoded) == payload_nbytes(message)


def test_round_trip_examples_cover_optionals_nesting_and_empties() -> None:
    view = AlignmentView(session="s", secondary="bank", primary_index=np.arange(3),
                         secondary_index=np.zeros((3, 2), dtype=np.int64),
                         similarity=np.ones((3, 2), dtype=np.float32), meta={"tau": 0.5})
    bare = dataclasses.replace(view, similarity=None, meta={},
                               primary_index=np.empty(0, dtype=np.int64))
    for message in (
        AlignmentViews(views=(view, bare)),
        AlignmentViews(views=()),
        SetupBottom(spec=BottomSpec(hidden=(200, 100), out_dim=8, dropout=0.1)),
        Embeddings(batch_id=2, embeddings=torch.randn(16, 32),
                   inverse=np.array([0, 1, 1], dtype=np.int64)),
        Embeddings(batch_id=0, embeddings=torch.empty(0, 32), inverse=np.empty(0, np.int64)),
        IdentifierEncodings(session="s", encoder="string", values=("ann", "bob", "")),
        IdentifierEncodings(session="s", encoder="bloom",
                            values=np.zeros((4, 128), dtype=np.uint8)),
        Hello(party="bank", role="secondary"),
    ):
        decoded = wire_round_trip(message)
        assert_same(message, decoded)
        assert payload_nbytes(decoded) == payload_nbytes(message)


def test_received_arrays_are_writable_native_copies() -> None:
    grad = torch.randn(4, 3, requires_grad=True)
    sent = Backward(batch_id=1, grad=grad)
    got = wire_round_trip(sent)
    assert isinstance(got, Backward)
    assert torch.equal(got.grad, grad.detach()) and not got.grad.requires_grad
    got.grad.add_(1.0)  # writable, and not aliasing the sender's tensor
    assert not torch.equal(got.grad, grad.detach())
    # big-endian and non-contiguous inputs arrive as native little-endian, contiguous arrays
    rows = np.arange(10, dtype=">i8")[::2]
    fwd = wire_round_trip(Forward(batch_id=1, rows=rows, train=False))
    assert isinstance(fwd, Forward)
    assert fwd.rows.dtype == np.int64 and fwd.rows.tolist() == [0, 2, 4, 6, 8]


def test_numpy_scalars_travel_as_python_numbers() -> None:
    info: dict[str, Any] = {"a": np.float32(1.5), "b": np.float64(2.0), "n": 3}
    got = wire_round_trip(Ack(info=info))
    assert isinstance(got, Ack)
    assert got.info == {"a": 1.5, "b": 2.0, "n": 3}
    assert type(got.info["a"]) is float and type(got.info["n"]) is int


# --- strict decoding --------------------------------------------------------------------------


def envelope(kind: str = "forward", **fields: Any) -> Any:
    """A hand-built envelope: ``fields`` map names to functions filling a ``Value``."""
    env = pb.Envelope(protocol_version=PROTOCOL_VERSION, kind=kind, sender="primary")
    for name, fill in fields.items():
        field = env.fields.add()
        field.name = name
        fill(field.value)
    return env


def int_value(n: int) -> Any:
    return lambda v: setattr(v, "int_value", n)


def bool_value(b: bool) -> Any:
    return lambda v: setattr(v, "bool_value", b)


def array_value(dtype: str, shape: tuple[int, ...], data: bytes, arm: str = "ndarray") -> Any:
    def fill(v: Any) -> None:
        arr = getattr(v, arm)
        arr.dtype = dtype
        arr.shape.extend(shape)
        arr.data = data
    return fill


def good_forward(**override: Any) -> Any:
    fields = {"batch_id": int_value(1),
              "rows": array_value("int64", (2,), np.arange(2, dtype="<i8").tobytes()),
              "train": bool_value(True), "run": lambda v: setattr(v, "str_value", "r1")}
    fields.update(override)
    return envelope("forward", **{k: v for k, v in fields.items() if v is not None})


def test_hand_built_envelope_decodes() -> None:
    message = message_from_proto(good_forward())
    assert isinstance(message, Forward) and message.rows.tolist() == [0, 1]
    assert message.run == "r1"


@pytest.mark.parametrize(("env", "error"), [
    (envelope("nope"), "unknown message kind 'nope'"),
    (good_forward(extra=int_value(1)), "unknown field 'extra' for Forward"),
    (good_forward(train=None), "missing field"),
    (good_forward(batch_id=lambda v: setattr(v, "str_value", "1")),
     r"forward.batch_id: expected int, got str"),
    (good_forward(train=int_value(1)), "forward.train: expected bool, got int"),
    (good_forward(rows=array_value("int32", (2,), b"\0" * 8)),
     r"forward.rows: expected .*int64.*, got numpy array of int32"),
    (good_forward(rows=array_value("int64", (2,), b"\0" * 16, arm="tensor")),
     r"forward.rows: expected .*, got tensor of torch.int64"),
    (good_forward(rows=array_value("object", (2,), b"\0" * 16)),
     "forward.rows: unknown array dtype 'object'"),
    (good_forward(rows=array_value("float128", (1,), b"\0" * 16)), "unknown array dtype"),
    (good_forward(rows=array_value("int64", (3,), b"\0" * 20)),
     r"forward.rows: 20 bytes do not match shape \(3,\) of int64 \(24 bytes expected\)"),
    (good_forward(rows=array_value("int64", (2, 2**40), b"")), "do not match shape"),
    (good_forward(rows=lambda v: None), "forward.rows: empty value"),
    (envelope("embeddings", batch_id=int_value(1),
              embeddings=array_value("float32", (2, 2), b"\0" * 12, arm="tensor"),
              inverse=array_value("int64", (0,), b"")),
     r"embeddings.embeddings: 12 bytes do not match shape \(2, 2\) of float32"),
    (envelope("embeddings", batch_id=int_value(1),
              embeddings=array_value("complex64", (1,), b"\0" * 8, arm="tensor"),
              inverse=array_value("int64", (0,), b"")), "unknown tensor dtype 'complex64'"),
    (envelope("backward", batch_id=int_value(1),
              grad=array_value("bool", (2,), b"\x01\x07", arm="tensor")), "other than 0 and 1"),
])
def test_strict_decoding_rejects(env: Any, error: str) -> None:
    with pytest.raises(ProtocolError, match=error):
        message_from_proto(env)
    # and the same after a trip through bytes
    with pytest.raises(ProtocolError, match=error):
        message_from_proto(envelope_from_bytes(env.SerializeToString()))


def test_version_duplicates_nesting_and_payload_allowlist() -> None:
    env = good_forward()
    env.protocol_version = PROTOCOL_VERSION + 1
    with pytest.raises(ProtocolError, match=f"protocol version mismatch.*speaks version "
                                            f"{PROTOCOL_VERSION + 1}"):
        message_from_proto(env)

    dup = good_forward()
    field = dup.fields.add()
    field.name = "batch_id"
    field.value.int_value = 2
    with pytest.raises(ProtocolError, match="field 'batch_id' given twice"):
        message_from_proto(dup)

    def secret(v: Any) -> None:
        v.payload.type = "Secret"
        v.payload.SetInParent()
    with pytest.raises(ProtocolError, match="'Secret' is not an allowed payload type"):
        message_from_proto(envelope("setup_bottom", spec=secret))

    bad_spec = message_to_proto(SetupBottom(spec=BottomSpec()), sender="primary")
    (activation,) = [f for f in bad_spec.fields[0].value.payload.fields if f.name == "activation"]
    activation.value.str_value = "sigmoid"  # the receiving dataclass's own validation runs
    with pytest.raises(ProtocolError, match="invalid BottomSpec.*activation"):
        message_from_proto(bad_spec)

    def deep(v: Any) -> None:
        for _ in range(MAX_DEPTH + 2):
            v = v.tuple_value.items.add()
        v.int_value = 1
    with pytest.raises(ProtocolError, match="nested deeper than"):
        message_from_proto(envelope("ack", info=deep))

    def unknown_nested(v: Any) -> None:
        v.message.type = "nope"
        v.message.SetInParent()
    with pytest.raises(ProtocolError, match=r"alignment_views.views\[0\]: unknown message kind"):
        message_from_proto(envelope(
            "alignment_views", views=lambda v: unknown_nested(v.tuple_value.items.add())))

    with pytest.raises(ProtocolError, match="malformed envelope"):
        envelope_from_bytes(b"\xff\xff\xff")


@dataclasses.dataclass(frozen=True)
class Probe(Message):
    """A message "added later": the serde must carry it without any change."""

    kind: ClassVar[str] = "probe"
    task: Task
    maybe_task: Task | None
    counts: list[int]
    blob: bytes
    hellos: tuple[Hello, ...]
    scores: dict[str, float] = dataclasses.field(default_factory=dict)


def test_a_newly_registered_message_travels_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(MESSAGE_TYPES, Probe.kind, Probe)
    probe = Probe(task=Task.BINARY, maybe_task=None, counts=[1, -2], blob=b"\x00\xff",
                  hellos=(Hello(party="a", role="b"),), scores={"x": 0.5})
    got = wire_round_trip(probe)
    assert got == probe and isinstance(got, Probe) and got.task is Task.BINARY
    env = message_to_proto(dataclasses.replace(probe, maybe_task=Task.REGRESSION), sender="a")
    assert message_from_proto(env).maybe_task is Task.REGRESSION  # type: ignore[attr-defined]
    env.fields[0].value.str_value = "clustering"
    with pytest.raises(ProtocolError, match="probe.task: 'clustering' is not a valid Task; "
                                            "valid: 'binary', 'multiclass', 'regression'"):
        message_from_proto(env)


# --- strict encoding --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Unregistered(Message):
    kind: ClassVar[str] = "unregistered"


@pytest.mark.parametrize(("message", "error"), [
    (Forward(batch_id=1, rows=np.array(["a"]), train=True), r"forward.rows: expected"),
    (IdentifierEncodings(session="s", encoder="raw", values=np.array([object()])),
     "numpy dtype object cannot travel"),
    (Backward(batch_id=1, grad=torch.zeros(2, dtype=torch.complex64)),
     "tensor of torch.complex64 .* cannot travel"),
    (Forward(batch_id=2**64, rows=np.arange(2), train=True), "does not fit in 64 bits"),
    (Ack(info={1: 2.0}), r"ack.info: expected dict\[str, float\]"),  # type: ignore[dict-item]
    (Hello(party="a\ud800", role="x"), "not valid Unicode"),
    (Unregistered(), "not registered in MESSAGE_TYPES"),
])
def test_encoding_refuses_what_cannot_travel(message: Message, error: str) -> None:
    with pytest.raises(ProtocolError, match=error):
        message_to_proto(message, sender="primary")


def test_payload_types_are_all_dataclasses() -> None:
    # The serde's allowlist of nested dataclasses is exactly PAYLOAD_TYPES.
    assert all(dataclasses.is_dataclass(cls) for cls in PAYLOAD_TYPES.values())


def test_wire_type_hints_resolve_for_every_message() -> None:
    """The serde checks every field's type on the wire from the messages' annotations; the
    messages module imports torch only for type checkers, so the serde must supply it (a
    silent fall-back to "not checked" would let a peer send any type)."""
    from vflink.transport.grpc import serde

    for cls in MESSAGE_TYPES.values():
        hints = serde._hints(cls)
        assert {f.name for f in dataclasses.fields(cls) if f.init} <= set(hints), cls
    assert serde._hints(MESSAGE_TYPES["backward"])["grad"] is torch.Tensor
