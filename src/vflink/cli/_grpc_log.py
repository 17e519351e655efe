"""gRPC's C core writes its own log lines straight to file descriptor 2, in its own format
(``W1124 14:49:56.485389   31605 log.cc:102] ...``), ahead of and between vflink's messages.

``vflink serve`` needs one kind of them: a TLS handshake that fails (a certificate of another CA,
a plaintext client) ends inside the C core before any Python code runs, and only the core's
INFO log names it. :func:`route_grpc_core_log` keeps that log on, but reads descriptor 2
through a pipe: each core line becomes a ``logging`` record of logger ``vflink.grpc`` (a failed
handshake a warning, the core's own warnings and errors as such, the rest debug, shown with
``-vv``), so a user sees vflink's messages in vflink's format, and the core's "INFO is not
suitable for production" notice (about the level we chose on purpose) is dropped. Python's own
``sys.stderr`` keeps writing to the real descriptor 2, so nothing else changes.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

__all__ = ["core_line_record", "route_grpc_core_log"]

log = logging.getLogger("vflink.grpc")

#: ``<severity><MMDD> <time> <thread> <file>:<line>] <message>`` (absl / gRPC core)
_CORE_LINE = re.compile(r"^([IWEF])\d{4} [\d:.]+\s+\d+ ([\w./-]+:\d+)\] ?(.*)$")
_LEVELS = {"I": logging.DEBUG, "W": logging.WARNING, "E": logging.ERROR, "F": logging.CRITICAL}
_DROP = ("is not suitable for production",)


def core_line_record(line: str) -> tuple[int, str] | None:
    """(logging level, message) for one gRPC core log line; None for a line that is not one
    (passed through as it is) or one to drop (returned as level 0)."""
    match = _CORE_LINE.match(line.rstrip("\n"))
    if match is None:
        return None
    severity, where, message = match.groups()
    if any(d in message for d in _DROP):
        return 0, ""
    level = _LEVELS[severity]
    if "Handshake failed" in message:  # a refused TLS peer: what the INFO level is on for
        level = logging.WARNING
        return level, f"gRPC: a TLS handshake failed: {message}"
    return level, f"gRPC ({where}): {message}"


def _pump(read_fd: int, passthrough: TextIO) -> None:
    with os.fdopen(read_fd, "r", encoding="utf-8", errors="replace") as lines:
        for line in lines:
            record = core_line_record(line)
            try:
                if record is None:
                    passthrough.write(line)
                    passthrough.flush()
                elif record[0]:
                    log.log(record[0], "%s", record[1])
            except (OSError, ValueError):
                # the real stderr closed under us (a child process kept the pipe open past
                # the end of the block): nothing is left to write to
                return


@contextmanager
def route_grpc_core_log() -> Iterator[None]:
    """Route what is written to descriptor 2 (gRPC's core log) through :data:`log` while the
    block runs; Python's ``sys.stderr`` writes to the original descriptor meanwhile."""
    try:
        sys.stderr.flush()
        original = os.dup(2)
    except (OSError, ValueError):  # no real descriptor 2 (an embedding host): leave it be
        yield
        return
    read_fd, write_fd = os.pipe()
    saved_stderr = sys.stderr
    real = open(original, "w", buffering=1, encoding="utf-8", closefd=False)  # noqa: SIM115
    os.dup2(write_fd, 2)
    os.close(write_fd)
    sys.stderr = real
    pump = threading.Thread(target=_pump, args=(read_fd, real), name="grpc-core-log",
                            daemon=True)
    pump.start()
    try:
        yield
    finally:
        os.dup2(original, 2)  # closes the pipe's last write end: the pump reads to its end
        pump.join(timeout=2)
        sys.stderr = saved_stderr
        real.close()
        os.close(original)
