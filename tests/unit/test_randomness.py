"""The one source of protective draws (vflink.randomness): secret by default, reproducible only
behind the switch, exactly the old draws when reproducible, and restorable bit for bit."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import numpy as np
import pytest
import torch

from vflink import randomness
from vflink.randomness import NoiseSource, as_source, keyed_generator, party_secret


def test_a_torch_generator_keeps_only_32_bits_of_its_seed() -> None:
    """Why a secret draw never comes from a seeded torch.Generator: seeds that differ above
    bit 32 give the same stream, so a "63-bit secret seed" is a 2^32 search."""
    for seed in (7, 123_456_789):
        a = torch.randn(5, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        b = torch.randn(5, generator=torch.Generator().manual_seed(seed + 2**32),
                        dtype=torch.float64)
        assert torch.equal(a, b)


def test_a_reproducible_source_draws_exactly_what_a_seeded_torch_generator_drew() -> None:
    # the figures published with a seed repeat under the switch: the same calls, in order
    src, gen = NoiseSource(seed=11), torch.Generator().manual_seed(11)
    assert src.kind == randomness.REPRODUCIBLE and not src.secret
    assert torch.equal(src.normal((4, 3), dtype=torch.float64),
                       torch.randn((4, 3), generator=gen, dtype=torch.float64))
    assert torch.equal(src.normal((6,)), torch.randn((6,), generator=gen))
    assert torch.equal(src.uniform((5,), dtype=torch.float64),
                       torch.rand((5,), generator=gen, dtype=torch.float64))
    assert torch.equal(src.integers(7, (9,)), torch.randint(0, 7, (9,), generator=gen))
    src.reseed(12)
    gen.manual_seed(12)
    assert torch.equal(src.uniform((3,)), torch.rand((3,), generator=gen))
    wrapped = as_source(torch.Generator().manual_seed(11))
    assert torch.equal(wrapped.normal((4, 3), dtype=torch.float64),
                       torch.randn((4, 3), generator=torch.Generator().manual_seed(11),
                                   dtype=torch.float64))


def test_the_secret_source_is_fresh_each_time_and_has_the_right_laws() -> None:
    a, b = NoiseSource(), NoiseSource()
    assert a.kind == randomness.SECRET and a.secret
    x, y = a.normal((200_000,), dtype=torch.float64), b.normal((200_000,), dtype=torch.float64)
    assert not torch.equal(x, y)
    assert abs(float(x.mean())) < 0.015 and float(x.std()) == pytest.approx(1.0, abs=0.01)
    u = a.uniform((200_000,), dtype=torch.float64)
    assert 0.0 <= float(u.min()) and float(u.max()) < 1.0
    assert float(u.mean()) == pytest.approx(0.5, abs=0.005)
    k = a.integers(5, (50_000,))
    assert k.dtype == torch.int64 and set(k.tolist()) == set(range(5))
    assert a.uniform_array(3).dtype == np.float64
    with pytest.raises(TypeError, match="no torch.Generator"):
        _ = a.generator  # a seeded torch generator is never handed out for secret draws
    with pytest.raises(TypeError):
        _ = NoiseSource(seed=1).numpy


def test_a_secret_stream_continues_bit_for_bit_from_its_saved_state() -> None:
    src = NoiseSource()
    src.normal((7,))
    state = src.state()
    assert state["kind"] == "secret"
    first = src.normal((5, 2), dtype=torch.float64)
    other = NoiseSource()  # a resumed process: a new key, then the checkpoint's state
    other.set_state(state)
    assert torch.equal(other.normal((5, 2), dtype=torch.float64), first)
    with pytest.raises(ValueError, match="cannot continue"):
        NoiseSource(seed=3).set_state(state)
    seeded = NoiseSource(seed=3)
    saved = seeded.state()
    again = seeded.uniform((4,))
    seeded.set_state(saved)
    assert torch.equal(seeded.uniform((4,)), again)


def test_keyed_generators_repeat_per_key_and_context_only() -> None:
    key = os.urandom(32)
    a = keyed_generator(key, "stand-ins", 3).permutation(100)
    assert np.array_equal(a, keyed_generator(key, "stand-ins", 3).permutation(100))
    assert not np.array_equal(a, keyed_generator(key, "stand-ins", 4).permutation(100))
    assert not np.array_equal(a, keyed_generator(os.urandom(32), "stand-ins", 3)
                              .permutation(100))
    # context parts are length-prefixed: ("ab", "c") and ("a", "bc") are different streams
    assert keyed_generator(key, "ab", "c").integers(2**62) != \
        keyed_generator(key, "a", "bc").integers(2**62)
    with pytest.raises(ValueError, match="16 bytes"):
        keyed_generator(b"short", "x")


def test_a_party_secret_is_kept_in_its_own_directory(tmp_path: Path) -> None:
    one = party_secret(tmp_path / "bank")
    assert len(one) == 32 and party_secret(tmp_path / "bank") == one
    mode = stat.S_IMODE((tmp_path / "bank" / randomness.PARTY_SECRET_FILE).stat().st_mode)
    assert mode == 0o600  # its owner's only
    assert party_secret(tmp_path / "other") != one
    assert party_secret(None) == party_secret(None)  # one per process without a directory
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / randomness.PARTY_SECRET_FILE).write_bytes(b"x")
    with pytest.raises(ValueError, match="32 bytes"):
        party_secret(tmp_path / "bad")


def test_a_secret_fill_draws_its_first_block_from_its_own_stream_and_the_rest_fresh() -> None:
    """SecretGenerator.standard_normal_fill: the first block is the generator's own next
    draws, the others come from fresh secret streams (so the whole is not the stream's own
    sequence), and the values have the standard normal's laws."""
    g = randomness.secret_generator()
    assert isinstance(g, randomness.SecretGenerator)
    twin = np.random.Generator(type(g.bit_generator)(key=1, rounds=20))
    twin.bit_generator.state = g.bit_generator.state  # the same stream from here
    n = 4 * randomness._FILL_MIN
    got = g.standard_normal_fill((n // 8, 8), threads=2)
    assert got.shape == (n // 8, 8) and got.dtype == np.float64
    own = twin.standard_normal(n)
    flat = got.reshape(-1)
    half = n // 2
    np.testing.assert_array_equal(flat[:half], own[:half])
    assert not np.array_equal(flat[half:], own[half:])
    assert abs(float(flat.mean())) < 0.005 and float(flat.std()) == pytest.approx(1.0, abs=0.005)
    small = g.standard_normal_fill((10,))  # below the threshold: one stream
    assert small.shape == (10,) and np.isfinite(small).all()


def test_an_unseeded_links_noise_is_drawn_from_several_secret_streams(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Eq. 2's noise on a large linkage with the secret source goes through the parallel
    fill; with a seed it is the seeded stream's own draws (test_link_speedups checks those
    values)."""
    from vflink.linkage.search import Neighbours
    from vflink.linkage.soft import soft_linkage

    calls: list[tuple[int, ...]] = []
    fill = randomness.SecretGenerator.standard_normal_fill

    def spy(self: randomness.SecretGenerator, shape: tuple[int, ...],
            **kw: int) -> np.ndarray:
        calls.append(shape)
        return fill(self, shape, **kw)

    monkeypatch.setattr(randomness.SecretGenerator, "standard_normal_fill", spy)
    rng = np.random.default_rng(0)
    d = np.sort(rng.uniform(0, 1, (30_000, 100)), axis=1)
    nb = Neighbours(np.tile(np.arange(100), (30_000, 1)), d, exact=True)
    lk = soft_linkage(nb, metric="euclidean", n_secondary=100, sigma=0.5,
                      rng=randomness.secret_generator())
    assert calls == [(30_000, 100)]
    noise = lk.similarities - lk.raw_similarities()
    assert float(noise.std()) == pytest.approx(0.5, rel=0.01)
    calls.clear()
    soft_linkage(nb, metric="euclidean", n_secondary=100, sigma=0.5, rng=7)
    assert calls == []
