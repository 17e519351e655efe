"""The ray engine on a two-node loopback cluster: tasks, retries, errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.helpers.ray_tasks import die_once, node_of
from tests.raycluster.conftest import RAY_REASON
from vflink.engine import ComputeConfig, RayEngine, get_engine
from vflink.errors import LinkageError, TransportError

pytest.importorskip("ray", reason=RAY_REASON)
pytestmark = [pytest.mark.ray, pytest.mark.timeout(240)]


def test_map_keeps_order_and_uses_both_nodes(ray_cluster: str) -> None:
    engine = get_engine(ComputeConfig(engine="ray", address=ray_cluster))
    assert isinstance(engine, RayEngine) and engine.workers == 2
    seen: list[int] = []
    out = engine.map(node_of, list(range(40)), shared=1000, progress=seen.append)
    assert [v for v, _ in out] == [1000 + i for i in range(40)]
    assert len(seen) == 40
    assert len({node for _, node in out}) == 2  # tasks ran on both nodes
    engine.close()  # the cluster was joined, not started: it keeps running
    import ray
    assert ray.is_initialized()


def test_a_lost_worker_is_retried(ray_cluster: str, tmp_path: Path) -> None:
    engine = RayEngine(ComputeConfig(engine="ray", address=ray_cluster, max_retries=2))
    assert engine.map(die_once, list(range(6)), shared=str(tmp_path)) == [
        i * i for i in range(6)]
    assert (tmp_path / "3").exists()  # it did die once


def test_no_retries_is_a_clear_error(ray_cluster: str, tmp_path: Path) -> None:
    engine = RayEngine(ComputeConfig(engine="ray", address=ray_cluster, max_retries=0))
    with pytest.raises(TransportError, match="lost a task"):
        engine.map(die_once, [3], shared=str(tmp_path))


def test_unreachable_address_names_it() -> None:
    import socket

    from vflink.engine.rayengine import probe_address

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: refused
        with pytest.raises(TransportError, match=f"127.0.0.1:{port}"):
            probe_address(f"127.0.0.1:{port}", timeout_s=2)


def test_worker_errors_come_back_as_themselves(ray_cluster: str) -> None:
    from vflink.linkage.chunked import search_chunk
    from vflink.linkage.search import SearchOptions

    engine = RayEngine(ComputeConfig(engine="ray", address=ray_cluster))
    with pytest.raises(LinkageError, match="top_k"):  # raised in the worker
        engine.map(search_chunk, [(0, 1, 0, 1)],
                   shared=("euclidean", np.zeros((1, 2)), np.zeros((1, 2)), 0, SearchOptions()))
