"""The encoder contract and the registry of encoders by name (ARCHITECTURE.md, convention 5).

An encoder turns one party's raw identifier column(s) into what the search compares: float
vectors (``"raw"``), normalised strings (``"string"``) or packed Bloom filters (``"bloom"``).
Both parties must build their encoder from the same parameters (fit statistics, normalisation,
Bloom secret), so parameters are passed in explicitly rather than learnt from one side's data.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import numpy as np

from vflink.registry import Registry
from vflink.types import Compute

__all__ = ["ENCODERS", "Encoder", "encode_chunk", "encode_chunked", "make_encoder"]

#: Fewest rows in an encoding task unless ``chunk_rows`` asks for fewer (below this, a task's
#: fixed cost dominates).
_MIN_CHUNK = 4096


@runtime_checkable
class Encoder(Protocol):
    """Encodes identifiers; ``metric`` names the distance its output is meant for."""

    @property
    def metric(self) -> str: ...

    def encode(self, values: Any) -> Any: ...


#: Encoder factories by name: ``"raw"``, ``"string"``, ``"bloom"``.
ENCODERS: Registry[Callable[..., Encoder]] = Registry("encoder")


def make_encoder(name: str, /, **params: Any) -> Encoder:
    """Build the encoder registered as ``name`` with keyword parameters ``params``."""
    return ENCODERS.get(name)(**params)


def encode_chunk(encoder: Encoder, values: Any) -> Any:
    """One engine task: ``encoder.encode`` of a chunk of rows (module-level: pickled)."""
    return encoder.encode(values)


def encode_chunked(encoder: Encoder, values: Any, compute: Compute | None) -> Any:
    """``encoder.encode(values)`` as a map over chunks of rows on ``compute``.

    Every encoder encodes each row on its own from parameters fixed beforehand (fit
    statistics, the Bloom secret, the numeric range), so the concatenated chunks equal one call
    over all rows. The encoder (with its secret) goes to the party's own workers only.
    ``compute=None`` or a small input: one call here."""
    n = len(values)
    if compute is None:
        return encoder.encode(values)
    size = min(compute.chunk_rows, max(_MIN_CHUNK, -(-n // (4 * max(1, compute.workers)))))
    if size >= n:
        return encoder.encode(values)
    chunks = [values[i:i + size] for i in range(0, n, size)]
    parts = compute.map(encode_chunk, chunks, shared=encoder)
    if all(isinstance(p, list) for p in parts):
        return [x for p in parts for x in p]
    return np.concatenate([np.asarray(p) for p in parts])
