"""State files: tensors in safetensors, the rest in versioned JSON, committed atomically."""

from __future__ import annotations

import io
import json
import re
import tokenize
from pathlib import Path

import numpy as np
import pytest
import torch

from vflink.models.merge import AggregatorConfig
from vflink.models.mlp import build_mlp, build_optimizer
from vflink.models.spec import BottomSpec
from vflink.models.splitnn import SplitNNPrimary
from vflink.models.statefile import (
    StateFileError,
    load_state,
    remove_state,
    save_state,
    state_json_path,
)

SRC = Path(__file__).resolve().parents[3] / "src"


def equal(a: object, b: object) -> bool:
    """Deep equality with tensors compared by value, dtype and shape; types must match."""
    if isinstance(a, torch.Tensor):
        return (isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape
                and torch.equal(a, b))
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, dict):
        return (isinstance(b, dict) and list(a) == list(b)
                and all(equal(a[k], b[k]) for k in a))
    if isinstance(a, (list, tuple)):
        return (type(a) is type(b) and len(a) == len(b)  # type: ignore[arg-type]
                and all(equal(x, y) for x, y in zip(a, b)))  # type: ignore[call-overload]
    return type(a) is type(b) and (a == b or (a != a and b != b))


BOTTOMS = {"mlp": {}, "cnn": {"bottom": "cnn", "channels": (3, 4), "kernels": (3, 1),
                               "image_shape": (1, 1, 5)}}


@pytest.mark.parametrize("bottom", sorted(BOTTOMS))
@pytest.mark.parametrize("optimizer", ["adam", "adamw", "lamb", "sgd"])
def test_model_and_optimizer_round_trip_exactly(tmp_path: Path, optimizer: str,
                                                bottom: str) -> None:
    spec = BottomSpec(hidden=(8,), out_dim=3, optimizer=optimizer, **BOTTOMS[bottom])
    model = SplitNNPrimary(5, spec, [4], (6,), 2, learn_missing=True, aggregator="fedsim", k=3,
                           aggregator_config=AggregatorConfig(dropout=0.3, seed=1))
    if bottom == "cnn":
        assert any(isinstance(m, torch.nn.Conv2d) for m in model.modules())
    opt = build_optimizer(model.parameters(), spec)
    model.train()
    for _ in range(3):  # real optimiser moments, step counts and dropout-stream positions
        sec = [torch.randn(4, 3, 4)]
        out = model(torch.randn(4, 5), sec, torch.rand(4, 3), torch.ones(4, 3, dtype=torch.bool))
        opt.zero_grad()
        out.square().mean().backward()
        opt.step()
    state = {"model": model.state_dict(), "optimizer": opt.state_dict(),
             "rng": np.random.default_rng(3).bit_generator.state, "best": float("nan"),
             "history": [{"epoch": 1, "loss": 0.5}], "array": np.arange(4, dtype=np.int32),
             "spec": (1, (2, 3)), "int_keys": {1: "a", 2: None}, "$odd": {"$tensor": "x"}}
    path = save_state(tmp_path, "ck", state, kind="primary")
    assert path == tmp_path / "ck.json"
    assert [p.name for p in tmp_path.iterdir() if p.suffix == ".safetensors"] == [
        json.loads(path.read_text())["tensors"]]
    back = load_state(tmp_path, "ck", kind="primary")
    assert equal(state["optimizer"], back["optimizer"])
    assert equal({k: v for k, v in state.items() if k not in ("model", "optimizer")},
                 {k: v for k, v in back.items() if k not in ("model", "optimizer")})
    # the restored model and optimiser continue exactly like the originals
    twin = SplitNNPrimary(5, spec, [4], (6,), 2, learn_missing=True, aggregator="fedsim", k=3,
                          aggregator_config=AggregatorConfig(dropout=0.3, seed=1))
    twin_opt = build_optimizer(twin.parameters(), spec)
    twin.load_state_dict(back["model"])
    twin_opt.load_state_dict(back["optimizer"])
    x, sec, sim = torch.randn(4, 5), [torch.randn(4, 3, 4)], torch.rand(4, 3)
    mask = torch.ones(4, 3, dtype=torch.bool)
    for m, o in ((model, opt), (twin, twin_opt)):
        o.zero_grad()
        m(x, sec, sim, mask).square().mean().backward()
        o.step()
    for a, b in zip(model.parameters(), twin.parameters()):
        assert torch.equal(a, b)


