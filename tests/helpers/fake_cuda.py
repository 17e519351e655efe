"""A stand-in for a CUDA device on a machine without one, to test device placement.

A run under :func:`fake_cuda` sees ``torch.cuda.is_available()`` true, and a tensor moved or
made on ``"cuda"`` is a :class:`FakeCudaTensor`: it reports ``device(type='cuda', index=0)``
and holds a CPU tensor that does the arithmetic. Every aten call that involves one is checked
as CUDA checks it, so code that would fail on a GPU fails here, with CUDA's own messages:

- tensors of two devices in one op ("Expected all tensors to be on the same device"), except
  where CUDA allows it: a 0-dim CPU tensor as a scalar, copies between devices, CPU indices;
- ``.numpy()`` of a CUDA tensor (it has no CPU storage);
- a CPU generator handed to a CUDA op.

Randomness drawn on the fake device comes from a generator of its own, seeded by
``torch.manual_seed`` / ``torch.cuda.manual_seed_all`` as the real one is but on another
stream: a run whose results depend on where its noise is drawn differs from the CPU run, as
it would on a GPU. Everything else is computed on the CPU, so a device-generic run under the
fake equals its CPU run bit for bit.

What this does not model: CUDA's own numerics (another summation order, TF32, non-deterministic
scatter-adds), memory, streams and speed. Those need a GPU (tests/integration/
test_training_resources.py, ``-k cuda``).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

__all__ = ["CUDA", "FakeCudaTensor", "fake_cuda"]

CUDA = torch.device("cuda", 0)
#: what a fake tensor reports as its device: autograd asks the device's guard for streams, and
#: a CPU build has none for "cuda" (it aborts the process) but a no-op one for "meta"
FAKE = torch.device("meta")
_CPU = torch.device("cpu")

#: ops that take tensors of two devices on CUDA as well
_CROSS_DEVICE = {
    "aten::_to_copy", "aten::copy_", "aten::_copy_from", "aten::_copy_from_and_resize",
    "aten::index", "aten::index_put_", "aten::_index_put_impl_", "aten::index_put",
    "aten::lift_fresh", "aten::detach", "aten::alias", "aten::set_",
}
#: aten random ops: their draws come from the device's generator
_RANDOM = {
    "aten::bernoulli", "aten::bernoulli_", "aten::normal", "aten::normal_", "aten::uniform_",
    "aten::rand", "aten::randn", "aten::randint", "aten::randperm", "aten::multinomial",
    "aten::exponential_", "aten::random_", "aten::native_dropout", "aten::rand_like",
    "aten::randn_like", "aten::randint_like", "aten::poisson", "aten::geometric_",
    "aten::cauchy_", "aten::log_normal_",
}
#: a seed's fake-CUDA stream differs from its CPU stream, as Philox's does from mt19937's
_STREAM_OFFSET = 0x5DEECE66D


class FakeCudaTensor(torch.Tensor):
    """A tensor on the fake CUDA device: the CPU tensor ``elem`` underneath."""

    elem: torch.Tensor

    @staticmethod
    def __new__(cls, elem: torch.Tensor) -> FakeCudaTensor:
        out = torch.Tensor._make_wrapper_subclass(  # type: ignore[attr-defined]
            cls, elem.size(), strides=elem.stride(), storage_offset=elem.storage_offset(),
            dtype=elem.dtype, layout=elem.layout, device=FAKE, requires_grad=elem.requires_grad)
        out.elem = elem
        return out

    # Python sees the device the fake stands for (torch's C++ side, autograd included, sees
    # FAKE); a "meta" tensor's state is not loaded by load_state_dict, a CUDA one's is
    @property  # type: ignore[override]
    def device(self) -> torch.device:
        return CUDA

    @property  # type: ignore[override]
    def is_cuda(self) -> bool:
        return True

    @property  # type: ignore[override]
    def is_meta(self) -> bool:
        return False

    def __repr__(self) -> str:  # type: ignore[override]
        return f"FakeCudaTensor({self.elem!r})"

    def numpy(self, *args: Any, **kwargs: Any) -> np.ndarray:  # type: ignore[override]
        raise TypeError("can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu() to "
                        "copy the tensor to host memory first.")

    def __deepcopy__(self, memo: dict[int, Any]) -> FakeCudaTensor:
        # torch's own deepcopy copies a CUDA tensor's storage, which a wrapper has none of
        if id(self) not in memo:
            copied = FakeCudaTensor(self.elem.detach().clone())
            if getattr(self, "_is_param", False):  # what nn.Parameter makes of a subclass
                copied._is_param = True
            memo[id(self)] = copied.requires_grad_(self.requires_grad)
        return memo[id(self)]  # type: ignore[no-any-return]

    def tolist(self) -> Any:  # type: ignore[override]
        return self.elem.tolist()  # CUDA copies to the host for it

    def __array__(self, *args: Any, **kwargs: Any) -> np.ndarray:
        return self.numpy()

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        return _STATE.call(func, args, kwargs or {})


class _State:
    def __init__(self) -> None:
        self.generator = torch.Generator()
        self.lock = threading.RLock()
        self.ops = 0
        #: the random ops drawn on the fake device, in order
        self.draws: list[str] = []

    def seed(self, seed: int) -> None:
        self.generator.manual_seed((int(seed) + _STREAM_OFFSET) & 0xFFFF_FFFF_FFFF_FFFF)

    def call(self, func: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        name = func._schema.name
        devices: set[str] = set()
        wrappers: dict[int, FakeCudaTensor] = {}

        def unwrap(t: Any) -> Any:
            if isinstance(t, FakeCudaTensor):
                devices.add("cuda:0")
                wrappers[id(t.elem)] = t
                return t.elem
            if isinstance(t, torch.Tensor) and not (t.dim() == 0 and t.device == _CPU):
                devices.add(str(t.device))
            return t

        plain_args, plain_kwargs = tree_map(unwrap, args), tree_map(unwrap, kwargs)
        target = plain_kwargs.get("device")
        on_cuda = "cuda:0" in devices
        if target is not None:
            target = torch.device(target)
            # a factory (``empty_like(x, device=...)`` too) or a copy: made where it is told
            on_cuda = target.type in ("cuda", "meta")
            if on_cuda:
                plain_kwargs["device"] = _CPU
        if len(devices) > 1 and name not in _CROSS_DEVICE:
            a, b = sorted(devices)
            raise RuntimeError(f"Expected all tensors to be on the same device, but found at "
                               f"least two devices, {a} and {b}! (in {name})")
        random = on_cuda and name in _RANDOM
        if random:
            self.draws.append(name)
            given = plain_kwargs.get("generator")
            if given is not None:
                raise RuntimeError(f"Expected a 'cuda' device type for generator but found "
                                   f"'{given.device.type}' (in {name})")
        with self.lock:
            self.ops += 1
        if random:  # not every overload takes a generator: lend it the device's stream
            with self.lock:
                cpu = torch.random.default_generator.get_state()
                torch.random.default_generator.set_state(self.generator.get_state())
                try:
                    out = func(*plain_args, **plain_kwargs)
                finally:
                    self.generator.set_state(torch.random.default_generator.get_state())
                    torch.random.default_generator.set_state(cpu)
        else:
            out = func(*plain_args, **plain_kwargs)
        if not on_cuda:
            return out

        def wrap(t: Any) -> Any:
            if isinstance(t, torch.Tensor) and not isinstance(t, FakeCudaTensor):
                kept = wrappers.get(id(t))  # an in-place op returns its operand
                return kept if kept is not None else FakeCudaTensor(t)
            return t

        return tree_map(wrap, out)


_STATE = _State()


class _FactoryMode(TorchDispatchMode):
    """Routes ops with no fake-CUDA operand (factories, ``cpu.to("cuda")``) to the fake."""

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        device = kwargs.get("device")
        leaves, _ = tree_flatten((args, kwargs))
        if any(isinstance(t, FakeCudaTensor) for t in leaves) or _is_cuda(device):
            return _STATE.call(func, args, kwargs)
        return func(*args, **kwargs)


def _is_cuda(device: Any) -> bool:
    return device is not None and torch.device(device).type in ("cuda", "meta")


def _to_fake(t: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``t`` copied to the fake device (differentiable, as ``Tensor.to`` is)."""
    if isinstance(t, FakeCudaTensor) and dtype in (None, t.dtype):
        return t
    return torch.ops.aten._to_copy.default(t, dtype=dtype or t.dtype, device=CUDA)


