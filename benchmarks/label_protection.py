"""Cost of label protection (``[privacy] labels``) at the primary, printed as JSON.

* ``per_batch``: what each mode adds to one training batch of the primary, in the same process:
  ``dp`` (each record's logit gradient plus Gaussian noise), ``marvell`` (the batch's two-class
  statistics, the covariance solve of Li et al. §4 and the noise on the gradient rows),
  ``max-norm`` (the heuristic's noise), against a baseline primary step (its top model's
  forward and backward on the batch), in ms and as a ratio;
* ``end_to_end``: seconds per epoch of a whole in-process SplitNN run on Adult (label-only
  primary, two secondaries) for each mode, and the ratio to ``off`` measured in the same run.

    PYTHONPATH=src python benchmarks/label_protection.py [--batch 128 --rows 6000 --epochs 2]
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
sys.path.insert(0, str(ROOT / "benchmarks"))

from privacy import adult_epochs  # noqa: E402  (the same Adult run loop as the AFE benchmark)

from vflink.models.mlp import build_mlp, seeded_init  # noqa: E402
from vflink.privacy.config import PrivacyConfig  # noqa: E402
from vflink.privacy.label_protection import LabelProtection  # noqa: E402
from vflink.types import Task  # noqa: E402

MODES = ("off", "dp", "marvell", "max-norm")


def per_batch(batch: int, steps: int, cut: int, positives: float) -> dict[str, object]:
    gen = torch.Generator().manual_seed(0)
    emb = torch.randn(steps, batch, 2 * cut, generator=gen)
    y = (torch.rand(steps, batch, generator=gen) < positives).float()
    with seeded_init(0):
        top = build_mlp(2 * cut, (), 1)
    opt = torch.optim.Adam(top.parameters(), lr=1e-3)
    rows = np.arange(batch)
    times: dict[str, float] = {}
    for mode in MODES:
        protection = None if mode == "off" else LabelProtection(
            {**PrivacyConfig(labels=mode).label_settings(), "seed": 0}, task=Task.BINARY,
            party="p", n_rows=batch, classes=2)
        if protection is not None:
            protection.plan(rows, epochs=10 * steps)  # room for every step of the benchmark
        start = time.perf_counter()
        for i in range(steps):
            h = emb[i].clone().requires_grad_(True)
            z = top(h)
            opt.zero_grad(set_to_none=True)
            if protection is not None and mode == "dp":
                z.backward(protection.noisy_logit_gradient(z, y[i], rows) / batch)
            else:
                torch.nn.functional.binary_cross_entropy_with_logits(z.squeeze(-1),
                                                                     y[i]).backward()
            opt.step()
            grad = h.grad
            if protection is not None and mode != "dp" and grad is not None:
                for half in (grad[:, :cut], grad[:, cut:]):  # one row set per secondary
                    protection.perturb(half, y[i])
        times[mode] = (time.perf_counter() - start) / steps * 1e3
    base = times["off"]
    return {"batch": batch, "steps": steps, "cut_per_secondary": cut, "secondaries": 2,
            "positive_rate": positives, "unprotected_ms": base,
            "ms": times, "ratio_to_unprotected": {m: t / base for m, t in times.items()}}


def end_to_end(rows: int, epochs: int) -> dict[str, object]:
    return adult_epochs(rows, epochs, {mode: PrivacyConfig(labels=mode) for mode in MODES},
                        top_hidden=(), ratio_key="ratio_to_off")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--cut", type=int, default=16)
    parser.add_argument("--positives", type=float, default=0.25)
    parser.add_argument("--rows", type=int, default=6000)
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(1)
    result = {"per_batch": per_batch(args.batch, args.steps, args.cut, args.positives),
              "end_to_end": end_to_end(args.rows, args.epochs),
              "torch_threads": torch.get_num_threads()}
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
