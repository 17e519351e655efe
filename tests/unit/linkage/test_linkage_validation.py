"""Bad identifiers fail fast, naming the side, the row and the value."""

from __future__ import annotations

import numpy as np
import pytest

from vflink.errors import DataError, LinkageError, UnknownNameError
from vflink.linkage import link, validate_identifiers

GOOD = np.array([[40.0, 116.0], [41.0, 117.0]])


@pytest.mark.parametrize(("primary", "secondary", "metric", "k", "error", "match"), [
    (np.zeros((2, 3)), np.zeros((2, 2)), "euclidean", 1, DataError,
     "mismatched identifier dimensions: primary has 3, secondary has 2"),
    (np.array([[1.0, np.nan]]), GOOD, "euclidean", 1, DataError,
     r"primary identifiers .* first at row 0, column 1: nan"),
    (GOOD, np.array([[1.0, 2.0], [np.inf, 0.0]]), "euclidean", 1, DataError,
     "secondary identifiers .* row 1, column 0: inf"),
    (np.array([[40.0, 116.0], [95.0, 116.0]]), GOOD, "haversine", 1, DataError,
     r"primary identifiers: 1 row\(s\) with latitude outside \[-90, 90\]; first at row 1: 95.0"),
    (GOOD, np.array([[0.0, 181.0]]), "haversine", 1, DataError,
     r"secondary .*longitude outside \[-180, 180\]; first at row 0: 181.0"),
    (GOOD, np.zeros((2, 3)), "haversine", 1, DataError, "must have 2 columns"),
    (GOOD, GOOD, "euclidean", 3, LinkageError, "`top_k` = 3 is larger than the secondary table"),
    (GOOD, GOOD, "euclidean", 0, LinkageError, "`top_k` must be an int ≥ 1, got 0"),
    (["a", ""], ["b"], "levenshtein", 1, DataError, "primary identifiers: row 1 is an empty"),
    (["a"], ["b", None], "levenshtein", 1, DataError, "secondary identifiers: row 1 is not a str"),
    ([], ["b"], "levenshtein", 1, DataError, "primary identifiers are empty"),
    (np.zeros((2, 4), np.uint8), np.zeros((2, 8), np.uint8), "hamming", 1, DataError,
     "mismatched bytes per Bloom filter: primary has 4, secondary has 8"),
    (np.full((1, 2), 300), np.zeros((1, 2), np.uint8), "hamming", 1, DataError, "uint8"),
    (np.zeros((0, 2)), GOOD, "euclidean", 1, DataError, "primary identifiers are empty"),
    (GOOD, GOOD, "cosine", 1, UnknownNameError, "euclidean, hamming, haversine, levenshtein"),
])
def test_bad_inputs_raise(primary: object, secondary: object, metric: str, k: int,
                          error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        validate_identifiers(primary, secondary, metric=metric, top_k=k)
    with pytest.raises(error):
        link(primary, secondary, metric=metric, top_k=k)


def test_good_inputs_are_converted() -> None:
    p, s = validate_identifiers([1.0, 2.0], [[3.0]], metric="euclidean", top_k=1)
    assert p.shape == (2, 1) and s.shape == (1, 1) and p.dtype == np.float64
