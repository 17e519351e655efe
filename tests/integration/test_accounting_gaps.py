"""Label releases the accounting must not miss: union training's figures derived from real
labels, a batch replayed after a resume, and what the run reports from the clean labels."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from vflink.alignment.synthetic import get_strategy
from vflink.errors import ConfigError, PeerUnavailable
from vflink.parties import SecondaryParty
from vflink.parties.union import check_union_labels
from vflink.privacy.budget import ReleaseBudget
from vflink.privacy.config import PrivacyConfig
from vflink.privacy.label_protection import DOES_NOT_COVER, LabelProtection
from vflink.protocol.messages import Backward, Forward
from vflink.reporting.ledger import privacy_summary
from vflink.runfiles.config import (
    AlignmentConfig,
    DataConfig,
    ModelConfig,
    RunConfig,
    TrainingConfig,
)
from vflink.runner.train import run_training
from vflink.transport import Transcript
from vflink.types import Task

OPTIONS = {"n_samples": 900, "sigma_cf": 0.1, "seed": 3}


def _union(algorithm: str, labels: str, **privacy: object) -> RunConfig:
    return RunConfig(seed=1, algorithm=algorithm,
                     data=DataConfig(dataset="kdd-protein", options={"max_rows": 1500}),
                     alignment=AlignmentConfig(method="psu", alpha=0.3, beta=0.3),
                     model=ModelConfig(hidden=(16,), cut_dim=8, top_hidden=(8,)),
                     training=TrainingConfig(epochs=2, batch_size=128, split=(0.5, 0.2, 0.3)),
                     privacy=PrivacyConfig(labels=labels, **privacy))  # type: ignore[arg-type]


def test_dp_refuses_synthetic_labels_copied_from_real_ones_before_any_work() -> None:
    with pytest.raises(ConfigError, match=r"label-neighbors.*√\(1 \+ m\)·Δ"):
        run_training(_union("label-neighbors", "dp"))
    check_union_labels("rr-prior", get_strategy("label-neighbors"))  # post-processing: fine
    check_union_labels("dp", get_strategy("label-random-pred"))


def test_dp_charges_the_rate_of_positives_union_training_derives_its_labels_from(
        tmp_path: Path) -> None:
    """label-majority-tr fills the primary's gaps with the majority class and shifts every
    record's logits by π: under dp both come from one noisy release of the count of
    positives, charged to the real records beside the training releases."""
    result = run_training(_union("label-majority-tr", "dp"), tmp_path / "run")
    (entry,) = result.extra["protections"]
    g = entry["guarantee"]
    rate = g["positive_rate"]
    assert rate["noise_multiplier"] == 20.0 and rate["records"] > 0
    # one rate release and one release per epoch, composed: still within the total
    assert g["max_releases"] == 3 and g["epsilon"] <= 4.0 + 1e-9
    florist = result.extra["florist"]
    assert florist["positive_rate"] == pytest.approx(rate["rate"])  # the reported π is it
    assert g["does_not_cover"] == DOES_NOT_COVER and "training loss" in DOES_NOT_COVER
    # kept with the primary's data like its other label releases: a later run pays for it
    (budget_dir,) = (tmp_path / "run" / "models").glob("*/_privacy-budget")
    assert list(budget_dir.glob("*.json"))


def test_rr_prior_takes_the_rate_from_the_randomised_labels() -> None:
    result = run_training(_union("label-majority-tr", "rr-prior"))
    (entry,) = result.extra["protections"]
    rate = entry["guarantee"]["positive_rate"]
    assert "post-processing" in rate["from"]
    assert result.extra["florist"]["positive_rate"] == pytest.approx(rate["rate"])


def test_the_rate_release_is_charged_to_a_budget_that_outlives_the_run(
        tmp_path: Path) -> None:
    y = (np.arange(100) % 4 == 0).astype(np.float64)
    first = LabelProtection({"mode": "dp", "epsilon": 4.0}, task=Task.BINARY, party="p",
                            n_rows=100, budget=ReleaseBudget.open(tmp_path, "cd" * 16, 100,
                                                                  party="p"))
    rate = first.release_positive_rate(y, np.arange(100))
    assert abs(rate - 0.25) < 1.0  # 20/100 noise on the count's rate, clipped to [0, 1]
    first.plan(np.arange(100), epochs=1)
    again = ReleaseBudget.open(tmp_path, "cd" * 16, 100, party="p")
    assert again.totals.tolist() == [1] * 100
    assert any(s.mode == "labels-dp-rate" for s in again.settings)


def _config(**privacy: object) -> RunConfig:
    return RunConfig(seed=3, algorithm="splitnn",
                     data=DataConfig(dataset="sklearn-small", options=dict(OPTIONS)),
                     alignment=AlignmentConfig(method="exact"),
                     training=TrainingConfig(epochs=3, patience=3),
                     privacy=PrivacyConfig(labels="dp", **privacy))  # type: ignore[arg-type]


def test_a_resumed_run_replays_its_secret_label_noise_bit_for_bit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The secret stream's state travels in the primary's own checkpoint: the batches replayed
    after a resume send exactly what was sent before the crash, so they are not new releases
    and nothing is counted twice."""
    calls = {"n": 0}
    original = SecondaryParty.on_forward

    def dying(self: SecondaryParty, sender: str, message: Forward):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] == 9:  # in epoch 2, after a few of its batches were sent
            raise PeerUnavailable(self.name, "simulated crash")
        return original(self, sender, message)

    cut = Transcript()
    monkeypatch.setattr(SecondaryParty, "on_forward", dying)
    with pytest.raises(PeerUnavailable):
        run_training(_config(), tmp_path / "cut", transcript=cut)
    monkeypatch.setattr(SecondaryParty, "on_forward", original)
    again = Transcript()
    resumed = run_training(_config(), tmp_path / "cut", resume=True, transcript=again)
    before = [r.message.grad for r in cut.records if isinstance(r.message, Backward)]
    after = [r.message.grad for r in again.records if isinstance(r.message, Backward)]
    per_epoch = len(after) // 2  # the resumed run trains epochs 2 and 3
    replayed = len(before) - per_epoch  # epoch 2's batches sent before the crash
    assert replayed > 0
    for a, b in zip(before[per_epoch:], after[:replayed], strict=True):
        assert torch.equal(a, b)  # the same noise on the same records: bit for bit
    (entry,) = [p for p in resumed.extra["protections"] if p["kind"] == "label-dp"]
    assert entry["params"]["noise"] == "secret"
    assert entry["guarantee"]["max_releases"] == 3  # one per epoch: the replay is free


