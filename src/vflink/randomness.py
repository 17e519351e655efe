"""Where every protective random draw comes from: secret by default, reproducible on request.

A *protective draw* is randomness that hides something from a peer: the Gaussian noise of
label DP, Marvell and max-norm on the gradients the primary sends back, the noise of DP on
embeddings and randomized response at a secondary, the coordinator's noise on similarities
(FedSim Eq. 2), the synthetic rows and labels of union training (FLORIST), and the secret
exponents and shuffles of PSI/PSU. Every one of them is drawn here, by the party that applies
the protection, in its own process (in-process, ``--party`` over gRPC, ``vflink serve``d, or in
a Ray worker alike).

Two sources (docs/security.md, "Secret randomness"):

* **secret** (the default): a ChaCha20 stream (``randomgen.ChaCha``, 20 rounds, the cipher of
  RFC 8439) keyed with 256 bits from the operating system's CSPRNG (:func:`secrets.randbits`,
  i.e. ``getrandom``), wrapped in a :class:`numpy.random.Generator`. Nothing a peer receives or
  can guess (a run seed, a model spec's seed, a session name, a small integer) enters it.
* **reproducible**: the generators the project used before (``torch.Generator`` /
  ``numpy.random.default_rng`` seeded from the run's seed), only behind the one switch
  ``[privacy] reproducible_noise = true``. Whoever knows the seed regenerates every draw and
  subtracts it: the ledger, the run's summary line and the report then say
  :data:`NOT_PRIVATE`. In-process simulations and the paper reproductions use it to repeat
  their published figures bit for bit.

Why not a seeded ``torch.Generator`` or PCG64 with a secret seed: a protection is only as
secret as the state its noise comes from. torch's CPU generator is MT19937 and keeps only the
low 32 bits of ``manual_seed`` (seeds ``s`` and ``s + 2**32`` give the same stream; a test
shows it), so a "secret 63-bit seed" is a 2^32 search that one batch's noisy gradients
confirm; MT19937 is also linear, its state follows from 624 outputs. A 64- or 128-bit secret
seed of PCG64 cannot be searched, but PCG64 is not a cryptographic generator: its state has
been recovered from its outputs (Bouillaguet, Martinez & Sauvage, ToSC 2020), and every noisy
gradient a peer receives is an output up to a bounded signal. A stream cipher keyed from the
OS leaks nothing of its key or of its other outputs from any number of outputs, which is what
Opacus' ``secure_mode`` (a CSPRNG) and Google's DP library rely on. It costs 1.4 times a seeded
torch generator's time per normal and twice PCG64's (≈ 32 ms per million, 13 µs for a batch's
label noise: ``benchmarks/noise_source.py``), negligible beside a training step.

Not covered (as in Opacus and the papers): floating-point attacks on the sampler itself
(Mironov 2012; Jin et al., S&P 2022), which read the low bits of a released noisy double; what
crosses the boundary here is rounded to float32 after the signal is added.

PSI/PSU exponents, key-confirmation nonces and the data parties' HMAC secret are never
reproducible, whatever the switch: a reproducible exponent would break the protocol itself.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from vflink._threads import MAX_PASS_THREADS, cores

FloatArray = npt.NDArray[np.float64]

if TYPE_CHECKING:
    import torch

__all__ = ["NOT_PRIVATE", "REPRODUCIBLE", "SECRET", "SWITCH", "NoiseSource", "SecretGenerator",
           "as_source", "describe", "keyed_generator", "party_secret", "secret_below",
           "secret_bytes", "secret_generator", "secret_int"]

#: The kinds of source, as the ledger's ``noise`` field names them.
SECRET, REPRODUCIBLE = "secret", "reproducible"
#: The one switch that makes protective draws reproducible (a run file's / party file's key).
SWITCH = "[privacy] reproducible_noise"
#: What the ledger, the summary line and the report say of a reproducible source.
NOT_PRIVATE = "not private: the noise can be regenerated"

#: ChaCha rounds: 20 is the full cipher (RFC 8439); fewer would trade security for speed.
_ROUNDS = 20


def _chacha_bits(key: int) -> Any:
    """randomgen's ChaCha20 bit generator keyed with ``key``. randomgen is imported here, on
    the first stream made, not with this module: its import registers every bit generator it
    has (12 ms here), which a link without noise (privacy off) never uses."""
    from randomgen import ChaCha

    return ChaCha(key=key, rounds=_ROUNDS)


def describe(kind: str) -> str:
    """A plain sentence on a source kind (for the ledger's explanations)."""
    if kind == REPRODUCIBLE:
        return (f"{NOT_PRIVATE} (the noise was seeded from the run's seed: `{SWITCH} = true`); "
                "whoever holds that seed can subtract it")
    return ("the noise came from a ChaCha20 stream keyed by the operating system's secure "
            "random source, never from a seed a peer knows")


# --- raw secrets ------------------------------------------------------------------------------


def secret_bytes(n: int) -> bytes:
    """``n`` bytes from the OS CSPRNG (keys, nonces)."""
    return secrets.token_bytes(n)


def secret_int(bits: int) -> int:
    """A uniform integer of ``bits`` bits from the OS CSPRNG."""
    return secrets.randbits(bits)


def secret_below(n: int) -> int:
    """A uniform integer in [0, n) from the OS CSPRNG (PSI/PSU exponents)."""
    return secrets.randbelow(n)


# --- generators -------------------------------------------------------------------------------


class SecretGenerator(np.random.Generator):
    """A numpy Generator on ChaCha20 keyed with 256 bits from the OS CSPRNG: the secret source.

    Its draws cannot be regenerated by anyone, this process included, so which stream an
    array of them comes from changes nothing a peer can compute: :meth:`standard_normal_fill`
    fills a large one from several such streams at once (one thread each), where a seeded
    generator must give its own stream's values in order."""

    def standard_normal_fill(self, shape: tuple[int, ...], *,
                             threads: int | None = None) -> FloatArray:
        """Standard normals of ``shape``: the first block of rows from this stream, each other
        block from a fresh secret ChaCha20 stream, the blocks drawn at once on ``threads``
        threads (default: one per core, at most eight; each Generator releases the GIL while
        it fills; ChaCha20 in software made this the private link's slowest draw: 0.49 s for
        14 M normals on one core)."""
        if threads is None:
            threads = min(cores(), MAX_PASS_THREADS)
        out = np.empty(shape, dtype=np.float64)
        flat = out.reshape(-1)
        parts = max(1, min(threads, flat.size // _FILL_MIN or 1))
        if parts == 1:
            self.standard_normal(out=flat)
            return out
        bounds = np.linspace(0, flat.size, parts + 1).astype(np.int64)
        streams = [self, *(secret_generator() for _ in range(parts - 1))]
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(parts) as pool:
            list(pool.map(lambda i: streams[i].standard_normal(
                out=flat[bounds[i]:bounds[i + 1]]), range(parts)))
        return out


#: Draws per stream below which :meth:`SecretGenerator.standard_normal_fill` uses one stream.
_FILL_MIN = 1 << 20


def secret_generator() -> SecretGenerator:
    """A fresh numpy Generator on ChaCha20 keyed with 256 bits from the OS CSPRNG."""
    return SecretGenerator(_chacha_bits(secrets.randbits(256)))


def keyed_generator(key: bytes, *context: bytes | str | int) -> np.random.Generator:
    """A numpy Generator on ChaCha20 keyed by BLAKE2b(``key``, ``context``): the same secret
    key and context give the same stream (a party's fixed assignment of stand-in rows), two
    contexts give independent ones; without ``key`` nothing about the stream can be told."""
    if len(key) < 16:
        raise ValueError("a keyed generator needs a key of at least 16 bytes")
    h = hashlib.blake2b(digest_size=32, key=key[:64], person=b"vflink-keyed-rng")
    for part in context:
        raw = part if isinstance(part, bytes) else str(part).encode()
        h.update(len(raw).to_bytes(8, "little"))
        h.update(raw)
    return np.random.Generator(_chacha_bits(int.from_bytes(h.digest(), "little")))


_PROCESS_SECRET: bytes | None = None
_PROCESS_LOCK = threading.Lock()
#: The file a party keeps its long-lived noise key in, inside its own state directory.
PARTY_SECRET_FILE = "_noise-key"


def party_secret(state_dir: Path | None = None) -> bytes:
    """A party's long-lived 32-byte secret for keyed streams that must repeat across runs
    (FLORIST's stand-in rows: a peer comparing two runs must not see them change).

    Kept in ``state_dir/_noise-key`` (created once, readable by its owner only) when the party
    has a state directory; otherwise one secret for the life of this process."""
    global _PROCESS_SECRET
    if state_dir is None:
        with _PROCESS_LOCK:
            if _PROCESS_SECRET is None:
                _PROCESS_SECRET = secrets.token_bytes(32)
            return _PROCESS_SECRET
    path = Path(state_dir) / PARTY_SECRET_FILE
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        fresh = secrets.token_bytes(32)
        try:  # exclusive create: two processes starting at once agree on the first key
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            data = path.read_bytes()
        else:
            with os.fdopen(fd, "wb") as f:
                f.write(fresh)
                f.flush()
                os.fsync(f.fileno())
            return fresh
    if len(data) != 32:
        raise ValueError(f"{path}: a party's noise key is 32 bytes, found {len(data)}; "
                         "remove the file to start a new key")
    return data


class NoiseSource:
    """One party's stream of protective draws, as torch tensors or numpy arrays.

    ``NoiseSource()`` is secret (ChaCha20 keyed from the OS). ``NoiseSource(seed=s)`` is
    reproducible: exactly the draws of ``torch.Generator().manual_seed(s)`` that the project
    made before this source existed (``torch.randn`` / ``torch.rand`` / ``torch.randint``), so
    that figures published with a seed repeat; it is built only where the run asked for
    ``[privacy] reproducible_noise``.
    """

    def __init__(self, *, seed: int | None = None) -> None:
        import torch

        self._torch: torch.Generator | None = None
        self._numpy: np.random.Generator | None = None
        if seed is None:
            self._numpy = secret_generator()
        else:
            self._torch = torch.Generator().manual_seed(int(seed))

    @classmethod
    def wrap(cls, generator: torch.Generator) -> NoiseSource:
        """A reproducible source on an existing seeded ``torch.Generator`` (tests, callers
        that hold one)."""
        out = cls.__new__(cls)
        out._torch, out._numpy = generator, None
        return out

    @property
    def kind(self) -> str:
        return SECRET if self._numpy is not None else REPRODUCIBLE

    @property
    def secret(self) -> bool:
        return self._numpy is not None

    @property
    def generator(self) -> torch.Generator:
        """The seeded torch generator of a reproducible source (refused for a secret one:
        a torch generator's state is not secret, see the module's docstring)."""
        if self._torch is None:
            raise TypeError("a secret noise source has no torch.Generator")
        return self._torch

    def reseed(self, seed: int) -> None:
        """A reproducible source's next stream (a fixed seed's later runs, see
        :meth:`vflink.privacy.budget.ReleaseBudget.claim_stream_seed`)."""
        self.generator.manual_seed(int(seed))

    @property
    def numpy(self) -> np.random.Generator:
        """The secret source's numpy Generator (ChaCha20), for draws numpy makes (choices,
        permutations); a reproducible source has none (its draws are torch's)."""
        return self._chacha

    @property
    def _chacha(self) -> np.random.Generator:
        if self._numpy is None:
            raise TypeError("a reproducible noise source draws through its torch.Generator")
        return self._numpy

    # --- draws ----------------------------------------------------------------------------

    def normal(self, shape: Sequence[int], dtype: torch.dtype | None = None) -> torch.Tensor:
        """Standard normal draws (float32 unless ``dtype``)."""
        import torch

        dtype = dtype or torch.float32
        size = tuple(int(s) for s in shape)
        if self._torch is not None:
            return torch.randn(size, generator=self._torch, dtype=dtype)
        return torch.from_numpy(self._chacha.standard_normal(size)).to(dtype)

    def uniform(self, shape: Sequence[int], dtype: torch.dtype | None = None) -> torch.Tensor:
        """Uniform draws on [0, 1) (float32 unless ``dtype``)."""
        import torch

        dtype = dtype or torch.float32
        size = tuple(int(s) for s in shape)
        if self._torch is not None:
            return torch.rand(size, generator=self._torch, dtype=dtype)
        return torch.from_numpy(self._chacha.random(size)).to(dtype)

    def integers(self, high: int, shape: Sequence[int]) -> torch.Tensor:
        """Uniform integers in [0, high) (int64)."""
        import torch

        size = tuple(int(s) for s in shape)
        if self._torch is not None:
            return torch.randint(0, int(high), size, generator=self._torch)
        return torch.from_numpy(self._chacha.integers(0, int(high), size, dtype=np.int64))

    def uniform_array(self, n: int) -> npt.NDArray[np.float64]:
        """``n`` float64 uniforms on [0, 1) as a numpy array."""
        import torch

        return self.uniform((n,), dtype=torch.float64).numpy()

    # --- state (a party's own checkpoint: as private as the data it protects) -------------

    def state(self) -> dict[str, Any]:
        """The source's position, to continue it after a resume bit for bit. A secret source's
        state holds its key: it belongs in the party's own checkpoint only, never sent."""
        if self._torch is not None:
            return {"kind": REPRODUCIBLE, "torch": self._torch.get_state()}
        s = self._chacha.bit_generator.state["state"]
        return {"kind": SECRET, "block": np.asarray(s["block"], dtype=np.uint32).copy(),
                "key": np.asarray(s["keysetup"], dtype=np.uint32).copy(),
                "counter": np.asarray(s["ctr"], dtype=np.uint64).astype(np.int64),
                "rounds": int(s["rounds"])}

    def set_state(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state` (of a source of the same kind)."""
        kind = state.get("kind")
        if kind != self.kind:
            raise ValueError(f"a {self.kind} noise source cannot continue a {kind} one")
        if self._torch is not None:
            self._torch.set_state(state["torch"])
            return
        bg = self._chacha.bit_generator
        full = dict(bg.state)
        full["state"] = {"block": np.asarray(state["block"], dtype=np.uint32),
                         "keysetup": np.asarray(state["key"], dtype=np.uint32),
                         "ctr": np.asarray(state["counter"], dtype=np.int64).astype(np.uint64),
                         "rounds": int(state["rounds"])}
        bg.state = full


def as_source(generator: torch.Generator | NoiseSource) -> NoiseSource:
    """``generator`` as a :class:`NoiseSource` (a ``torch.Generator`` is a reproducible one)."""
    return generator if isinstance(generator, NoiseSource) else NoiseSource.wrap(generator)
