"""The test double for a CUDA device (tests/helpers/fake_cuda.py) refuses what CUDA refuses and
computes what the CPU computes: the oracle behind tests/integration/test_cuda_placement.py."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from tests.helpers.fake_cuda import FakeCudaTensor, fake_cuda
from vflink.models.merge import (
    AggregatorConfig,
    FedSimAggregator,
    build_aggregator,
    weight_curve,
)
from vflink.models.mlp import Dropout, build_mlp, seeded_init

SAME_DEVICE = "Expected all tensors to be on the same device"


@pytest.fixture
def cuda(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    with fake_cuda(monkeypatch) as state:
        yield state


def test_a_tensor_moved_or_made_on_cuda_reports_cuda(cuda) -> None:  # type: ignore[no-untyped-def]
    assert torch.cuda.is_available()
    for t in (torch.ones(2, 3).to("cuda"), torch.ones(2).cuda(), torch.zeros(2, device="cuda"),
              torch.tensor([1.0], device="cuda"), torch.as_tensor(np.ones(2), device="cuda"),
              torch.ones(2).to(torch.device("cuda"), torch.float64)):
        assert isinstance(t, FakeCudaTensor) and t.device == torch.device("cuda", 0)
        assert t.is_cuda and not t.is_meta
    x = torch.arange(6.0).reshape(2, 3).to("cuda")
    assert isinstance(x * 2 + 1, FakeCudaTensor) and isinstance(torch.zeros_like(x),
                                                               FakeCudaTensor)
    assert not isinstance(torch.empty_like(x, device="cpu"), FakeCudaTensor)
    back = x.cpu()
    assert type(back) is torch.Tensor and torch.equal(back, torch.arange(6.0).reshape(2, 3))


def test_what_cuda_refuses_is_refused(cuda) -> None:  # type: ignore[no-untyped-def]
    x = torch.ones(2, 3).to("cuda")
    with pytest.raises(RuntimeError, match=SAME_DEVICE):
        x + torch.ones(2, 3)
    with pytest.raises(RuntimeError, match=SAME_DEVICE):
        torch.ones(3) + x[0, 0]  # a device scalar does not mix with a CPU tensor
    with pytest.raises(RuntimeError, match=SAME_DEVICE):
        build_mlp(3, (4,), 1)(x)  # a CPU model on device inputs
    with pytest.raises(TypeError, match="can't convert cuda:0 device type tensor to numpy"):
        x.numpy()
    with pytest.raises(TypeError, match="can't convert cuda"):
        np.asarray(x)
    with pytest.raises(RuntimeError, match="Expected a 'cuda' device type for generator"):
        torch.empty(3, device="cuda").normal_(generator=torch.Generator())
    # ... and what CUDA allows is allowed: CPU scalars, CPU indices, copies, host reads
    assert isinstance(x * torch.tensor(2.0), FakeCudaTensor)
    assert x[torch.tensor([1, 0])].shape == (2, 3)
    assert x.tolist() == [[1.0] * 3] * 2 and float(x.sum()) == 6.0
    x.copy_(torch.zeros(2, 3))
    assert x.sum().item() == 0.0


def test_training_on_cuda_computes_the_cpus_values(cuda) -> None:  # type: ignore[no-untyped-def]
    """Forward, backward, an optimiser step, a deep copy and a state dict round trip on the
    fake device give the CPU's numbers bit for bit, with every parameter on the device."""
    def step(device: str) -> tuple[torch.nn.Module, torch.Tensor]:
        with seeded_init(3):
            model = build_mlp(5, (7,), 2).to(device)
        opt = torch.optim.Adam(model.parameters(), lr=0.1)
        x = torch.linspace(-1, 1, 20).reshape(4, 5).to(device)
        for _ in range(3):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), torch.tensor([0, 1, 1, 0]).to(
                device))
            loss.backward()
            opt.step()
        return model, loss.detach()

    cpu_model, cpu_loss = step("cpu")
    model, loss = step("cuda")
    assert all(isinstance(p, FakeCudaTensor) for p in model.parameters())
    assert isinstance(loss, FakeCudaTensor) and torch.equal(loss.cpu(), cpu_loss)
    for (name, a), b in zip(cpu_model.state_dict().items(), model.state_dict().values(),
                            strict=True):
        assert torch.equal(a, b.cpu()), name
    copied = copy.deepcopy(model)
    assert all(isinstance(p, FakeCudaTensor) for p in copied.parameters())
    fresh = build_mlp(5, (7,), 2).to("cuda")
    fresh.load_state_dict(cpu_model.state_dict())  # a CPU checkpoint read onto the device
    for a, b in zip(cpu_model.parameters(), fresh.parameters(), strict=True):
        assert torch.equal(a, b.cpu())


