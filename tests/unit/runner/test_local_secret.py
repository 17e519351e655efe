"""The in-process secret: derived from the seed when unset, and said so once per process."""

from __future__ import annotations

import logging

import pytest

import vflink.runner.local as local
from vflink.runner.local import secret_with_source


def test_unset_secret_warns_once_per_process(monkeypatch: pytest.MonkeyPatch,
                                             caplog: pytest.LogCaptureFixture) -> None:
    """`vflink demo` trains three runs: one warning, not three."""
    monkeypatch.delenv("VFLINK_SECRET", raising=False)
    monkeypatch.delenv("OTHER_SECRET", raising=False)
    monkeypatch.setattr(local, "_WARNED", set())
    with caplog.at_level(logging.WARNING, logger="vflink.runner.local"):
        secrets = [secret_with_source("VFLINK_SECRET", seed=s) for s in (0, 0, 1)]
        secret_with_source("OTHER_SECRET", seed=0)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2, warnings
    assert "$VFLINK_SECRET" in warnings[0] and "NOT a secret" in warnings[0]
    assert "$OTHER_SECRET" in warnings[1]
    # every run still derives (and reports) its own seed's secret
    assert secrets[0] == secrets[1] != secrets[2]
    assert all("not a secret" in source for _, source in secrets)
