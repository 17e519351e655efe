"""A party's own training resources: its device and where its encoded features live.

In a party file these are the ``[training]`` table; in a run file the same keys sit in the
run's ``[training]`` section and apply to the parties the run builds in its own process. They
are the party's business only: nothing of them is sent to a peer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vflink._checks import check_choice, from_table, raise_if
from vflink.data.featurestore import FEATURE_STORES
from vflink.models.device import DEFAULT_DEVICE, DEVICES

__all__ = ["TrainingResources"]


@dataclass(frozen=True, kw_only=True)
class TrainingResources:
    """Where a party trains (``[training]`` in a party file).

    Attributes:
        device: ``"cpu"`` (default), ``"cuda"`` or ``"auto"`` (CUDA where
            ``torch.cuda.is_available()``, else the CPU): where this party's own models and
            tensors live. What crosses to a peer stays CPU numpy as always.
        feature_store: ``"auto"`` (default: a table of at least 10^6 rows is read per batch
            from a memory-mapped Arrow copy of its encoded features, a smaller one is held in
            memory), ``"memory"`` or ``"mmap"``. Results are identical either way. A
            secondary whose features are mapped also reads its table file in record batches,
            never whole (:func:`vflink.data.streamed.open_table`).
    """

    device: str = DEFAULT_DEVICE
    feature_store: str = "auto"

    def __post_init__(self) -> None:
        problems: list[str] = []
        check_choice(problems, "training.device", self.device, DEVICES)
        check_choice(problems, "training.feature_store", self.feature_store, FEATURE_STORES)
        raise_if(problems, "[training] section")

    @classmethod
    def from_dict(cls, raw: Any, where: str = "[training]") -> TrainingResources:
        """From a party file's TOML table, every problem (unknown keys included) at once."""
        return from_table(cls, raw, where)