def test_randomness_drawn_on_cuda_comes_from_another_stream(cuda) -> None:  # type: ignore[no-untyped-def]
    """As CUDA's Philox stream differs from the CPU's: the same seed draws other numbers on the
    device (the same ones again for the same seed), so results that depend on where noise is
    drawn differ between a CPU and a device run."""
    torch.manual_seed(7)
    on_cpu = torch.randn(50)
    torch.manual_seed(7)
    on_device = torch.randn(50, device="cuda")
    torch.manual_seed(7)
    again = torch.randn(50, device="cuda")
    assert torch.equal(on_device.cpu(), again.cpu())
    assert not torch.equal(on_device.cpu(), on_cpu)
    assert cuda.draws == ["aten::randn", "aten::randn"]
    # torch's own dropout draws its mask there; vflink's Dropout draws the CPU's
    x = torch.ones(8, 16)
    with seeded_init(4):
        want = Dropout(0.5)(x)
    with seeded_init(4):
        torch.cuda.manual_seed_all(4)
        native = torch.nn.Dropout(0.5)(x.to("cuda"))
    with seeded_init(4):
        ours = Dropout(0.5)(x.to("cuda"))
    assert torch.equal(ours.cpu(), want) and not torch.equal(native.cpu(), want)


def test_the_weight_curve_bug_fails_under_the_fake(cuda) -> None:  # type: ignore[no-untyped-def]
    """The evaluate stage's crash on a GPU (a CPU similarity grid fed to a CUDA weight gate)
    is what the fake raises; the fixed code runs."""
    config = AggregatorConfig(sim_hidden=(4,), conv_channels=2, k_conv=2, merge_hidden=(8,),
                              out_dim=5, seed=1)
    agg = build_aggregator("fedsim", k=3, emb_dim=4, config=config)
    assert isinstance(agg, FedSimAggregator)
    grid = np.linspace(-1.0, 1.0, 7)
    want = weight_curve(agg, grid)
    agg.to("cuda")
    with pytest.raises(RuntimeError, match=SAME_DEVICE):
        agg.weights(torch.from_numpy(grid.astype(np.float32))[None, :])
    np.testing.assert_array_equal(weight_curve(agg, grid), want)


def test_a_party_on_cuda_says_which_device(cuda, caplog: pytest.LogCaptureFixture  # type: ignore[no-untyped-def]
                                            ) -> None:
    from vflink.models.device import resolve_device

    with caplog.at_level("INFO", logger="vflink.models.device"):
        assert resolve_device("auto", party="bank") == torch.device("cuda")
        assert resolve_device("cpu", party="bank") == torch.device("cpu")
    assert [r.getMessage() for r in caplog.records] == [
        "party 'bank': models on CUDA (fake CUDA (the CPU); training.device = 'auto')"]


def test_leaving_the_block_restores_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    available = torch.cuda.is_available()
    with fake_cuda(monkeypatch):
        pass
    monkeypatch.undo()
    assert torch.cuda.is_available() == available
    assert type(torch.ones(2) * 2) is torch.Tensor
