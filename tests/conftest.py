from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
from hypothesis import HealthCheck, settings

# Tests import helpers as `tests.helpers...`.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# Small per-batch tensors: one intra-op thread is much faster on 2 cores (ARCHITECTURE.md).
torch.set_num_threads(1)
os.environ.setdefault("MPLBACKEND", "Agg")

settings.register_profile("ci", max_examples=50, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ci")
