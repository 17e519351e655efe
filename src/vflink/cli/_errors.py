"""One exit-code table for every command, and failures turned into one message each.

A user never sees a stack trace: a known error (:class:`~vflink.errors.VflinkError`) prints
its message; a file-system error prints the path and the reason; anything unexpected prints a
short message and the path of a log file holding the full trace (docs/reference/exit-codes.md).
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vflink._files import log_dir
from vflink.errors import (
    ConfigError,
    DataError,
    LinkageError,
    PrivacyBudgetExceeded,
    RunError,
    VflinkError,
)

if TYPE_CHECKING:  # rich is imported only once a command runs
    from rich.console import Console
    from rich.logging import RichHandler

__all__ = [
    "EXIT_CODES_HELP",
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_TERMINATED",
    "EXIT_USAGE",
    "Terminated",
    "console_log_handler",
    "exit_code",
    "report_failure",
]

#: The exit-code table (docs/reference/exit-codes.md; `vflink --help`).
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT
EXIT_TERMINATED = 143  # 128 + SIGTERM

EXIT_CODES_HELP = """exit codes (every command):
  0    success
  1    the run failed: a peer unavailable or misbehaving, a file that cannot be written,
       or an unexpected error (the message names a log file with the full trace)
  2    usage, configuration or data error: a bad option, run or party file, a missing or
       bad data file, an output that exists, a --resume that does not match its run
  130  interrupted (Ctrl-C)
  143  terminated (SIGTERM)
`vflink serve` runs until Ctrl-C or SIGTERM and then exits 0."""

#: Errors in what the user gave us (exit 2); other vflink errors are failed runs (exit 1).
_USAGE_ERRORS: tuple[type[BaseException], ...] = (ConfigError, DataError, RunError,
                                                  LinkageError, PrivacyBudgetExceeded)


class Terminated(BaseException):  # noqa: N818 - like KeyboardInterrupt, not an Exception
    """Raised in the main thread by the CLI's SIGTERM handler."""


def exit_code(exc: BaseException) -> int:
    """The exit code of a command that raised ``exc``."""
    if isinstance(exc, KeyboardInterrupt):
        return EXIT_INTERRUPTED
    if isinstance(exc, Terminated):
        return EXIT_TERMINATED
    if isinstance(exc, _USAGE_ERRORS):
        return EXIT_USAGE
    if isinstance(exc, FileNotFoundError):  # a path given that does not exist: a missing
        return EXIT_USAGE                   # input file, or an output's missing folder
    return EXIT_FAILED


def console_log_handler(console: Console, *, show_traces: bool = False) -> RichHandler:
    """A rich log handler that shows records without their tracebacks (with them when
    ``show_traces``: ``-vv``); the tracebacks are kept (bounded) in ``handler.traces`` for an
    unexpected failure's log file."""
    from rich.logging import RichHandler

    class ConsoleLogHandler(RichHandler):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.traces: list[str] = []

        def emit(self, record: logging.LogRecord) -> None:
            if record.exc_info:
                self.traces.append(f"{record.getMessage()}\n" + "".join(
                    traceback.format_exception(*record.exc_info)))
                del self.traces[:-20]
                if not show_traces:
                    record = logging.makeLogRecord({**record.__dict__, "exc_info": None,
                                                    "exc_text": None})
            super().emit(record)

    return ConsoleLogHandler(console=console, show_path=False)


def _write_trace(exc: BaseException, command: str, handler: Any) -> Path:
    directory = log_dir()
    directory.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f"vflink-{command}-{time.strftime('%Y%m%d-%H%M%S')}-",
                                suffix=".log", dir=directory)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(f"vflink {command} failed at {time.strftime('%Y-%m-%d %H:%M:%S')}\n\n")
        for trace in getattr(handler, "traces", []):
            fh.write(f"logged earlier: {trace}\n")
        fh.write("".join(traceback.format_exception(exc)))
    return Path(name)


def _os_message(exc: OSError) -> str:
    reason = exc.strerror or str(exc)
    where = exc.filename if exc.filename is not None else ""
    return f"{where}: {reason}" if where else reason


def report_failure(exc: BaseException, console: Console, handler: Any = None,
                   *, command: str = "command") -> int:
    """Print one message for ``exc`` (never a traceback) and return its exit code."""
    from rich.markup import escape

    code = exit_code(exc)
    # soft_wrap: the terminal wraps the message, never rich, so a path or a value in it is
    # never cut in two (copied from the screen, it still works)
    if isinstance(exc, KeyboardInterrupt):
        console.print("[yellow]interrupted[/]")
    elif isinstance(exc, Terminated):
        console.print(f"[yellow]terminated (SIGTERM): vflink {command} stopped[/]",
                      highlight=False, soft_wrap=True)
    elif isinstance(exc, VflinkError) and "incident" in str(exc):
        # an internal error of a party: name its trace file when that party ran here
        from vflink.protocol.boundary import with_local_trace

        console.print(f"[bold red]error:[/] {escape(str(with_local_trace(exc)))}",
                      highlight=False, soft_wrap=True)
    elif isinstance(exc, (ConfigError, RunError)) and code == EXIT_USAGE:
        label = "configuration error" if isinstance(exc, ConfigError) else "error"
        console.print(f"[bold red]{label}:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
    elif isinstance(exc, VflinkError):
        console.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
    elif isinstance(exc, OSError):
        console.print(f"[bold red]error:[/] {escape(_os_message(exc))}", highlight=False,
                      soft_wrap=True)
    else:
        try:
            where = f"the full trace is in {_write_trace(exc, command, handler)}"
        except OSError as log_exc:
            where = f"no log file could be written ({_os_message(log_exc)})"
        console.print(f"[bold red]unexpected error:[/] {escape(type(exc).__name__)}: "
                      f"{escape(str(exc)[:300])}\n{where}; please report it", highlight=False,
                      soft_wrap=True)
    return code
