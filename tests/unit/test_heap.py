"""``keep_large_blocks_mapped``: after it, a block above 128 KiB is its own mapping (returned to
the system on free) even after a larger block was freed, which without it raises glibc's
dynamic threshold and sends the next blocks to the arenas. Observed through glibc's own
``mallinfo2().hblks`` (blocks held as mappings), in a fresh process each time."""

from __future__ import annotations

import ctypes
import subprocess
import sys

import pytest

#: What both probes share: glibc's malloc, free and mallinfo2 through ctypes.
PRELUDE = r"""
import ctypes, sys
libc = ctypes.CDLL(None)
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
libc.mallinfo2.restype = Info
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
"""

PROBE = PRELUDE + r"""
if sys.argv[1] == "fixed":
    from vflink.cli._heap import keep_large_blocks_mapped
    assert keep_large_blocks_mapped()
big = libc.malloc(8 << 20)     # a mapping; freeing it raises the dynamic threshold to 8 MiB
libc.free(big)
before = libc.mallinfo2().hblks
chunk = libc.malloc(1 << 20)   # a 1 MiB chunk: a mapping only if the threshold stayed put
print(libc.mallinfo2().hblks - before)
libc.free(chunk)
"""


def _glibc_with_mallinfo2() -> bool:
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None)
    return hasattr(libc, "mallinfo2") and hasattr(libc, "mallopt")


@pytest.mark.skipif(not _glibc_with_mallinfo2(), reason="needs glibc ≥ 2.33 (mallinfo2)")
@pytest.mark.parametrize(("mode", "mapped"), [("default", 0), ("fixed", 1)])
def test_a_chunk_after_a_larger_free_is_mapped_only_with_the_fixed_threshold(
        mode: str, mapped: int) -> None:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True,
                         check=True)
    assert int(out.stdout.strip()) == mapped


def test_elsewhere_it_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    from vflink.cli import _heap

    monkeypatch.setattr(_heap.sys, "platform", "darwin")
    assert _heap.keep_large_blocks_mapped() is False


BATCH_PROBE = PRELUDE + r"""
if sys.argv[1] == "batch":
    from vflink.cli._heap import keep_batch_blocks
    assert keep_batch_blocks()
before = libc.mallinfo2().hblks
block = libc.malloc(8 << 20)   # a batch's block: a mapping of its own with glibc's default
mapped = libc.mallinfo2().hblks - before
libc.free(block)
print(mapped, int(libc.mallinfo2().keepcost >= 8 << 20))  # its pages kept for the next one
"""


@pytest.mark.skipif(not _glibc_with_mallinfo2(), reason="needs glibc ≥ 2.33 (mallinfo2)")
@pytest.mark.parametrize(("mode", "seen"), [("default", "1 0"), ("batch", "0 1")])
def test_a_links_batch_blocks_come_from_the_arena_and_stay_there(mode: str, seen: str) -> None:
    out = subprocess.run([sys.executable, "-c", BATCH_PROBE, mode], capture_output=True,
                         text=True, check=True)
    assert out.stdout.strip() == seen


def test_elsewhere_the_links_setting_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    from vflink.cli import _heap

    monkeypatch.setattr(_heap.sys, "platform", "darwin")
    assert _heap.keep_batch_blocks() is False
