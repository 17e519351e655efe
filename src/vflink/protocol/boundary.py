"""What an error may say when it crosses the party boundary.

An error raised while a party handles a peer's message has two audiences. The party's own
operator needs the full story (which row, which file, which library failed), and gets it in the
party's log. The peer gets only what is safe to tell another organisation: the error's class,
a stable code, and a message written for the boundary that says which check failed, never a
cell value, a local path or the text of another exception (a secondary used to echo
``row 0 holds 'Alice ... Smith'`` and its absolute state path to the primary).

A check that wants the peer to learn more than "class X, code Y" raises with :func:`refuse`,
which attaches a ``public`` message and a ``code``; everything else is reduced by
:func:`boundary_error` to a generic message naming the party, the message kind and the code.
Unexpected exceptions become ``internal error in party X`` with an incident id; the party
writes the full trace to ``vflink-incident-<id>.log`` in its log folder (``$VFLINK_LOG_DIR``,
else the system's temporary folder) and names that file in its own log. The peer learns the
file's name, never its path; a caller in the same process (:func:`with_local_trace`) gets the
path.
"""

from __future__ import annotations

import logging
import re
import time
import traceback
import uuid
from pathlib import Path
from typing import TypeVar

from vflink import errors
from vflink._files import atomic_write_text, log_dir
from vflink.errors import VflinkError

__all__ = ["BOUNDARY_ATTR", "boundary_error", "error_code", "incident_log", "is_boundary",
           "local_detail", "mark_public", "refuse", "with_local_trace"]

log = logging.getLogger(__name__)

E = TypeVar("E", bound=VflinkError)

#: Attribute set on an exception whose ``str()`` is safe to send to a peer as it is.
BOUNDARY_ATTR = "vflink_boundary"


def _kebab(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "-", name).lower()


def error_code(exc: BaseException) -> str:
    """The stable code of ``exc``: the one given to :func:`refuse`, else one per class
    (``ProtocolError`` → ``protocol-error``)."""
    code = getattr(exc, "code", None)
    if isinstance(code, str) and code:
        return code
    if isinstance(exc, VflinkError):
        return _kebab(type(exc).__name__)
    return "internal"


def is_boundary(exc: BaseException) -> bool:
    """True when ``str(exc)`` was written for the boundary (or already crossed it)."""
    return bool(getattr(exc, BOUNDARY_ATTR, False))


def mark_public(exc: E, code: str | None = None) -> E:
    """Declare that ``str(exc)`` may cross the boundary as it is (e.g. an error rebuilt from
    what a peer sent, which holds only that peer's boundary message)."""
    setattr(exc, BOUNDARY_ATTR, True)
    if code:
        exc.code = code  # type: ignore[attr-defined]
    return exc


def refuse(cls: type[E], public: str, *, code: str, detail: str | None = None) -> E:
    """An error of class ``cls`` whose peer-facing message is ``public`` (plus the code).

    ``detail``, if given, is what this party's own log shows instead (it may name local
    paths or values); the peer never sees it.
    """
    exc = cls(f"{public} [{code}]")
    exc.code = code  # type: ignore[attr-defined]
    if detail is not None:
        exc.detail = detail  # type: ignore[attr-defined]
    setattr(exc, BOUNDARY_ATTR, True)
    return exc


def local_detail(exc: BaseException) -> str:
    """The full text of ``exc`` for this party's own log."""
    detail = getattr(exc, "detail", None)
    return f"{exc} ({detail})" if isinstance(detail, str) and detail else str(exc)


def _same_kind(exc: VflinkError, text: str) -> VflinkError:
    """A fresh error of ``exc``'s class (or the nearest ``vflink.errors`` class built from one
    message) carrying ``text``: no cause, no context, no attributes of the original."""
    for cls in type(exc).__mro__:
        if not (isinstance(cls, type) and issubclass(cls, VflinkError)):
            continue
        if getattr(errors, cls.__name__, None) is not cls:
            continue  # a class of another module: rebuild as its vflink.errors parent
        if cls.__name__ in ("PeerUnavailable", "UnknownNameError"):
            continue  # constructors with other arguments; their parents take a message
        try:
            return cls(text)
        except TypeError:
            continue
    return VflinkError(text)


def boundary_error(exc: BaseException, party: str, kind: str) -> VflinkError:
    """What the peer that sent a ``kind`` message to ``party`` may learn about ``exc``.

    Already-public errors pass unchanged; other vflink errors keep their class and code but
    lose their text; anything else becomes an internal error with an incident id that is
    logged here together with the full trace.
    """
    if isinstance(exc, VflinkError) and is_boundary(exc):
        return exc
    code = error_code(exc)
    if isinstance(exc, errors.PeerUnavailable) and exc.peer == party:
        # a party that reports itself unavailable (shutting down) is unavailable to its caller
        out: VflinkError = errors.PeerUnavailable(party, f"it stopped while handling {kind}")
    elif isinstance(exc, errors.PeerUnavailable):
        out = errors.TransportError(
            f"party {party!r} could not reach its peer {exc.peer!r} while handling {kind} "
            f"[{code}]")
    elif isinstance(exc, VflinkError):
        out = _same_kind(exc, f"{type(exc).__name__} in party {party!r} while handling {kind} "
                              f"[{code}]; the details are in that party's log")
    else:
        incident = uuid.uuid4().hex[:12]
        path = _write_incident(incident, party, kind, exc)
        where = f"; trace in {path}" if path is not None else ""
        log.error("party %r: internal error handling %s (incident %s%s)", party, kind,
                  incident, where, exc_info=exc)
        code = "internal"
        out = VflinkError(f"internal error in party {party!r} while handling {kind} "
                          f"[{code}, incident {incident}]; the trace is in that party's log "
                          f"folder, in {incident_log(incident).name}")
        out.incident = incident  # type: ignore[attr-defined]
    return mark_public(out, code)


def incident_log(incident: str) -> Path:
    """The file holding the trace of internal error ``incident`` in this process's log folder
    (it exists where the party that raised it runs)."""
    return log_dir() / f"vflink-incident-{incident}.log"


def _write_incident(incident: str, party: str, kind: str, exc: BaseException) -> Path | None:
    """Write the trace of ``exc`` to :func:`incident_log`; None when no file can be written
    (the party's log then holds the trace alone)."""
    path = incident_log(incident)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, f"vflink: internal error in party {party!r} while handling "
                                f"{kind} (incident {incident}) at "
                                f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n\n"
                                + "".join(traceback.format_exception(exc)))
    except OSError as write_exc:
        log.warning("party %r: could not write %s: %s", party, path, write_exc)
        return None
    return path


_INCIDENT = re.compile(r"incident ([0-9a-f]{12})\]")


def with_local_trace(exc: VflinkError) -> VflinkError:
    """``exc`` for a caller in this process: an internal error whose incident file is here
    names its path (the party and its caller share the machine and the operator)."""
    match = _INCIDENT.search(str(exc))
    if match is None:
        return exc
    path = incident_log(match.group(1))
    if not path.is_file() or str(path) in str(exc):
        return exc
    text = re.sub(r"; the trace is in that party's log folder, in \S+$", "", str(exc))
    out = mark_public(_same_kind(exc, f"{text}; the trace is in {path}"), error_code(exc))
    for name in ("incident", "peer"):
        if hasattr(exc, name) and not hasattr(out, name):
            setattr(out, name, getattr(exc, name))
    return out
