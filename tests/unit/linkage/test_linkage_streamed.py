"""Streamed soft linkage: tables read in batches, chunk tasks scanning the secondary
file, links written part by part; equal to the in-memory link of the same tables."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from vflink.data.parts import is_partitioned, read_parts
from vflink.engine import ComputeConfig, LocalEngine
from vflink.errors import DataError
from vflink.linkage import link
from vflink.linkage.streamed import link_streamed


def _tables(tmp: Path, n: int, m: int, suffix: str = ".parquet") -> tuple[Path, Path,
                                                                           pd.DataFrame,
                                                                           pd.DataFrame]:
    rng = np.random.default_rng(11)
    p = pd.DataFrame({"x": rng.uniform(0, 100, n), "y": rng.uniform(0, 100, n),
                      "other": rng.integers(0, 3, n)})
    s = pd.DataFrame({"lon": rng.uniform(0, 100, m), "lat": rng.uniform(0, 100, m)})
    paths = tmp / f"p{suffix}", tmp / f"s{suffix}"
    for frame, path in zip((p, s), paths, strict=True):
        if suffix == ".csv":
            frame.to_csv(path, index=False, float_format="%.17g")
        else:
            frame.to_parquet(path, index=False, row_group_size=97)
    return paths[0], paths[1], p, s


@pytest.mark.parametrize("suffix", [".parquet", ".csv"])
@pytest.mark.parametrize("sigma", [None, 0.7])
@pytest.mark.parametrize("threads", [1, 2])
def test_streamed_links_equal_the_in_memory_link(tmp_path: Path, suffix: str,
                                                 sigma: float | None, threads: int) -> None:
    p_path, s_path, p, s = _tables(tmp_path, 530, 1210, suffix)
    k = 6
    want = link(p[["x", "y"]].to_numpy(), s[["lon", "lat"]].to_numpy(), metric="euclidean",
                top_k=k, sigma=sigma, rng=5)
    out = tmp_path / "links.parquet"
    with LocalEngine(ComputeConfig(num_cpus=threads)) as engine:
        summary = link_streamed(p_path, s_path, on=["x", "y"], secondary_on=["lon", "lat"],
                                out=out, top_k=k, compute=engine if threads > 1 else None,
                                chunk_rows=100, partition_rows=250, sigma=sigma, seed=5)
    assert is_partitioned(out) and summary["parts"] == 6 and summary["links"] == 530 * k
    got = read_parts(out).to_pandas()
    assert list(got.columns) == ["primary_index", "secondary_index", "rank", "distance",
                                 "similarity"]
    np.testing.assert_array_equal(got["primary_index"], np.repeat(np.arange(530), k))
    np.testing.assert_array_equal(got["rank"], np.tile(np.arange(k), 530))
    np.testing.assert_array_equal(got["secondary_index"].to_numpy().reshape(-1, k),
                                  want.indices)
    np.testing.assert_array_equal(got["distance"].to_numpy().reshape(-1, k), want.distances)
    # μ0 and σ0 accumulated chunk by chunk: equal to rounding; the same noise draws
    np.testing.assert_allclose(got["similarity"].to_numpy().reshape(-1, k), want.similarities,
                               rtol=1e-9, atol=1e-9)
    assert summary["mu0"] == pytest.approx(want.mu0, rel=1e-12)
    assert summary["sigma0"] == pytest.approx(want.sigma0, rel=1e-9)
    assert not [x for x in tmp_path.iterdir() if x.name.startswith(".")]


def test_a_bad_cell_names_file_column_and_row_and_leaves_nothing(tmp_path: Path) -> None:
    p_path, s_path, p, s = _tables(tmp_path, 50, 80, ".csv")
    s = s.astype({"lat": object})
    s.loc[63, "lat"] = "n/a?"
    s.to_csv(s_path, index=False)
    out = tmp_path / "links.parquet"
    with pytest.raises(DataError, match=r"s\.csv: column 'lat' needs a finite number.*row 63 "
                                        r"\(line 65 of a CSV\), value 'n/a\?'"):
        link_streamed(p_path, s_path, on=["x", "y"], secondary_on=["lon", "lat"], out=out,
                      top_k=3, chunk_rows=20, partition_rows=30)
    assert not out.exists()
    assert not [x for x in tmp_path.iterdir() if x.name.startswith(".")]
