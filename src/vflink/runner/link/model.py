"""The model stage: what scores a candidate pair beyond its distance.

``MODELS``:

* ``none``: the distance itself (FedSim's soft linkage: the top-K by similarity);
* ``fellegi-sunter``: a Fellegi–Sunter model the coordinator trains without labels on the
  encodings it holds (m by EM, u from random pairs, term-frequency adjusted;
  :mod:`vflink.linkage.scoring`, :mod:`vflink.linkage.fellegi_sunter`), whose match weights
  and probabilities the decide stage decides on.
"""

from __future__ import annotations

from vflink.registry import Registry
from vflink.runner.link.context import LinkContext, Stage

__all__ = ["MODELS"]

MODELS: Registry[Stage] = Registry("link model")


@MODELS.register("none")
def none(ctx: LinkContext) -> LinkContext:
    return ctx


@MODELS.register("fellegi-sunter")
def fellegi_sunter(ctx: LinkContext) -> LinkContext:
    ctx.request["model"] = "fellegi-sunter"
    return ctx
