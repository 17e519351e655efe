"""Batched Chaum–Pedersen proofs over both groups: an honest proof verifies; a list with any one
element changed, two elements swapped, another exponent, another commitment, or a proof
replayed from another session or chunk does not."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vflink.alignment import proofs
from vflink.alignment.groups import Group, get_group

GROUPS = {name: get_group(name, workers=1) for name in ("ristretto255", "modp2048")}


def statement(g: Group, n: int, seed: int) -> tuple[int, np.ndarray, np.ndarray]:
    xs = g.hash_to_group([b"x-%d-%d" % (seed, i) for i in range(n)])
    k = g.random_exponent()
    return k, xs, g.power(xs, k)


@pytest.mark.parametrize("name", sorted(GROUPS))
@settings(max_examples=6, deadline=None)
@given(n=st.integers(1, 9), seed=st.integers(0, 10**6), data=st.data())
def test_honest_proofs_verify_and_every_deviation_fails(name: str, n: int, seed: int,
                                                        data: st.DataObject) -> None:
    g = GROUPS[name]
    k, xs, ys = statement(g, n, seed)
    ctx = proofs.context("psi@1", "p_ts", 0)
    commitment = proofs.commit(g, k)
    proof = proofs.prove(g, k, xs, ys, ctx=ctx)
    assert proofs.verify(g, commitment, xs, ys, proof, ctx=ctx)

    i = data.draw(st.integers(0, n - 1))
    changed = ys.copy()  # one element replaced by another valid element (a guess)
    changed[i] = g.hash_to_group([b"guess-%d" % seed])[0]
    assert not proofs.verify(g, commitment, xs, changed, proof, ctx=ctx)
    # ... also with a fresh proof: no exponent raises xs to that list
    assert not proofs.verify(g, commitment, xs, changed, proofs.prove(g, k, xs, changed,
                                                                      ctx=ctx), ctx=ctx)
    if n > 1:
        j = data.draw(st.integers(0, n - 1).filter(lambda j: j != i))
        swapped = ys.copy()
        swapped[[i, j]] = swapped[[j, i]]
        assert not proofs.verify(g, commitment, xs, swapped, proof, ctx=ctx)
        assert not proofs.verify(g, commitment, xs, swapped,
                                 proofs.prove(g, k, xs, swapped, ctx=ctx), ctx=ctx)
    # another exponent (committed or not), another commitment
    other = g.random_exponent()
    assert not proofs.verify(g, commitment, xs, g.power(xs, other),
                             proofs.prove(g, other, xs, g.power(xs, other), ctx=ctx), ctx=ctx)
    assert not proofs.verify(g, proofs.commit(g, other), xs, ys, proof, ctx=ctx)
    # replayed from another session, list or chunk
    for where in (("psi@2", "p_ts", 0), ("psi@1", "a_s", 0), ("psi@1", "p_ts", 1)):
        assert not proofs.verify(g, commitment, xs, ys, proof, ctx=proofs.context(*where))
    # malformed proofs
    for bad in (b"", proof[:-1], proof + b"\x00", bytes(len(proof)), b"\xff" * len(proof)):
        assert not proofs.verify(g, commitment, xs, ys, bad, ctx=ctx)


@pytest.mark.parametrize("name", sorted(GROUPS))
def test_a_streamed_list_proves_as_a_whole_one(name: str) -> None:
    """Coefficients depend on an element's position, not on how the list is cut."""
    g = GROUPS[name]
    k, xs, ys = statement(g, 11, 1)
    ctx = proofs.context("s", "l", -1)
    whole = proofs.prove(g, k, xs, ys, ctx=ctx)

    def cut(size: int) -> proofs.Pairs:
        return lambda: ((xs[i:i + size], ys[i:i + size]) for i in range(0, len(xs), size))

    for size in (1, 3, 11):
        assert proofs.verify_batches(g, proofs.commit(g, k), cut(size), whole, ctx=ctx)
        assert proofs.verify(g, proofs.commit(g, k), xs, ys,
                             proofs.prove_batches(g, k, cut(size), ctx=ctx), ctx=ctx)


@pytest.mark.parametrize("name", sorted(GROUPS))
def test_an_empty_list_has_a_proof_bound_to_its_session(name: str) -> None:
    g = GROUPS[name]
    k = g.random_exponent()
    ctx = proofs.context("psi@1", "p_ts", -1)
    proof = proofs.prove(g, k, g.empty(), g.empty(), ctx=ctx)
    assert proofs.verify(g, proofs.commit(g, k), g.empty(), g.empty(), proof, ctx=ctx)
    assert not proofs.verify(g, proofs.commit(g, k), g.empty(), g.empty(), proof,
                             ctx=proofs.context("psi@2", "p_ts", -1))


def test_the_combination_is_the_groups_own_arithmetic() -> None:
    """prod x_i^{c_i} through the group equals the product of separate exponentiations."""
    for g in GROUPS.values():
        xs = g.hash_to_group([b"a", b"b", b"c"])
        cs = [3, 0, g.order - 1]
        acc = g.identity()
        for x, c in zip(xs, cs, strict=True):
            if c:
                acc = g.operate(acc, g.power(x[None], c))
        assert np.array_equal(g.combine_elements(xs, cs), acc)
        assert np.array_equal(g.operate(g.identity(), xs[:1]), xs[:1])
