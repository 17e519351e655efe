"""The compare stage: how a candidate pair is compared, and Eq. 1's normalisation.

``COMPARISONS``:

* ``distance``: one identifier's distance by the search metric; the coordinator normalises
  the top-K distances with Eq. 1 (μ0, σ0 over every computed distance);
* ``fields``: each field's comparison (:func:`vflink.runner.encoding.link_fields`: the Dice
  distance of keyed Bloom filters, or the field's own metric on raw values with privacy off),
  its weight and, for a model link, its agreement levels and term frequencies; the summary
  says what each field was really compared with;
* ``moments``: the streamed link's Eq. 1: μ0 from the exact sum of every distance, then σ0 from
  a second pass over the spilled top-K (the in-memory link's very bits,
  :mod:`vflink.linkage.moments`).
"""

from __future__ import annotations

import math

import numpy as np

from vflink.linkage.moments import ExactSum, squares_total
from vflink.registry import Registry
from vflink.runner.encoding import compared_as, link_fields
from vflink.runner.link.context import LinkContext, Stage

__all__ = ["COMPARISONS"]

COMPARISONS: Registry[Stage] = Registry("link comparison")


@COMPARISONS.register("distance")
def distance(ctx: LinkContext) -> LinkContext:
    """The coordinator compares the encodings with the search metric (``candidates``)."""
    return ctx


@COMPARISONS.register("fields")
def fields(ctx: LinkContext) -> LinkContext:
    plan = link_fields(ctx.fields, ctx.encodings)
    ctx.request["fields"] = tuple(f.comparison for f in plan)
    ctx.fields_compared = compared_as(ctx.fields, ctx.encodings)
    return ctx


@COMPARISONS.register("moments")
def moments(ctx: LinkContext) -> LinkContext:
    total: ExactSum = ctx.state["total"]
    mean = total.mean()
    squares = ExactSum()
    for path in ctx.state["raw"]:
        with np.load(path) as r:
            part = squares_total(r["distances"], mean)
        squares.total += part.total
        squares.count += part.count
    ctx.state["scale"] = (-mean, math.sqrt(squares.mean()))
    ctx.state["moments"] = "exact"
    return ctx
