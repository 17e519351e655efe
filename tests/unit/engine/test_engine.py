"""The engine interface without Ray: config, the local engine, the factory (issue 22)."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

from vflink.engine import ComputeConfig, LocalEngine, chunk_bounds, get_engine
from vflink.errors import ConfigError


def _add(shared: int, item: int) -> int:
    return shared + item


def _thread(shared: None, item: int) -> str:
    return threading.current_thread().name


def test_config_reports_every_problem_at_once() -> None:
    with pytest.raises(ConfigError) as err:
        ComputeConfig(engine="spark", num_cpus=0, chunk_rows=0, max_retries=-1)  # type: ignore[arg-type]
    text = "\n".join(err.value.problems)
    for name in ("compute.engine", "compute.num_cpus", "compute.chunk_rows",
                 "compute.max_retries"):
        assert name in text
    assert len(err.value.problems) == 4


def test_address_needs_ray_and_from_dict_names_unknown_keys() -> None:
    with pytest.raises(ConfigError, match="needs `compute.engine = \"ray\"`"):
        ComputeConfig(address="10.0.0.1:6379")
    with pytest.raises(ConfigError) as err:
        ComputeConfig.from_dict({"engine": "ray", "workers": 4, "chunk_rows": "big"})
    assert any("unknown key(s) ['workers']" in p for p in err.value.problems)
    assert any("compute.chunk_rows" in p for p in err.value.problems)
    assert ComputeConfig.from_dict({"engine": "ray", "address": "local"}).engine == "ray"


def test_flags_override_the_file() -> None:
    base = ComputeConfig(engine="ray", address="127.0.0.1:6379", chunk_rows=10)
    assert base.override(engine="local") == ComputeConfig(chunk_rows=10)
    assert ComputeConfig().override(address="local") == ComputeConfig(engine="ray",
                                                                       address="local")
    assert base.override() is base
    assert "address" not in base.summary()  # a party's cluster is not written for peers


def test_local_engine_maps_in_order_with_shared_and_progress() -> None:
    done: list[int] = []
    with LocalEngine() as engine:
        assert not engine.parallel and engine.workers == 1
        assert engine.map(_add, [1, 2, 3], shared=10, progress=done.append) == [11, 12, 13]
    assert done == [1, 1, 1]
    with LocalEngine(ComputeConfig(num_cpus=2)) as engine:
        assert engine.parallel
        assert engine.map(_add, list(range(50)), shared=1) == list(range(1, 51))
        names = set(engine.map(_thread, list(range(20))))
        assert all(n.startswith("vflink-engine") for n in names)


def test_chunk_bounds_cover_every_row_once() -> None:
    for n, rows, workers in ((0, 5, 1), (1, 5, 1), (10, 3, 1), (1000, 100, 2), (7, 100, 4)):
        bounds = chunk_bounds(n, rows, workers)
        covered = [i for a, b in bounds for i in range(a, b)]
        assert covered == list(range(n))
        assert all(b - a <= rows for a, b in bounds)
    assert len(chunk_bounds(1000, 10**6, 2)) == 8  # four tasks per worker


def test_local_engine_imports_no_ray() -> None:
    code = ("import sys; from vflink.engine import get_engine; e = get_engine(); "
            "e.map(lambda s, x: x, [1]); import vflink.runner.train, vflink.cli.main; "
            "print('ray' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"


def test_ray_engine_without_ray_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(ConfigError, match=r"pip install 'vflink\[ray\]'"):
        get_engine(ComputeConfig(engine="ray"))


def test_ray_engine_refuses_a_malformed_address() -> None:
    pytest.importorskip("ray", reason="needs the ray extra")
    from vflink.engine.rayengine import probe_address

    with pytest.raises(ConfigError, match="host:port"):
        probe_address("nowhere")
