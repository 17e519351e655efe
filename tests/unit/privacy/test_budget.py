"""Release counts that belong to the data: they outlive an EmbeddingDP (a
run), persist in a file, compose across settings, and only an explicit reset forgets them."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from dp_accounting import gaussian_mechanism

from vflink.errors import DataError, PrivacyBudgetExceeded
from vflink.privacy.accounting import calibrate, composed_epsilon, composed_epsilon_mixed
from vflink.privacy.budget import ReleaseBudget, ReleaseSetting, budget_file, reset_budget
from vflink.privacy.config import PrivacyConfig
from vflink.privacy.embedding_dp import EmbeddingDP

FP = "ab" * 32
N = 10


def _dp(store: ReleaseBudget | None = None, seed: int | None = 1, **kw: object) -> EmbeddingDP:
    config = PrivacyConfig(**{"embeddings": "vanilla", "epsilon": 2.0, **kw})  # type: ignore[arg-type]
    return EmbeddingDP(config, party="bank", n_rows=N, seed=seed, budget=store)


def _gaussian_oracle(releases: list[tuple[float, int]], delta: float) -> float:
    """Closed form: m_k Gaussian releases of multipliers σ_k compose to one Gaussian of
    multiplier (Σ m_k/σ_k²)^(-1/2) (Dong, Roth, Su 2019, GDP composition), an independent
    route to the accountant's figure."""
    mu2 = sum(m / s**2 for s, m in releases)
    return float(gaussian_mechanism.get_epsilon_gaussian(1.0 / math.sqrt(mu2), delta))


@pytest.mark.parametrize("releases", [[(1.1, 3)], [(1.1, 3), (0.67, 2)],
                                      [(2.0, 10), (0.8, 1), (5.0, 40)]])
def test_mixed_composition_matches_the_closed_form(releases: list[tuple[float, int]]) -> None:
    got = composed_epsilon_mixed(tuple(releases), 1e-2)
    assert got == pytest.approx(_gaussian_oracle(releases, 1e-2), rel=2e-3)
    if len(releases) == 1:  # one setting: exactly the figures the ledger always reported
        assert got == composed_epsilon(releases[0][0], releases[0][1], 1e-2)


def test_counts_persist_and_every_write_is_atomic(tmp_path: Path) -> None:
    d = tmp_path / "_privacy-budget"
    b = ReleaseBudget.open(d, FP, N, party="bank")
    assert not budget_file(d, FP).exists()  # nothing released, nothing written
    dp = _dp(b)
    dp.release(torch.randn(3, 4), np.array([0, 4, 9]))
    # on disk before release() returned (write-ahead), and no temporary file is left
    assert sorted(p.name for p in d.iterdir()) == [f"{FP}.json"]
    again = ReleaseBudget.open(d, FP, N, party="bank")
    np.testing.assert_array_equal(again.counts, b.counts)
    assert again.settings == b.settings and again.streams == b.streams == 1
    assert again.totals.tolist() == [1, 0, 0, 0, 1, 0, 0, 0, 0, 1]


def test_a_damaged_or_foreign_file_fails_closed(tmp_path: Path) -> None:
    b = ReleaseBudget.open(tmp_path, FP, N, party="bank")
    b.record(ReleaseSetting(sigma=1.0), np.array([1]))
    path = budget_file(tmp_path, FP)
    with pytest.raises(DataError, match="other data"):  # a file copied under another name
        _open_with(tmp_path, path, fingerprint="cd" * 32)
    with pytest.raises(DataError, match="counts 10 records, the party has 11"):
        ReleaseBudget.open(tmp_path, FP, N + 1, party="bank")
    doc = json.loads(path.read_text())
    doc["counts"]["base64"] = "!!"
    path.write_text(json.dumps(doc))
    with pytest.raises(DataError, match="unusable.*vflink privacy-budget --reset"):
        ReleaseBudget.open(tmp_path, FP, N, party="bank")


def _open_with(directory: Path, path: Path, *, fingerprint: str) -> ReleaseBudget:
    """The file of one data version copied under another fingerprint's name."""
    other = budget_file(directory, fingerprint)
    other.write_text(path.read_text())
    return ReleaseBudget.open(directory, fingerprint, N, party="bank")


