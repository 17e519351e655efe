"""The Ray engine: a party's chunked stages as tasks on the party's own Ray cluster.

``ray`` is an optional extra (``pip install 'vflink[ray]'``) and is imported only when a
:class:`RayEngine` is created. Ray schedules; vflink only cuts the work into chunk tasks and
merges their results (no scheduler of our own). A task whose worker dies is re-run by Ray
(``max_retries``); every chunk function is deterministic, so a retry gives the same result.
"""

from __future__ import annotations

import collections
import logging
import os
import socket
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from vflink.engine.base import ComputeConfig, Engine
from vflink.errors import ConfigError, RunError, TransportError, VflinkError

__all__ = ["RayEngine", "probe_address"]

log = logging.getLogger(__name__)

R = TypeVar("R")

#: Seconds to wait for a cluster's GCS port before calling the address unreachable (Ray's own
#: connection attempts retry for about a minute before failing, with a less clear message).
PROBE_TIMEOUT_S = 5.0


#: Host names of this machine's loopback interface.
_LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")


def _keep_on_loopback(address: str) -> None:
    """Ray turns a loopback address into the machine's outward IP (to be reachable from
    other nodes), where a cluster bound to 127.0.0.1 does not answer. For ``"local"`` and
    loopback addresses, ask Ray (before it is imported: the setting is read at import) to
    stay on loopback, as it does on single-machine platforms."""
    host = address.split("://", 1)[-1].rpartition(":")[0]
    if address == "local" or host in _LOOPBACK:
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")


def _import_ray() -> Any:
    try:
        import ray
        if not hasattr(ray, "init"):  # a stray directory named ray/ (e.g. Ray's own /tmp/ray)
            raise ImportError("not the ray package")
    except ImportError:
        raise ConfigError("`compute.engine = \"ray\"` (or --engine ray) needs Ray: install the "
                          "extra with `pip install 'vflink[ray]'`") from None
    return ray


def probe_address(address: str, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """Refuse an unreachable ``host:port`` at once with an error naming it."""
    target = address.split("://", 1)[-1]
    host, sep, port = target.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ConfigError(f"`compute.address` must be \"local\", \"auto\" or host:port, got "
                          f"{address!r}")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            pass
    except OSError as exc:
        raise TransportError(f"the Ray cluster at {address} is unreachable ({exc}); start it "
                             "with `ray start --head` there, or use --address local") from None


def _first_line(exc: BaseException) -> str:
    """The first line of a Ray error's text (the rest is Ray's advice on its own logs)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class RayEngine(Engine):
    """Tasks on a Ray cluster: ``address = "local"`` starts one here (``num_cpus``), anything
    else joins an existing cluster. A cluster already initialised in this process (a test's
    ``ray.cluster_utils.Cluster``, an application's own ``ray.init``) is reused, and left
    running on :meth:`close`."""

    name = "ray"

    def __init__(self, config: ComputeConfig | None = None) -> None:
        super().__init__(config or ComputeConfig(engine="ray"))
        address = self.config.resolved_address
        _keep_on_loopback(address)
        ray = self._ray = _import_ray()
        self._owned = False
        self._remotes: dict[Callable[..., Any], Any] = {}
        if ray.is_initialized():
            log.info("ray engine: using the Ray cluster this process already joined")
            return
        options: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False,
                                   "logging_level": logging.WARNING}
        try:
            if address == "local":
                # address="local", not None: given no address, Ray joins the cluster another
                # process last started on this machine (/tmp/ray/ray_current_cluster: someone's
                # `ray start`, a test suite's cluster), whose other nodes and settings are not
                # ours; a task placed there failed to fetch its input (OwnerDiedError)
                ray.init(address="local", num_cpus=self.config.num_cpus,
                         _node_ip_address="127.0.0.1", **options)
            else:
                if address != "auto":
                    probe_address(address)
                ray.init(address=address, **options)
        except VflinkError:
            raise
        except Exception as exc:  # Ray raises ConnectionError, RuntimeError, ValueError...
            raise TransportError(f"could not join the Ray cluster at {address}: {exc}") from None
        self._owned = True
        log.info("ray engine: %s cluster with %d CPUs", address, self.workers)

    @property
    def workers(self) -> int:
        return max(1, int(self._ray.cluster_resources().get("CPU", 1)))

    @property
    def parallel(self) -> bool:
        return True

    def _remote(self, fn: Callable[..., Any]) -> Any:
        remote = self._remotes.get(fn)
        if remote is None:
            remote = self._remotes[fn] = self._ray.remote(
                num_cpus=1, max_retries=self.config.max_retries)(fn)
        return remote

    def map(self, fn: Callable[[Any, Any], R], items: Sequence[Any], *, shared: Any = None,
            progress: Callable[[int], None] | None = None) -> list[R]:
        ray = self._ray
        if not items:
            return []
        try:
            return self._map(fn, items, shared, progress)
        except ray.exceptions.RayError as exc:  # ray.put, a submission, or a task's Ray error
            raise self._translate(exc) from None

    def _translate(self, exc: BaseException) -> VflinkError:
        """A Ray failure as the vflink error a user can act on (never a bare Ray error,
        which a party would report as an internal error)."""
        ray = self._ray
        where = f"the Ray cluster at {self.config.resolved_address}"
        # a worker, node or object gone (after Ray's own retries), as opposed to a task error
        lost = (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError,
                ray.exceptions.ObjectLostError, ray.exceptions.OwnerDiedError,
                ray.exceptions.LocalRayletDiedError, ray.exceptions.RaySystemError,
                ray.exceptions.RpcError)
        if isinstance(exc, lost):
            return TransportError(f"{where} lost a task after {self.config.max_retries} "
                                  f"retries ({type(exc).__name__}): {_first_line(exc)}")
        if isinstance(exc, ray.exceptions.OutOfMemoryError):
            return RunError(f"{where} stopped a task because the node ran out of memory; "
                            f"lower [compute] chunk_rows (now {self.config.chunk_rows}) or "
                            f"give the cluster more memory: {_first_line(exc)}")
        return RunError(f"a task failed on {where} ({type(exc).__name__}): "
                        f"{_first_line(exc)}")

    def _map(self, fn: Callable[[Any, Any], R], items: Sequence[Any], shared: Any,
             progress: Callable[[int], None] | None) -> list[R]:
        ray = self._ray
        remote = self._remote(fn)
        shared_ref = ray.put(shared)  # once into the object store, not once per task
        # At most a few tasks per worker in flight: the driver never holds every chunk's
        # result and input at once, and results are collected in order.
        window = 2 * self.workers
        pending: collections.deque[Any] = collections.deque()
        out: list[R] = []

        def collect() -> None:
            ref = pending.popleft()
            try:
                out.append(ray.get(ref))
            except ray.exceptions.RayTaskError as exc:
                # the task's own exception is raised as it is (a vflink error keeps its class
                # and message); a Ray error inside it (an input it could not fetch) is the
                # cluster's failure, translated by map()
                cause = getattr(exc, "cause", None)
                if isinstance(cause, Exception):
                    raise cause from None
                raise
            if progress is not None:
                progress(1)

        for item in items:
            pending.append(remote.remote(shared_ref, item))
            if len(pending) >= window:
                collect()
        while pending:
            collect()
        return out

    def close(self) -> None:
        if self._owned and self._ray.is_initialized():
            self._ray.shutdown()
        self._owned = False
        self._remotes.clear()
