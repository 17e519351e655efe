"""Why FedSim trails Exact on the IMDb title task: test RMSE split by exact title match
(``scripts/imdb_gap.py`` is the entry point; results: ``examples/experiments/imdb-gap.md``).

:func:`imdb_gap` runs the algorithms of an IMDb experiment file
(``examples/experiments/imdb-titles.toml`` or ``imdb-titles-normalized.toml``) for some seeds,
each seed aligned once (:func:`vflink.runner.prepare.prepare`) as ``vflink experiment`` does and
every algorithm one pipeline on it, and splits every algorithm's test RMSE between the primary
records whose title has an exact match among the secondary's titles (Exact links them) and the
others. It also reports the weight FedSim's similarity model gives to a link as a function of
its distance.

Two diagnostic changes of FedSim's model can be switched on; they are not vflink options and
patch the model classes of this process (see imdb-gap.md for why): ``exact_flag`` gives the
similarity model a second input, 1 where the link's distance is 0; ``pair_similarity`` gives
each pair's SplitNN top model the pair's similarity as one more input.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vflink.models import merge, splitnn
from vflink.models.merge import weight_curve
from vflink.models.mlp import build_mlp
from vflink.runfiles.experiment import load_experiment
from vflink.runner.prepare import prepare
from vflink.runner.train import run_training
from vflink.types import MISSING

__all__ = ["gap_table", "imdb_gap", "patch_exact_flag", "patch_pair_similarity", "rmse"]


def rmse(pred: np.ndarray, y: np.ndarray) -> float:
    return float(np.sqrt(np.mean((pred - y) ** 2)))


def patch_exact_flag(rho_exact: list[float]) -> None:
    """Diagnostic: the similarity model sees [s, 1{s = ρ(dist 0)}] (two inputs, not one)."""
    init = merge.FedSimAggregator.__init__

    def new_init(self: Any, k: int, emb_dim: int, config: Any, **kw: Any) -> None:
        init(self, k, emb_dim, config, **kw)
        if self.sim_model is not None:
            self.sim_model = build_mlp(2, config.sim_hidden, 1, activation=config.activation)

    def weights(self: Any, sim: torch.Tensor) -> torch.Tensor:
        flag = (sim >= rho_exact[0] - 1e-4).to(sim.dtype)
        return torch.sigmoid(self.sim_model(torch.stack([sim, flag], -1))).squeeze(-1)

    merge.FedSimAggregator.__init__ = new_init  # type: ignore[method-assign]
    merge.FedSimAggregator.weights = weights  # type: ignore[method-assign]


def patch_pair_similarity() -> None:
    """Diagnostic: each pair's top model sees [primary cut, secondary cut, s_k]."""
    init = splitnn.SplitNNPrimary.__init__

    def new_init(self: Any, n_features: int, bottom: Any, secondary_dims: Any,
                 top_hidden: Any, n_outputs: int, **kw: Any) -> None:
        init(self, n_features, bottom, secondary_dims, top_hidden, n_outputs, **kw)
        l_m = splitnn.pair_width(kw.get("aggregator", "top1sim"), n_outputs,
                                 kw.get("pair_dim", 10))
        self.top = build_mlp(self.width + 1, top_hidden, l_m, activation=bottom.activation,
                             dropout=bottom.dropout)

    def forward(self: Any, x: torch.Tensor, secondary: Any, sim: torch.Tensor,
                mask: torch.Tensor) -> torch.Tensor:
        b, k = mask.shape
        parts = [self.bottom(x).unsqueeze(1).expand(b, k, -1), *secondary, sim.unsqueeze(-1)]
        return self.head(self.aggregator(self.top(torch.cat(parts, -1)), sim, mask))

    splitnn.SplitNNPrimary.__init__ = new_init  # type: ignore[method-assign]
    splitnn.SplitNNPrimary.forward = forward  # type: ignore[method-assign]


def imdb_gap(experiment: Path, *, seeds: Sequence[int] = (0,),
             algorithms: Sequence[str] | None = None, exact_flag: bool = False,
             pair_similarity: bool = False,
             on_row: Callable[[dict[str, Any]], None] | None = None
             ) -> tuple[list[str], list[dict[str, Any]]]:
    """Run every (seed, algorithm) of the experiment file ``experiment``; return the
    algorithms and one row per run (test RMSE, on exactly matched and on unmatched records,
    the similarity model's weights). ``on_row(row)`` sees each row as it is measured."""
    exp = load_experiment(experiment)
    algorithms = list(algorithms or exp.algorithms)
    rho_exact = [0.0]
    if exact_flag:
        patch_exact_flag(rho_exact)
    if pair_similarity:
        patch_pair_similarity()
    runs: list[dict[str, Any]] = []
    for seed in seeds:
        config = exp.configs[0].replace(seed=seed)
        prepared = prepare(config, algorithms=sorted({*algorithms, "exact"}))
        sec = prepared.inputs.secondaries[0].name
        n = len(prepared.inputs.primary)
        meta = prepared.alignments["topk"][sec].meta
        rho_exact[0] = -meta["mu0"] / meta["sigma0"]  # Eq. 1 at distance 0
        exact = prepared.alignments["exact"][sec].for_primary_rows(n)[:, 0] != MISSING
        for algorithm in algorithms:
            got: dict[str, Any] = {}

            def after(primary: Any, splits: Any, got: dict[str, Any] = got,
                      exact: np.ndarray = exact, meta: dict[str, float] = meta) -> None:
                test = splits[2]
                got["pred"] = np.asarray(primary.predict_scores(test), dtype=float).ravel()
                got["y"] = np.asarray(primary.targets(test), dtype=float).ravel()
                got["matched"] = exact[test]
                agg = primary.model.aggregator
                if getattr(agg, "sim_model", None) is not None and not exact_flag:
                    scale = 1.0 if meta["sigma0"] > 1 else 0.05  # edits, or a share of the title
                    d = np.array([scale * i for i in range(9)], dtype=np.float32)
                    w = weight_curve(agg, (-d - meta["mu0"]) / meta["sigma0"])
                    got["weights"] = {f"{float(a):g}": round(float(b), 3) for a, b in zip(d, w)}

            result = run_training(exp.config_for(config, algorithm), prepared=prepared,
                                  after_training=after)
            m, p, y = got["matched"], got["pred"], got["y"]
            row = {"seed": seed, "algorithm": algorithm, "rmse": rmse(p, y),
                   "matched": rmse(p[m], y[m]), "unmatched": rmse(p[~m], y[~m]),
                   "matched_share": float(m.mean()), "best_epoch": result.best_epoch,
                   "weights": got.get("weights")}
            runs.append(row)
            if on_row is not None:
                on_row(row)
    return algorithms, runs


def gap_table(algorithms: Sequence[str], runs: Sequence[dict[str, Any]]) -> str:
    """Markdown: each algorithm's test RMSE, overall and on matched / unmatched records."""
    lines = ["", "| algorithm | test RMSE | exact-matched records | unmatched records |",
             "|---|---|---|---|"]
    for algorithm in algorithms:
        rows = [r for r in runs if r["algorithm"] == algorithm]
        cells = [f"{np.mean([r[c] for r in rows]):.4f} ± {np.std([r[c] for r in rows]):.4f}"
                 for c in ("rmse", "matched", "unmatched")]
        lines.append(f"| {algorithm} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