def test_a_replay_is_charged_when_its_noise_cannot_be_restored_or_its_loss_is_clipped(
) -> None:
    rows = np.arange(8)
    for task, restore in ((Task.BINARY, False), (Task.REGRESSION, True)):
        budget = ReleaseBudget(8, party="p")
        first = LabelProtection({"mode": "dp", "epsilon": 8.0}, task=task, party="p",
                                n_rows=8, budget=budget)
        first.plan(rows, epochs=3)
        z, y = torch.zeros(8, 1), torch.ones(8)
        first.noisy_logit_gradient(z, y, rows)  # epoch 1
        state = first.state_dict()  # its checkpoint
        first.noisy_logit_gradient(z, y, rows)  # sent, then the process dies
        if not restore:
            state = {**state, "noise": None}  # e.g. a checkpoint of an older version
        resumed = LabelProtection({"mode": "dp", "epsilon": 8.0}, task=task, party="p",
                                  n_rows=8, budget=budget)
        resumed.load_state_dict(state)
        assert not resumed.replay_is_free
        resumed.noisy_logit_gradient(z, y, rows)
        assert budget.totals.tolist() == [3] * 8  # the replay is a new release: counted
    # the case that is free: cross-entropy with its noise restored
    budget = ReleaseBudget(8, party="p")
    first = LabelProtection({"mode": "dp", "epsilon": 8.0}, task=Task.BINARY, party="p",
                            n_rows=8, budget=budget)
    first.plan(rows, epochs=3)
    first.noisy_logit_gradient(torch.zeros(8, 1), torch.ones(8), rows)  # epoch 1
    state = first.state_dict()  # its checkpoint
    sent = first.noisy_logit_gradient(torch.zeros(8, 1), torch.ones(8), rows)  # epoch 2 ...
    resumed = LabelProtection({"mode": "dp", "epsilon": 8.0}, task=Task.BINARY, party="p",
                              n_rows=8, budget=budget)
    resumed.load_state_dict(state)
    assert resumed.replay_is_free
    # other embeddings the second time (a secondary may send anything): the same noise
    again = resumed.noisy_logit_gradient(torch.ones(8, 1), torch.ones(8), rows)
    g_first = torch.sigmoid(torch.zeros(8, 1)) - 1
    g_again = torch.sigmoid(torch.ones(8, 1)) - 1
    torch.testing.assert_close(again - g_again, sent - g_first)
    assert budget.totals.tolist() == [2] * 8  # epochs 1 and 2, the replay not again


def test_the_summary_the_ledger_and_the_report_say_not_private_behind_the_switch(
        tmp_path: Path) -> None:
    from vflink.reporting.report import build_report

    seeded = run_training(_config(reproducible_noise=True).replace(
        training=TrainingConfig(epochs=1, patience=1)), tmp_path / "seeded")
    html = build_report(tmp_path / "seeded")
    assert "not-private" in html and "NOT PRIVATE: THE NOISE CAN BE REGENERATED" in html
    line = privacy_summary(seeded)
    assert line.startswith("privacy: NOT PRIVATE: THE NOISE CAN BE REGENERATED (primary")
    (entry,) = [p for p in seeded.extra["protections"] if p["kind"] == "label-dp"]
    assert entry["guarantee"]["private"] is False
    assert entry["explanation"].startswith("NOT PRIVATE")
    secret = run_training(_config().replace(training=TrainingConfig(epochs=1, patience=1)),
                          tmp_path / "secret")
    assert "NOT PRIVATE" not in privacy_summary(secret)
    assert "NOT PRIVATE" not in build_report(tmp_path / "secret")
    assert privacy_summary(secret).endswith("noise: secret (OS CSPRNG)")