class _MoveMode(TorchFunctionMode):
    """The calls whose Python binding checks a "cuda" device before dispatch (``Tensor.to``,
    ``Tensor.cuda``, ``torch.tensor``, ``torch.as_tensor``, ``Tensor.new_tensor``): done on the
    CPU, then copied to the fake device by ``aten::_to_copy``, which the dispatch mode takes."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.to:
            copy = kwargs.pop("copy", False)
            device, dtype, _, _ = torch._C._nn._parse_to(*args[1:], **kwargs)
            if _is_cuda(device):
                moved = _to_fake(args[0], dtype)
                return moved.clone() if copy and moved is args[0] else moved
        elif func is torch.Tensor.cuda:
            return _to_fake(args[0])
        elif func in (torch.tensor, torch.as_tensor, torch.Tensor.new_tensor) and _is_cuda(
                kwargs.get("device")):
            kwargs.pop("device")
            data = args[1] if func is torch.Tensor.new_tensor else args[0]
            if isinstance(data, FakeCudaTensor) and func is torch.as_tensor:
                return _to_fake(data, kwargs.get("dtype"))
            if isinstance(data, FakeCudaTensor):
                args = (*args[:-1], data.elem) if func is torch.Tensor.new_tensor else (
                    data.elem, *args[1:])
            return _to_fake(func(*args, **kwargs))
        return func(*args, **kwargs)


@contextlib.contextmanager
def fake_cuda(monkeypatch: Any) -> Iterator[_State]:
    """Make ``"cuda"`` the fake device for the calling thread while the block runs
    (``monkeypatch`` restores ``torch.cuda``'s functions afterwards). Yields the fake's state:
    ``ops`` counts the aten calls done on the device."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "manual_seed", _STATE.seed)
    monkeypatch.setattr(torch.cuda, "manual_seed_all", _STATE.seed)
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda *a, **k: _STATE.generator.get_state())
    monkeypatch.setattr(torch.cuda, "set_rng_state",
                        lambda state, *a, **k: _STATE.generator.set_state(state))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a, **k: "fake CUDA (the CPU)")
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a, **k: 0)
    # torch's argument parser initialises CUDA before a "cuda" device reaches dispatch
    monkeypatch.setattr(torch.cuda, "_lazy_init", lambda: None)
    _STATE.seed(0)
    _STATE.ops = 0
    _STATE.draws.clear()
    with _MoveMode(), _FactoryMode():
        yield _STATE
