"""The charts stage: the figures beside the links file, when asked for, never before it.

``CHARTS``:

* ``figures`` (``charts=True``, ``--charts``): the sorted-similarity curve of FedSim Figure 4
  (``<out>.similarity.png``, a soft link of K > 1; a streamed link draws it from the rows the
  in-memory plot samples) and, for a model link, its charts (``<out>.model.png``: the
  match-weight histogram, the threshold chart, one pair's waterfall); drawn beside the write
  for a link held in memory (:func:`~vflink.runner.link.pipeline.run_link`);
* ``none`` (the default): no figure, and matplotlib is not imported.
"""

from __future__ import annotations

from pathlib import Path

from vflink.registry import Registry
from vflink.runner.link.context import LinkContext, Stage

__all__ = ["CHARTS", "link_outputs"]

CHARTS: Registry[Stage] = Registry("link charts")


def link_outputs(out: Path) -> tuple[Path, Path, Path, Path]:
    """The links file, its summary, its similarity curve and a model link's charts."""
    return (out, out.with_name(out.name + ".summary.json"),
            out.with_name(out.name + ".similarity.png"), out.with_name(out.name + ".model.png"))


@CHARTS.register("figures")
def figures(ctx: LinkContext) -> LinkContext:
    s, shown = ctx.settings, ctx.shown
    if s.out is None or shown is None:
        return ctx
    _, _, curve, model = link_outputs(s.out)
    drawn = []
    if s.mode == "soft" and s.top_k > 1:
        from vflink.linkage.improvement import plot_similarity_curve

        drawn.append(plot_similarity_curve(shown, curve, delta=ctx.improvement.get("avgsim")))
    if ctx.linkage is not None and ctx.linkage.model:
        from vflink.reporting.plots import plot_link_model

        plot_link_model(ctx.linkage.model, model)
        drawn.append(model)
    ctx.state["charts"] = drawn
    return ctx


@CHARTS.register("none")
def no_charts(ctx: LinkContext) -> LinkContext:
    """No figure; an earlier link's figures beside an ``out`` replaced are removed, so that
    none describes other links."""
    s = ctx.settings
    if s.out is not None and s.overwrite:
        for path in link_outputs(s.out)[2:]:
            path.unlink(missing_ok=True)
    return ctx