def test_a_new_run_on_the_same_data_keeps_the_counts_and_the_refusal() -> None:
    b = ReleaseBudget(N, party="bank")
    allowed = 3  # ε(3) ≈ 4.21 ≤ 5 < ε(4) ≈ 5.14 at σ(ε = 2, δ = 1e-2)
    rows = np.array([0, 3, 5])
    refused = 0
    for _ in range(4):  # four "runs" (a new SetupBottom each), each trying two releases
        dp = _dp(b, budget=5.0)
        for _ in range(2):
            try:
                dp.release(torch.randn(3, 4), rows)
            except PrivacyBudgetExceeded:
                refused += 1
    assert b.totals[rows].tolist() == [allowed] * 3 and refused == 8 - allowed
    assert _dp(b, budget=5.0).report()["guarantee"]["max_releases"] == allowed
    # other records still have their whole budget
    _dp(b, budget=5.0).release(torch.randn(2, 4), np.array([1, 2]))


def test_releases_under_other_settings_compose_into_the_check_and_the_report() -> None:
    b = ReleaseBudget(N, party="bank")
    weak = _dp(b, epsilon=4.0)  # σ ≈ 0.67
    weak.release(torch.randn(2, 4), np.array([0, 1]))
    strong = _dp(b, budget=7.0)  # σ ≈ 1.12, ε(1) = 2
    s2, s4 = calibrate(2.0, 1e-2).sigma, calibrate(4.0, 1e-2).sigma
    released = 0
    with pytest.raises(PrivacyBudgetExceeded, match="under 2 settings"):
        for _ in range(10):
            strong.release(torch.randn(1, 4), np.array([0]))
            released += 1
    # the oracle: the last release fits the budget, one more would not
    assert _gaussian_oracle([(s4, 1), (s2, released)], 1e-2) <= 7.0 * (1 + 2e-3)
    assert _gaussian_oracle([(s4, 1), (s2, released + 1)], 1e-2) > 7.0 * (1 - 2e-3)
    assert released < 4  # alone, σ(ε = 2) would allow 4 releases within 7.0
    g = strong.report()["guarantee"]
    assert g["settings_used"] == 2 and g["max_releases"] == released + 1
    assert g["run_max_releases"] == released
    assert g["epsilon_total"] == pytest.approx(
        _gaussian_oracle([(s4, 1), (s2, released)], 1e-2), rel=2e-3)


def test_a_single_run_reports_the_figures_it_always_did() -> None:
    dp = _dp()
    for _ in range(3):
        dp.release(torch.randn(N, 4), np.arange(N))
    g = dp.report()["guarantee"]
    assert g["max_releases"] == g["run_max_releases"] == 3
    assert g["epsilon_total"] == composed_epsilon(dp.sigma, 3, 1e-2)
    assert g["releases_total"] == g["run_releases_total"] == 3 * N
    rescale = _dp(embeddings="rescale")
    rescale.release(torch.randn(N, 4), np.arange(N))
    rescale.release(torch.randn(N, 4), np.arange(N))
    r = rescale.report()["guarantee"]
    assert r["delta_total"] == pytest.approx(1e-2 + 2 * (1 - r["p2"]))


def test_a_fixed_seed_never_repeats_its_noise_on_the_same_data() -> None:
    x = torch.zeros(2, 4)
    rows = np.array([0, 1])
    fresh = [_dp(ReleaseBudget(N)).release(x, rows)[1] for _ in range(2)]
    torch.testing.assert_close(fresh[0], fresh[1])  # reproducible: a fresh budget, same noise
    b = ReleaseBudget(N)
    first = _dp(b).release(x, rows)[1]
    second = _dp(b).release(x, rows)[1]  # a second run on the same data, same seed
    torch.testing.assert_close(first, fresh[0])
    assert not torch.allclose(first, second)  # else second - first would be noise-free


