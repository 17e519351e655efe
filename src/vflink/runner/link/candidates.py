"""The candidates stage: which secondary records each primary record is compared with.

``CANDIDATES``:

* ``search``: the coordinator's top-K search of one identifier's encodings (faiss for dense
  and binary vectors, string bounds for raw strings; exact, or a measured approximate search
  by the settings' ``search``, given to the coordinator as its own options);
* ``fields``: a multi-field link's: the pairs of the blocking rules (the keyed digests the
  data parties sent), or without rules each record's nearest by the field distance (a model
  link: every pair of a small link);
* ``chunks``: the streamed link's: each primary chunk searched against every secondary
  partition on the engine (a running exact top-K), the raw top-K spilled to the scratch
  directory and the distances summed exactly for Eq. 1 (:mod:`vflink.linkage.moments`).

In memory the coordinator finds the candidates on the primary's one request (the decide
stage sends it); these entries say what that request asks, and the seconds the coordinator
spent are counted here.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from vflink.errors import DataError
from vflink.linkage import SearchOptions
from vflink.linkage.moments import ExactSum
from vflink.linkage.streamed import search_chunk_against_parts
from vflink.registry import Registry
from vflink.runner.link.context import LinkContext, Stage

__all__ = ["CANDIDATES"]

CANDIDATES: Registry[Stage] = Registry("link candidates")


@CANDIDATES.register("search")
def search(ctx: LinkContext) -> LinkContext:
    """The K nearest by the metric the encodings are searched with (Hamming for Bloom
    filters)."""
    ctx.request.update(metric=ctx.search_metric, top_k=ctx.settings.top_k)
    return ctx


@CANDIDATES.register("fields")
def fields(ctx: LinkContext) -> LinkContext:
    """The pairs of the blocking rules (OR-ed), or each record's nearest without rules; a
    model link also says what each rule requires (which fields' whole values: public
    structure, no value), so that the coordinator can estimate what the rules miss."""
    ctx.request.update(top_k=ctx.settings.top_k, blocking=len(ctx.settings.blocking))
    if ctx.settings.model is not None and ctx.settings.blocking:
        ctx.request["rule_atoms"] = ctx.state.get("rule_atoms", ())
    return ctx


@CANDIDATES.register("chunks")
def chunks(ctx: LinkContext) -> LinkContext:
    s = ctx.settings
    n_secondary = ctx.secondary.rows
    if n_secondary < s.top_k:
        raise DataError(f"{ctx.secondary.source}: `top_k` = {s.top_k} is larger than the "
                        f"secondary table ({n_secondary} rows)")
    o = SearchOptions(mode=s.search)  # type: ignore[arg-type]
    compute = ctx.compute
    task_options = SearchOptions(mode="exact", dense_index=o.dense_index,
                                 chunk_size=o.chunk_size, threads=o.threads if compute is None
                                 or o.threads is not None else 1)
    shared = (ctx.search_metric, ctx.state["partitions"], s.top_k, task_options)
    window = 2 * (compute.workers if compute is not None else 1)
    scratch = ctx.state["scratch"]
    raw: list[Any] = []
    total = ExactSum()

    def flush(held: list[Any]) -> None:
        results = ([search_chunk_against_parts(shared, c) for c in held]
                   if compute is None else
                   compute.map(search_chunk_against_parts, held, shared=shared))
        for dist, idx in results:
            path = scratch / f"r-{len(raw):06d}.npz"
            np.savez(path, distances=dist, indices=idx)
            raw.append(path)
            total.add(dist)

    held: list[Any] = []
    n_primary = 0
    for enc in ctx.state["primary_chunks"]:
        held.append(enc)
        n_primary += len(enc)
        if len(held) >= window:
            flush(held)
            held = []
    if held:
        flush(held)
    if not raw:
        raise DataError(f"{ctx.primary.source}: the primary table is empty")
    ctx.primary.rows = n_primary
    ctx.state.update(raw=raw, total=total)
    return ctx
