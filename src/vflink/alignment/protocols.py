"""The PSI protocols by name, as data (no numpy): what a run file, a party's policy and the
``--protocol`` flag may name, and which of them run on the optional engine
(:mod:`vflink.alignment.engine`).

``dh`` is vflink's own Diffie–Hellman PSI (:mod:`vflink.alignment.psi`), whose answers carry
proofs; ``rr22`` (Raghuraman and Rindal, CCS 2022) and ``kkrt`` (Kolesnikov, Kumaresan,
Rosulek and Trieu, CCS 2016) are OT-extension PSIs from SecretFlow's ``spu``, an optional
extra, semi-honest only.
"""

from __future__ import annotations

__all__ = ["ENGINE_PROTOCOLS", "ENGINE_REVEALS", "INSTALL", "PSI_PROTOCOLS", "PYTHONS"]

PSI_PROTOCOLS: tuple[str, ...] = ("dh", "rr22", "kkrt")
ENGINE_PROTOCOLS: tuple[str, ...] = ("rr22", "kkrt")
#: who learns the intersection through the engine (it has no size-only mode)
ENGINE_REVEALS: tuple[str, ...] = ("both", "primary", "secondary")
#: how the engine installs, and where it exists (spu 0.9.5 ships cp310 and cp311 wheels only)
INSTALL = "pip install 'vflink[rr22]'"
PYTHONS = "3.10 and 3.11"
