"""The link as a pipeline of stages: each stage's entry chosen from its registry by the
settings before any stage runs, the same for the API, the command and a [link] file, every
stage timed once (its lazy work included) in the summary."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

import vflink
from vflink.cli.main import main
from vflink.errors import ConfigError, UnknownNameError
from vflink.runner.link import context
from vflink.runner.link.context import STAGES, Clock
from vflink.runner.link.pipeline import REGISTRIES, build, choose
from vflink.runner.link.settings import LinkSettings


def _tables(tmp_path: Path, n: int = 50, m: int = 30) -> tuple[Path, Path]:
    rng = np.random.default_rng(3)
    words = ["anna", "bert", "carla", "dirk", "emma"]

    def table(k: int) -> pd.DataFrame:
        return pd.DataFrame({"x": rng.normal(size=k), "y": rng.normal(size=k),
                             "name": [f"{words[i % 5]} {i % 7}" for i in range(k)]})

    p, s = tmp_path / "p.csv", tmp_path / "s.parquet"
    table(n).to_csv(p, index=False)
    table(m).to_parquet(s)
    return p, s


CHOICES = [
    ({"on": "x,y", "metric": "euclidean"},
     {"read": "tables", "encode": "identifier", "candidates": "search", "compare": "distance",
      "model": "none", "decide": "top-k", "write": "file", "charts": "none"}),
    ({"fields": [{"on": ["name"], "metric": "levenshtein"}], "blocking": ["name"], "sigma": 0.5},
     {"read": "tables", "encode": "fields", "candidates": "fields", "compare": "fields",
      "model": "none", "decide": "top-k", "write": "file", "charts": "none"}),
    ({"on": "name", "model": "fellegi-sunter", "one_to_one": "greedy", "sigma": 0.5},
     {"read": "tables", "encode": "fields", "candidates": "fields", "compare": "fields",
      "model": "fellegi-sunter", "decide": "matches", "write": "file", "charts": "none"}),
    ({"on": "x,y", "metric": "euclidean", "stream": True},
     {"read": "batches", "encode": "chunks", "candidates": "chunks", "compare": "moments",
      "model": "none", "decide": "chunks", "write": "stream", "charts": "none"}),
    ({"on": "x,y", "metric": "euclidean", "charts": True},
     {"read": "tables", "encode": "identifier", "candidates": "search", "compare": "distance",
      "model": "none", "decide": "top-k", "write": "file", "charts": "figures"}),
]


@pytest.mark.parametrize(("options", "want"), CHOICES, ids=["identifier", "fields", "model",
                                                            "streamed", "charts"])
def test_the_settings_choose_every_stage_and_the_summary_says_which(
        tmp_path: Path, options: dict[str, Any], want: dict[str, str]) -> None:
    p, s = _tables(tmp_path)
    out = tmp_path / "links.parquet"
    settings = LinkSettings.from_options(top_k=2, seed=0, out=out, **options)
    pipeline = build(settings, (p, s))
    assert dict(pipeline.choices) == want
    assert [name for name, _ in pipeline.stages] == list(STAGES)
    assert all(REGISTRIES[name].get(want[name]) is stage for name, stage in pipeline.stages)
    links = vflink.link(p, s, top_k=2, seed=0, out=out, **options)  # type: ignore[arg-type]
    written = json.loads(Path(f"{out}.summary.json").read_text())
    assert written["stages"] == links.summary["stages"] == want
    seconds = written["stage_seconds"]
    assert list(seconds) == list(STAGES) and all(v >= 0 for v in seconds.values())
    # every second counted once: the stages add up to no more than the whole link
    assert sum(seconds.values()) <= sum(written["phase_seconds"].values()) + 0.01


def test_without_out_nothing_is_written_or_drawn(tmp_path: Path) -> None:
    p, s = _tables(tmp_path)
    settings = LinkSettings.from_options(on="x,y", metric="euclidean", top_k=2)
    assert choose(settings, streamed=False)["write"] == "none"
    assert choose(settings, streamed=False)["charts"] == "none"
    links = vflink.link(p, s, on="x,y", metric="euclidean", top_k=2, seed=0)
    assert len(links.frame) == 100 and links.path is None
    assert sorted(x.name for x in tmp_path.iterdir()) == ["p.csv", "s.parquet"]


def test_an_unknown_entry_lists_the_valid_ones() -> None:
    with pytest.raises(UnknownNameError, match="tables"):
        REGISTRIES["read"].get("spreadsheet")


def test_the_command_and_a_link_file_build_the_same_pipeline_as_the_api(
        tmp_path: Path) -> None:
    """The same links, summary and stages from vflink.link, `vflink link` and a [link]
    file (the timings aside). The command's primary takes its alignment without the float32
    similarities (the file holds them): the API asked the same way reports the same bytes,
    and the API's default 4 bytes a link more from the coordinator to the primary."""
    p, s = _tables(tmp_path)
    api = vflink.link(p, s, on="x,y", metric="euclidean", top_k=3, seed=1, tau=0.5,
                      out=tmp_path / "api.parquet", alignment_similarities=False)
    whole = vflink.link(p, s, on="x,y", metric="euclidean", top_k=3, seed=1, tau=0.5)
    sent = {name: run.summary["communication"]["coordinator->primary"]["bytes"]
            for name, run in (("api", api), ("whole", whole))}
    assert sent["whole"] - sent["api"] == 4 * len(api)  # a float32 similarity per link
    assert main(["link", "--primary", str(p), "--secondary", str(s), "--on", "x,y",
                 "--metric", "euclidean", "--top-k", "3", "--seed", "1", "--tau", "0.5",
                 "--out", str(tmp_path / "cli.parquet")]) == 0
    (tmp_path / "link.toml").write_text(
        f'[link]\nprimary = "{p.name}"\nsecondary = "{s.name}"\non = "x,y"\n'
        'metric = "euclidean"\ntop_k = 3\nseed = 1\ntau = 0.5\nout = "file.parquet"\n')
    assert main(["link", "--config", str(tmp_path / "link.toml")]) == 0
    timing = ("seconds", "phase_seconds", "stage_seconds", "step_seconds")
    for name in ("cli", "file"):
        assert ((tmp_path / f"{name}.parquet").read_bytes()
                == (tmp_path / "api.parquet").read_bytes())
        got = json.loads((tmp_path / f"{name}.parquet.summary.json").read_text())
        assert {k: v for k, v in got.items() if k not in timing} == {
            k: v for k, v in json.loads(json.dumps(api.summary, default=str)).items()
            if k not in timing}


