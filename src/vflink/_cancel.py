"""Cooperative cancellation: work done for a caller stops when the caller gives up.

A served party computes on a peer's behalf (PSU/PSI rounds over a peer's set, Bloom encodings
of its own table, top-K searches). When the caller gives up (its deadline passes, it cancels
the call, its connection drops), that work is worthless: the caller treats the call as failed
and may retry it. Without a way to stop it, one abandoned request of ten million group elements
kept a party from answering anyone else for minutes after its caller had gone.

The transport opens a :func:`work_scope` around each served call, holding the call's deadline
(its *work limit*) and a callback telling whether the caller is still there. Long loops in the
algorithms call :func:`checkpoint` between chunks; it is a no-op outside a scope (in-process
runs, tests, a library user's own calls), and otherwise raises :class:`~vflink.errors.Cancelled`
once the caller is gone or the limit has passed. The scope is a :mod:`contextvars` variable, so
it follows the serving thread and never leaks into another call; a worker pool's threads do
not see it unless they run in a copy of the caller's context (the linkage's job pool does,
:func:`vflink.linkage.grouped.map_jobs`; elsewhere their chunks are short, and the loop that
collects them checks).

This module is in the lowest layer (beside :mod:`vflink._checks`): algorithms may call
:func:`checkpoint` without importing the transport or the parties.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from vflink.errors import Cancelled, ConfigError

__all__ = ["WorkScope", "checkpoint", "current_scope", "remaining_s", "work_scope"]


@dataclass(frozen=True)
class WorkScope:
    """One call's work limit: ``deadline`` on the :func:`time.monotonic` clock (None: none)
    and ``is_active`` (None: the caller cannot go away), for the call ``what``."""

    deadline: float | None
    is_active: Callable[[], bool] | None
    what: str


_SCOPE: ContextVar[WorkScope | None] = ContextVar("vflink_work_scope", default=None)


@contextmanager
def work_scope(*, limit_s: float | None = None, is_active: Callable[[], bool] | None = None,
               what: str = "this call") -> Iterator[WorkScope]:
    """Run the body under a work limit of ``limit_s`` seconds from now (None: no limit) and
    ``is_active`` (the caller is still waiting). Scopes nest: the inner one is stricter (the
    earlier deadline, both callbacks)."""
    if limit_s is not None and (isinstance(limit_s, bool) or not isinstance(limit_s, (int, float))
                                or limit_s != limit_s):
        raise ConfigError(f"`limit_s` must be a number of seconds or None, got {limit_s!r}")
    deadline = None if limit_s is None else time.monotonic() + max(0.0, float(limit_s))
    outer = _SCOPE.get()
    if outer is not None:
        if outer.deadline is not None:
            deadline = outer.deadline if deadline is None else min(deadline, outer.deadline)
        if outer.is_active is not None:
            inner, parent = is_active, outer.is_active
            is_active = parent if inner is None else (lambda: parent() and inner())
    scope = WorkScope(deadline=deadline, is_active=is_active, what=what)
    token = _SCOPE.set(scope)
    try:
        yield scope
    finally:
        _SCOPE.reset(token)


def current_scope() -> WorkScope | None:
    """The scope this code runs under (None outside any)."""
    return _SCOPE.get()


def remaining_s() -> float | None:
    """Seconds left before the current scope's work limit (None: no limit)."""
    scope = _SCOPE.get()
    if scope is None or scope.deadline is None:
        return None
    return scope.deadline - time.monotonic()


def checkpoint() -> None:
    """Raise :class:`~vflink.errors.Cancelled` if the current call's caller gave up or its
    work limit has passed; otherwise return at once (cheap: call it between chunks)."""
    scope = _SCOPE.get()
    if scope is None:
        return
    if scope.deadline is not None and time.monotonic() > scope.deadline:
        raise Cancelled(f"work on {scope.what} stopped: its work limit (the caller's "
                        "deadline) passed before it finished")
    if scope.is_active is not None and not scope.is_active():
        raise Cancelled(f"work on {scope.what} stopped: the caller gave up")
