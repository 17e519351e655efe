"""numpy's transparent-huge-page advice is off for a link's duration (vflink._memory): the
switch is restored afterwards, and left alone where the user set NUMPY_MADVISE_HUGEPAGE."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from numpy._core import multiarray

from vflink._memory import small_pages


@pytest.fixture
def advice_on(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    monkeypatch.delenv("NUMPY_MADVISE_HUGEPAGE", raising=False)
    before = multiarray._set_madvise_hugepage(True)
    yield
    multiarray._set_madvise_hugepage(before)


@pytest.mark.usefixtures("advice_on")
def test_the_advice_is_off_inside_and_restored_after() -> None:
    with small_pages():
        assert multiarray._get_madvise_hugepage() is False
    assert multiarray._get_madvise_hugepage() is True
    with pytest.raises(RuntimeError), small_pages():
        raise RuntimeError("a failed link")
    assert multiarray._get_madvise_hugepage() is True


@pytest.mark.usefixtures("advice_on")
def test_a_users_own_setting_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NUMPY_MADVISE_HUGEPAGE", "1")
    with small_pages():
        assert multiarray._get_madvise_hugepage() is True


@pytest.mark.usefixtures("advice_on")
def test_a_link_through_the_api_runs_without_the_advice(monkeypatch: pytest.MonkeyPatch) -> None:
    import vflink
    from vflink.linkage import soft

    seen: list[bool] = []
    real = soft.eq1_scale

    def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(multiarray._get_madvise_hugepage())
        return real(*args, **kwargs)

    monkeypatch.setattr(soft, "eq1_scale", spy)
    rng = np.random.default_rng(0)
    p = pd.DataFrame({"x": rng.uniform(0, 1, 40), "y": rng.uniform(0, 1, 40)})
    s = pd.DataFrame({"x": rng.uniform(0, 1, 30), "y": rng.uniform(0, 1, 30)})
    links = vflink.link(p, s, on=["x", "y"], metric="euclidean", top_k=3, privacy="off")
    assert len(links) == 120
    assert seen == [False]
    assert multiarray._get_madvise_hugepage() is True


def test_prefault_touches_every_page_and_stops_when_told() -> None:
    """A Prefault left to finish has written every element (zeros); once stopped, it writes
    nothing more, so the caller's own values stay."""
    import time

    from vflink._memory import Prefault

    a, b = np.full(3_000_001, 5.0), np.full((1000, 37), 9, dtype=np.int64)
    warm = Prefault(a, b)
    warm._thread.join()
    warm.stop()
    assert not a.any() and not b.any()
    big = np.empty(1 << 26, dtype=np.uint8)  # eight pieces
    warm = Prefault(big)
    warm.stop()
    big[:] = 3
    time.sleep(0.05)
    assert (big == 3).all()
