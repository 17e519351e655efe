"""The privacy-utility curve table from experiment runs: the cells against hand-computed means and
population standard deviations, the first run of a (mode, ε, seed) kept, bad input named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vflink.errors import ConfigError
from vflink.experiments.dp_curve import curve_points, curve_table, load_runs, plot_curve


def _run(eps: float, mode: str, seed: int, acc: float, auc: float) -> dict[str, object]:
    return {"sweep": f"total_epsilon={eps}, embeddings={mode}", "seed": seed,
            "algorithm": "splitnn", "test": {"accuracy": acc, "auc": auc}}


def test_cells_are_mean_std_over_seeds_and_the_first_run_wins(tmp_path: Path) -> None:
    runs = [_run(1.0, "vanilla", 0, 0.70, 0.60), _run(1.0, "vanilla", 1, 0.80, 0.70),
            _run(1.0, "vanilla", 0, 0.10, 0.10),  # a repeat of seed 0: ignored
            _run(8.0, "randomized-response", 0, 0.83, 0.90)]
    (tmp_path / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in runs[:2]))
    out = tmp_path / "exp"
    out.mkdir()
    (out / "results.json").write_text(json.dumps({"runs": runs[2:]}))
    points = curve_points(load_runs([tmp_path / "a.jsonl", out]))
    assert len(points[("vanilla", 1.0)]) == 2
    table = curve_table(points, ["vanilla", "randomized-response"])
    lines = table.splitlines()
    assert lines[0] == "| total ε (δ = 1e-5) | 1 | 8 |"
    # mean 75.0, population std 5.0; AUC mean 0.650
    assert lines[2] == "| vanilla | 75.0 ± 5.0 / 0.650 |  |"
    assert lines[3] == "| randomized-response |  | 83.0 ± 0.0 / 0.900 |"
    plot_curve(points, tmp_path / "curve.png", title="t")
    assert (tmp_path / "curve.png").stat().st_size > 0


def test_runs_of_another_sweep_and_missing_files_are_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="code_bits=4"):
        curve_points([{"sweep": "code_bits=4", "seed": 0, "test": {"accuracy": 1.0}}])
    with pytest.raises(ConfigError, match="nowhere"):
        load_runs([tmp_path / "nowhere"])
