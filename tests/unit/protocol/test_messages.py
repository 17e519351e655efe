from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from vflink.protocol import MESSAGE_TYPES, Backward, Embeddings, Forward, payload_nbytes


def test_every_message_is_frozen_and_registered_once() -> None:
    for kind, cls in MESSAGE_TYPES.items():
        assert cls.kind == kind
        params = getattr(cls, "__dataclass_params__", None)
        assert params is not None and params.frozen, cls


def test_payload_bytes_count_tensors_and_scalars() -> None:
    rows = np.arange(10, dtype=np.int64)
    assert payload_nbytes(Forward(batch_id=1, rows=rows, train=True)) == 8 + 80 + 1
    emb = torch.zeros(4, 16)
    msg = Embeddings(batch_id=1, embeddings=emb, inverse=np.zeros(7, dtype=np.int64))
    assert payload_nbytes(msg) == 8 + 4 * 16 * 4 + 7 * 8
    with pytest.raises(dataclasses.FrozenInstanceError):
        msg.batch_id = 2  # type: ignore[misc]
    assert payload_nbytes(Backward(batch_id=1, grad=torch.zeros(2, 3, dtype=torch.float64))) \
        == 8 + 48


@pytest.mark.parametrize("cls", sorted(MESSAGE_TYPES.values(), key=lambda c: c.__name__),
                         ids=lambda c: c.__name__)
def test_equality_hash_and_repr_are_the_dataclasses_own(cls: type) -> None:
    """Messages share one ==, hash and repr (the base class's): each gives what
    ``@dataclass(frozen=True)`` would have made for the message, compared with such a
    dataclass of the same fields."""
    names = [f.name for f in dataclasses.fields(cls)]
    reference = dataclasses.make_dataclass(cls.__name__, names, frozen=True)
    reference.__qualname__ = cls.__qualname__
    values = {name: f"v{i}" for i, name in enumerate(names)}
    other = {name: f"w{i}" for i, name in enumerate(names)}
    a, b, c = cls(**values), cls(**values), cls(**other)
    ra, rb, rc = reference(**values), reference(**values), reference(**other)
    assert repr(a) == repr(ra)
    assert (a == b, a == c, a != c) == (ra == rb, ra == rc, ra != rc)
    assert hash(a) == hash(ra) and hash(a) == hash(b)
    assert a.__eq__(ra) is NotImplemented  # another class: never equal
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.x = 1  # type: ignore[attr-defined]


def test_the_value_types_inside_messages_compare_by_value() -> None:
    """The specs messages carry (not messages themselves) keep their dataclass ==, repr."""
    from vflink.protocol.messages import BlockingKey, EncodingSpec, FieldComparison, FieldEncoding

    for cls in (EncodingSpec, FieldEncoding, BlockingKey, FieldComparison):
        names = [f.name for f in dataclasses.fields(cls)]
        values = {name: f"v{i}" for i, name in enumerate(names)}
        a, b = cls(**values), cls(**values)
        assert a == b and a is not b
        assert repr(a).startswith(f"{cls.__name__}(") and "v0" in repr(a)
