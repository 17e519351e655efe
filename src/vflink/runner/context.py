"""What the stages of a run hand each other: :class:`Prepared` (the aligned inputs).

Plain data built by the alignment stage and read by the training plans; no stage logic here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from vflink.runfiles.inputs import Inputs
from vflink.runner.federation import Federation
from vflink.types import Alignment

__all__ = ["Prepared"]


@dataclass(frozen=True)
class Prepared:
    """Inputs plus the alignments each kind of algorithm consumes.

    ``alignments[kind][secondary]`` with kind ``"base"`` (top-1 of the configured alignment),
    ``"top1"``, ``"topk"`` or ``"exact"``; ``sessions[kind]`` names the coordinator session a
    secondary fetches its view of that alignment from; ``rows`` are the primary rows every
    algorithm trains and is evaluated on, so their metrics are comparable.
    """

    inputs: Inputs
    alignments: dict[str, dict[str, Alignment]]
    sessions: dict[str, str]
    rows: npt.NDArray[np.int64]
    communication: dict[str, dict[str, int]]
    federation: Federation | None = None
    summary: dict[str, Any] = field(default_factory=dict)
