"""vflink._files: writes that never follow a link, reads of run-directory files as data."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vflink import _files
from vflink._files import (
    atomic_open,
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_text,
    check_regular_file,
    json_depth,
    loads_json,
    read_data_file,
    read_json_file,
)
from vflink.errors import DataError, RunError


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "elsewhere" / "victim.txt"
    victim.parent.mkdir()
    victim.write_text("precious\n")
    return victim


# --- writing -----------------------------------------------------------------------------------

def test_a_link_at_the_target_is_replaced_not_followed(tmp_path: Path) -> None:
    victim = _victim(tmp_path)
    target = tmp_path / "report.html"
    target.symlink_to(victim)
    atomic_write_text(target, "<html></html>\n")
    assert victim.read_text() == "precious\n"
    assert not target.is_symlink() and target.read_text() == "<html></html>\n"


def test_the_old_fixed_temporary_names_are_never_written(tmp_path: Path) -> None:
    # the fixed names the writers once used: a link planted there is not followed
    victim = _victim(tmp_path)
    for name in (".report.html.partial", "report.html.tmp", "privacy.json.tmp"):
        (tmp_path / name).symlink_to(victim)
    atomic_write_text(tmp_path / "report.html", "page")
    atomic_write_json(tmp_path / "privacy.json", {"version": 1})
    assert victim.read_text() == "precious\n"
    assert json.loads((tmp_path / "privacy.json").read_text()) == {"version": 1}


def test_a_failing_writer_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "metrics.json"
    target.write_text("old")
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(RuntimeError, match="boom"), atomic_open(target, "w") as fh:
        fh.write("half a new fi")
        raise RuntimeError("boom")
    assert target.read_text() == "old"
    assert sorted(os.listdir(tmp_path)) == before


def test_a_planted_temporary_name_is_skipped(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    victim = _victim(tmp_path)
    names = iter(["aaaa", "bbbb"])
    monkeypatch.setattr(_files.secrets, "token_hex", lambda n: next(names))
    (tmp_path / ".out.bin.aaaa.tmp").symlink_to(victim)  # the first name is taken by a link
    atomic_write_bytes(tmp_path / "out.bin", b"data")
    assert victim.read_text() == "precious\n"
    assert (tmp_path / "out.bin").read_bytes() == b"data"
    assert (tmp_path / ".out.bin.aaaa.tmp").is_symlink()  # left alone, not written through
    assert not (tmp_path / ".out.bin.bbbb.tmp").exists()


def test_when_every_temporary_name_is_taken_nothing_is_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    victim = _victim(tmp_path)
    monkeypatch.setattr(_files.secrets, "token_hex", lambda n: "same")
    (tmp_path / ".out.bin.same.tmp").symlink_to(victim)
    with pytest.raises(FileExistsError):
        atomic_write_bytes(tmp_path / "out.bin", b"data")
    assert victim.read_text() == "precious\n" and not (tmp_path / "out.bin").exists()


def test_permissions_are_set_at_creation(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        atomic_write_bytes(tmp_path / "a.key", b"k", perms=0o600)
        atomic_write_bytes(tmp_path / "b.txt", b"t")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "a.key").st_mode) == 0o600
    assert stat.S_IMODE(os.stat(tmp_path / "b.txt").st_mode) == 0o644


def test_text_mode_handle_for_writers_that_take_one(tmp_path: Path) -> None:
    with atomic_open(tmp_path / "t.csv", "w", newline="") as fh:
        fh.write("a,b\r\n1,2\n")
    assert (tmp_path / "t.csv").read_bytes() == b"a,b\r\n1,2\n"


# --- reading -----------------------------------------------------------------------------------

def test_a_regular_file_inside_the_directory_is_read(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "m.json").write_text('{"a": [1, 2]}')
    assert read_json_file(tmp_path, "sub/m.json") == {"a": [1, 2]}
    assert read_data_file(tmp_path, Path("sub") / "m.json") == b'{"a": [1, 2]}'


def test_a_linked_root_directory_is_fine(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "m.json").write_text("{}")
    (tmp_path / "latest").symlink_to(tmp_path / "run")  # e.g. runs/latest -> runs/2026-...
    assert read_json_file(tmp_path / "latest", "m.json") == {}


def test_a_symlinked_file_is_refused_naming_it(tmp_path: Path) -> None:
    victim = _victim(tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").symlink_to(victim)
    with pytest.raises(DataError, match=r"run/config\.json: is a symbolic link"):
        read_data_file(run, "config.json")
    # even a link to a file inside the directory: it must be the file itself
    (run / "real.json").write_text("{}")
    (run / "alias.json").symlink_to(run / "real.json")
    with pytest.raises(DataError, match="alias.json: is a symbolic link"):
        read_json_file(run, "alias.json")


def test_a_file_reached_through_a_linked_folder_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "truth.json").write_text("{}")
    run = tmp_path / "run"
    run.mkdir()
    (run / "evaluation").symlink_to(outside)
    with pytest.raises(DataError, match="evaluation/truth.json: lies outside the directory"):
        read_json_file(run, "evaluation/truth.json")


def test_not_a_regular_file_is_refused_without_blocking(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")  # opening a FIFO for reading would hang without a writer
    with pytest.raises(DataError, match="fifo: is not a regular file"):
        read_data_file(tmp_path, "fifo")
    (tmp_path / "dir").mkdir()
    with pytest.raises(DataError, match="dir: is not a regular file"):
        read_data_file(tmp_path, "dir")


@pytest.mark.parametrize("relative", ["../x.json", "/etc/hostname", ""])
def test_paths_leaving_the_directory_are_refused(tmp_path: Path, relative: str) -> None:
    with pytest.raises(DataError, match="expected a file inside"):
        check_regular_file(tmp_path, relative)


def test_missing_and_oversize_files(tmp_path: Path) -> None:
    with pytest.raises(RunError, match="nope.json: missing"):
        read_json_file(tmp_path, "nope.json", error=RunError)
    (tmp_path / "big.json").write_text("[" + "0," * 600 + "0]")
    with pytest.raises(DataError, match=r"big.json: is 1,203 bytes; at most 1,000 bytes"):
        read_json_file(tmp_path, "big.json", max_bytes=1000)
    assert len(read_json_file(tmp_path, "big.json", max_bytes=1203)) == 601


# --- JSON limits -------------------------------------------------------------------------------

def _depth_oracle(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((_depth_oracle(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth_oracle(v) for v in value), default=0)
    return 0


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=3), inner,
                                                                 max_size=4),
    max_leaves=30)


@given(json_values)
def test_json_depth_matches_a_recursive_oracle(value: Any) -> None:
    assert json_depth(value) == _depth_oracle(value)


def _nested(depth: int, kinds: list[bool]) -> str:
    opens = "".join('{"k":' if kinds[i % len(kinds)] else "[" for i in range(depth))
    closes = "".join("}" if kinds[i % len(kinds)] else "]" for i in reversed(range(depth)))
    return opens + "0" + closes


@given(depth=st.integers(0, 120), limit=st.integers(1, 100),
       kinds=st.lists(st.booleans(), min_size=1, max_size=5))
def test_nesting_is_accepted_up_to_the_limit_and_refused_beyond(depth: int, limit: int,
                                                                 kinds: list[bool]) -> None:
    text = _nested(depth, kinds)
    if depth <= limit:
        assert loads_json(text, source="m.json", max_depth=limit) == json.loads(text)
    else:
        with pytest.raises(DataError, match=f"m.json: JSON nested more than {limit} levels"):
            loads_json(text, source="m.json", max_depth=limit)


@pytest.mark.parametrize("depth", [1_000, 100_000])
def test_nesting_beyond_the_parser_is_a_data_error_not_a_crash(depth: int) -> None:
    # json.loads alone raises RecursionError here ("unexpected error" in the CLI)
    with pytest.raises(DataError, match="metrics.json: JSON nested more than 100 levels"):
        loads_json("[" * depth + "]" * depth, source="metrics.json")


def test_bad_json_names_the_file() -> None:
    with pytest.raises(DataError, match=r"x.json: not valid JSON \(Expecting"):
        loads_json("{", source="x.json")
    with pytest.raises(DataError, match="x.json: not UTF-8 text"):
        loads_json(b"\xff\xfe", source="x.json")


def test_reserved_space_is_the_files_length_until_cut(tmp_path: Path) -> None:
    from vflink._files import reserve_space

    path = tmp_path / "f.bin"
    with open(path, "wb") as fh:
        assert reserve_space(fh.fileno(), 1 << 20) is True  # Linux, a local filesystem
        assert path.stat().st_size == 1 << 20
        fh.write(b"abc")
        fh.truncate()
    assert path.read_bytes() == b"abc"
    with open(path, "ab") as fh:
        assert reserve_space(fh.fileno(), 0) is False
        assert reserve_space(-1, 10) is False  # a failed call leaves everything as it was
    assert path.read_bytes() == b"abc"
