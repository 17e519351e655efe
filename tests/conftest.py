from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, settings

pytest_plugins = ("pytester",)  # tests of the suite itself (test_suite_hygiene.py)

# Tests import helpers as `tests.helpers...`.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# Small per-batch tensors: one intra-op thread is much faster on 2 cores (ARCHITECTURE.md).
torch.set_num_threads(1)
os.environ.setdefault("MPLBACKEND", "Agg")

settings.register_profile("ci", max_examples=50, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ci")


# Every process a test starts is kept here until the session ends, then reaped. A process
# object collected while its process still runs warns (ResourceWarning: "subprocess N is still
# running") wherever the collection happens: in a later test, which warnings-as-errors then
# fails for a reason of another test's timing (on a busy machine a served party takes seconds
# to stop). Holding every object keeps that warning from ever firing; reaping at the end of the
# session, after every fixture is torn down, never stops a process a longer-lived fixture still
# uses (a Ray cluster started for the whole session).
_STARTED: list[subprocess.Popen[Any]] = []
_popen_init = subprocess.Popen.__init__


def _tracked_init(self: subprocess.Popen[Any], *args: Any, **kwargs: Any) -> None:
    _popen_init(self, *args, **kwargs)
    _STARTED.append(self)


subprocess.Popen.__init__ = _tracked_init  # type: ignore[method-assign]


@pytest.fixture(scope="session", autouse=True)
def _reap_processes() -> Iterator[None]:
    yield  # set up before every other fixture: torn down after them
    left = [p for p in _STARTED if p.poll() is None]
    for proc in left:
        proc.kill()
    for proc in left:
        proc.wait()
    _STARTED.clear()


@pytest.fixture(scope="session", autouse=True)
def _log_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Log files vflink names in messages (traces, internal-error incidents) go to a folder of
    the test session, not the machine's temporary folder."""
    old = os.environ.get("VFLINK_LOG_DIR")
    os.environ.setdefault("VFLINK_LOG_DIR", str(tmp_path_factory.mktemp("vflink-logs")))
    yield
    if old is None:
        os.environ.pop("VFLINK_LOG_DIR", None)
