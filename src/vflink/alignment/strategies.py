"""FLORIST's named configurations (§3, App. E-H) as data: which synthetic labels and features
fill the gaps of the union, which calibration corrects them, and which records are scheduled.

Pure data and a registry (no numpy or torch), so the algorithm registry, and with it
`vflink --help`, can list them without importing the generators in
:mod:`vflink.alignment.synthetic`.
"""

from __future__ import annotations

from dataclasses import dataclass

from vflink.registry import Registry

__all__ = ["STRATEGIES", "Strategy", "get_strategy"]


@dataclass(frozen=True)
class Strategy:
    """One configuration of the paper's experiments.

    ``labels``/``features``: the synthetic generators (None: that party's gaps are not
    filled, which only the baselines do); ``calibration``: ``"tr"``, ``"te"`` or ``None``;
    ``calibrate``: which distortions the shift corrects (``"labels"``, ``"features"``,
    ``"both"``); ``schedule``: ``"union"`` (every UID), ``"intersection"`` (baseline-partial:
    only records with real data on both sides) or ``"full"`` (baseline-full: every record,
    all real, nothing hidden).
    """

    name: str
    labels: str = "label-majority"
    features: str = "fea-sampling"
    calibration: str | None = None
    calibrate: str = "both"
    schedule: str = "union"
    label_samples: int = 1
    description: str = ""


STRATEGIES: Registry[Strategy] = Registry("FLORIST strategy")
for _s in (
    Strategy("baseline-full", schedule="full",
             description="every record real on both sides (upper bound)"),
    Strategy("baseline-partial", schedule="intersection",
             description="only the records both parties hold"),
    Strategy("label-majority", description="missing labels := majority class (§3.1)"),
    Strategy("label-majority-tr", calibration="tr", calibrate="labels",
             description="label-majority, logits shift in training (App. E)"),
    Strategy("label-majority-te", calibration="te", calibrate="labels",
             description="label-majority, logits shift at test (App. E)"),
    Strategy("label-minority", labels="label-minority", description="missing labels := 1"),
    Strategy("label-random-pos", labels="label-random-pos",
             description="missing labels ~ Bernoulli(own positive rate)"),
    Strategy("label-random-pred", labels="label-random-pred",
             description="missing labels ~ the model's prediction (App. H)"),
    Strategy("label-neighbors", labels="label-neighbors",
             description="missing labels := 3-NN vote, cosine on cut-layer embeddings"),
    Strategy("fea-sampling", description="missing features := a random own record (§2.4)"),
    Strategy("fea-sampling-tr", calibration="tr", calibrate="features",
             description="fea-sampling, logits shift in training (App. F)"),
    Strategy("fea-sampling-te", calibration="te", calibrate="features",
             description="fea-sampling, logits shift at test (App. F)"),
    Strategy("fea-gaussian", features="fea-gaussian",
             description="missing cut-layer embeddings ~ N(0, max‖f‖²/d)"),
    Strategy("fea-random", features="fea-random",
             description="missing cut-layer embeddings ~ N(moving μ, σ²)"),
    Strategy("florist", calibration="tr", calibrate="both",
             description="label-majority + fea-sampling, logits shift in training (App. G)"),
    Strategy("florist-vanilla", calibration="te", calibrate="labels",
             description="label-majority + fea-sampling, label-majority-te calibration only"),
):
    STRATEGIES.add(_s.name, _s)


def get_strategy(name: str) -> Strategy:
    return STRATEGIES.get(name)
