"""The local engine: the calling process (the default; no Ray)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from vflink.engine.base import ComputeConfig, Engine

__all__ = ["LocalEngine"]

R = TypeVar("R")


class LocalEngine(Engine):
    """Maps in the calling thread, or in ``num_cpus`` threads when that is set above 1.

    Threads only help where a chunk function releases the GIL (faiss, rapidfuzz, libsodium
    through rbcl all do); the algorithms already use their own pools there, so by default a
    party on the local engine is handed no engine at all and runs today's code unchanged
    (:attr:`parallel` is false).
    """

    name = "local"

    def __init__(self, config: ComputeConfig | None = None) -> None:
        super().__init__(config or ComputeConfig())
        self._threads = self.config.num_cpus or 1
        self._pool: ThreadPoolExecutor | None = None

    @property
    def workers(self) -> int:
        return self._threads

    @property
    def parallel(self) -> bool:
        return self._threads > 1

    def map(self, fn: Callable[[Any, Any], R], items: Sequence[Any], *, shared: Any = None,
            progress: Callable[[int], None] | None = None) -> list[R]:
        out: list[R] = []
        if self._threads <= 1 or len(items) <= 1:
            for item in items:
                out.append(fn(shared, item))
                if progress is not None:
                    progress(1)
            return out
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self._threads, thread_name_prefix="vflink-engine")
        for result in self._pool.map(lambda item: fn(shared, item), items):
            out.append(result)
            if progress is not None:
                progress(1)
        return out

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
