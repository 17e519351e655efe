"""Cost of VFL-AFE's protection per training step (VFL-AFE Table 3): noise, +R, +D.

Two measurements, printed as JSON:

* ``per_step``: one secondary step on a batch (bottom model forward and backward, the
  unprotected baseline), and on top of it what each component adds, measured in the same
  process: ``noise`` (clip + Gaussian noise, Alg. 1 lines 6 and 9), ``+R`` (pairwise distances,
  μh + 3σh, rescaling and the KL regulariser: lines 7-8, Eqs. 3-6) and ``+D`` (fuzzy c-means on
  the received gradients and the contrastive loss: lines 16-17, Eqs. 7-8), each as ms per step
  and as a fraction of the unprotected step;
* ``end_to_end``: seconds per epoch of a whole in-process run (every party, the channel,
  evaluation) for each mode against the unprotected run.

    PYTHONPATH=src python benchmarks/privacy.py
    PYTHONPATH=src python benchmarks/privacy.py --batch 128 --steps 200 --rows 6000
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from vflink.models.mlp import build_mlp, seeded_init  # noqa: E402
from vflink.privacy.config import PrivacyConfig  # noqa: E402
from vflink.privacy.embedding_dp import EmbeddingDP  # noqa: E402
from vflink.runfiles.config import (  # noqa: E402
    DataConfig,
    ModelConfig,
    RunConfig,
    TrainingConfig,
)
from vflink.runner.train import run_training  # noqa: E402


def per_step(batch: int, steps: int, in_dim: int, classes: int) -> dict[str, object]:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(steps, batch, in_dim, generator=gen)
    grads = torch.randn(steps, batch, 16, generator=gen) * 1e-2
    with seeded_init(0):
        model = build_mlp(in_dim, (128,), 16)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    rows = np.arange(batch)
    times: dict[str, float] = {}
    for mode in ("off", "vanilla", "rescale", "adjust"):
        dp = None if mode == "off" else EmbeddingDP(
            PrivacyConfig(embeddings=mode, epsilon=8.0, fcm_threshold=0.3, labels="off"),
            party="s", n_rows=batch, seed=0, classes=classes)
        start = time.perf_counter()
        for i in range(steps):
            out = model(x[i])
            if dp is not None:
                out, _ = dp.release(out, rows)
                dp.counts[:] = 0  # the benchmark reuses the same rows
            extra = dp.local_loss(out, grads[i]) if dp is not None else None
            opt.zero_grad(set_to_none=True)
            if extra is not None and extra.requires_grad:
                torch.autograd.backward([out, extra], [grads[i], torch.ones_like(extra)])
            else:
                out.backward(grads[i])
            opt.step()
        times[mode] = (time.perf_counter() - start) / steps * 1e3
    base = times["off"]
    noise = times["vanilla"] - base
    parts = {"noise": noise, "+R": times["rescale"] - times["vanilla"],
             "+D": times["adjust"] - times["vanilla"]}
    return {"batch": batch, "steps": steps, "in_dim": in_dim, "classes": classes,
            "unprotected_ms": base,
            "added_ms": parts,
            "added_fraction_of_unprotected": {k: v / base for k, v in parts.items()},
            "total_ms": {m: t for m, t in times.items()}}


def adult_epochs(rows: int, epochs: int, privacies: dict[str, PrivacyConfig], *,
                 top_hidden: tuple[int, ...], ratio_key: str) -> dict[str, object]:
    """Seconds per epoch and test accuracy of an in-process SplitNN run on Adult (label-only
    primary, two secondaries) under each named privacy setting, with its ratio to the first
    one's, all in this process (``benchmarks/label_protection.py`` uses it too)."""
    out: dict[str, object] = {}
    base = None
    for mode, privacy in privacies.items():
        cfg = RunConfig(seed=0, algorithm="splitnn",
                        data=DataConfig(dataset="adult", options={
                            "n_secondaries": 2, "label_only_primary": True, "max_rows": rows}),
                        model=ModelConfig(hidden=(64,), cut_dim=16, top_hidden=top_hidden),
                        training=TrainingConfig(epochs=epochs, patience=epochs, threads=1),
                        privacy=privacy)
        result = run_training(cfg)
        per_epoch = float(np.mean([h.seconds for h in result.history]))
        base = base if base is not None else per_epoch
        out[mode] = {"seconds_per_epoch": per_epoch, ratio_key: per_epoch / base,
                     "test_accuracy": result.metrics["test"]["accuracy"]}
    return {"dataset": "adult (label-only primary, 2 secondaries)", "rows": rows,
            "epochs": epochs, "modes": out}


def end_to_end(rows: int, epochs: int) -> dict[str, object]:
    return adult_epochs(rows, epochs, {
        mode: PrivacyConfig(embeddings=mode, epsilon=8.0, labels="off")
        for mode in ("off", "vanilla", "rescale", "adjust", "afe")},
        top_hidden=(32,), ratio_key="ratio_to_unprotected")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--in-dim", type=int, default=392)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--rows", type=int, default=6000)
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(1)
    result = {"per_step": per_step(args.batch, args.steps, args.in_dim, args.classes),
              "end_to_end": end_to_end(args.rows, args.epochs),
              "torch_threads": torch.get_num_threads()}
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