def test_settings_report_every_problem_at_once() -> None:
    with pytest.raises(ConfigError) as info:
        LinkSettings.from_options(on="x,y", secondary_on="x", metric="cosine", top_k=0,
                                  mode="fuzzy", one_to_one=True)
    text = str(info.value)
    for needle in ("`metric` must be one of", "`top_k` must be an int", "`mode` must be one of",
                   "--on names 2 column(s) but --secondary-on names 1",
                   "`one_to_one` decide(s) among a model's matches"):
        assert needle in text
    with pytest.raises(ConfigError, match="`view` must be one of"):
        LinkSettings(on=("x",), metric="euclidean", view="everything")


def test_a_refused_stream_fails_before_any_stage(tmp_path: Path) -> None:
    p, s = _tables(tmp_path)
    settings = LinkSettings.from_options(on="x,y", metric="euclidean", top_k=2, stream=True,
                                         empty="skip", out=tmp_path / "l.csv")
    with pytest.raises(ConfigError, match="empty = \"skip\" is not streamed"):
        build(settings, (p, s))
    assert not (tmp_path / "l.csv").exists()


class _FakeTime:
    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


def test_the_clock_counts_each_second_once_for_the_stage_that_spent_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Work done lazily inside another stage goes to the stage that made it; seconds a party
    measured are moved from the running stage to theirs; nothing is counted twice."""
    fake = _FakeTime()
    monkeypatch.setattr(context, "time", fake)
    clock = Clock()
    with clock.stage("encode"):
        fake.now += 1.0
    with clock.stage("candidates"):
        fake.now += 2.0
        with clock.stage("encode"):  # a chunk encoded when the search asks for it
            fake.now += 0.5
            with clock.stage("read"):
                fake.now += 0.25
        fake.now += 1.0
    with clock.stage("decide"):
        fake.now += 4.0
        clock.book({"candidates": 3.0, "model": 0.5, "decide": 0.2})
    assert clock.seconds == {"encode": 1.5, "candidates": 6.0, "read": 0.25, "decide": 0.5,
                             "model": 0.5}
    assert sum(clock.seconds.values()) == fake.now
    assert clock.rounded()["compare"] == 0.0


@pytest.mark.parametrize(("options", "steps"), [
    ({"on": "x,y", "metric": "euclidean"}, {"candidates", "decide"}),
    ({"fields": [{"on": ["name"], "metric": "levenshtein"}]}, {"candidates", "decide"}),
    ({"fields": [{"on": ["name"]}, {"on": ["x"]}], "model": "fellegi-sunter", "sigma": 0.5},
     {"candidates", "model"})], ids=["identifier", "fields", "model"])
def test_the_coordinator_times_its_own_steps_and_they_go_to_their_stages(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, options: dict[str, Any],
        steps: set[str]) -> None:
    from vflink.runner.link.pipeline import run_link

    p, s = _tables(tmp_path)
    booked: list[dict[str, float]] = []
    real = Clock.book

    def book(self: Clock, seconds: dict[str, float]) -> None:
        booked.append(dict(seconds))
        real(self, seconds)

    monkeypatch.setattr(Clock, "book", book)
    ctx = run_link(LinkSettings.from_options(top_k=2, seed=0, **options), p, s)
    assert ctx.parties is not None
    measured = ctx.parties.seconds()
    assert set(measured) == steps and all(v > 0 for v in measured.values())
    assert booked == [measured]  # the decide stage booked them, once


@pytest.mark.parametrize("on", [{"on": "x,y", "metric": "euclidean"},
                                {"fields": [{"on": "name", "metric": "levenshtein"},
                                            {"on": "x", "metric": "euclidean"}]}],
                         ids=["identifiers", "fields"])
def test_a_links_arrays_go_with_its_result_not_at_the_next_collection(
        tmp_path: Path, on: dict[str, Any]) -> None:
    import gc
    import weakref

    p, s = _tables(tmp_path)
    links = vflink.link(p, s, top_k=3, privacy="off", **on)
    held = [weakref.ref(a) for a in (links.outcome.linkage.distances,
                                     links.outcome.linkage.indices,
                                     links.outcome.alignment.secondary_index)]
    gc.disable()
    try:
        del links
        # no reference cycle keeps them: the in-process parties (the hub forgets them when
        # the link ends, a party's session table calls it back through a weak reference)
        assert [w() for w in held] == [None, None, None]
    finally:
        gc.enable()
