"""The test command is green on a busy machine: no test depends on the timing of another
test's subprocess (a served party stopped too slowly used to fail a later, unrelated test with
"ResourceWarning: subprocess ... is still running")."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.network import stop_processes

ROOT = Path(__file__).resolve().parents[2]

STUBBORN = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print('ready', flush=True); time.sleep(120)")


def test_stop_processes_waits_for_what_it_kills() -> None:
    # a process that ignores SIGTERM, as a busy served party is slow to honour it
    with subprocess.Popen([sys.executable, "-c", STUBBORN], stdout=subprocess.PIPE,
                          text=True) as proc:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        stop_processes([proc], timeout=0.2)
        assert proc.returncode is not None  # reaped: its object may be collected anywhere


def test_a_process_left_running_does_not_fail_a_later_test(pytester: pytest.Pytester) -> None:
    """With the suite's conftest, a module that drops a running process object leaves no
    warning for the next module, even with warnings as errors."""
    pytester.makeconftest((ROOT / "tests" / "conftest.py").read_text(encoding="utf-8")
                          .replace('pytest_plugins = ("pytester",)', ""))
    pytester.makepyfile(test_a=f'''
import subprocess, sys

def test_leaves_a_process():
    subprocess.Popen([sys.executable, "-c", {STUBBORN!r}], stdout=subprocess.DEVNULL)
''', test_b='''
import gc

def test_later():
    gc.collect()
''')
    result = pytester.runpytest_subprocess("-W", "error", "-p", "no:cacheprovider",
                                           "-o", "filterwarnings=error")
    result.assert_outcomes(passed=2)
