"""Group operations in buckets on a compute engine equal the in-process ones."""

from __future__ import annotations

import numpy as np
import pytest

from vflink.alignment.groups import GROUPS, get_group
from vflink.engine import ComputeConfig, LocalEngine
from vflink.errors import ProtocolError
from vflink.linkage import BloomConfig, BloomEncoder, RawEncoder, StringEncoder
from vflink.linkage.encoding import NumericRange, encode_chunked


@pytest.mark.parametrize("name", GROUPS.names())
def test_bucketed_group_operations_equal(name: str) -> None:
    # several buckets of each group; modp2048's exponentiations cost 3.5 ms each, so fewer
    n = 500 if name == "modp2048" else 5000
    keys = [f"k{i}".encode() for i in range(n)]
    engine = LocalEngine(ComputeConfig(num_cpus=2, chunk_rows=120 if name == "modp2048"
                                       else 300))
    here = get_group(name, workers=1)
    there = get_group(name, compute=engine)
    there.parallel_threshold = here.parallel_threshold = 256
    h = here.hash_to_group(keys)
    np.testing.assert_array_equal(there.hash_to_group(keys), h)
    e = here.random_exponent()
    seen: list[int] = []
    np.testing.assert_array_equal(there.power(h, e, progress=seen.append), here.power(h, e))
    assert sum(seen) == n and len(seen) > 1
    assert there.operations == 2 * n
    there.validate(h, "h")
    bad = h.copy()
    bad[n - 1] = 0  # the identity, in the last bucket
    with pytest.raises(ProtocolError, match="not every row"):
        there.validate(bad, "bad")


def test_chunked_encoding_equals_one_call() -> None:
    rng = np.random.default_rng(0)
    engine = LocalEngine(ComputeConfig(num_cpus=2, chunk_rows=100))
    words = [f"street {i % 13} no {i}" for i in range(1000)]
    numbers = rng.normal(size=(1000, 2))
    ranges = NumericRange(low=(-5.0, -5.0), high=(5.0, 5.0))
    for encoder, values in ((BloomEncoder(secret=b"s" * 32), words),
                            (BloomEncoder(secret=b"s" * 32, kind="numeric", ranges=ranges,
                                          config=BloomConfig()), numbers),
                            (StringEncoder(), words), (RawEncoder(), numbers)):
        want = encoder.encode(values)
        got = encode_chunked(encoder, values, engine)
        if isinstance(want, list):
            assert got == want
        else:
            np.testing.assert_array_equal(got, want)
