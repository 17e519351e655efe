"""Aggregators: merge the K soft-linked secondary rows of one primary record into one vector.

FedSim (Wu, Li, He; NeurIPS 2022) links every primary record with its K most similar secondary
records (§4.1) and merges what the K pairs produce with three gates around SplitNN (§4.2,
Algorithm 1, Figure 3)::

    w  = f(θ_sim; s)          similarity model, one similarity → one weight   (Alg. 1 line 8)
    o' = diag(w) · o          weight gate                                     (Alg. 1 line 9)
    o' = sort_rows(o', by s)  sort gate                                       (Alg. 1 line 10)
    ŷ  = f(θ_m; o')           merge gate: CNN with a k_conv × 1 kernel        (Alg. 1 line 11)

Here ``o`` is the ``(B, K, D)`` tensor ``emb``: whatever the primary holds for each linked pair
(the secondary's cut-layer embeddings, or the per-pair SplitNN outputs ``o_i`` of the paper, whose
width ``l_m`` is 10 in Figure 10). Every aggregator maps ``(emb, sim, mask)`` to ``(B, out_dim)``.

Registered names (:data:`AGGREGATORS`):

=====================  =================================================================
``fedsim``             weight gate (similarity model) + sort gate + CNN merge gate
``fedsim-no-weight``   similarities used directly as weights (§6.1 "FedSim w/o weight")
``fedsim-no-sort``     no sort gate (§6.1 "FedSim w/o sort")
``fedsim-mlp-merge``   MLP on the flattened K×D matrix with about as many parameters as
                       the CNN (§6.1 "FedSim-MLP", Table 1 "w/o CNN")
``fedsim-mean-merge``  weight gate + "average over rows" of o' (§4.2, linear merge model)
``avgsim``             unweighted mean over the K linked rows (§3 AvgSim, see below)
``top1sim``            the top-1 linked row only (§3 Top1Sim)
``featuresim``         each row with its similarity appended as a feature, averaged over
                       the K rows (§3 FeatureSim, see below)
=====================  =================================================================

Reading of the paper where it is terse:

* **AvgSim** (§3, and "the K outputs of SplitNN are averaged" in the early version): the
  prediction is the *plain* average over the K pairs; the paper stresses that AvgSim is
  "unaware of the similarity of each pair", so no similarity weighting. It averages per-pair
  outputs, not raw features; averaging is linear, so the mean of ``emb`` is exactly AvgSim when
  ``emb`` holds per-pair outputs, and the natural analogue when it holds cut-layer embeddings.
* **FeatureSim** (§3): every one of the K pairs is kept and "the similarity between each pair is
  appended to the record"; App. F.4 confirms it processes K times more samples, like AvgSim (and
  its parameter count exceeds AvgSim's by one input column). So FeatureSim = AvgSim with the
  similarity as an extra feature: the mean over valid rows of ``[emb_k, s_k]``, width ``D + 1``.
* **Merge gate shapes** (§4.2, §6.1 "Training"): o' is a one-channel ``K × D`` image;
  ``Conv2d(1, C, kernel=(k_conv, 1))`` mixes only neighbouring rows (pairs with close
  similarities after sorting) within each of the D output features, followed by a dropout layer
  and an MLP with one hidden layer. The paper gives neither C nor the padding. We follow the
  authors' public implementation: ``k_conv - 1`` zero rows of padding on both ends ("full"
  convolution, so any ``k_conv`` works for any K), ReLU after the convolution, the feature map
  ``C × (K + k_conv - 1) × D`` flattened into the MLP; defaults C = 8, k_conv = 7, hidden 400,
  dropout 0.2 and a 10-unit similarity model are those of the authors' experiment scripts
  (App. E only fixes hidden sizes to {100, 200, 400}).
* **Similarity model**: "one-dimensional input and one-dimensional output" MLP with one hidden
  layer (§6.1). Its output goes through a sigmoid, as in the authors' code, so weights are
  positive importances in (0, 1) (Figure 10, middle).
* **Sort gate**: rows are sorted by similarity (Alg. 1 line 10), most similar first, so an input
  already in linkage order (row 0 = top-1) is left as is. The paper sorts ascending; for a
  convolution with symmetric padding the direction is only a relabelling of the kernel.

Padding (``mask`` False) never influences the output: padded rows are replaced by zeros before
anything reads them (so even NaN there is harmless), get weight 0, sort after every valid row, and
are left out of means. A record with no valid row at all gets the output of an all-zero input.

Randomness: parameters are initialised under :func:`~vflink.models.mlp.seeded_init` with
``config.seed``, and dropout draws from a private ``torch.Generator`` seeded from the same seed,
so a training run is reproducible without any global seeding (ARCHITECTURE.md, convention 11).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import torch
from torch import Tensor, nn

from vflink._checks import check_choice, check_float, check_int, raise_if
from vflink.errors import DataError
from vflink.models.device import PreciseConv2d
from vflink.models.mlp import build_mlp, seeded_init
from vflink.registry import Registry

__all__ = [
    "AGGREGATORS",
    "Aggregator",
    "AggregatorConfig",
    "AvgSimAggregator",
    "FeatureSimAggregator",
    "FedSimAggregator",
    "Top1SimAggregator",
    "aggregator_names",
    "build_aggregator",
    "weight_curve",
]

log = logging.getLogger(__name__)

_ACTIVATIONS = ("relu", "tanh", "gelu")
_DROPOUT_SEED_OFFSET = 0x5EED  # keeps the dropout stream distinct from the init stream


@dataclass(frozen=True, kw_only=True)
class AggregatorConfig:
    """Hyperparameters of the merge models (shared by every aggregator name).

    Attributes:
        sim_hidden: hidden sizes of the similarity model (weight gate); §6.1 uses one hidden
            layer, the authors' scripts 10 units.
        conv_channels: output channels C of the merge gate's convolution.
        k_conv: height of the ``k_conv × 1`` convolution kernel (§4.2).
        merge_hidden: hidden sizes of the MLP after the convolution (§6.1: one hidden layer;
            App. E: sizes from {100, 200, 400}).
        mlp_merge_hidden: hidden sizes of the "fedsim-mlp-merge" ablation; ``None`` picks one
            hidden layer sized so the MLP has about as many parameters as the CNN merge model
            it replaces (§6.1 "FedSim-MLP ... with a similar number of parameters").
        dropout: dropout probability after the convolution and after each hidden layer of the
            merge MLPs (§6.1 "followed by a dropout layer").
        out_dim: output width of the learned merge models ("fedsim", "fedsim-no-weight",
            "fedsim-no-sort", "fedsim-mlp-merge"); ``None`` keeps the embedding width D. The
            other aggregators have a fixed width (D, or D + 1 for "featuresim") and ignore it;
            :attr:`Aggregator.out_dim` is authoritative.
        activation: hidden activation of the similarity model and merge MLPs.
        seed: seeds the parameter initialisation and the dropout stream.
        merge: the merge gate of ``fedsim`` (the ablation names fix their own): ``"cnn"``
            (§4.2, the default) or ``"average"``: Σ_k w_k o_k / Σ_k w_k with
            w_k = f(θ_sim; s_k) + 1e-7, the linear merge the authors' public code uses on
            their synthetic data (``use_conv=False``: ``AvgSumModel`` over similarity-normalised
            weights). With ``pair_dim = 1`` each pair's output is one prediction, as there.
    """

    sim_hidden: tuple[int, ...] = (10,)
    conv_channels: int = 8
    k_conv: int = 7
    merge_hidden: tuple[int, ...] = (400,)
    mlp_merge_hidden: tuple[int, ...] | None = None
    dropout: float = 0.2
    out_dim: int | None = None
    activation: str = "relu"
    seed: int = 0
    merge: str = "cnn"

    def __post_init__(self) -> None:
        problems: list[str] = []
        check_choice(problems, "merge", self.merge, ("cnn", "average"))
        for field in ("sim_hidden", "merge_hidden", "mlp_merge_hidden"):
            value = getattr(self, field)
            if value is None and field == "mlp_merge_hidden":
                continue
            if isinstance(value, (list, tuple)):
                object.__setattr__(self, field, tuple(value))
                for i, h in enumerate(value):
                    check_int(problems, f"{field}[{i}]", h, min=1)
            else:
                problems.append(f"`{field}` must be a list of ints ≥ 1, got {value!r}")
        check_int(problems, "conv_channels", self.conv_channels, min=1)
        check_int(problems, "k_conv", self.k_conv, min=1)
        check_float(problems, "dropout", self.dropout, min=0.0, max=0.95)
        if self.out_dim is not None:
            check_int(problems, "out_dim", self.out_dim, min=1)
        check_choice(problems, "activation", self.activation, _ACTIVATIONS)
        check_int(problems, "seed", self.seed, min=0)
        raise_if(problems, "aggregator config")


class Aggregator(nn.Module):
    """Merges the K linked rows of each primary record into one vector.

    ``forward(emb, sim, mask)``:
        emb: ``(B, K, D)`` float embeddings of the K linked rows (row 0 = most similar).
        sim: ``(B, K)`` float similarities (already normalised and noised, FedSim Eq. 1-2).
        mask: ``(B, K)`` bool, False where a slot holds no linked row (padding); such slots
            do not influence the output.
        returns ``(B, out_dim)``.
    """

    out_dim: int
    # Whether the K axis must equal ``k`` (models with K-shaped parameters); others accept any K.
    _fixed_k: bool = False

    def __init__(self, k: int, emb_dim: int) -> None:
        super().__init__()
        self.k = k
        self.emb_dim = emb_dim

    def _check(self, emb: Tensor, sim: Tensor, mask: Tensor) -> None:
        if emb.dim() != 3 or emb.shape[2] != self.emb_dim:
            raise DataError(f"`emb` must have shape (B, K, {self.emb_dim}), got "
                            f"{tuple(emb.shape)}")
        if self._fixed_k and emb.shape[1] != self.k:
            raise DataError(f"`emb` must have K = {self.k} slots, got {emb.shape[1]}")
        if tuple(sim.shape) != tuple(emb.shape[:2]) or tuple(mask.shape) != tuple(emb.shape[:2]):
            raise DataError(f"`sim` and `mask` must have shape {tuple(emb.shape[:2])}, got "
                            f"{tuple(sim.shape)} and {tuple(mask.shape)}")
        if mask.dtype != torch.bool:
            raise DataError(f"`mask` must be a bool tensor, got {mask.dtype}")

    def forward(self, emb: Tensor, sim: Tensor, mask: Tensor) -> Tensor:
        raise NotImplementedError


def _clean(emb: Tensor, sim: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """Zero the padded slots so nothing downstream can read them (not even NaN)."""
    zero = torch.zeros((), dtype=emb.dtype, device=emb.device)
    emb = torch.where(mask.unsqueeze(-1), emb, zero)
    sim = torch.where(mask, sim, zero.to(sim.dtype))
    return emb, sim


def _masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Mean over the valid rows of ``x`` (B, K, F) whose padded rows are already zero."""
    count = mask.sum(dim=1, keepdim=True).clamp(min=1).to(x.dtype)
    return x.sum(dim=1) / count


