"""The repeated-setup attack on a secondary's privacy budget, over both
transports: a primary that repeats ``SetupBottom`` + ``FitPreprocessing`` (or
``SetupPrivacy``) after the budget refusal still gets nothing, and a new party object on the
same state directory (a restarted service) keeps refusing."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from vflink.data import PartySchema, PartyTable
from vflink.errors import VflinkError
from vflink.models.spec import BottomSpec
from vflink.parties import SecondaryParty
from vflink.privacy.accounting import calibrate, composed_epsilon, max_releases_within
from vflink.privacy.budget import BUDGET_DIR
from vflink.privacy.config import PrivacyConfig
from vflink.protocol import Embeddings, FitPreprocessing, Forward, SetupBottom
from vflink.protocol.messages import SetupPrivacy
from vflink.transport import InProcessHub
from vflink.transport.grpc import GrpcChannel, GrpcServer, PeerAddress, create_dev_pki
from vflink.transport.grpc.tls import TlsConfig

N = 24
PRIVACY = PrivacyConfig(embeddings="vanilla", epsilon=2.0, delta=1e-2, budget=5.0)
ALLOWED = max_releases_within(calibrate(2.0, 1e-2).sigma, 1e-2, 5.0)  # 3


def bank_table() -> PartyTable:
    frame = pd.DataFrame({"id": [f"k{i}" for i in range(N)],
                          "income": np.linspace(1000.5, 9000.25, N),
                          "age": np.arange(N, dtype=float) + 20.5})
    schema = PartySchema(name="bank", role="secondary", key=("id",),
                         numeric=("income", "age"))
    return PartyTable.from_frame(schema, frame, "bank.csv")


def new_bank(state: Path | None) -> SecondaryParty:
    party = SecondaryParty(bank_table(), InProcessHub().channel("bank"), out_dir=state,
                           privacy=PRIVACY, privacy_seed=5)
    party.roles = {"primary": "primary", "bank": "secondary"}
    party.set_linked_rows(np.arange(N), peer="primary")  # aligned with the primary: it serves rows
    return party


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("pki")
    create_dev_pki(d, ["primary", "bank"])
    return d


@pytest.fixture(params=["inprocess", pytest.param("grpc", marks=pytest.mark.network)])
def connect(request: pytest.FixtureRequest, pki: Path
            ) -> Iterator[Callable[[SecondaryParty], Any]]:
    """``connect(bank)``: the primary's channel to ``bank``, in-process or over gRPC."""
    servers: list[GrpcServer] = []
    channels: list[GrpcChannel] = []

    def connect(bank: SecondaryParty) -> Any:
        if request.param == "inprocess":
            hub = InProcessHub()
            hub.register("bank", bank)
            return hub.channel("primary")
        server = GrpcServer("bank", bank, "127.0.0.1:0", TlsConfig.for_party(pki, "bank"),
                            {"primary"}).start()
        servers.append(server)
        channel = GrpcChannel("primary", {"bank": PeerAddress("127.0.0.1", server.port)},
                              TlsConfig.for_party(pki, "primary"))
        channels.append(channel)
        return channel

    yield connect
    for c in channels:
        c.close()
    for s in servers:
        s.stop(grace=0.5)


def setup(ch: Any) -> None:
    """The primary's part of a new training run (primary.setup)."""
    ch.call("bank", SetupBottom(spec=BottomSpec(hidden=(8,), out_dim=4, seed=1)))
    ch.call("bank", SetupPrivacy(settings=PRIVACY.public_settings(), classes=2))
    ch.call("bank", FitPreprocessing(rows=np.arange(N)))


def released(ch: Any, batch: int, rows: np.ndarray, train: bool = False) -> bool:
    """One release of ``rows``: True if embeddings came back, False on the budget refusal."""
    try:
        reply = ch.call("bank", Forward(batch_id=batch, rows=rows, train=train))
    except VflinkError as exc:
        assert "privacy.budget" in str(exc), exc
        return False
    assert isinstance(reply, Embeddings)
    return True


def test_repeated_setups_after_the_refusal_release_nothing_more(
        connect: Callable[[SecondaryParty], Any], tmp_path: Path) -> None:
    state = tmp_path / "state"
    bank = new_bank(state)
    ch = connect(bank)
    rows = np.arange(8)
    batch = 0
    answers = []
    for attempt in range(6):  # the attack: set up again after every refusal
        setup(ch)
        for _ in range(3):
            batch += 1
            answers.append(released(ch, batch, rows, train=bool(attempt % 2)))
    assert sum(answers) == ALLOWED and answers[:ALLOWED] == [True] * ALLOWED
    counts = bank.protection.budget.totals
    assert counts[rows].tolist() == [ALLOWED] * len(rows) and counts[8:].sum() == 0
    run = bank.training_run("primary")
    assert run is not None
    g = run.protection.report()[0]["guarantee"]
    assert g["max_releases"] == ALLOWED
    assert g["epsilon_total"] == composed_epsilon(calibrate(2.0, 1e-2).sigma, ALLOWED, 1e-2)
    assert g["epsilon_total"] <= PRIVACY.budget  # type: ignore[operator]
    # the other records keep their own budget
    assert released(ch, batch + 1, np.arange(8, 12))

    # a restart: a new party on the same state directory remembers every release
    restarted = new_bank(state)
    ch2 = connect(restarted)
    setup(ch2)
    assert not released(ch2, 1, rows[:1])
    assert released(ch2, 2, np.arange(12, 16))
    assert (state / BUDGET_DIR).is_dir()
    np.testing.assert_array_equal(restarted.protection.budget.totals[:12],
                                  [ALLOWED] * 8 + [ALLOWED + 1 - ALLOWED] * 4)


def test_without_a_state_directory_the_counts_live_as_long_as_the_party(
        connect: Callable[[SecondaryParty], Any]) -> None:
    bank = new_bank(None)
    ch = connect(bank)
    answers = []
    for attempt in range(ALLOWED + 2):
        setup(ch)
        answers.append(released(ch, attempt, np.arange(4)))
    assert answers == [True] * ALLOWED + [False] * 2


def test_a_primary_s_links_are_kept_as_counts_per_row() -> None:
    """A secondary keeps how many of a primary's records link to each of its rows (what its
    release accounting counts a soft link's reuse of a row by), not the alignment's n × K
    rows; a run of that primary counts on them, a run of another primary on none."""
    party = SecondaryParty(bank_table(), InProcessHub().channel("bank"), privacy=PRIVACY,
                           privacy_seed=5)
    rows = np.array([[0, 2], [2, -1], [2, 0], [5, 23]])  # −1: a missing link
    party.set_linked_rows(rows, peer="primary")
    expected = np.bincount([0, 2, 2, 2, 0, 5, 23], minlength=N)
    kept = party._links["primary"]
    assert kept.shape == (N,) and np.array_equal(kept, expected)
    assert not np.shares_memory(kept, rows)
    run = party.protection.for_run(kept)
    assert np.array_equal(run._links, expected) and not np.shares_memory(run._links, kept)
    assert not party.protection.for_run(party._links.get("another"))._links.any()
    with pytest.raises(VflinkError, match="3 link counts for a table of 24 rows"):
        party.protection.for_run(np.ones(3, dtype=np.int64))
