"""Why FedSim trails Exact on the IMDb title task: test RMSE split by exact title match.

Runs the algorithms of an IMDb experiment file (``examples/experiments/imdb-titles.toml`` or
``imdb-titles-normalized.toml``) for some seeds, each (seed) linked once as ``vflink
experiment`` does, and splits every algorithm's test RMSE between the primary records whose
title has an exact match among the secondary's titles (Exact links them) and the others. It
also prints the weight FedSim's similarity model gives to a link as a function of its distance.
Results: ``examples/experiments/imdb-gap.md``.

Two diagnostic changes of FedSim's model can be switched on (they are not vflink options; see
imdb-gap.md for why): ``--exact-flag`` gives the similarity model a second input, 1 where the
link's distance is 0; ``--pair-similarity`` gives each pair's SplitNN top model the pair's
similarity as one more input.

    python scripts/extract_datasets.py --imdb-out imdb_movies.csv.gz     # once
    PYTHONPATH=src OMP_NUM_THREADS=1 python scripts/imdb_gap.py --seeds 0 1 2 \\
        --config examples/experiments/imdb-titles.toml --out gap.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vflink.models import merge, splitnn
from vflink.models.mlp import build_mlp
from vflink.runfiles.experiment import load_experiment
from vflink.runner.prepare import prepare
from vflink.runner.train import run_training
from vflink.types import MISSING

ROOT = Path(__file__).resolve().parents[1]


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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", type=Path, default=ROOT / "examples/experiments/imdb-titles.toml")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--algorithms", nargs="+", default=None)
    ap.add_argument("--exact-flag", action="store_true")
    ap.add_argument("--pair-similarity", action="store_true")
    ap.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    exp = load_experiment(args.config)
    algorithms = args.algorithms or list(exp.algorithms)
    rho_exact = [0.0]
    if args.exact_flag:
        patch_exact_flag(rho_exact)
    if args.pair_similarity:
        patch_pair_similarity()
    runs: list[dict[str, Any]] = []
    for seed in args.seeds:
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
                if getattr(agg, "sim_model", None) is not None and not args.exact_flag:
                    scale = 1.0 if meta["sigma0"] > 1 else 0.05  # edits, or a share of the title
                    d = torch.tensor([scale * i for i in range(9)], dtype=torch.float32)
                    with torch.no_grad():
                        w = agg.weights((-d - meta["mu0"]) / meta["sigma0"])
                    got["weights"] = {f"{float(a):g}": round(float(b), 3) for a, b in zip(d, w)}

            result = run_training(exp.config_for(config, algorithm), prepared=prepared,
                                  after_training=after)
            m, p, y = got["matched"], got["pred"], got["y"]
            row = {"seed": seed, "algorithm": algorithm, "rmse": rmse(p, y),
                   "matched": rmse(p[m], y[m]), "unmatched": rmse(p[~m], y[~m]),
                   "matched_share": float(m.mean()), "best_epoch": result.best_epoch,
                   "weights": got.get("weights")}
            runs.append(row)
            print(json.dumps(row), flush=True)
    print("\n| algorithm | test RMSE | exact-matched records | unmatched records |")
    print("|---|---|---|---|")
    for algorithm in algorithms:
        rows = [r for r in runs if r["algorithm"] == algorithm]
        cells = [f"{np.mean([r[c] for r in rows]):.4f} ± {np.std([r[c] for r in rows]):.4f}"
                 for c in ("rmse", "matched", "unmatched")]
        print(f"| {algorithm} | " + " | ".join(cells) + " |")
    if args.out is not None:
        args.out.write_text(json.dumps({"config": str(args.config), "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
