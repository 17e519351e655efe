"""The label-protection tables and figure from run records (no training)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vflink.errors import ConfigError
from vflink.experiments.label_protection import (
    adjusting_table,
    curve_table,
    load_runs,
    plot_curve,
    power_table,
    protection_table,
)


def _run(labels: str, seed: int, acc: float, *, eps: float | None = None, auc: float = 0.5,
         embeddings: str = "off") -> dict[str, object]:
    return {"dataset": "adult", "labels": labels, "epsilon": eps, "embeddings": embeddings,
            "power": None, "algorithm": "splitnn", "seed": seed,
            "test": {"accuracy": acc, "auc": 0.9},
            "attacks": {"label-norm": {"auc": auc}, "label-direction": {"auc": auc},
                        "label-fcm": {"auc": auc}},
            "guarantee": {"epsilon": eps, "sigma": 2.0, "max_releases": 20}
            if labels == "dp" else {}}


RUNS = [_run("off", s, 0.86 + 0.01 * s, auc=0.95) for s in range(2)] + \
    [_run("dp", s, 0.85 + 0.01 * s, eps=e, auc=0.5) for s in range(2) for e in (1.0, 4.0)]


def test_protection_table_pairs_each_seed_with_its_unprotected_run() -> None:
    text = protection_table(RUNS, epsilon=4.0, attacks=(("label-norm", "norm"),))
    rows = {line.split("|")[1].strip(): line for line in text.splitlines()[2:4]}
    assert set(rows) == {"off", "dp"}
    assert "-1.0 ± 0.0" in rows["dp"]  # 1 point below its own seed's unprotected run
    assert "0.500 ± 0.000" in rows["dp"] and "(ε = 4.00, δ = 1e-5), σ = 2.00" in rows["dp"]
    curve = curve_table(RUNS, modes=("dp",))
    assert "ε = 1 | ε = 4 | off" in curve.splitlines()[0]
    assert "85.5 ± 0.5" in curve and "86.5 ± 0.5" in curve


def test_adjusting_table_and_figure(tmp_path: Path) -> None:
    runs = [_run(mode, s, 0.80 + (0.01 if emb == "adjust" else 0.0), embeddings=emb)
            for mode in ("off", "dp") for emb in ("vanilla", "adjust") for s in range(2)]
    text = adjusting_table(runs)
    assert "| off | 80.0 ± 0.0 | 81.0 ± 0.0 | 1.0 ± 0.0 |" in text
    plot_curve(RUNS, tmp_path / "curve.png", title="t", modes=("dp",))
    assert (tmp_path / "curve.png").stat().st_size > 1000


def test_runs_files_keep_the_first_run_of_a_point(tmp_path: Path) -> None:
    path = tmp_path / "runs.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in RUNS + [_run("off", 0, 0.1)]) + "\n")
    runs = load_runs([path])
    assert len(runs) == len(RUNS) and runs[0]["test"]["accuracy"] == 0.86
    with pytest.raises(ConfigError, match="no such runs file"):
        load_runs([tmp_path / "missing.jsonl"])


def test_power_table_pairs_marvell_runs_with_the_unprotected_ones() -> None:
    runs = [_run("off", s, 0.90) for s in range(2)]
    for power in (1.0, 4.0):
        for s in range(2):
            run = _run("marvell", s, 0.90 - 0.01 * power, auc=0.5 + 0.01 / power)
            run.update(power=power, guarantee={"leak_auc_bound_max": 0.6 + 0.01 * power})
            runs.append(run)
    lines = power_table(runs).splitlines()
    assert lines[2].startswith("| 1 | 89.0 ± 0.0 | -1.0 ± 0.0 |") and lines[2].endswith("0.610 |")
    assert lines[3].startswith("| 4 | 86.0 ± 0.0 | -4.0 ± 0.0 |")
