"""The engine interface without Ray: config, the local engine, the factory."""

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


class _FakeRay:
    """Stands in for the ``ray`` module: records ``init``'s arguments and raises the Ray
    errors a test plants (the real ones are tested on a cluster in tests/raycluster)."""

    class exceptions:  # noqa: N801 - mirrors ray.exceptions
        class RayError(Exception):
            pass

        class RayTaskError(RayError):
            def __init__(self, cause: BaseException) -> None:
                super().__init__(f"task failed: {cause}")
                self.cause = cause

        class OwnerDiedError(RayError):
            pass

        class ObjectLostError(RayError):
            pass

        class WorkerCrashedError(RayError):
            pass

        class NodeDiedError(RayError):
            pass

        class LocalRayletDiedError(RayError):
            pass

        class RaySystemError(RayError):
            pass

        class RpcError(RayError):
            pass

        class OutOfMemoryError(RayError):
            pass

        class ObjectStoreFullError(RayError):
            pass

    def __init__(self) -> None:
        self.inits: list[dict[str, object]] = []
        self.initialized = False
        self.get_error: BaseException | None = None
        self.put_error: BaseException | None = None

    def is_initialized(self) -> bool:
        return self.initialized

    def init(self, **kwargs: object) -> None:
        self.inits.append(kwargs)
        self.initialized = True

    def shutdown(self) -> None:
        self.initialized = False

    def cluster_resources(self) -> dict[str, float]:
        return {"CPU": 2.0}

    def remote(self, **options: object):  # type: ignore[no-untyped-def]
        def wrap(fn):  # type: ignore[no-untyped-def]
            class Remote:
                @staticmethod
                def remote(shared: object, item: object) -> object:
                    return (fn, shared, item)
            return Remote()
        return wrap

    def put(self, value: object) -> object:
        if self.put_error is not None:
            raise self.put_error
        return value

    def get(self, ref: tuple) -> object:  # type: ignore[type-arg]
        if self.get_error is not None:
            raise self.get_error
        fn, shared, item = ref
        return fn(shared, item)


def _square(shared: int, item: int) -> int:
    return shared + item * item


@pytest.fixture
def fake_ray(monkeypatch: pytest.MonkeyPatch) -> _FakeRay:
    fake = _FakeRay()
    monkeypatch.setitem(sys.modules, "ray", fake)  # type: ignore[arg-type]
    return fake


def test_address_local_starts_a_cluster_of_its_own(fake_ray: _FakeRay) -> None:
    # Given no address, Ray joins the cluster another process last started on this machine
    # (a test suite's, someone's `ray start`); "local" must start this party's own.
    from vflink.engine.rayengine import RayEngine

    engine = RayEngine(ComputeConfig(engine="ray"))
    assert fake_ray.inits[-1]["address"] == "local"
    assert engine.map(_square, [1, 2, 3], shared=10) == [11, 14, 19]
    engine.close()
    assert not fake_ray.initialized


def test_ray_failures_become_vflink_errors(fake_ray: _FakeRay) -> None:
    # A bare Ray error reaching a party's handler was reported as an internal error with no
    # word of the cluster: every Ray failure is a vflink error that names the cluster.
    from vflink.engine.rayengine import RayEngine
    from vflink.errors import RunError, TransportError

    ex = fake_ray.exceptions
    engine = RayEngine(ComputeConfig(engine="ray"))
    fake_ray.get_error = ex.RayTaskError(ex.OwnerDiedError("Failed to retrieve object 00ff"))
    with pytest.raises(TransportError, match="Ray cluster at local lost a task.*OwnerDied"):
        engine.map(_square, [1], shared=0)
    fake_ray.get_error = ex.OutOfMemoryError("node memory 97%")
    with pytest.raises(RunError, match="ran out of memory.*chunk_rows"):
        engine.map(_square, [1], shared=0)
    fake_ray.get_error = ex.RayTaskError(KeyboardInterrupt())  # not an Exception: Ray's own
    with pytest.raises(RunError, match="a task failed on the Ray cluster at local"):
        engine.map(_square, [1], shared=0)
    fake_ray.get_error = None
    fake_ray.put_error = ex.ObjectStoreFullError("object store full")
    with pytest.raises(RunError, match=r"\(ObjectStoreFullError\): object store full"):
        engine.map(_square, [1], shared=0)
    fake_ray.put_error = None
    fake_ray.get_error = ex.RayTaskError(ValueError("a bug in the task"))
    with pytest.raises(ValueError, match="a bug in the task"):  # the task's own error
        engine.map(_square, [1], shared=0)