def test_a_new_save_replaces_the_pair(tmp_path: Path) -> None:
    save_state(tmp_path, "s", {"w": torch.zeros(3)}, kind="secondary")
    save_state(tmp_path, "s", {"w": torch.ones(3)}, kind="secondary")
    assert len(list(tmp_path.glob("s.*.safetensors"))) == 1
    assert torch.equal(load_state(tmp_path, "s")["w"], torch.ones(3))
    save_state(tmp_path, "s-2", {"w": torch.ones(2)}, kind="secondary")  # a similar name
    remove_state(tmp_path, "s")
    assert sorted(p.name[:3] for p in tmp_path.iterdir()) == ["s-2", "s-2"]


def test_crash_between_the_two_writes_keeps_the_old_state(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    save_state(tmp_path, "s", {"w": torch.zeros(3)}, kind="secondary")
    import vflink.models.statefile as sf

    real = sf._write_atomic

    def die_on_json(path: Path, data: bytes) -> None:
        if path.suffix == ".json":
            raise KeyboardInterrupt
        real(path, data)

    monkeypatch.setattr(sf, "_write_atomic", die_on_json)
    with pytest.raises(KeyboardInterrupt):
        save_state(tmp_path, "s", {"w": torch.ones(3)}, kind="secondary")
    monkeypatch.undo()
    assert torch.equal(load_state(tmp_path, "s")["w"], torch.zeros(3))


def corrupt(tmp_path: Path, how: str) -> None:
    path = state_json_path(tmp_path, "s")
    doc = json.loads(path.read_text())
    weights = tmp_path / doc["tensors"]
    if how == "empty json":
        path.write_bytes(b"")
    elif how == "truncated json":
        path.write_bytes(path.read_bytes()[:40])
    elif how == "empty weights":
        weights.write_bytes(b"")
    elif how == "truncated weights":
        weights.write_bytes(weights.read_bytes()[:-7])
    elif how == "missing weights":
        weights.unlink()
    elif how == "other version":
        path.write_text(json.dumps({**doc, "version": 2}))
    elif how == "not ours":
        path.write_text('{"hello": 1}')
    elif how == "bad tree":
        path.write_text(json.dumps({**doc, "state": {"w": {"$tensor": "nope"}}}))


@pytest.mark.parametrize("how", ["empty json", "truncated json", "empty weights",
                                 "truncated weights", "missing weights", "other version",
                                 "not ours", "bad tree"])
def test_damaged_files_give_a_clear_error_naming_the_file(tmp_path: Path, how: str) -> None:
    save_state(tmp_path, "s", {"w": torch.arange(100.0)}, kind="secondary")
    corrupt(tmp_path, how)
    with pytest.raises(StateFileError) as info:
        load_state(tmp_path, "s", kind="secondary")
    text = str(info.value)
    assert str(tmp_path) in text
    if how == "other version":
        assert "format version 2" in text
    else:
        assert "truncated or not a vflink state file" in text


def test_kind_and_legacy_pickle_files_are_refused(tmp_path: Path) -> None:
    save_state(tmp_path, "s", {"w": torch.zeros(1)}, kind="secondary")
    with pytest.raises(StateFileError, match="expected a 'primary'"):
        load_state(tmp_path, "s", kind="primary")
    (tmp_path / "model.pt").write_bytes(b"\x80\x04not really")
    with pytest.raises(StateFileError, match="old pickle format"):
        load_state(tmp_path, "model")
    with pytest.raises(StateFileError, match="not found"):
        load_state(tmp_path, "absent")


def test_no_pickle_anywhere_in_src() -> None:
    """Model and state files are data, never code (ARCHITECTURE.md): no name containing
    ``pickle`` (the module, ``allow_pickle=True``, ``read_pickle``...) in any code of src/, and no
    ``torch.load`` or ``weights_only=False`` at all (prose may still explain why)."""
    hits = []
    for path in sorted(SRC.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.NAME and "pickle" in tok.string.lower():
                if tok.string == "allow_pickle" and re.match(r"allow_pickle\s*=\s*False",
                                                             tok.line[tok.start[1]:]):
                    continue  # numpy's safe setting: refuse pickled objects in .npz
                hits.append(f"{path.relative_to(SRC)}:{tok.start[0]}: {tok.line.strip()}")
        for m in re.finditer(r"weights_only\s*=\s*False|torch\.load\s*\(|\bdill\b", text):
            hits.append(f"{path.relative_to(SRC)}: {m.group(0)}")
    assert hits == []


def test_mlp_state_is_plain_tensors(tmp_path: Path) -> None:
    mlp = build_mlp(3, [4], 2)
    save_state(tmp_path, "m", {"model": mlp.state_dict()}, kind="secondary")
    again = build_mlp(3, [4], 2)
    again.load_state_dict(load_state(tmp_path, "m")["model"])
    for a, b in zip(mlp.parameters(), again.parameters()):
        assert torch.equal(a, b)
