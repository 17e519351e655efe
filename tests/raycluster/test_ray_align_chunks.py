"""``chunk_rows`` sizes PSU/PSI's messages on the ray engine as on the local one, and the
streamed outputs decide the same pairing."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from tests.integration.test_align_streamed import _check_chunked, _chunk_sizes, _pairs
from tests.raycluster.conftest import RAY_REASON
from vflink.engine import ComputeConfig, get_engine
from vflink.runner.align import KeyFile, align_in_process
from vflink.transport import Transcript

pytest.importorskip("ray", reason=RAY_REASON)

pytestmark = pytest.mark.ray


@pytest.mark.parametrize("method", ["psu", "psi"])
def test_chunk_rows_on_ray(ray_cluster: str, method: str, tmp_path: Path) -> None:
    pd.DataFrame({"id": [f"k{i}" for i in range(60)]}).to_parquet(tmp_path / "a.parquet")
    pd.DataFrame({"id": [f"k{i}" for i in range(40, 95)]}).to_csv(tmp_path / "b.csv",
                                                                   index=False)
    engine = get_engine(ComputeConfig(engine="ray", address=ray_cluster, chunk_rows=9))
    pairs = {}
    for name, compute in (("local", None), ("ray", engine)):
        transcript = Transcript()
        out = tmp_path / name
        align_in_process(KeyFile(tmp_path / "a.parquet", ("id",), "primary"),
                         KeyFile(tmp_path / "b.csv", ("id",), "secondary"), method=method,
                         compute=compute, chunk_rows=None if compute else 9,
                         transcript=transcript, out=out)
        _check_chunked(_chunk_sizes(transcript), 9)
        pairs[name] = _pairs(pd.read_parquet(out / "primary.parquet"),
                             pd.read_parquet(out / "secondary.parquet"))
    assert pairs["ray"] == pairs["local"]
    assert len(pairs["local"]) == (20 if method == "psi" else 95)
