"""Opening a party's compute engine for a run: ``[compute]`` plus the flags."""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager

from vflink.engine import ComputeConfig, Engine, get_engine

__all__ = ["current_compute", "open_compute", "run_compute"]


@contextmanager
def open_compute(config: ComputeConfig | None = None) -> Iterator[Engine | None]:
    """The engine ``config`` names, closed on exit; ``None`` when the party's stages should run
    in this process as before (the default local engine), so that path costs nothing new."""
    engine = get_engine(config or ComputeConfig())
    try:
        yield engine if engine.parallel else None
    finally:
        engine.close()


#: The engine of the run this context is in (set by :func:`run_compute`), read where the run
#: builds its parties and groups, so that one engine serves every stage of the run.
_CURRENT: contextvars.ContextVar[Engine | None] = contextvars.ContextVar("vflink_compute",
                                                                         default=None)


def current_compute() -> Engine | None:
    """The engine of the run in progress (``None``: in this process)."""
    return _CURRENT.get()


@contextmanager
def run_compute(config: ComputeConfig | None) -> Iterator[Engine | None]:
    """:func:`open_compute` for a whole run: the stages built during it use the engine (an
    engine already open in this context is reused)."""
    if _CURRENT.get() is not None:
        yield _CURRENT.get()
        return
    with open_compute(config) as engine:
        token = _CURRENT.set(engine)
        try:
            yield engine
        finally:
            _CURRENT.reset(token)
