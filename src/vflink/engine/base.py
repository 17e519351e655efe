"""The engine interface, its configuration (``[compute]``) and the factory."""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from vflink._checks import check_choice, check_int, from_table, raise_if

__all__ = ["ENGINES", "ComputeConfig", "Engine", "chunk_bounds"]

R = TypeVar("R")

#: The engines by name (``[compute] engine``, ``--engine``).
ENGINES = ("local", "ray")
#: Rows per task when ``chunk_rows`` is not set: the order of secretflow/psi's and FATE's
#: buckets (about 10^6 rows) divided by ten, so that 10^6-row inputs still make enough tasks to
#: keep a few workers busy.
DEFAULT_CHUNK_ROWS = 100_000


@dataclass(frozen=True, kw_only=True)
class ComputeConfig:
    """Where a party's chunked stages run (``[compute]`` in a party or run file).

    Attributes:
        engine: ``"local"`` (default; the current process, no Ray) or ``"ray"``.
        address: the Ray cluster: ``"local"`` starts one of its own on this machine, never
            joining one that runs there (default for ``engine = "ray"``), ``"auto"`` joins the
            one ``ray start`` runs here, ``host:port`` joins that cluster's GCS. Stays inside
            this party: never sent to a peer.
        num_cpus: CPUs of a cluster started with ``address = "local"`` (default: all), and the
            workers a local engine's thread pool uses (default: 1, the calling thread).
        chunk_rows: rows per task (bounds a task's memory); at most this many, fewer where
            that is needed to give every worker several tasks.
        max_retries: how often the engine retries a task whose worker died (Ray's own
            ``max_retries``); a retried task gives the same result.
    """

    engine: str = "local"
    address: str | None = None
    num_cpus: int | None = None
    chunk_rows: int = DEFAULT_CHUNK_ROWS
    max_retries: int = 3

    def __post_init__(self) -> None:
        problems: list[str] = []
        check_choice(problems, "compute.engine", self.engine, ENGINES)
        if self.address is not None and (not isinstance(self.address, str)
                                         or not self.address.strip()):
            problems.append(f"`compute.address` must be \"local\", \"auto\" or host:port, got "
                            f"{self.address!r}")
        if self.address is not None and self.engine == "local":
            problems.append("`compute.address` is a Ray cluster's address: it needs "
                            "`compute.engine = \"ray\"`")
        if self.num_cpus is not None:
            check_int(problems, "compute.num_cpus", self.num_cpus, min=1)
        check_int(problems, "compute.chunk_rows", self.chunk_rows, min=1)
        check_int(problems, "compute.max_retries", self.max_retries, min=0)
        raise_if(problems, "[compute] section")

    @classmethod
    def from_dict(cls, raw: Any, where: str = "[compute]") -> ComputeConfig:
        """From a TOML table, every problem (unknown keys included) reported at once."""
        return from_table(cls, raw, where)

    def override(self, *, engine: str | None = None, address: str | None = None
                 ) -> ComputeConfig:
        """This configuration with a command line's ``--engine`` / ``--address`` applied."""
        changes: dict[str, Any] = {}
        if engine is not None:
            changes["engine"] = engine
            if engine == "local":
                changes["address"] = None
        if address is not None:
            changes["address"] = address
            changes.setdefault("engine", "ray")
        return dataclasses.replace(self, **changes) if changes else self

    @property
    def resolved_address(self) -> str:
        return self.address or "local"

    def summary(self) -> dict[str, Any]:
        """What a run directory records: the engine and chunking, never the address (a
        party's cluster is its own; its address is not written where a peer could read it)."""
        return {"engine": self.engine, "chunk_rows": self.chunk_rows}


def chunk_bounds(n: int, chunk_rows: int, workers: int, *, min_rows: int = 1
                 ) -> list[tuple[int, int]]:
    """``[start, stop)`` ranges covering ``range(n)``: at most ``chunk_rows`` rows each, and
    small enough that every worker gets about four tasks (load balance, regular progress), but
    not below ``min_rows`` (a task has a fixed cost)."""
    if n <= 0:
        return []
    size = min(chunk_rows, max(min_rows, -(-n // (4 * max(1, workers)))))
    size = max(1, size)
    return [(i, min(n, i + size)) for i in range(0, n, size)]


class Engine(ABC):
    """Runs ``fn(shared, item)`` for many items; results come back in the items' order."""

    name: str = "engine"

    def __init__(self, config: ComputeConfig) -> None:
        self.config = config

    @property
    @abstractmethod
    def workers(self) -> int:
        """How many tasks can run at once."""

    @abstractmethod
    def map(self, fn: Callable[[Any, Any], R], items: Sequence[Any], *, shared: Any = None,
            progress: Callable[[int], None] | None = None) -> list[R]:
        """``[fn(shared, item) for item in items]``, possibly in parallel; ``progress(1)`` after
        each finished item. ``fn`` must be a module-level function (Ray pickles it)."""

    @property
    def chunk_rows(self) -> int:
        return self.config.chunk_rows

    @property
    def parallel(self) -> bool:
        """Whether mapping through this engine can use more than the calling thread; a party
        hands its algorithms the engine only then, so the local engine keeps today's paths."""
        return False

    def close(self) -> None:  # noqa: B027 - most engines hold nothing to release
        """Release what the engine started (a local Ray cluster, a thread pool)."""

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
