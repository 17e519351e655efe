"""Threads of a large numpy pass (vflink._threads) and the elementwise passes that use them."""

from __future__ import annotations

import numpy as np
import pytest

from vflink import _threads
from vflink.linkage import soft


def test_a_pass_takes_one_thread_per_core_within_its_bounds(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_threads, "cores", lambda: 16)
    assert _threads.pass_threads(_threads.PASS_MIN - 1) == 1
    assert _threads.pass_threads(_threads.PASS_MIN) == 2  # each at least half the minimum
    assert _threads.pass_threads(100 * _threads.PASS_MIN) == _threads.MAX_PASS_THREADS
    monkeypatch.setattr(_threads, "cores", lambda: 1)
    assert _threads.pass_threads(100 * _threads.PASS_MIN) == 1


@pytest.mark.parametrize("threads", [1, 2, 3, 7])
def test_eq1_in_pieces_gives_the_whole_passes_bits(monkeypatch: pytest.MonkeyPatch,
                                                   threads: int) -> None:
    rng = np.random.default_rng(2)
    d = rng.gamma(2.0, 0.01, (1001, 13))
    mu0, sigma0 = -0.02, 0.013
    want = (-d - mu0) / sigma0
    monkeypatch.setattr(soft, "pass_threads", lambda size: threads)
    got = np.empty_like(d)
    soft._in_parts(lambda a, out: soft._rho(a, mu0, sigma0, out), d, got)
    np.testing.assert_array_equal(got.view(np.int64), want.view(np.int64))


@pytest.mark.parametrize("dtype", ["float64", "float32", "int64"])
def test_extremes_in_pieces_equal_numpys(monkeypatch: pytest.MonkeyPatch, dtype: str) -> None:
    """The minimum and maximum of a large array taken in pieces are numpy's; a NaN in any
    piece is both (as numpy's min and max give it), and a view that is not contiguous is
    taken whole."""
    monkeypatch.setattr(_threads, "cores", lambda: 3)
    rng = np.random.default_rng(4)
    values = (rng.normal(0, 1e3, 3 * _threads.PASS_MIN)).astype(dtype)
    assert _threads.pass_threads(values.size) == 3
    lo, hi = _threads.extremes(values)
    assert lo == values.min() and hi == values.max()
    assert _threads.extremes(values[::3]) == (values[::3].min(), values[::3].max())
    if dtype != "int64":
        values[-1] = np.nan
        lo, hi = _threads.extremes(values)
        assert np.isnan(lo) and np.isnan(hi)


def test_pieces_run_on_the_caller_and_the_kept_pool_threads() -> None:
    """The first piece runs on the calling thread, the others on the process's pool, whose
    threads are kept for the next call (no thread started per call); the pieces are in order
    and cover the range, their bounds multiples of ``align``."""
    import threading

    seen: list[tuple[slice, int]] = []

    def piece(r: slice) -> tuple[int, int]:
        seen.append((r, threading.get_ident()))
        return r.start, r.stop

    got = _threads.in_pieces(piece, 1000, 3, align=64)
    assert got == [(0, 320), (320, 640), (640, 1000)]
    first = {ident for r, ident in seen if r.start == 0}
    assert first == {threading.get_ident()}
    pool_threads = {t.ident for t in threading.enumerate() if t.name.startswith("vflink-pass")}
    assert {ident for r, ident in seen if r.start != 0} <= pool_threads
    before = set(pool_threads)
    for _ in range(20):
        _threads.in_pieces(piece, 100, 2)
    after = {t.ident for t in threading.enumerate() if t.name.startswith("vflink-pass")}
    assert after == before  # the same threads, none started per call
    assert len(after) <= max(_threads.cores(), _threads.MAX_PASS_THREADS)


def test_pieces_within_a_piece_run_in_turn_without_waiting_for_the_pool() -> None:
    """A piece that itself cuts its work into pieces, on every pool thread at once, runs
    them in turn (waiting on the pool from a pool thread could wait for ever)."""
    width = max(_threads.cores(), _threads.MAX_PASS_THREADS) + 1

    def inner(r: slice) -> int:
        return sum(_threads.in_pieces(lambda s: s.stop - s.start, r.stop - r.start, 4))

    assert _threads.in_pieces(inner, 100 * width, width) == [100] * width


def test_an_error_in_a_piece_is_raised_once_every_piece_has_ended() -> None:
    import threading
    import time

    ended = threading.Event()

    def piece(r: slice) -> None:
        if r.start == 0:
            raise ValueError("first")
        time.sleep(0.2)
        ended.set()

    with pytest.raises(ValueError, match="first"):
        _threads.in_pieces(piece, 10, 2)
    assert ended.is_set()  # the other piece had ended before the error came out
    with pytest.raises(KeyError):
        _threads.in_pieces(lambda r: {}[r.start] if r.start else None, 10, 2)


def test_a_forked_child_makes_a_pool_of_its_own() -> None:
    import os

    _threads.in_pieces(lambda r: None, 10, 2)  # the parent's pool exists
    pid = os.fork()
    if pid == 0:  # the child: the parent's pool threads do not exist here
        import signal

        signal.alarm(30)  # a child waiting for threads that do not exist would never end
        try:
            ok = _threads.in_pieces(lambda r: r.stop - r.start, 10, 2) == [5, 5]
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_pieces_run_on_the_caller_where_the_pool_takes_no_more_work(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A pool shut (as the interpreter's exit shuts it before it joins the other threads):
    every piece still runs, those the pool refused on the calling thread, in order."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    shut = ThreadPoolExecutor(2)
    shut.shutdown()
    monkeypatch.setattr(_threads, "_POOL", shut)
    seen: list[str] = []

    def piece(r: slice) -> int:
        seen.append(threading.current_thread().name)
        return r.stop - r.start

    assert _threads.in_pieces(piece, 10, 3) == [3, 3, 4]
    assert seen == [threading.current_thread().name] * 3


def test_a_thread_still_at_work_as_the_interpreter_exits_deletes_the_old_dataset(
        tmp_path: object) -> None:
    """The old output's deletion (a thread of its own, joined at exit) reaching its pieces
    only after the exit has shut the pool: the directory still goes, and nothing is
    reported on stderr."""
    import subprocess
    import sys
    from pathlib import Path

    old = Path(str(tmp_path)) / "old-links"
    old.mkdir()
    for i in range(4):
        (old / f"part-{i:05d}.parquet").write_bytes(b"x" * 1000)
    script = (
        "import sys, threading, time\n"
        "from pathlib import Path\n"
        "from vflink import _threads\n"
        "from vflink.data import parts\n"
        "_threads.in_pieces(lambda r: None, 10, 2)  # the pool exists, with its threads\n"
        "def late():\n"
        "    time.sleep(0.5)  # the main thread has begun to exit by now\n"
        "    parts._remove_dataset(Path(sys.argv[1]))\n"
        "threading.Thread(target=late).start()\n"
        "sys.exit(0)\n")
    done = subprocess.run([sys.executable, "-c", script, str(old)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert not old.exists()
