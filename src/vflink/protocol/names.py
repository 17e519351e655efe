"""Every name a peer sends that becomes a key or a path, checked in one place before use.

A peer names things a party then keeps: protocol sessions, training runs, snapshot tags and
saved states (a state name becomes files in the party's own directory). Each used to be checked
where it was used, and not all were: a 5,000-character ``SaveState`` name reached the file
system and the caller saw an internal error (``File name too long``). Like h11, which refuses a
malformed header before it touches anything, every such name goes through :func:`check_name`
first, and a bad one is refused with a :class:`~vflink.errors.ProtocolError` that says what a
name of that kind may be (never echoing more than the start of the name sent).

=========== ========================================= ================================
kind        what it becomes                           allowed
=========== ========================================= ================================
``session`` a session table key (``purpose@<id>``)    1-200 of letters, digits ``._@:+=-``
``run``     a training run's key (empty: the default) 0-200 of the same
``snapshot`` a snapshot tag (a key in memory)         1-200 of the same
``state``   file names under the party's directory    1-200 in all, ``/``-separated parts
                                                      of letters, digits ``._-``, at most
                                                      :data:`MAX_PARTS` parts
``peer``    a folder named after an authenticated     1-200 of letters, digits ``._-``
            peer (a served party's per-peer states)
=========== ========================================= ================================

Every name starts with a letter or a digit (so no part is ``.``, ``..`` or hidden), holds no
NUL, slash (except between a state name's parts), backslash or space, and a state name's first
part is none of the party's own folders (:data:`RESERVED`).
"""

from __future__ import annotations

import re
from typing import Any

from vflink.errors import ProtocolError
from vflink.protocol.boundary import refuse

__all__ = ["MAX_NAME", "MAX_PARTS", "NAME_KINDS", "RESERVED", "check_name", "name_parts"]

#: Longest name of any kind, in characters (a file name stays far below the usual 255 bytes,
#: with the ``.<digest>.safetensors`` a saved state adds).
MAX_NAME = 200
#: Most ``/``-separated parts of a state name (``<run>/checkpoint-0001`` has two).
MAX_PARTS = 8
#: First parts a state name may not take: the folders a secondary keeps its own files in (its
#: set alignments, encoded features, peers' states and recordings).
RESERVED = frozenset({"alignments", "features", "peers", "evaluation"})

_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@:+=-]*")
_FILE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")

#: kind → (what the peer is told a name of this kind may be, error code)
NAME_KINDS: dict[str, tuple[str, str]] = {
    "session": (f"1 to {MAX_NAME} characters of letters, digits and ._@:+=- starting with a "
                "letter or digit", "session.name"),
    "run": (f"empty or 1 to {MAX_NAME} characters of letters, digits and ._@:+=- starting "
            "with a letter or digit", "run.name"),
    "snapshot": (f"1 to {MAX_NAME} characters of letters, digits and ._@:+=- starting with a "
                 "letter or digit", "snapshot.tag"),
    "state": (f"1 to {MAX_NAME} characters in all: at most {MAX_PARTS} parts separated by '/', "
              "each of letters, digits and ._- starting with a letter or digit, the first "
              f"none of {', '.join(sorted(RESERVED))}", "state.name"),
    "peer": (f"1 to {MAX_NAME} characters of letters, digits and ._- starting with a letter "
             "or digit", "peer.name"),
}


def _shown(value: Any) -> str:
    """The start of what was sent (a peer's own input; long names are cut, not echoed)."""
    if not isinstance(value, str):
        return f"a {type(value).__name__}"
    if len(value) <= 40:
        return repr(value)
    return f"{value[:32]!r}… ({len(value)} characters)"


def name_parts(name: str) -> tuple[str, ...]:
    """The parts of a checked state name (``"r1/checkpoint-0001"`` → ``("r1", ...)``)."""
    return tuple(name.split("/"))


def _valid(kind: str, value: str) -> bool:
    if kind == "run" and value == "":
        return True
    if not 0 < len(value) <= MAX_NAME:
        return False
    if kind == "state":
        parts = name_parts(value)
        return (len(parts) <= MAX_PARTS and all(_FILE.fullmatch(p) for p in parts)
                and parts[0] not in RESERVED)
    pattern = _FILE if kind == "peer" else _KEY
    return pattern.fullmatch(value) is not None


def check_name(value: Any, kind: str, *, party: str | None = None) -> str:
    """``value`` if it is a valid name of ``kind`` (:data:`NAME_KINDS`); otherwise a
    :class:`~vflink.errors.ProtocolError` naming the kind and the rule, raised before the name
    is used as a key or a path."""
    rule, code = NAME_KINDS[kind]
    if isinstance(value, str) and _valid(kind, value):
        return value
    who = f"party {party!r}: " if party else ""
    what = "snapshot tag" if kind == "snapshot" else f"{kind} name"
    raise refuse(ProtocolError, f"{who}invalid {what} {_shown(value)}: a {what} is {rule}",
                 code=code)
