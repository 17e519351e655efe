"""q-gram blocking: candidate generation for string identifiers (the "blocking" step of PPRL).

For every primary string we keep the ``n_candidates`` secondary strings that share the most
(IDF-weighted) padded q-grams with it; only those candidates are then compared with the exact
Levenshtein distance. Very frequent q-grams (document frequency above ``max_df``) are dropped
from the inverted index, because they make every string a candidate of every other string and
so cost time without separating anything.

This is an *approximate* candidate generator: a secondary string at a small edit distance almost
always shares q-grams with the query, but the K-th nearest neighbour of a query can be a string
that shares few of them. The search that uses it therefore measures and reports its recall
against brute force (:func:`vflink.linkage.search.search_levenshtein`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import numpy.typing as npt
import scipy.sparse as sp

__all__ = ["QgramIndex", "padded_qgrams", "qgram_candidates"]

#: Padding character added on both sides so that the first and last characters form q-grams
#: of their own (the usual convention for q-gram blocking and q-gram Bloom filters).
PAD = "\x00"


def padded_qgrams(s: str, q: int) -> list[str]:
    """The q-grams of ``s`` padded with ``q - 1`` pad characters on each side (with repeats)."""
    if q <= 1:
        return list(s)
    pad = PAD * (q - 1)
    t = f"{pad}{s}{pad}"
    return [t[i:i + q] for i in range(len(t) - q + 1)]


class QgramIndex:
    """Binary document × q-gram matrix of the secondary strings, with IDF weights.

    ``max_df`` is the largest fraction of secondary strings a q-gram may occur in and still be
    indexed.
    """

    def __init__(self, secondary: Sequence[str], *, q: int, max_df: float) -> None:
        self.q = q
        self.vocab: dict[str, int] = {}
        matrix = self._matrix(secondary, grow=True)
        n = matrix.shape[0]
        df = np.asarray(matrix.sum(axis=0)).ravel()
        idf = np.log((n + 1.0) / (df + 1.0)).astype(np.float32)
        keep = (df <= max(1.0, max_df * n)).astype(np.float32)
        weights = sp.diags(idf * keep)
        # CSC of the transposed, weighted matrix: (V × n) so that A @ Bᵀ is one sparse product.
        self.weighted_t = (matrix @ weights).T.tocsr()
        self.size = n

    def _matrix(self, strings: Sequence[str], *, grow: bool) -> sp.csr_matrix:
        indptr = [0]
        indices: list[int] = []
        vocab = self.vocab
        for s in strings:
            ids = set()
            for g in padded_qgrams(s, self.q):
                j = vocab.get(g)
                if j is None:
                    if not grow:
                        continue
                    j = vocab[g] = len(vocab)
                ids.add(j)
            indices.extend(ids)
            indptr.append(len(indices))
        data = np.ones(len(indices), dtype=np.float32)
        return sp.csr_matrix(
            (data, np.asarray(indices, dtype=np.int64), np.asarray(indptr, dtype=np.int64)),
            shape=(len(strings), len(vocab)),
        )

    def query_matrix(self, strings: Sequence[str]) -> sp.csr_matrix:
        """q-gram matrix of query strings over this index's vocabulary (unknown q-grams dropped)."""
        m = self._matrix(strings, grow=False)
        m.resize((m.shape[0], self.weighted_t.shape[0]))
        return m


def qgram_candidates(
    primary: Sequence[str],
    index: QgramIndex,
    *,
    n_candidates: int,
    chunk_size: int,
) -> Iterator[tuple[int, list[npt.NDArray[np.int64]]]]:
    """Yield ``(start_row, [candidate secondary indices per row])`` chunk by chunk.

    Candidates of a row are the ``n_candidates`` secondary strings with the highest IDF-weighted
    count of shared q-grams (all of them when fewer share a q-gram); a row may get fewer than
    ``n_candidates``, or none, and the caller must handle that.
    """
    for start in range(0, len(primary), chunk_size):
        chunk = primary[start:start + chunk_size]
        scores = (index.query_matrix(chunk) @ index.weighted_t).tocsr()
        rows: list[npt.NDArray[np.int64]] = []
        for r in range(scores.shape[0]):
            lo, hi = scores.indptr[r], scores.indptr[r + 1]
            cols = scores.indices[lo:hi].astype(np.int64)
            data = scores.data[lo:hi]
            if cols.size > n_candidates:
                cols = cols[np.argpartition(-data, n_candidates - 1)[:n_candidates]]
            rows.append(cols)
        yield start, rows
