"""The compute engine: where a party's heavy, chunked stages run (docs/how-to/scale-out.md).

One small interface, :class:`Engine` (``map(fn, items, shared=...)``), with two
implementations:

- ``local`` (:class:`LocalEngine`, the default): the calling process. A party with the local
  engine runs exactly today's code paths (the algorithms' own thread pools); nothing imports
  Ray.
- ``ray`` (:class:`RayEngine`, ``pip install 'vflink[ray]'``): tasks on a Ray cluster that
  belongs to this party alone, started by ``ray.init(address=...)``; ``"local"`` starts one on
  this machine. Ray imports lazily, on first use.

Pure algorithms expose chunk-level functions (search a primary chunk against a secondary
partition, exponentiate a bucket of group elements, encode a chunk of rows) and take a
:class:`vflink.types.Compute`; the engine maps them. A party's cluster (its address, nodes,
object store) never appears in a message or the ledger: everything that crosses parties still
goes over vflink's transport. The engine sits below ``parties/`` and beside ``transport/``.
"""

from __future__ import annotations

from vflink.engine.base import ENGINES, ComputeConfig, Engine, chunk_bounds
from vflink.engine.factory import get_engine
from vflink.engine.local import LocalEngine
from vflink.engine.rayengine import RayEngine

__all__ = ["ENGINES", "ComputeConfig", "Engine", "LocalEngine", "RayEngine", "chunk_bounds",
           "get_engine"]
