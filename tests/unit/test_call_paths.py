"""Following ``config`` from the training entry point never re-enters a file it left.

A run's orchestration (the pipeline, its stages and registries, the run files, reporting and
experiments) calls down: ``train → pipeline → prepare / plans / loop → parties``. Each test
runs a tiny :func:`vflink.runner.train.run_training` under :func:`sys.setprofile` and, at every
call into an orchestration module, takes the stack of orchestration frames, collapses
consecutive frames of the same file, and fails if a file appears twice in it (A → B → A: a
call back up into a file the path had left). Frames of other packages (parties, models,
torch) are left out of that stack.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

import pytest

from vflink.runfiles.config import (
    AlignmentConfig,
    DataConfig,
    ModelConfig,
    RunConfig,
    TrainingConfig,
)
from vflink.runner.train import run_training

#: the orchestration packages: the path of a run's config must stay a tree through them
ORCHESTRATION = ("vflink.runner", "vflink.runfiles", "vflink.experiments", "vflink.reporting")


def _orchestration(frame: FrameType) -> bool:
    module = frame.f_globals.get("__name__", "")
    return isinstance(module, str) and any(
        module == p or module.startswith(p + ".") for p in ORCHESTRATION)


def _file_stack(frame: FrameType | None) -> list[tuple[str, str]]:
    """(file, function) of the orchestration frames from the outermost call inward, with
    consecutive frames of one file collapsed into the first; code generated at run time
    (dataclass ``__init__``: ``<string>``) is no file and is skipped."""
    frames: list[tuple[str, str]] = []
    while frame is not None:
        code = frame.f_code
        if _orchestration(frame) and not code.co_filename.startswith("<"):
            frames.append((code.co_filename, code.co_name))
        frame = frame.f_back
    frames.reverse()
    collapsed: list[tuple[str, str]] = []
    for file, function in frames:
        if not collapsed or collapsed[-1][0] != file:
            collapsed.append((file, function))
    return collapsed


def re_entries(run: Callable[[], Any]) -> list[str]:
    """Every distinct path (``file:function → ...``) of ``run`` that re-enters a file."""
    found: dict[tuple[str, ...], None] = {}

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        # the orchestration stack only grows by a call into an orchestration module
        if event != "call" or not _orchestration(frame):
            return
        stack = _file_stack(frame)
        files = [f for f, _ in stack]
        if len(files) != len(set(files)):
            short = tuple(f"{f.split('/src/')[-1]}:{fn}" for f, fn in stack)
            found.setdefault(short)

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return [" → ".join(path) for path in found]


def _exact_splitnn() -> RunConfig:
    return RunConfig(seed=0, algorithm="splitnn",
                     data=DataConfig(dataset="sklearn-small",
                                     options={"n_samples": 120, "sigma_cf": 0.1, "seed": 0}),
                     alignment=AlignmentConfig(method="exact"),
                     model=ModelConfig(hidden=(8,), cut_dim=4, top_hidden=(4,)),
                     training=TrainingConfig(epochs=1, patience=1, batch_size=32))


def _soft_fedsim() -> RunConfig:
    return _exact_splitnn().replace(algorithm="fedsim",
                                    alignment=AlignmentConfig(method="soft", top_k=3))


def _psu_florist() -> RunConfig:
    return RunConfig(seed=1, algorithm="florist",
                     data=DataConfig(dataset="kdd-protein", options={"max_rows": 300}),
                     alignment=AlignmentConfig(method="psu", alpha=0.3, beta=0.3),
                     model=ModelConfig(hidden=(8,), cut_dim=4, top_hidden=(4,)),
                     training=TrainingConfig(epochs=1, batch_size=64, split=(0.5, 0.2, 0.3)))


@pytest.mark.parametrize("config", [_exact_splitnn, _soft_fedsim, _psu_florist],
                         ids=["exact-splitnn", "soft-fedsim", "psu-florist"])
def test_the_path_of_a_run_never_re_enters_a_file(config: Callable[[], RunConfig],
                                                    tmp_path: Any) -> None:
    cfg = config()
    found = re_entries(lambda: run_training(cfg, tmp_path / "run"))
    assert not found, "re-entered a file it had left:\n" + "\n".join(found[:10])


def test_the_check_sees_a_call_back_up() -> None:
    """The oracle: a stage module calling back into the module that called it is reported,
    and a stage that only calls down is not."""
    import vflink.runner.pipeline as pipeline

    # a stage in a (made-up) orchestration module of its own
    source = ("def down(ctx):\n    return ctx\n\n"
              "def back_up(ctx):\n    return run_pipeline(ctx, (down,))\n")
    stage_module: dict[str, Any] = {"__name__": "vflink.runner.planted",
                                    "run_pipeline": pipeline.run_pipeline}
    exec(compile(source, "/x/src/vflink/runner/planted.py", "exec"), stage_module)
    ctx: Any = object()
    assert re_entries(lambda: pipeline.run_pipeline(ctx, (stage_module["down"],))) == []
    found = re_entries(lambda: pipeline.run_pipeline(ctx, (stage_module["back_up"],)))
    assert found[0] == ("vflink/runner/pipeline.py:run_pipeline → vflink/runner/planted.py:"
                        "back_up → vflink/runner/pipeline.py:run_pipeline")


# --- the link pipeline -----------------------------------------------------------------------


def _link_tables(tmp_path: Any) -> tuple[Any, Any]:
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(0)
    names = ["anna", "bert", "carla", "dirk", "emma", "femke", "gijs", "hugo"]

    def table(n: int) -> pd.DataFrame:
        return pd.DataFrame({"x": rng.normal(size=n), "y": rng.normal(size=n),
                             "given": [names[i % 8] for i in range(n)],
                             "surname": [f"smith{i % 13}" for i in range(n)]})

    p, s = tmp_path / "p.csv", tmp_path / "s.csv"
    table(60).to_csv(p, index=False)
    table(40).to_csv(s, index=False)
    return p, s


LINKS = {
    "identifier": {"on": "x,y", "metric": "euclidean", "top_k": 3},
    "model": {"fields": [{"on": ["given"]}, {"on": ["surname"]}], "top_k": 2,
              "model": "fellegi-sunter", "blocking": ["surname"], "one_to_one": True,
              "sigma": 0.5},
    "streamed": {"on": "x,y", "metric": "euclidean", "top_k": 3, "stream": True,
                 "chunk_rows": 16},
}


@pytest.mark.parametrize("kind", sorted(LINKS))
def test_the_path_of_a_link_never_re_enters_a_file(kind: str, tmp_path: Any) -> None:
    """``vflink.link`` (what ``vflink link`` and a [link] file run) goes api → pipeline →
    each stage → parties or the linkage package, and never back: a streamed link's lazy
    work (the primary's encodings, the links the write stage takes) included."""
    import vflink

    p, s = _link_tables(tmp_path)
    found = re_entries(lambda: vflink.link(p, s, out=tmp_path / "links.parquet", seed=0,
                                           **LINKS[kind]))
    assert not found, "re-entered a file it had left:\n" + "\n".join(found[:10])
    summary = vflink.link(p, s, out=tmp_path / "again.parquet", seed=0, **LINKS[kind]).summary
    assert list(summary["stage_seconds"]) == ["read", "encode", "candidates", "compare",
                                              "model", "decide", "write", "charts"]
