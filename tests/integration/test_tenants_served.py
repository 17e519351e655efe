"""A served secondary keeps each primary's training apart, refuses names that cannot be files,
and keeps an honest PSU alive however long its driver computes: against a real `vflink serve`
process, each peer with its own issued certificate (tests/helpers/hostile.py).

Each failure of the tenancy probe is one case here:

* two primary identities training at once, interleaving setup, training and state verbs: each
  gets only its own model (its embeddings equal those of the same messages sent to a secondary
  serving it alone) and its own states (the other's name is refused, not loaded);
* a 5,000-character and path-like state names: a clear refusal, the service keeps serving;
* a PSU whose lists take longer to compute than the idle expiry: it completes; an old driver
  without keepalive is told its session expired, and its allowance is not used up;
* ``vflink serve`` logs the dictionary limit of its policy at start.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from tests.helpers.hostile import (
    G,
    Tenancy,
    Training,
    align_for_training,
    expected_run,
    honest_ids,
    keys,
    tenancy,
    trained_alone,
)
from vflink.errors import ProtocolError, VflinkError
from vflink.models.spec import BottomSpec
from vflink.parties import setalign as setalign_module
from vflink.parties.setalign import SetAlignmentDriver
from vflink.protocol import Ack, Hello, LoadState, Restore, SaveState, Snapshot
from vflink.protocol.sessions import new_session_name

pytestmark = pytest.mark.network

TTL = 1.5


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tenancy]:
    # a short idle expiry, as the reported PSU had (30 s there, for a list of 46 s)
    with tenancy(tmp_path_factory.mktemp("tenants"),
                 policy={"session_ttl_s": TTL, "max_set_sessions": 50}) as t:
        yield t


def test_two_primaries_training_at_once_each_get_only_their_own_model_and_states(
        served: Tenancy) -> None:
    with served.channel("primary") as c1, served.channel("primary2") as c2:
        a = Training(served, "primary", c1, align_for_training(served, "primary", c1))
        b = Training(served, "primary2", c2, align_for_training(served, "primary2", c2))
        a.setup()
        b.setup()  # the second primary's setup after the first's
        for _ in range(3):  # interleaved, with the same batch ids
            a.step()
            b.step()
        for tr in (a, b):
            tr.send(Snapshot(tag="best"))
        a.step()
        b.step()
        a.send(Restore(tag="best"))  # only the first's model goes back
        for tr in (a, b):  # one state name, two owners
            assert tr.send(SaveState(name="shared/best")) == Ack(info={"saved": 1.0})
        a_saved = a.embeddings()
        b.setup(BottomSpec(hidden=(5,), out_dim=4, seed=7))  # a new model, the second's only
        b.step()
        assert torch.equal(a.embeddings(), a_saved)
        assert torch.allclose(a_saved, trained_alone(a), atol=1e-6)
        assert torch.allclose(b.embeddings(), trained_alone(b), atol=1e-6)
        # loading the shared name gives each its own state back
        b.send(LoadState(name="shared/best"))
        a.send(LoadState(name="shared/best"))
        assert torch.equal(a.embeddings(), a_saved)
        # the predictable names of the report: the other's is refused, not loaded
        a.send(SaveState(name="run-a/checkpoint-0001"))
        with pytest.raises(ProtocolError, match=r"no saved state .* of yours.*state\.unknown"):
            b.send(LoadState(name="run-a/checkpoint-0001"))
        assert torch.equal(a.embeddings(), a_saved)
    for who in ("primary", "primary2"):
        assert (served.state / "peers" / who / "shared" / "best.json").is_file()


@pytest.mark.parametrize("name", ["x" * 5000, "../outside", "a/../../b", "/etc/passwd",
                                  "a\x00b", "alignments/psi@x"])
def test_long_and_path_like_state_names_are_refused_clearly(served: Tenancy, name: str) -> None:
    with served.channel("primary") as ch:
        tr = Training(served, "primary", ch, align_for_training(served, "primary", ch),
                      run="names")
        tr.setup()
        for verb in (SaveState(name=name, run="names"), LoadState(name=name, run="names")):
            with pytest.raises(ProtocolError) as info:
                ch.call("secondary", verb)
            text = str(info.value)
            assert "invalid state name" in text and "[state.name]" in text, text
            assert "internal" not in text and str(served.state) not in text
        assert isinstance(ch.call("secondary", Hello(party="primary", role="primary")), Hello)
    assert "File name too long" not in served.log()


def _slow_driver(monkeypatch: pytest.MonkeyPatch, per_batch_s: float) -> None:
    """The driver's own lists computed in batches of 50 elements of ``per_batch_s`` each: a
    list that takes longer than the idle expiry, whatever the machine."""
    real = setalign_module._hashed

    def slow(group: Any, batches: Any, size: int) -> Iterator[Any]:
        for item in real(group, batches, size):
            time.sleep(per_batch_s)
            yield item

    monkeypatch.setattr(setalign_module, "_hashed", slow)
    monkeypatch.setattr(SetAlignmentDriver, "_batch", lambda self, c: 50)


def _sessions_used(t: Tenancy, peer: str) -> int:
    doc = json.loads((t.state / "_set-sessions.json").read_text())
    return len(doc["peers"].get(peer, []))


@pytest.mark.slow
def test_a_psu_whose_lists_take_longer_than_the_expiry_completes(
        served: Tenancy, monkeypatch: pytest.MonkeyPatch) -> None:
    n = 400  # 8 batches of 0.5 s: 4 s of line 3 alone, against 1.5 s of idle expiry
    _slow_driver(monkeypatch, per_batch_s=0.5)
    with served.channel("primary2", deadline_s=30) as ch:
        before = _sessions_used(served, "primary2") if (
            served.state / "_set-sessions.json").is_file() else 0
        started = time.monotonic()
        out = SetAlignmentDriver(keys(honest_ids(served, "primary2", n)), ch, G).psu(
            "secondary", new_session_name("psu"))
        took = time.monotonic() - started
    assert took > 2 * TTL
    assert out.sizes == expected_run(served, "primary2", n)["union"]  # the plaintext union
    assert _sessions_used(served, "primary2") == before + 1
    # an old driver (no keepalive) on the same list: told its session expired, and the
    # failed run does not use up the allowance
    monkeypatch.setattr(SetAlignmentDriver, "_tick", lambda self, stream, n: None)
    with served.channel("primary2", deadline_s=30) as ch:
        with pytest.raises(VflinkError) as info:
            SetAlignmentDriver(keys(honest_ids(served, "primary2", n)), ch, G).psu(
                "secondary", new_session_name("psu"))
    text = str(info.value)
    assert "expired" in text and "session_ttl_s" in text and "state 'new'" not in text, text
    assert _sessions_used(served, "primary2") == before + 1


def test_serve_logs_its_dictionary_limit(served: Tenancy) -> None:
    limit = min(20_000_000, 50 * int(served.policy["max_set_elements"]))
    assert (f"dictionary limit per peer: a deviating primary can test at most {limit:,} "
            "guessed identifiers against this party's set per 1 day(s)") in served.log()
