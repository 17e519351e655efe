"""Cost of the secret noise source (vflink.randomness) against the seeded generators it
replaced, per draw shape, measured in the same process.

For each shape (a batch of label-noise scalars, a batch of cut-layer noise, a million normals)
it times standard normal draws from: ``torch`` (a seeded ``torch.Generator``, the old default),
``pcg64`` (numpy's default generator), ``secret`` (:class:`vflink.randomness.NoiseSource`:
ChaCha20 keyed by the OS, as torch tensors) and ``urandom`` (Box-Muller on ``os.urandom``, the
old ``secure_rng`` path), and prints JSON with the sizes, the median time per call (ms) over
``--repeat`` calls and the ratio of ``secret`` to ``torch``. Peak memory is that of this one
process (the draws are small).

    PYTHONPATH=src python benchmarks/noise_source.py
    PYTHONPATH=src python benchmarks/noise_source.py --repeat 50
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from vflink.randomness import NoiseSource  # noqa: E402

SHAPES = {"labels-batch-256": (256, 1), "embeddings-batch-256x16": (256, 16),
          "million": (1000, 1000)}


def _urandom_normal(shape: tuple[int, ...]) -> torch.Tensor:
    n = math.prod(shape)
    k = (n + 1) // 2
    raw = np.frombuffer(os.urandom(16 * k), dtype=np.uint64).reshape(2, k)
    u1 = (raw[0] >> np.uint64(11)).astype(np.float64) * 2.0**-53 + 2.0**-53
    u2 = (raw[1] >> np.uint64(11)).astype(np.float64) * 2.0**-53
    r = np.sqrt(-2.0 * np.log(u1))
    z = np.concatenate([r * np.cos(2 * np.pi * u2), r * np.sin(2 * np.pi * u2)])[:n]
    return torch.from_numpy(z).reshape(shape)


def _time(fn: Callable[[], object], repeat: int) -> float:
    fn()  # warm up
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    pcg = np.random.default_rng(0)
    secret = NoiseSource()
    out: dict[str, object] = {"repeat": args.repeat, "shapes": {}}
    for name, shape in SHAPES.items():
        times = {
            "torch": _time(lambda s=shape: torch.randn(s, generator=gen, dtype=torch.float64),
                           args.repeat),
            "pcg64": _time(lambda s=shape: torch.from_numpy(pcg.standard_normal(s)),
                           args.repeat),
            "secret": _time(lambda s=shape: secret.normal(s, dtype=torch.float64),
                            args.repeat),
            "urandom": _time(lambda s=shape: _urandom_normal(s), args.repeat),
        }
        out["shapes"][name] = {  # type: ignore[index]
            "size": list(shape), "ms_per_call": {k: round(v, 4) for k, v in times.items()},
            "ratio_secret_to_torch": round(times["secret"] / times["torch"], 2),
            "ratio_secret_to_pcg64": round(times["secret"] / times["pcg64"], 2)}
    out["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