def test_reset_deletes_logs_and_keeps_a_record(tmp_path: Path,
                                               caplog: pytest.LogCaptureFixture) -> None:
    b = ReleaseBudget.open(tmp_path, FP, N, party="bank")
    b.record(ReleaseSetting(sigma=1.0), np.array([2, 3]))
    with caplog.at_level(logging.WARNING, logger="vflink.privacy.budget"):
        entry = reset_budget(tmp_path, FP, party="bank", operator="alice@host")
    assert entry is not None and entry["releases_total"] == 2
    assert not budget_file(tmp_path, FP).exists()
    (record,) = [r for r in caplog.records if "RESET" in r.getMessage()]
    assert record.levelno == logging.WARNING
    assert "alice@host" in record.getMessage() and FP in record.getMessage()
    (line,) = (tmp_path / "resets.jsonl").read_text().splitlines()
    assert json.loads(line)["operator"] == "alice@host"
    assert ReleaseBudget.open(tmp_path, FP, N).totals.sum() == 0
    assert reset_budget(tmp_path, FP, party="bank", operator="alice@host") is None


def _journals(d: Path) -> list[Path]:
    return sorted(d.glob("*.journal"))


def test_the_journal_holds_every_batch_and_is_folded_into_the_snapshot(tmp_path: Path) -> None:
    b = ReleaseBudget.open(tmp_path, FP, N, party="bank")
    setting = ReleaseSetting(sigma=1.0)
    b.record(setting, np.array([0, 1]))  # a new setting: a snapshot
    assert _journals(tmp_path) == []
    for rows in ([1, 2], [2, 3, 9], [9]):
        b.record(setting, np.array(rows))  # appended to the journal, not a new snapshot
    (journal,) = _journals(tmp_path)
    oracle = [1, 2, 2, 1, 0, 0, 0, 0, 0, 2]
    # what a reader finds on disk: the snapshot plus the journal
    assert ReleaseBudget.open(tmp_path, FP, N, read_only=True).totals.tolist() == oracle
    assert journal.exists()  # a read-only open writes nothing
    # a crash that tore the last record (its write never finished: it was never sent)
    with open(journal, "ab") as fh:
        fh.write(b"VFR1\x00\x00")
    reopened = ReleaseBudget.open(tmp_path, FP, N, party="bank")  # the party's open compacts
    assert reopened.totals.tolist() == oracle and _journals(tmp_path) == []
    assert reopened.generation > b.generation
    reopened.record(setting, np.array([4]))
    # a journal of an older generation (a crash between the snapshot and its deletion) is
    # already in the snapshot: never replayed twice
    stale = budget_file(tmp_path, FP).with_name(f"{FP}.{b.generation}.journal")
    stale.write_bytes(_journals(tmp_path)[0].read_bytes())
    oracle[4] = 1
    assert ReleaseBudget.open(tmp_path, FP, N, read_only=True).totals.tolist() == oracle


def test_a_damaged_journal_record_fails_closed(tmp_path: Path) -> None:
    b = ReleaseBudget.open(tmp_path, FP, N, party="bank")
    setting = ReleaseSetting(sigma=1.0)
    for rows in ([0], [1, 2], [3]):
        b.record(setting, np.array(rows))
    (journal,) = _journals(tmp_path)
    data = bytearray(journal.read_bytes())
    data[16] ^= 0xFF  # a row of the first journal record (not the last): damage, not a tear
    journal.write_bytes(bytes(data))
    with pytest.raises(DataError, match="damaged record"):
        ReleaseBudget.open(tmp_path, FP, N, party="bank")


def test_the_number_of_settings_is_bounded() -> None:
    from vflink.privacy.budget import MAX_SETTINGS

    b = ReleaseBudget(N, party="bank")
    for k in range(MAX_SETTINGS):
        b.record(ReleaseSetting(sigma=1.0 + k), np.array([0]))
    with pytest.raises(PrivacyBudgetExceeded, match="no new one"):
        b.record(ReleaseSetting(sigma=0.5), np.array([1]))
    assert b.counts.shape == (MAX_SETTINGS, N) and b.totals[1] == 0
    b.record(ReleaseSetting(sigma=1.0), np.array([1]))  # a known setting still counts
