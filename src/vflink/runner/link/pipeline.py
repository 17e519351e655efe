"""A link as a pipeline of stages: read → encode → candidates → compare → model → decide →
write → charts, the same for ``vflink.link``, ``vflink link`` and a ``[link]`` run file.
(The charts, when asked for, are drawn beside the write, in a thread of their own, for a link
held in memory; after it for a streamed link.)

Every stage has one signature, ``stage(ctx: LinkContext) -> LinkContext``; :func:`build`
chooses each from its registry by the link's settings, before any stage runs (so an unknown
name, or a link that cannot be streamed when told to, fails first):

=============  ===================================  ===========================================
stage          registry                             entries
=============  ===================================  ===========================================
read           ``read.READERS``                     ``tables`` (whole), ``batches`` (streamed)
encode         ``encode.ENCODERS``                  ``identifier``, ``fields``, ``chunks``
candidates     ``candidates.CANDIDATES``            ``search``, ``fields``, ``chunks``
compare        ``compare.COMPARISONS``              ``distance``, ``fields``, ``moments``
model          ``model.MODELS``                     ``none``, ``fellegi-sunter``
decide         ``decide.DECISIONS``                 ``top-k``, ``matches``, ``chunks``
write          ``write.WRITERS``                    ``file``, ``stream``, ``none``
charts         ``charts.CHARTS``                    ``figures`` (``charts=True``), ``none``
=============  ===================================  ===========================================

A link held in memory runs as parties in this process (:mod:`.parties`): the data parties
encode, and the coordinator finds, compares, scores and decides on the primary's one request,
as a deployed coordinator would; a streamed link runs the same roles chunk by chunk (memory
flat in the tables' size) and writes the same file. Each stage's seconds (the coordinator's
own steps counted for theirs, a streamed stage's lazy work for the stage that made it) go to
the summary's ``stage_seconds``. Stage modules call down, never back up into this module.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vflink._files import atomic_write_json
from vflink._memory import small_pages
from vflink.errors import ConfigError
from vflink.registry import Registry
from vflink.runner.link.candidates import CANDIDATES
from vflink.runner.link.charts import CHARTS, link_outputs
from vflink.runner.link.compare import COMPARISONS
from vflink.runner.link.context import STAGES, LinkContext, Side, Stage, estimate_improvement
from vflink.runner.link.decide import DECISIONS
from vflink.runner.link.encode import ENCODERS
from vflink.runner.link.model import MODELS
from vflink.runner.link.outcome import LINK_COLUMNS, LinkOutcome, link_summary
from vflink.runner.link.read import READERS, streams
from vflink.runner.link.settings import LinkSettings
from vflink.runner.link.write import WRITERS
from vflink.transport import Transcript
from vflink.types import Compute

__all__ = ["REGISTRIES", "LinkPipeline", "build", "run_link"]

#: Each stage's registry
REGISTRIES: Mapping[str, Registry[Stage]] = {
    "read": READERS, "encode": ENCODERS, "candidates": CANDIDATES, "compare": COMPARISONS,
    "model": MODELS, "decide": DECISIONS, "write": WRITERS, "charts": CHARTS}


@dataclass(frozen=True)
class LinkPipeline:
    """What :func:`build` chose for a link: the registry entry of each stage, and the stages."""

    choices: Mapping[str, str]
    stages: tuple[tuple[str, Stage], ...]

    @property
    def streamed(self) -> bool:
        return self.choices["read"] == "batches"


def choose(settings: LinkSettings, *, streamed: bool) -> dict[str, str]:
    """The registry entry of each stage for ``settings``."""
    s = settings
    written = s.out is not None
    charts = "figures" if written and s.charts else "none"
    if streamed:
        return {"read": "batches", "encode": "chunks", "candidates": "chunks",
                "compare": "moments", "model": "none", "decide": "chunks", "write": "stream",
                "charts": charts}
    return {"read": "tables", "encode": s.kind,
            "candidates": "fields" if s.fields else "search",
            "compare": "fields" if s.fields else "distance",
            "model": s.model or "none", "decide": "matches" if s.model else "top-k",
            "write": "file" if written else "none", "charts": charts}


def build(settings: LinkSettings, tables: Sequence[Any]) -> LinkPipeline:
    """The stages of a link of ``settings`` between ``tables`` (primary, secondary): whether
    it is streamed (:func:`~vflink.runner.link.read.streams`, from the files' sizes unless
    the settings say), then each stage's entry. Existing outputs are refused here, before
    any work, unless ``overwrite``."""
    choices = choose(settings, streamed=streams(settings, tables))
    if settings.out is not None and not settings.overwrite:
        for path in link_outputs(settings.out):
            if path.exists():
                raise ConfigError(f"{path}: output already exists; choose another `out` "
                                  "or pass overwrite=True to replace it")
    return LinkPipeline(choices, tuple((stage, REGISTRIES[stage].get(choices[stage]))
                                       for stage in STAGES))


def run_link(settings: LinkSettings, primary: Any, secondary: Any, *,
             compute: Compute | None = None, transcript: Transcript | None = None,
             secret: bytes | None = None) -> LinkContext:
    """Link ``primary`` to ``secondary`` (DataFrames or table files) as ``settings`` say:
    build the pipeline, run its stages, and write the summary beside the links (when
    ``settings.out``). ``compute``: the engine of the chunked work (encodings, search);
    ``transcript``: records every message between the parties; ``secret``: the data
    parties' shared secret (default: $VFLINK_SECRET, see :mod:`vflink.runner.local`)."""
    pipeline = build(settings, (primary, secondary))
    ctx = LinkContext(settings=settings, primary=Side("primary", primary),
                      secondary=Side("secondary", secondary), compute=compute,
                      transcript=transcript, secret=secret, choices=dict(pipeline.choices))
    stages = dict(pipeline.stages)
    # A link held in memory has all its figures' data before the write: its charts are drawn
    # beside the write (a thread of their own; matplotlib draws on a bare Figure, no pyplot
    # state), never before it, after Δ, which the summary and the similarity curve show and
    # is estimated beside the write too. A streamed link's figures wait for its last chunk.
    beside = pipeline.choices["charts"] != "none" and not pipeline.streamed
    with ctx.cleanup, small_pages():
        for name, stage in pipeline.stages:
            if name == "charts" and beside:
                continue
            if name == "write" and (beside or ctx.improvement_of is not None):
                charts = stages["charts"] if beside else None
                with _Beside(estimate_improvement, charts, ctx) as done:
                    with ctx.clock.stage(name):
                        ctx = stage(ctx)
                if beside:
                    ctx.clock.seconds["charts"] = done.seconds
                continue
            with ctx.clock.stage(name):
                ctx = stage(ctx)
    return _finish(estimate_improvement(ctx))


