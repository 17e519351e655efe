"""End-to-end SplitNN across the party boundary (exact alignment through a coordinator)."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch

from tests.helpers.tables import two_party_tables
from vflink.data import PartySchema, PartyTable
from vflink.protocol import (
    AlignmentView,
    Backward,
    Embeddings,
    Forward,
    KeyDigests,
)
from vflink.runfiles.config import (
    AlignmentConfig,
    DataConfig,
    ModelConfig,
    PrivacyConfig,
    RunConfig,
    TrainingConfig,
)
from vflink.runner.train import run_training
from vflink.transport import Transcript

DATA = DataConfig(dataset="in-memory")


def config(algorithm: str = "splitnn", **training: object) -> RunConfig:
    t = {"epochs": 12, "patience": 4, **training}
    # the model's quality and the messages, with the gradients sent in clear (label protection:
    # tests/integration/test_label_protection.py)
    return RunConfig(algorithm=algorithm, data=DATA, training=TrainingConfig(**t),  # type: ignore[arg-type]
                     privacy=PrivacyConfig(labels="off"))


@pytest.fixture(scope="module")
def tables() -> tuple[PartyTable, PartyTable]:
    return two_party_tables(4000, seed=1)


def test_only_embeddings_gradients_and_hashes_cross(tables: tuple[PartyTable, PartyTable]) -> None:
    primary, bank = tables
    small = (PartyTable.from_frame(primary.schema, primary.frame.iloc[:600], "p"),
             PartyTable.from_frame(bank.schema, bank.frame, "b"))
    transcript = Transcript()
    run_training(config(epochs=2), transcript=transcript, tables=(small[0], (small[1],)))

    allowed = {
        ("primary", "coordinator"): {"key_tag", "fetch_key_tags", "key_digests", "match_keys"},
        ("coordinator", "primary"): {"ack", "key_tags", "alignment_views"},
        ("bank", "coordinator"): {"key_tag", "fetch_key_tags", "key_digests", "fetch_alignment"},
        ("coordinator", "bank"): {"ack", "key_tags", "alignment_view"},
        ("primary", "bank"): {"confirm_key", "share_keys", "alignment_ready", "setup_bottom",
                              "fit_preprocessing", "forward", "backward", "snapshot", "restore",
                              "save_state"},
        ("bank", "primary"): {"ack", "embeddings"},
    }
    seen = {(r.sender, r.receiver) for r in transcript.records}
    assert seen == set(allowed)
    for pair, kinds in allowed.items():
        assert transcript.kinds(*pair) <= kinds, pair
    # training really happened across the boundary
    assert {"forward", "backward"} <= transcript.kinds("primary", "bank")

    raw_keys = set(small[0].frame["id"]) | set(small[1].frame["id"])
    cut = ModelConfig().cut_dim
    for record in transcript.records:
        m = record.message
        for value in vars(m).values():  # no raw key text anywhere
            assert not (isinstance(value, str) and value in raw_keys)
        if isinstance(m, Embeddings):
            assert m.embeddings.dtype == torch.float32 and m.embeddings.shape[1] == cut
            assert not m.embeddings.requires_grad  # values only; never an autograd graph
        elif isinstance(m, Backward):
            assert m.grad.dtype == torch.float32 and m.grad.shape[1] == cut
        elif isinstance(m, Forward):
            assert m.rows.dtype == np.int64  # row positions, nothing else
        elif isinstance(m, KeyDigests):
            assert m.digests.dtype == np.uint8 and m.digests.shape[1] == 32
            # keyed: the coordinator cannot check a guess with a plain hash
            first = hashlib.sha256(str(small[0].frame["id"].iloc[0]).encode()).digest()
            assert all(bytes(row) != first for row in m.digests)
        elif isinstance(m, AlignmentView) and record.receiver == "bank":
            assert m.similarity is None


def test_splitnn_close_to_combine_and_above_solo(tables: tuple[PartyTable, PartyTable]) -> None:
    primary, bank = tables
    results = {alg: run_training(config(alg), tables=(primary, (bank,)))
               for alg in ("solo", "splitnn", "combine")}
    acc = {alg: r.metrics["test"]["accuracy"] for alg, r in results.items()}
    assert acc["splitnn"] >= acc["combine"] - 0.02, acc
    assert acc["splitnn"] >= acc["solo"] + 0.10, acc
    # communication is accounted per epoch and per direction
    epoch = results["splitnn"].history[0].communication
    assert epoch["bank->primary"]["bytes"] > 0 and epoch["primary->bank"]["bytes"] > 0


def test_same_seed_same_numbers(tables: tuple[PartyTable, PartyTable]) -> None:
    primary, bank = tables
    small = (PartyTable.from_frame(primary.schema, primary.frame.iloc[:800], "p"), (bank,))
    a = run_training(config(epochs=3), tables=small)
    b = run_training(config(epochs=3), tables=small)
    assert a.metrics == b.metrics
    assert [r.train_loss for r in a.history] == [r.train_loss for r in b.history]
    c = run_training(config(epochs=3).replace(seed=7), tables=small)
    assert c.metrics != a.metrics


@pytest.mark.parametrize("unmatched", ["drop", "keep"])
def test_unmatched_primary_rows(unmatched: str) -> None:
    primary, bank = two_party_tables(1200, primary_unmatched=300, seed=2)
    cfg = config(epochs=3).replace(alignment=AlignmentConfig(unmatched=unmatched))
    result = run_training(cfg, tables=(primary, (bank,)))
    expected = 900 if unmatched == "drop" else 1200
    assert result.sizes["aligned_rows"] == expected
    assert result.extra["alignment"]["matched_fraction"]["bank"] == pytest.approx(0.75)
    assert result.metrics["test"]["accuracy"] > 0.6


def test_any_number_of_secondary_parties(tables: tuple[PartyTable, PartyTable]) -> None:
    primary, bank = tables
    cols = bank.schema.numeric
    parts = []
    for i, chunk in enumerate((cols[:3], cols[3:6], cols[6:])):
        schema = PartySchema(name=f"s{i}", role="secondary", key=("id",), numeric=chunk)
        frame = bank.frame[["id", *chunk]].sample(frac=1.0, random_state=i)
        parts.append(PartyTable.from_frame(schema, frame, f"s{i}"))
    transcript = Transcript()
    result = run_training(config(epochs=6), tables=(primary, tuple(parts)), transcript=transcript)
    for i in range(3):
        assert "forward" in transcript.kinds("primary", f"s{i}")
    assert result.metrics["test"]["accuracy"] > 0.85
