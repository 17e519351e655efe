"""A link of two DataFrames through the link pipeline, with what only in-process callers give:
a transcript of the parties' messages, the data parties' secret, an engine."""

from __future__ import annotations

from typing import Any

from vflink.runner.link.outcome import LinkOutcome
from vflink.runner.link.pipeline import run_link
from vflink.runner.link.settings import LinkSettings


def linked(primary: Any, secondary: Any, *, transcript: Any = None, secret: bytes | None = None,
           compute: Any = None, **options: Any) -> LinkOutcome:
    """``vflink.link(primary, secondary, **options).outcome``, with ``transcript``, ``secret``
    and ``compute`` handed to the pipeline."""
    ctx = run_link(LinkSettings.from_options(**options), primary, secondary, compute=compute,
                   transcript=transcript, secret=secret)
    assert ctx.outcome is not None
    return ctx.outcome
