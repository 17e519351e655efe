"""On-disk lists for the chunked set protocols, against in-memory oracles."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vflink.alignment import psi, psu
from vflink.alignment._dh import secure_permutation, sorted_unique
from vflink.alignment._spool import Buckets, RowOrder, Spool, Workdir, bucket_bits, shuffle
from vflink.alignment.groups import get_group

G = get_group("ristretto255", workers=1)


def elements(n: int, tag: str) -> np.ndarray:
    return G.hash_to_group([f"{tag}{i}".encode() for i in range(n)])


@settings(max_examples=30, deadline=None)
@given(n=st.integers(0, 300), per=st.integers(1, 50), chunk=st.integers(1, 64))
def test_buckets_keep_byte_order_and_shuffle_permutes(n: int, per: int, chunk: int) -> None:
    work = Workdir()
    try:
        x = elements(n, "b")
        b = Buckets(work.new("b"), 32, bits=bucket_bits(n, per))
        for lo in range(0, n, chunk):
            b.add(x[lo:lo + chunk], np.arange(lo, min(n, lo + chunk)))
        # sorted buckets one after the other = the whole list sorted
        parts = [sorted_unique(e) for e, _ in b]
        joined = np.concatenate(parts) if parts else G.empty()
        assert np.array_equal(joined, sorted_unique(x))
        for e, r in b:  # each element keeps its row
            assert np.array_equal(e, x[r])
        rand = Buckets(work.new("r"), 32, bits=bucket_bits(n, per), random=True)
        rand.add(x, np.arange(n))
        out = shuffle(rand, Spool(work.new("s"), 32, rows=True))
        e, r = out.read(0, n)
        assert r is not None and sorted(r) == list(range(n)) and np.array_equal(e, x[r])
        assert sum(len(c) for c, _ in out.chunks(chunk)) == n
    finally:
        work.close()
    assert not Path(work.path).exists()


@settings(max_examples=20, deadline=None)
@given(n_a=st.integers(0, 60), n_b=st.integers(0, 60), shared=st.integers(0, 60),
       bits=st.integers(0, 5))
def test_bucketed_intersection_and_union_ranks_equal_whole_lists(
        n_a: int, n_b: int, shared: int, bits: int) -> None:
    shared = min(shared, n_a, n_b)
    a = elements(n_a, "x")
    b = np.concatenate([a[:shared], elements(n_b - shared, "y")])
    b = b[secure_permutation(len(b))]
    order = secure_permutation(n_a)
    mine = a[order]
    work = Workdir()
    try:
        bm, bt = Buckets(work.new("m"), 32, bits=bits), Buckets(work.new("t"), 32, bits=bits)
        bm.add(mine, order)
        bt.add(b)
        got = psi.intersect_buckets(lambda: zip(bm, bt, strict=True), n_rows=n_a,
                                    ordered=True)
        want = psi.intersect(mine, order, b, ordered=True)
        assert got.size == want.size
        assert got.rows is not None and want.rows is not None and want.uids is not None
        assert np.array_equal(got.rows, want.rows) and np.array_equal(got.uids, want.uids)
        # PSU lines 10-12: a record's index in sorted U, bucket by bucket
        union = sorted_unique(np.concatenate([a, b]))
        bu, bo = Buckets(work.new("u"), 32, bits=bits), Buckets(work.new("o"), 32, bits=bits)
        bu.add(union[secure_permutation(len(union))])
        bo.add(a, np.arange(n_a))
        located = psu.locate_buckets(zip(bu, bo, strict=True), n_a, 32)
        assert np.array_equal(located.uids, union)
        assert np.array_equal(union[located.record_uid], a)
    finally:
        work.close()


@pytest.mark.parametrize(("n", "span"), [(0, 3), (1, 1), (50, 7), (10_000, 1)])
def test_row_order_reads_back_in_row_order(n: int, span: int, tmp_path: Path) -> None:
    rng = np.random.default_rng(n)
    rows = rng.permutation(n).astype(np.int64)
    elements = rng.integers(0, 256, size=(n, 4), dtype=np.uint8)
    order = RowOrder(tmp_path / "r", 4, n, span)
    for lo in range(0, n, 13):  # in any order, in pieces
        order.add(rows[lo:lo + 13], elements[lo:lo + 13])
    got = list(order)
    assert len(order) == n and len(got) <= RowOrder.MAX_PARTS
    back_rows = np.concatenate([r for r, _ in got]) if got else np.empty(0, np.int64)
    back = np.concatenate([e for _, e in got]) if got else np.empty((0, 4), np.uint8)
    assert (back_rows == np.arange(n)).all()
    assert (back[rows] == elements).all()
