"""Cooperative cancellation (vflink._cancel): checkpoints, work limits, and the group loops."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from vflink._cancel import checkpoint, current_scope, remaining_s, work_scope
from vflink.alignment.groups import get_group
from vflink.errors import Cancelled, ConfigError, VflinkError


def test_checkpoint_is_a_no_op_outside_a_scope() -> None:
    assert current_scope() is None and remaining_s() is None
    checkpoint()


def test_checkpoint_raises_once_the_limit_passes() -> None:
    with work_scope(limit_s=0.05, what="psu_round1 from 'primary'"):
        checkpoint()  # within the limit
        left = remaining_s()
        assert left is not None and 0 < left <= 0.05
        time.sleep(0.08)
        with pytest.raises(Cancelled, match="work limit") as info:
            checkpoint()
    assert isinstance(info.value, VflinkError)
    assert "psu_round1 from 'primary'" in str(info.value)
    checkpoint()  # the scope ended with its block


def test_checkpoint_raises_when_the_caller_gives_up() -> None:
    active = [True]
    with work_scope(is_active=lambda: active[0]):
        checkpoint()
        active[0] = False
        with pytest.raises(Cancelled, match="gave up"):
            checkpoint()


def test_nested_scopes_keep_the_stricter_limit_and_both_callers() -> None:
    outer_active = [True]
    with work_scope(limit_s=0.05, is_active=lambda: outer_active[0]):
        with work_scope(limit_s=100.0):
            left = remaining_s()
            assert left is not None and left <= 0.05  # the outer deadline is earlier
            outer_active[0] = False
            with pytest.raises(Cancelled, match="gave up"):
                checkpoint()


def test_scopes_do_not_leak_into_other_threads() -> None:
    seen: list[object] = []
    with work_scope(limit_s=0.0):
        t = threading.Thread(target=lambda: seen.append(current_scope()))
        t.start()
        t.join()
    assert seen == [None]


def test_bad_limit_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="limit_s"):
        with work_scope(limit_s="soon"):  # type: ignore[arg-type]
            pass


@pytest.mark.parametrize("workers", [1, 2])
def test_group_work_stops_at_the_next_chunk_when_the_caller_gives_up(workers: int) -> None:
    g = get_group("ristretto255", workers=workers)
    try:
        x = np.tile(g.hash_to_group([b"a", b"b"]), (20_000, 1))  # 40,000 elements
        e = g.random_exponent()
        calls = [0]

        def active() -> bool:  # the caller gives up after three checks
            calls[0] += 1
            return calls[0] <= 3

        before = g.operations
        started = time.monotonic()
        with work_scope(is_active=active), pytest.raises(Cancelled):
            g.power(x, e)
        assert g.operations == before  # nothing was counted as done
        assert time.monotonic() - started < 3.0  # 40,000 exponentiations take ~3 s or more
        with work_scope(is_active=active), pytest.raises(Cancelled):
            g.validate(x, "peer elements")
        with work_scope(is_active=active), pytest.raises(Cancelled):
            g.hash_to_group([b"k%d" % i for i in range(20_000)])
        # without a scope the same work completes, and equals an unchunked computation
        small = x[:5000]
        assert np.array_equal(g.power(small, e), g._power_chunk(small, e))
    finally:
        g.close()


@pytest.mark.parametrize("workers", [1, 2])
def test_linkage_jobs_stop_at_the_next_job_when_the_caller_gives_up(workers: int) -> None:
    """map_jobs' threads run in the caller's context: a served search whose caller gave up
    stops at the next job, on every thread, and raises Cancelled."""
    from vflink.linkage.grouped import map_jobs

    done: list[int] = []
    lock = threading.Lock()

    def job(i: int) -> None:
        time.sleep(0.001)
        with lock:
            done.append(i)

    calls = [0]

    def active() -> bool:  # the caller gives up after ten checks
        with lock:
            calls[0] += 1
            return calls[0] <= 10

    with work_scope(is_active=active), pytest.raises(Cancelled):
        map_jobs(job, list(range(1000)), workers)
    assert 10 - workers < len(done) <= 10  # the jobs checked in before it gave up
    done.clear()
    map_jobs(job, list(range(1000)), workers)  # without a scope every job runs, once
    assert sorted(done) == list(range(1000))


def test_linkage_jobs_stop_at_the_first_error() -> None:
    from vflink.linkage.grouped import map_jobs

    ran: list[int] = []

    def job(i: int) -> None:
        if i == 3:
            raise ValueError("job 3 failed")
        time.sleep(0.001)
        ran.append(i)

    with pytest.raises(ValueError, match="job 3 failed"):
        map_jobs(job, list(range(500)), 2)
    assert len(ran) < 20  # the other thread stopped at its next job
