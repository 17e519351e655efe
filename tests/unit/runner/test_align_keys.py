"""Canonical key bytes of text key columns, a column at a time, against the row-by-row
canonical form of :func:`vflink.alignment._dh.key_bytes`."""

from __future__ import annotations

import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from vflink.alignment._dh import key_bytes
from vflink.alignment.exact import normalise_key
from vflink.runner.align import text_key_bytes

text = st.one_of(st.none(), st.text(alphabet=st.characters(codec="utf-8"), max_size=6),
                 st.sampled_from([" 007 ", "\t1.0\n", "\u00a0x\u2003", "", "a\x1fb"]))


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 3).flatmap(lambda k: st.lists(st.tuples(*[text] * k), min_size=1,
                                                    max_size=8)))
def test_equals_row_by_row_canonical_keys(rows: list[tuple[str | None, ...]]) -> None:
    on = [f"c{i}" for i in range(len(rows[0]))]
    frame = pd.DataFrame(rows, columns=on).astype("string").fillna("")
    # one row at a time: key_bytes refuses a table with repeated keys, and a row with an empty
    # key column (an empty key is no key); such a row's canonical form is normalise_key's
    def canonical(i: int) -> bytes:
        row = frame.iloc[[i]]
        if any(str(v).strip() == "" for v in row.iloc[0]):
            return normalise_key(tuple(row.iloc[0])).encode()
        return key_bytes(row, on)[0]

    want = [canonical(i) for i in range(len(frame))]
    assert text_key_bytes(frame, on) == want
