"""Names a peer sends that become keys or paths: checked in one place, refused clearly."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vflink.errors import ProtocolError
from vflink.parties.base import state_path
from vflink.protocol.names import MAX_NAME, MAX_PARTS, NAME_KINDS, RESERVED, check_name

HOSTILE = ["", "x" * 5000, "../x", "a/../../b", "/etc/passwd", "a/./b", "a//b", "a/", ".hidden",
           "a\x00b", "a b", "a\\b", "-flag", "é", "x/" * (MAX_PARTS + 1) + "x",
           "alignments/psi@1", "features/x", "peers/other/best", "evaluation/received"]


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_state_names_are_refused_with_the_rule(name: str) -> None:
    with pytest.raises(ProtocolError) as info:
        check_name(name, "state", party="bank")
    text = str(info.value)
    assert getattr(info.value, "code", None) == "state.name"
    assert "party 'bank': invalid state name" in text and "at most 8 parts" in text
    assert len(text) < 600  # a 5,000-character name is not echoed back whole


def test_valid_names_of_every_kind() -> None:
    assert check_name("run-1/checkpoint-0001", "state") == "run-1/checkpoint-0001"
    assert check_name("psu@1a2b", "session") == "psu@1a2b"
    assert check_name("", "run") == ""  # a primary's one run
    assert check_name("best", "snapshot") == "best"
    assert check_name("primary2", "peer") == "primary2"
    assert check_name("x" * MAX_NAME, "session") == "x" * MAX_NAME
    with pytest.raises(ProtocolError, match=r"session\.name"):
        check_name("x" * (MAX_NAME + 1), "session")
    for kind in ("session", "snapshot", "peer"):
        with pytest.raises(ProtocolError, match=NAME_KINDS[kind][1].replace(".", r"\.")):
            check_name("", kind)
    with pytest.raises(ProtocolError, match=r"run\.name"):
        check_name("a/b", "run")  # a run is a key: no path separators
    with pytest.raises(ProtocolError, match=r"snapshot tag"):
        check_name(7, "snapshot")  # not even a string


@given(st.text(max_size=300))
def test_a_checked_state_name_never_leaves_the_root(name: str) -> None:
    root = Path("/srv/party/peers/primary")
    try:
        path = state_path(root, name)
    except ProtocolError as exc:
        assert getattr(exc, "code", None) == "state.name"
        return
    assert len(name) <= MAX_NAME and "\x00" not in name
    assert path.is_relative_to(root) and ".." not in path.relative_to(root).parts
    assert path.relative_to(root).parts[0] not in RESERVED
    # every part leaves room for the longest file a saved state adds
    assert all(len(p) + len(".0123456789abcdef.safetensors") < 255 for p in path.parts)
