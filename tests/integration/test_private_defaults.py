"""Private by default, and reproducible: keyed Bloom filters unless privacy is turned off
explicitly; in-process runs without a secret derive one from the seed."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from vflink.cli.main import main
from vflink.privacy.config import PrivacyConfig
from vflink.protocol import IdentifierEncodings, Message
from vflink.runfiles.config import AlignmentConfig, DataConfig, RunConfig, TrainingConfig
from vflink.runner.prepare import prepare
from vflink.runner.train import run_training
from vflink.transport import Transcript

OPTIONS = {"n_samples": 400, "sigma_cf": 0.1, "seed": 2}


def soft_config(**alignment: Any) -> RunConfig:
    return RunConfig(seed=2, algorithm="fedsim",
                     data=DataConfig(dataset="sklearn-small", options=dict(OPTIONS)),
                     alignment=AlignmentConfig(method="soft", top_k=3, tau=0.9999, **alignment),
                     training=TrainingConfig(epochs=2, patience=2))


def test_in_process_bloom_runs_without_a_secret_repeat_exactly(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.delenv("VFLINK_SECRET", raising=False)
    import vflink.runner.local

    monkeypatch.setattr(vflink.runner.local, "_WARNED", set())  # as in a fresh process
    # the alignment secret derives from the seed; the noise repeats behind the one switch
    config = soft_config(privacy="bloom").replace(
        privacy=PrivacyConfig(reproducible_noise=True))
    with caplog.at_level(logging.WARNING):
        first = run_training(config)
    assert "NOT a secret" in caplog.text
    second = run_training(config)
    assert first.metrics == second.metrics
    assert [r.train_loss for r in first.history] == [r.train_loss for r in second.history]
    summary = first.extra["alignment"]
    assert summary["encoding"] == "bloom" and "not a secret" in summary["secret"]
    a, b = prepare(config), prepare(config)
    np.testing.assert_array_equal(a.alignments["topk"]["secondary"].secondary_index,
                                  b.alignments["topk"]["secondary"].secondary_index)
    # another seed derives another secret
    other = prepare(config.replace(seed=3))
    assert other.summary["secret"] != a.summary["secret"]


def test_soft_alignment_is_private_unless_turned_off_and_the_summary_says_which() -> None:
    assert AlignmentConfig().privacy == "bloom"
    transcript = Transcript()
    default = prepare(soft_config(), transcript=transcript)
    assert default.summary["privacy"] == "bloom" and default.summary["encoding"] == "bloom"
    encodings = [r.message for r in transcript.records
                 if isinstance(r.message, IdentifierEncodings)]
    assert encodings and all(np.asarray(m.values).dtype == np.uint8 for m in encodings)
    off = prepare(soft_config(privacy="off"))
    assert off.summary["privacy"] == "off" and off.summary["encoding"] == "raw"
    assert "RAW" in off.summary["sent_to_coordinator"]
    exact = prepare(soft_config().replace(algorithm="splitnn",
                                          alignment=AlignmentConfig(method="exact")))
    assert exact.summary["encoding"] == "hmac-sha256" and "secret" in exact.summary


def _values(message: Message) -> list[Any]:
    out: list[Any] = []
    for value in vars(message).values():
        if isinstance(value, (tuple, list)):
            out.extend(value)
        else:
            out.append(value)
    return out


@pytest.mark.parametrize("case", ["coordinates", "names"])
def test_link_command_without_a_privacy_option_sends_no_raw_identifier(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    rng = np.random.default_rng(0)
    if case == "coordinates":
        p = pd.DataFrame({"lat": rng.uniform(37, 38, 80), "lon": rng.uniform(-122.5, -121.5, 80)})
        s = pd.DataFrame({"lat": rng.uniform(37, 38, 50), "lon": rng.uniform(-122.5, -121.5, 50)})
        args, raw = ["--on", "lat,lon", "--metric", "haversine"], set(p.to_numpy().ravel())
    else:
        first = ["anna", "bert", "carla", "dirk", "emma", "femke", "gijs", "hugo"]
        p = pd.DataFrame({"name": [f"{first[i % 8]} smith{i}" for i in range(40)]})
        s = pd.DataFrame({"name": [f"{first[i % 8]} smyth{i}" for i in range(30)]})
        args, raw = ["--on", "name", "--metric", "levenshtein"], set(p["name"]) | set(s["name"])
    pp, sp = tmp_path / "p.csv", tmp_path / "s.csv"
    p.to_csv(pp, index=False)
    s.to_csv(sp, index=False)
    transcript = Transcript()
    import vflink.runner.link.pipeline as pipeline

    real = pipeline.run_link

    def recorded(*a: Any, **kw: Any) -> Any:
        return real(*a, **kw, transcript=transcript)

    monkeypatch.setattr(pipeline, "run_link", recorded)
    out = tmp_path / "links.csv"
    code = main(["link", "--primary", str(pp), "--secondary", str(sp), *args, "--top-k", "3",
                 "--seed", "0", "--out", str(out)])
    assert code == 0
    to_coordinator = [r.message for r in transcript.records if r.receiver == "coordinator"]
    encodings = [m for m in to_coordinator if isinstance(m, IdentifierEncodings)]
    assert len(encodings) == 2  # one per data party, both keyed Bloom filters
    for m in encodings:
        assert m.encoder == "bloom" and np.asarray(m.values).dtype == np.uint8
    for m in to_coordinator:  # no raw identifier in any field of any message
        for value in _values(m):
            if isinstance(value, np.ndarray):
                assert value.dtype == np.uint8 or not (set(value.ravel().tolist()) & raw)
            else:
                assert not (isinstance(value, (str, float)) and value in raw), (m.kind, value)
    summary = json.loads((tmp_path / "links.csv.summary.json").read_text())
    assert summary["privacy"] == "bloom" and summary["encoding"] == "bloom"
    assert "Bloom" in summary["sent_to_coordinator"]


def test_link_command_sends_raw_identifiers_only_when_told(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]
                                                           ) -> None:
    rng = np.random.default_rng(1)
    p = pd.DataFrame({"x": rng.normal(size=30), "y": rng.normal(size=30)})
    pp = tmp_path / "p.csv"
    p.to_csv(pp, index=False)
    base = ["link", "--primary", str(pp), "--secondary", str(pp), "--on", "x,y", "--metric",
            "euclidean", "--top-k", "2"]
    assert main([*base, "--privacy", "off", "--out", str(tmp_path / "off.csv")]) == 0
    summary = json.loads((tmp_path / "off.csv.summary.json").read_text())
    assert summary["privacy"] == "off" and summary["encoding"] == "raw"
    assert main([*base, "--bloom", "--out", str(tmp_path / "bloom.csv")]) == 0  # still accepted
    assert json.loads((tmp_path / "bloom.csv.summary.json").read_text())["encoding"] == "bloom"
    capsys.readouterr()
    assert main([*base, "--bloom", "--privacy", "off", "--out", str(tmp_path / "x.csv")]) == 2
    assert "contradicts" in capsys.readouterr().err
