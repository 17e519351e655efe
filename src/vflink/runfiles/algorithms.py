"""Training algorithms by name: FedSim, its ablations and every baseline (FedSim §3, §6.1).

Each algorithm says which party data it uses and which alignment it consumes:

=====================  ==============================================================
``solo``               primary features only
``combine``            all features centralised on the true alignment (upper bound)
``splitnn``            SplitNN on the configured alignment (exact keys, or top-1 link)
``exact``              SplitNN on exactly matching identifiers only (others: "missing")
``top1sim``            SplitNN on the most similar secondary record
``avgsim``             mean over the K linked pairs
``featuresim``         K pairs with the similarity as a feature, averaged
``fedsim``             FedSim: weight, sort and CNN merge gates over the K pairs
``fedsim-no-weight``   ablation: similarities used as weights directly
``fedsim-no-sort``     ablation: no sort gate
``fedsim-mlp-merge``   ablation: MLP instead of the CNN merge gate
``fedsim-mean-merge``  ablation: mean instead of the CNN merge gate
=====================  ==============================================================
"""

from __future__ import annotations

from dataclasses import dataclass

from vflink.alignment.strategies import STRATEGIES, get_strategy
from vflink.registry import Registry

__all__ = ["ALGORITHMS", "Algorithm", "algorithm_names", "get_algorithm"]


@dataclass(frozen=True)
class Algorithm:
    """How an algorithm trains.

    Attributes:
        name: registry name.
        kind: ``"solo"``, ``"combine"`` or ``"vfl"`` (across the party boundary).
        aggregator: how the K pairs are merged (:mod:`vflink.models.merge`).
        links: which alignment it consumes: ``"base"`` (the configured alignment, top-1),
            ``"exact"`` (exact matches only), ``"top1"`` or ``"topk"`` (all K links).
        description: one line for ``--help`` and tables.
    """

    name: str
    kind: str
    aggregator: str = "top1sim"
    links: str = "base"
    description: str = ""

    @property
    def uses_k(self) -> bool:
        """Sees K pairs per record: App. E gives it K times smaller batches."""
        return self.links == "topk"


ALGORITHMS: Registry[Algorithm] = Registry("algorithm")

for _alg in (
    Algorithm("solo", "solo", description="primary features only"),
    Algorithm("combine", "combine", description="all features centralised (upper bound)"),
    Algorithm("splitnn", "vfl", description="SplitNN on the configured alignment"),
    Algorithm("exact", "vfl", links="exact", description="SplitNN on exact identifier matches"),
    Algorithm("top1sim", "vfl", links="top1", description="SplitNN on the most similar record"),
    Algorithm("avgsim", "vfl", "avgsim", "topk", "mean over the K linked pairs"),
    Algorithm("featuresim", "vfl", "featuresim", "topk", "similarity as a feature, K pairs"),
    Algorithm("fedsim", "vfl", "fedsim", "topk", "FedSim: weight, sort and merge gates"),
    Algorithm("fedsim-no-weight", "vfl", "fedsim-no-weight", "topk", "FedSim w/o weight gate"),
    Algorithm("fedsim-no-sort", "vfl", "fedsim-no-sort", "topk", "FedSim w/o sort gate"),
    Algorithm("fedsim-mlp-merge", "vfl", "fedsim-mlp-merge", "topk", "FedSim with MLP merge"),
    Algorithm("fedsim-mean-merge", "vfl", "fedsim-mean-merge", "topk",
              "FedSim with mean merge"),
):
    ALGORITHMS.add(_alg.name, _alg)


# FLORIST's strategies (§3, App. E-H) train over the PSU union (alignment.method = "psu"):
# "kind" florist, one per named configuration of the paper's experiments.
for _strategy in STRATEGIES.names():
    ALGORITHMS.add(_strategy, Algorithm(_strategy, "florist",
                                        description=get_strategy(_strategy).description))


def algorithm_names() -> tuple[str, ...]:
    return ALGORITHMS.names()


def get_algorithm(name: str) -> Algorithm:
    return ALGORITHMS.get(name)
