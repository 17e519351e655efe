"""``vflink experiment``: tables of mean ± std, and the same numbers on a re-run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vflink.cli.main import main
from vflink.errors import ConfigError
from vflink.experiments.grid import run_experiment
from vflink.runfiles.experiment import load_experiment

EXPERIMENT = """version = 1
[experiment]
name = "tiny"
algorithms = ["solo", "top1sim", "fedsim", "combine"]
seeds = [0, 1]
sweep = { "data.options.sigma_cf" = [0.0, 0.3] }
[data]
dataset = "sklearn-small"
[data.options]
n_samples = 600
[alignment]
method = "soft"
top_k = 4
privacy = "off"
[training]
epochs = 2
[privacy]
reproducible_noise = true   # the same numbers on a re-run: the noise seeded from the seeds
"""


@pytest.mark.slow
def test_experiment_tables_and_reproducibility(tmp_path: Path) -> None:
    path = tmp_path / "exp.toml"
    path.write_text(EXPERIMENT)
    assert main(["experiment", "--config", str(path), "--out", str(tmp_path / "a")]) == 0
    first = json.loads((tmp_path / "a" / "results.json").read_text())
    assert len(first["runs"]) == 2 * 2 * 4
    summary = first["summary"]
    assert set(summary) == {"0.0", "0.3"} and set(summary["0.0"]) == {"solo", "top1sim",
                                                                      "fedsim", "combine"}
    stat = summary["0.3"]["fedsim"]["accuracy"]
    runs = [r["test"]["accuracy"] for r in first["runs"]
            if r["sweep"] == 0.3 and r["algorithm"] == "fedsim"]
    assert stat["mean"] == pytest.approx(sum(runs) / 2) and stat["n"] == 2
    md = (tmp_path / "a" / "results.md").read_text()
    assert "| fedsim |" in md and "±" in md
    # privacy = "off" was chosen explicitly, and the results say what reached the coordinator
    assert first["encodings"] == ["raw"] and "coordinator as: raw" in md
    assert (tmp_path / "a" / "plot.png").stat().st_size > 1000
    # identical numbers on a re-run with the same seeds
    second = run_experiment(load_experiment(path), tmp_path / "b")
    assert second["summary"] == first["summary"]


def test_experiment_errors_are_reported_together(tmp_path: Path) -> None:
    path = tmp_path / "exp.toml"
    path.write_text(EXPERIMENT.replace('"solo", ', '"solo", "magic", ').replace(
        "seeds = [0, 1]", "seeds = [-1]"))
    with pytest.raises(ConfigError) as info:
        load_experiment(path)
    text = " ".join(info.value.problems)
    assert "magic" in text and "seeds" in text
