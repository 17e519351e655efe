"""PSU (FLORIST Algorithm 1) and ECDH PSI step functions against plaintext set operations."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vflink.alignment import psi, psu
from vflink.alignment._dh import lookup, to_hex
from vflink.alignment.groups import Group, get_group

GROUPS = {name: get_group(name, workers=1) for name in ("ristretto255", "modp2048")}

keysets = st.lists(st.integers(0, 40), max_size=14, unique=True)


def run_psu(g: Group, ka: list[bytes], kp: list[bytes]) -> tuple[psu.PsuResult, psu.PsuResult]:
    xa, xp = g.hash_to_group(ka), g.hash_to_group(kp)
    s, t = psu.PsuExponents.draw(g), psu.PsuExponents.draw(g)
    a_st, p_t = psu.lines4_5(g, psu.line3(g, xa, s), xp, t)
    _, union = psu.lines6_8(g, a_st, p_t, s)
    uids = psu.line10(psu.line9(g, union, t), group=g)
    # line 11 as vflink runs it: P_p raises the line-3 list it holds (in P_a's order)
    a_s1, order = psi.blind(g, xa, s.first)
    final = psu.line11_finish(g, psu.line11_peer(g, g.power(a_s1, t.first), t), s)
    mine = np.empty_like(final)
    mine[order] = final
    ra = psu.PsuResult(uids=uids, record_uid=lookup(uids, mine, "own records"))
    rp = psu.finish_own(g, psu.raise_for_peer(g, psu.blind_own(g, xp, t), s), t, uids,
                        expected=len(kp))
    return ra, rp


def check_union(ka: list[bytes], kp: list[bytes], ra: psu.PsuResult, rp: psu.PsuResult) -> None:
    assert len(ra.uids) == len(set(ka) | set(kp))
    assert (ra.uids == rp.uids).all()
    hex_a = dict(zip(ka, to_hex(ra.uids[ra.record_uid])))
    hex_p = dict(zip(kp, to_hex(rp.uids[rp.record_uid])))
    for k in set(ka) & set(kp):
        assert hex_a[k] == hex_p[k]
    assert not (set(hex_a[k] for k in set(ka) - set(kp)) & set(hex_p.values()))
    assert not (set(hex_p[k] for k in set(kp) - set(ka)) & set(hex_a.values()))
    assert len(set(hex_a.values())) == len(ka)  # a bijection
    assert sorted(to_hex(ra.uids)) == to_hex(ra.uids)  # U is sorted (line 10)


@pytest.mark.parametrize("name", sorted(GROUPS))
@settings(max_examples=12, deadline=None)
@given(a=keysets, p=keysets)
def test_psu_equals_plaintext_union(name: str, a: list[int], p: list[int]) -> None:
    ka = [f"id-{i}".encode() for i in a]
    kp = [f"id-{i}".encode() for i in p]
    ra, rp = run_psu(GROUPS[name], ka, kp)
    check_union(ka, kp, ra, rp)


@pytest.mark.parametrize("name", sorted(GROUPS))
@settings(max_examples=12, deadline=None)
@given(a=keysets, p=keysets)
def test_psi_equals_plaintext_intersection(name: str, a: list[int], p: list[int]) -> None:
    g = GROUPS[name]
    ka = [f"id-{i}".encode() for i in a]
    kp = [f"id-{i}".encode() for i in p]
    x, y = g.hash_to_group(ka), g.hash_to_group(kp)
    ea, eb = g.random_exponent(), g.random_exponent()
    sent, order = psi.blind(g, x, ea)
    a_st = psi.reblind(g, sent, eb, keep_order=True)
    p_t, p_order = psi.blind(g, y, eb)
    p_ts = psi.reblind(g, p_t, ea, keep_order=True)
    ra = psi.intersect(a_st, order, p_ts, ordered=True)
    rb = psi.intersect(p_ts, p_order, a_st, ordered=True)
    both = set(a) & set(p)
    assert ra.size == rb.size == len(both)
    assert ra.rows is not None and rb.rows is not None
    assert sorted(a[i] for i in ra.rows) == sorted(both)
    assert sorted(p[i] for i in rb.rows) == sorted(both)
    # the shared identifiers agree record by record
    assert assert_pairs(ra, rb, a, p)
    hidden = psi.intersect(psi.reblind(g, sent, eb, keep_order=False), order, p_ts,
                           ordered=False)
    assert hidden.size == len(both) and hidden.rows is None


def assert_pairs(ra: psi.PsiResult, rb: psi.PsiResult, a: list[int], p: list[int]) -> bool:
    assert ra.uids is not None and rb.uids is not None and ra.rows is not None \
        and rb.rows is not None
    uid_a = {a[r]: u for r, u in zip(ra.rows, to_hex(ra.uids))}
    uid_b = {p[r]: u for r, u in zip(rb.rows, to_hex(rb.uids))}
    return uid_a == uid_b


@pytest.mark.parametrize("name", sorted(GROUPS))
def test_simulators_produce_the_protocol_sizes(name: str) -> None:
    g = GROUPS[name]
    va = psu.simulate_active_view(g, 5, 7, 3)
    vp = psu.simulate_passive_view(g, 5, 7, 3)
    assert {k: len(v) for k, v in va.items()} == {"a_s1t1": 5, "p_t1": 7, "union": 9,
                                                  "a_s1t123": 5, "p_t2": 7}
    assert {k: len(v) for k, v in vp.items()} == {"a_s1": 5, "p_s1t1": 7, "union_s123t1": 9,
                                                  "p_s123t2": 7}
    for v in (*va.values(), *vp.values()):
        g.validate(v, "simulated")
    # S_a's p_t1 shares exactly |I_a ∩ I_p| elements with the g_i behind a_s1t1 (line 6)
    assert len(np.unique(np.concatenate([va["p_t1"]]), axis=0)) == 7