# -- reproducible dropout ------------------------------------------------------------------------

class _DropoutRng:
    """The aggregator's private dropout generator, seeded from its seed: a CPU generator for
    every device (masks are drawn on the CPU and moved), so that a run on CUDA drops what the
    CPU run of its seed drops."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self._gen: torch.Generator | None = None

    def get(self) -> torch.Generator:
        if self._gen is None:
            self._gen = torch.Generator()
            self._gen.manual_seed(self.seed)
        return self._gen

    def state(self) -> dict[str, Tensor]:
        return {} if self._gen is None else {"cpu": self._gen.get_state()}

    def set_state(self, state: dict[str, Tensor]) -> None:
        for device, gen_state in state.items():
            if device == "cpu":
                self.get().set_state(gen_state)
            else:  # a state saved before masks came from the CPU: a CUDA stream, not ours
                log.warning("dropout: ignoring a saved %s generator state; masks are drawn on "
                            "the CPU generator, which restarts from the seed", device)


class GeneratorDropout(nn.Module):
    """Inverted dropout whose masks come from a private generator instead of torch's global RNG.

    ``nn.Dropout`` draws from the global generator, which the library must not seed
    (ARCHITECTURE.md, convention 11); this draws from the aggregator's own stream instead,
    always on the CPU (the mask is moved to the input's device).
    """

    def __init__(self, p: float, rng: _DropoutRng) -> None:
        super().__init__()
        self.p = p
        self._rng = rng

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0.0:
            return x
        keep = torch.rand(x.shape, generator=self._rng.get(), dtype=x.dtype) >= self.p
        return x * keep.to(x.device) / (1.0 - self.p)

    def extra_repr(self) -> str:
        return f"p={self.p}"

    # The stream position is part of the training state: a checkpoint saves it so that a
    # resumed run draws the same masks as an uninterrupted one.
    def get_extra_state(self) -> dict[str, Tensor]:
        return self._rng.state()

    def set_extra_state(self, state: dict[str, Tensor]) -> None:
        self._rng.set_state(state)


def _mlp(in_dim: int, hidden: tuple[int, ...], out_dim: int, config: AggregatorConfig,
         rng: _DropoutRng, *, dropout: float) -> nn.Sequential:
    """``build_mlp`` with its dropout layers drawing from the private generator."""
    seq = build_mlp(in_dim, hidden, out_dim, activation=config.activation, dropout=dropout)
    for i, layer in enumerate(seq):
        if isinstance(layer, nn.Dropout):
            seq[i] = GeneratorDropout(layer.p, rng)
    return seq


# -- merge models (Alg. 1 line 11) -------------------------------------------------------------

class ConvMerge(nn.Module):
    """CNN merge model: Conv2d(1, C, (k_conv, 1)) → ReLU → dropout → MLP (§4.2, §6.1).

    The input o' (B, K, D) is a one-channel K × D image; the ``k_conv × 1`` kernel mixes
    neighbouring (similarly-similar) rows of the same output feature. ``k_conv - 1`` rows of zero
    padding on both ends (authors' implementation) give a (K + k_conv - 1) × D map per channel.
    """

    def __init__(self, k: int, emb_dim: int, out_dim: int, config: AggregatorConfig,
                 rng: _DropoutRng) -> None:
        super().__init__()
        # full float32 on a GPU too: cuDNN's TF32 default would move a CUDA run off the CPU's
        self.conv = PreciseConv2d(1, config.conv_channels, kernel_size=(config.k_conv, 1),
                                  padding=(config.k_conv - 1, 0))
        self.flat_dim = config.conv_channels * (k + config.k_conv - 1) * emb_dim
        self.dropout = GeneratorDropout(config.dropout, rng)
        self.mlp = _mlp(self.flat_dim, config.merge_hidden, out_dim, config, rng,
                        dropout=config.dropout)

    def forward(self, x: Tensor) -> Tensor:
        h = torch.relu(self.conv(x.unsqueeze(1)))  # (B, C, K + k_conv - 1, D)
        return self.mlp(self.dropout(h.flatten(1)))


class MLPMerge(nn.Module):
    """MLP on the flattened K × D matrix (ablation "FedSim-MLP", §6.1)."""

    def __init__(self, k: int, emb_dim: int, out_dim: int, hidden: tuple[int, ...],
                 config: AggregatorConfig, rng: _DropoutRng) -> None:
        super().__init__()
        self.mlp = _mlp(k * emb_dim, hidden, out_dim, config, rng, dropout=config.dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.mlp(x.flatten(1))


def _mlp_param_count(dims: list[int]) -> int:
    return sum((a + 1) * b for a, b in zip(dims[:-1], dims[1:]))


def _mlp_hidden_matching(k: int, emb_dim: int, out_dim: int, config: AggregatorConfig) -> int:
    """Width h of one hidden layer giving the flattened MLP about the CNN's parameter count."""
    flat = config.conv_channels * (k + config.k_conv - 1) * emb_dim
    budget = (config.conv_channels * (config.k_conv + 1)  # conv kernel + bias
              + _mlp_param_count([flat, *config.merge_hidden, out_dim]))
    # params of (K·D) → h → out: (K·D + 1) h + (h + 1) out
    return max(1, round((budget - out_dim) / (k * emb_dim + 1 + out_dim)))


# -- aggregators -------------------------------------------------------------------------------

WeightGate = Literal["model", "similarity"]
MergeKind = Literal["cnn", "mlp", "mean", "average"]


class FedSimAggregator(Aggregator):
    """FedSim's weight gate, sort gate and merge gate (§4.2, Alg. 1 lines 8-11).

    Args:
        k: number of linked rows K per primary record.
        emb_dim: width D of each row.
        config: hyperparameters.
        weight: ``"model"`` maps each similarity to a weight with the similarity model;
            ``"similarity"`` uses the similarity itself (ablation "w/o weight").
        sort: sort the rows by similarity before merging (sort gate).
        merge: ``"cnn"`` (FedSim), ``"mlp"`` (ablation), ``"mean"`` (average over rows) or
            ``"average"`` (weights normalised to sum 1, see :class:`AggregatorConfig`).
    """

    def __init__(self, k: int, emb_dim: int, config: AggregatorConfig, *,
                 weight: WeightGate = "model", sort: bool = True,
                 merge: MergeKind = "cnn") -> None:
        super().__init__(k, emb_dim)
        self.weight_gate = weight
        self.sort_gate = sort
        self.merge_kind = merge
        self._fixed_k = merge not in ("mean", "average")
        rng = _DropoutRng(config.seed + _DROPOUT_SEED_OFFSET)
        out_dim = config.out_dim if config.out_dim is not None else emb_dim
        self.sim_model: nn.Module | None = None
        if weight == "model":
            # Similarity model: 1 → hidden → 1 (§4.2 weight gate, §6.1 one hidden layer).
            self.sim_model = build_mlp(1, config.sim_hidden, 1, activation=config.activation)
        self.merge: nn.Module | None
        if merge == "cnn":
            self.merge = ConvMerge(k, emb_dim, out_dim, config, rng)
        elif merge == "mlp":
            hidden = config.mlp_merge_hidden
            if hidden is None:
                hidden = (_mlp_hidden_matching(k, emb_dim, out_dim, config),)
            self.merge = MLPMerge(k, emb_dim, out_dim, hidden, config, rng)
        else:
            self.merge = None  # "average over rows" of o' (§4.2): no parameters
            out_dim = emb_dim
        self.out_dim = out_dim
        self._normalised = merge == "average"

    def weights(self, sim: Tensor) -> Tensor:
        """w = f(θ_sim; s) per slot (Alg. 1 line 8), or s itself without the weight gate."""
        if self.sim_model is None:
            return sim
        return torch.sigmoid(self.sim_model(sim.unsqueeze(-1))).squeeze(-1)

    def forward(self, emb: Tensor, sim: Tensor, mask: Tensor) -> Tensor:
        self._check(emb, sim, mask)
        emb, sim = _clean(emb, sim, mask)
        # A normalised weighted sum does not depend on the row order: no sort needed.
        if self.sort_gate and not self._normalised:
            # Sort gate (Alg. 1 line 10): most similar first, padding last. A stable sort keeps
            # ties in input order, so an input already in linkage order is unchanged.
            key = sim.masked_fill(~mask, float("-inf"))
            order = torch.sort(key, dim=1, descending=True, stable=True).indices
            emb = emb.gather(1, order.unsqueeze(-1).expand_as(emb))
            sim = sim.gather(1, order)
            mask = mask.gather(1, order)
        # Weight gate (Alg. 1 lines 8-9): o' = diag(w) o, with w = 0 on padding.
        w = torch.where(mask, self.weights(sim), torch.zeros((), dtype=emb.dtype,
                                                             device=emb.device))
        if self._normalised:
            # The authors' linear merge: weights + 1e-7, normalised over the valid rows.
            w = torch.where(mask, w + 1e-7, w)
            return (emb * w.unsqueeze(-1)).sum(1) / w.sum(1, keepdim=True).clamp_min(1e-7)
        weighted = emb * w.unsqueeze(-1)
        # Merge gate (Alg. 1 line 11).
        if self.merge is None:
            return _masked_mean(weighted, mask)
        out: Tensor = self.merge(weighted)
        return out


class AvgSimAggregator(Aggregator):
    """AvgSim (§3): the plain mean of the K linked rows; similarities are not used."""

    def __init__(self, k: int, emb_dim: int) -> None:
        super().__init__(k, emb_dim)
        self.out_dim = emb_dim

    def forward(self, emb: Tensor, sim: Tensor, mask: Tensor) -> Tensor:
        self._check(emb, sim, mask)
        emb, _ = _clean(emb, sim, mask)
        return _masked_mean(emb, mask)


class Top1SimAggregator(Aggregator):
    """Top1Sim (§3): the most similar linked row only, i.e. row 0 in linkage order.

    Row 0 is the linkage's top-1 (ranked before the similarities were noised, Eq. 2), so it is
    taken by position, not by the largest noised similarity. Zeros when row 0 is padding.
    """

    def __init__(self, k: int, emb_dim: int) -> None:
        super().__init__(k, emb_dim)
        self.out_dim = emb_dim

    def forward(self, emb: Tensor, sim: Tensor, mask: Tensor) -> Tensor:
        self._check(emb, sim, mask)
        emb, _ = _clean(emb, sim, mask)
        return emb[:, 0, :]


class FeatureSimAggregator(Aggregator):
    """FeatureSim (§3): each linked row with its similarity appended, averaged over the K rows."""

    def __init__(self, k: int, emb_dim: int) -> None:
        super().__init__(k, emb_dim)
        self.out_dim = emb_dim + 1

    def forward(self, emb: Tensor, sim: Tensor, mask: Tensor) -> Tensor:
        self._check(emb, sim, mask)
        emb, sim = _clean(emb, sim, mask)
        rows = torch.cat([emb, sim.unsqueeze(-1).to(emb.dtype)], dim=-1)  # [emb_k, s_k]
        return _masked_mean(rows, mask)


# -- registry ----------------------------------------------------------------------------------

AggregatorFactory = Callable[[int, int, AggregatorConfig], Aggregator]

AGGREGATORS: Registry[AggregatorFactory] = Registry("aggregator")


def _fedsim(weight: WeightGate, sort: bool, merge: MergeKind | None) -> AggregatorFactory:
    def factory(k: int, emb_dim: int, config: AggregatorConfig) -> Aggregator:
        kind: MergeKind = merge or ("average" if config.merge == "average" else "cnn")
        return FedSimAggregator(k, emb_dim, config, weight=weight, sort=sort, merge=kind)

    return factory


AGGREGATORS.add("fedsim", _fedsim("model", True, None))  # merge gate from the config
AGGREGATORS.add("fedsim-no-weight", _fedsim("similarity", True, "cnn"))
AGGREGATORS.add("fedsim-no-sort", _fedsim("model", False, "cnn"))
AGGREGATORS.add("fedsim-mlp-merge", _fedsim("model", True, "mlp"))
AGGREGATORS.add("fedsim-mean-merge", _fedsim("model", True, "mean"))
AGGREGATORS.add("avgsim", lambda k, d, _config: AvgSimAggregator(k, d))
AGGREGATORS.add("top1sim", lambda k, d, _config: Top1SimAggregator(k, d))
AGGREGATORS.add("featuresim", lambda k, d, _config: FeatureSimAggregator(k, d))


def aggregator_names() -> tuple[str, ...]:
    """The registered aggregator names, sorted."""
    return AGGREGATORS.names()


def build_aggregator(name: str, *, k: int, emb_dim: int,
                     config: AggregatorConfig | None = None) -> Aggregator:
    """Build the aggregator registered as ``name`` for K linked rows of width ``emb_dim``.

    Parameters are initialised under ``seeded_init(config.seed)``, so the same config gives the
    same model without touching torch's global RNG.

    Raises:
        UnknownNameError: ``name`` is not registered (the message lists the valid names).
        ConfigError: ``k`` or ``emb_dim`` is not an int ≥ 1.
    """
    factory = AGGREGATORS.get(name)
    problems: list[str] = []
    check_int(problems, "k", k, min=1)
    check_int(problems, "emb_dim", emb_dim, min=1)
    raise_if(problems, "aggregator shape")
    config = config if config is not None else AggregatorConfig()
    with seeded_init(config.seed):
        return factory(k, emb_dim, config)


def weight_curve(aggregator: FedSimAggregator, similarities: npt.NDArray[np.floating[Any]]
                 ) -> npt.NDArray[np.float64]:
    """The aggregator's weight for each similarity (FedSim Figure 10, middle: the weight
    gate's learned mapping), computed on the aggregator's own device."""
    from vflink.models.device import module_device

    sim = torch.from_numpy(np.asarray(similarities, dtype=np.float32))[None, :]
    with torch.no_grad():
        w = aggregator.weights(sim.to(module_device(aggregator)))
    return w.reshape(-1).double().cpu().numpy()