class _Beside:
    """Run Δ's estimate, then a stage (the charts), in a thread of its own while the ``with``
    block runs; its error, if any, is raised at the block's end (after the block's own), and
    the stage's seconds are kept."""

    def __init__(self, first: Stage, stage: Stage | None, ctx: LinkContext) -> None:
        self.first, self.stage, self.ctx = first, stage, ctx
        self.seconds = 0.0
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="vflink-beside", daemon=True)

    def _run(self) -> None:
        try:
            self.first(self.ctx)
            start = time.perf_counter()
            try:
                if self.stage is not None:
                    self.stage(self.ctx)
            finally:
                self.seconds = time.perf_counter() - start
        except BaseException as exc:  # noqa: BLE001 - handed to the caller at the join
            self.error = exc

    def __enter__(self) -> _Beside:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.thread.join()
        if self.error is not None and exc[0] is None:
            raise self.error


def _finish(ctx: LinkContext) -> LinkContext:
    """The outcome and the summary of a link whose stages ran; the summary written beside
    the links."""
    s, clock = ctx.settings, ctx.clock
    if ctx.linkage is None or ctx.alignment is None:  # pragma: no cover - the decide stage's
        raise RuntimeError("the link produced no linkage")
    seconds = clock.rounded()
    linking = sum(clock.seconds.get(n, 0.0) for n in STAGES[1:6])
    if ctx.streamed:
        linking = sum(clock.seconds.values())
        phases = {"link": linking}
    else:
        phases = {"read": clock.seconds["read"], "link": linking}
        if s.out is not None:
            phases.update(write=clock.seconds["write"], figure=clock.seconds["charts"])
    ctx.outcome = LinkOutcome(
        linkage=ctx.linkage, alignment=ctx.alignment, seconds=linking, sizes=ctx.sizes,
        privacy=s.privacy if s.fields else "bloom" if ctx.encoder == "bloom" else "off",
        search_metric=ctx.search_metric,
        improvement=ctx.improvement, communication=ctx.communication, encoding=ctx.encoder,
        secret_source=ctx.secret_source, skipped_rows=ctx.skipped,
        fields_compared=ctx.fields_compared, reproducible_noise=s.seed is not None)
    columns = list(ctx.columns) if not ctx.streamed else [
        c for c in LINK_COLUMNS if s.view == "operator" or c != "distance"]
    ctx.summary = link_summary(ctx.outcome, columns=columns, view=s.view,
                               choices=ctx.choices, seconds=seconds, phases=phases)
    # the steps of FedSim §4.1 apart: the search, Eq. 1's moments (a streamed link's compare
    # stage), Eq. 2's noise (inside the coordinator's decide step; a streamed link draws it
    # chunk by chunk as its links are written, counted with its decide stage: None here)
    own = ctx.linkage.seconds
    steps = {"read": seconds["read"], "encode": seconds["encode"],
             "search": seconds["candidates"],
             "moments": seconds["compare"] if ctx.streamed else own.get("moments"),
             "noise": None if ctx.streamed else own.get("noise"),
             "write": seconds["write"], "charts": seconds["charts"]}
    ctx.summary["step_seconds"] = {k: None if v is None else round(v, 3)
                                   for k, v in steps.items()}
    if s.out is not None:
        drawn = ctx.state.get("charts", [])
        ctx.summary["charts"] = ([p.name for p in drawn] if drawn else
                                 "none drawn (charts=True / --charts draws them beside the links)")
        atomic_write_json(link_outputs(s.out)[1], ctx.summary, indent=2, default=str)
    return ctx

