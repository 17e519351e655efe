"""Task functions for the ray tests: in an importable module, since Ray workers import a
task's function by its module name (pytest imports test files under bare names)."""

from __future__ import annotations

import os
from pathlib import Path


def node_of(shared: int, item: int) -> tuple[int, str]:
    """``shared + item`` and the node that computed it. Each task holds its CPU a little, so
    that the scheduler spills tasks to the second node instead of running every one of them
    on the first before it could (seen in CI: all 40 quick tasks on the head node)."""
    import time

    import ray

    time.sleep(0.1)
    return shared + item, ray.get_runtime_context().get_node_id()


def die_once(marker: str, item: int) -> int:
    """Kills its worker the first time it sees item 3 (a lost worker), then answers."""
    path = Path(marker) / f"{item}"
    if item == 3 and not path.exists():
        path.write_text("died")
        os._exit(1)
    return item * item
