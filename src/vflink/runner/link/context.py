"""What the stages of a link hand each other: :class:`LinkContext`, its two :class:`Side` s and
the :class:`Clock` that times each stage. No stage logic here.

Every stage has one signature, ``stage(ctx: LinkContext) -> LinkContext`` (:class:`Stage`);
:mod:`vflink.runner.link.pipeline` chooses them and runs them in order.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import numpy.typing as npt
    import pandas as pd
    import pyarrow as pa

    from vflink.linkage import SoftLinkage
    from vflink.linkage.fields import FieldSpec
    from vflink.protocol import EncodingSpec
    from vflink.runner.link.batches import Batches
    from vflink.runner.link.outcome import LinkOutcome
    from vflink.runner.link.parties import LocalParties
    from vflink.runner.link.settings import LinkSettings
    from vflink.transport import Transcript
    from vflink.types import Alignment, Compute

__all__ = ["STAGES", "Clock", "LinkContext", "Side", "Stage"]

#: The stages of every link, in order; ``charts`` draws the figures beside the links file.
STAGES = ("read", "encode", "candidates", "compare", "model", "decide", "write", "charts")


class Stage(Protocol):
    def __call__(self, ctx: LinkContext) -> LinkContext: ...


class Clock:
    """Seconds per stage, each second counted once, for the one it belongs to.

    The pipeline runs each stage inside :meth:`stage`. Work a stage hands on lazily (the
    streamed reader's batches, the encodings of the primary's chunks, the links the decide
    stage makes as the write stage asks for them) runs inside a :meth:`stage` of its own
    (``with clock.stage("encode"): ...`` in the generator that makes it), so its seconds go to
    the stage that made it and are taken off the stage that consumed it; :meth:`book` moves
    seconds another party measured (the coordinator's own steps) from the running stage to
    theirs. (No wrapper between the consumer and the generator: a stage's path never passes
    back through this module.)
    """

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._running: list[list[Any]] = []  # [stage, since], innermost last

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        now = time.perf_counter()
        if self._running:
            outer = self._running[-1]
            self.seconds[outer[0]] += now - outer[1]
        self.seconds.setdefault(name, 0.0)
        self._running.append([name, now])
        try:
            yield
        finally:
            now = time.perf_counter()
            inner, since = self._running.pop()
            self.seconds[inner] += now - since
            if self._running:
                self._running[-1][1] = now

    def book(self, seconds: Mapping[str, float]) -> None:
        """Count ``seconds[stage]`` for each stage named, taken off the running stage."""
        if not self._running:
            return
        running = self._running[-1][0]
        for name, value in seconds.items():
            if name != running:
                self.seconds[name] = self.seconds.get(name, 0.0) + value
                self.seconds[running] -= value

    def rounded(self, names: Iterable[str] = STAGES) -> dict[str, float]:
        return {name: round(max(0.0, self.seconds.get(name, 0.0)), 3) for name in names}


@dataclass
class Side:
    """One data party's table, as given (``table``: a DataFrame or a path) and as the read
    stage leaves it: the whole ``frame`` (a pyarrow Table where the link needs only numeric
    identifier columns of a Parquet file: :func:`vflink.data.table.read_numeric_parquet`) or
    the ``batches`` of a streamed reader, the name errors call it by (``source``), its record
    ids, and the rows it links (``keep``: all but the records with an empty identifier under
    ``empty = "skip"``)."""

    party: str
    table: Any
    source: str = ""
    frame: pd.DataFrame | pa.Table | None = None
    batches: Batches | None = None
    ids: npt.NDArray[Any] | None = None
    keep: npt.NDArray[Any] | None = None
    rows: int = 0


@dataclass
class LinkContext:
    """What a link's stages hand each other: the settings and the two tables, then each
    stage's output. ``request`` gathers what the candidates, compare, model and decide stages
    ask of the coordinator when the roles are parties (one request, as a deployed coordinator
    receives it); ``state`` holds a streamed link's own hand-offs (scratch files, sums)."""

    settings: LinkSettings
    primary: Side
    secondary: Side
    compute: Compute | None = None
    transcript: Transcript | None = None
    secret: bytes | None = None
    #: the registry entry chosen for each stage (``pipeline.build``)
    choices: dict[str, str] = field(default_factory=dict)
    clock: Clock = field(default_factory=Clock)
    #: closed when the link ends, whatever happens: scratch directories
    cleanup: ExitStack = field(default_factory=ExitStack)
    # encode
    kind: str = ""
    encodings: tuple[EncodingSpec, ...] = ()
    fields: tuple[FieldSpec, ...] = ()
    search_metric: str = ""
    encoder: str = ""
    secret_source: str = ""
    parties: LocalParties | None = None
    # candidates, compare, model, decide
    request: dict[str, Any] = field(default_factory=dict)
    fields_compared: list[str] = field(default_factory=list)
    state: dict[str, Any] = field(default_factory=dict)
    # decide: the coordinator's linkage, the primary's alignment and the links' columns
    linkage: SoftLinkage | None = None
    alignment: Alignment | None = None
    sizes: dict[str, int] = field(default_factory=dict)
    improvement: dict[str, float] = field(default_factory=dict)
    #: the linkage whose Δ (FedSim §4.3) is still to be estimated, beside the write
    #: (:func:`estimate_improvement`)
    improvement_of: SoftLinkage | None = None
    communication: dict[str, dict[str, int]] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=lambda: {"primary": 0, "secondary": 0})
    #: the links' columns when held in memory (a :class:`~.outcome.LinkColumns`)
    columns: Mapping[str, npt.NDArray[Any]] = field(default_factory=dict)
    chunks: Iterable[Mapping[str, npt.NDArray[Any]]] = ()
    rows: int = 0
    #: the linkage whose sorted similarities the charts draw (FedSim Figure 4)
    shown: SoftLinkage | None = None
    # after the stages
    outcome: LinkOutcome | None = None
    summary: dict[str, Any] = field(default_factory=dict)

    @property
    def streamed(self) -> bool:
        return self.choices.get("read") == "batches"


def estimate_improvement(ctx: LinkContext) -> LinkContext:
    """Δ of FedSim §4.3 (``improvement``) for the linkage the decide stage left to estimate
    (``improvement_of``); nothing where there is none. The summary's figure only, so the
    pipeline computes it beside the write, whose threads leave part of a core idle (at FedSim's
    house scale 0.02 s of the link's critical path), and before the charts that show it."""
    if ctx.improvement_of is not None:
        from vflink.linkage.improvement import improvement_estimates

        ctx.improvement = improvement_estimates(ctx.improvement_of)
        ctx.improvement_of = None
    return ctx
