"""Files from elsewhere are data, never a lever (docs/reference/file-formats.md).

Two halves, usable from every layer:

* **Writing.** Every file vflink writes is created under a fresh random name in the target's
  own folder, opened with ``O_CREAT | O_EXCL | O_NOFOLLOW`` (so a link or file planted under
  that name makes the open fail instead of being followed), written, and renamed onto the
  target. ``rename`` replaces a target *name* that is a symlink; it never writes through it,
  so a link planted in a run directory someone else made (``report.html`` →
  ``~/.bashrc``) is replaced, and what it pointed to is untouched. A writer that fails leaves
  no temporary file behind and the old target as it was.

* **Reading a directory someone else made.** A file read from a run directory must be a
  regular file (not a symlink, FIFO or device), whose resolved path lies inside that
  directory, and no larger than a limit; JSON is parsed with a size and a nesting-depth limit.
  Each refusal raises :class:`~vflink.errors.DataError` (or the error type the caller asks
  for) naming the file and what was expected, which the CLI turns into exit 2.
"""

from __future__ import annotations

import io
import json
import logging
import os
import secrets
import stat
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from vflink.errors import DataError, VflinkError

__all__ = [
    "MAX_FILE_BYTES",
    "MAX_JSON_BYTES",
    "MAX_JSON_DEPTH",
    "atomic_open",
    "atomic_write_bytes",
    "atomic_write_json",
    "atomic_write_text",
    "check_directory",
    "check_regular_file",
    "json_depth",
    "loads_json",
    "log_dir",
    "open_data_bytes",
    "read_data_file",
    "read_json_file",
    "reserve_space",
    "table_format",
]

#: Largest JSON file read from a run directory (metrics, configs, ledgers, state headers are
#: kilobytes to a few megabytes; a run's tensors live in other files).
MAX_JSON_BYTES = 64 * 1024 * 1024
#: Deepest nesting of arrays/objects accepted; vflink's own files nest about ten levels (an
#: optimiser state in a state file), and the C parser gives up near 1000 with RecursionError.
MAX_JSON_DEPTH = 100
#: Default limit for other files read whole (a plot, an ``.npz`` of recorded messages).
MAX_FILE_BYTES = 4 * 1024 * 1024 * 1024

_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_BINARY = getattr(os, "O_BINARY", 0)  # Windows: no newline translation at the fd level
_O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)  # never hang opening a FIFO planted in a run

ErrorType = Callable[[str], VflinkError]

log = logging.getLogger(__name__)


def log_dir() -> Path:
    """Where vflink writes the log files it names in messages (an unexpected error's trace, a
    party's internal-error incident): ``$VFLINK_LOG_DIR``, else the system's temporary folder
    (docs/reference/exit-codes.md)."""
    return Path(os.environ.get("VFLINK_LOG_DIR") or tempfile.gettempdir())


# --- writing -----------------------------------------------------------------------------------

def _create_temp(target: Path, mode: int) -> tuple[int, Path]:
    """A new, empty file beside ``target`` under a random name, opened exclusively."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | _O_BINARY
    for _ in range(100):
        tmp = target.with_name(f".{target.name}.{secrets.token_hex(8)}.tmp")
        try:
            return os.open(tmp, flags, mode), tmp
        except FileExistsError:
            continue  # someone holds that name (by chance or on purpose): take another
    raise FileExistsError(f"{target}: could not create a temporary file beside it")


@contextmanager
def atomic_open(path: Path | str, mode: str = "wb", *, perms: int = 0o666, fsync: bool = False,
                newline: str | None = None) -> Iterator[IO[Any]]:
    """Yield an open file (``"wb"`` or ``"w"``, UTF-8) that becomes ``path`` when the block
    ends without an error; on an error the temporary file is removed and ``path`` is left as it
    was. ``perms`` is the new file's mode (less the umask), e.g. ``0o600`` for a private key.

    Hand the *handle* to writers that take one (pandas, pyarrow, numpy, matplotlib), never the
    temporary file's name: reopening by name could follow a link swapped in meanwhile.
    """
    if mode not in ("wb", "w"):
        raise ValueError(f"atomic_open: mode must be 'wb' or 'w', got {mode!r}")
    target = Path(path)
    fd, tmp = _create_temp(target, perms)
    try:
        if mode == "wb":
            fh: IO[Any] = os.fdopen(fd, "wb")
        else:
            fh = os.fdopen(fd, "w", encoding="utf-8", newline=newline)
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    try:
        with fh:
            yield fh
            fh.flush()
            if fsync:
                os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


#: glibc's ``fallocate`` (a ctypes function), ``False`` where this C library has none; looked
#: up on first use.
_FALLOCATE: Any = None


def reserve_space(fd: int, size: int) -> bool:
    """Allocate ``size`` bytes of disk to the empty file open as ``fd`` before it is written
    (Linux's ``fallocate``, mode 0: the file's length becomes ``size``); the writer then cuts
    the file at the end of what it wrote (``truncate()`` at its position). True where the
    space was allocated.

    Writing into blocks allocated up front took a tenth less time than letting the
    filesystem allocate them as each page is written (ext4; the 14 M links of FedSim's house
    scale in 15 Parquet parts of 24 MB on two threads: 0.177 s against 0.197 s, medians of
    eight runs alternately). The system call only: glibc's ``posix_fallocate`` writes zeros
    through a filesystem that cannot allocate (twice the bytes written); here such a
    filesystem, a full disk or any other failure leaves the file as it was (False), and the
    write goes on as it would have."""
    global _FALLOCATE
    if size <= 0 or not sys.platform.startswith("linux"):
        return False
    if _FALLOCATE is None:
        try:
            import ctypes

            fn = ctypes.CDLL(None, use_errno=True).fallocate
            fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
            fn.restype = ctypes.c_int
            _FALLOCATE = fn
        except (OSError, AttributeError):
            _FALLOCATE = False
    return bool(_FALLOCATE) and _FALLOCATE(fd, 0, 0, int(size)) == 0


def atomic_write_bytes(path: Path | str, data: bytes, *, perms: int = 0o666,
                       fsync: bool = False) -> None:
    """Write ``data`` to ``path`` atomically, never through a symlink (see module docs)."""
    with atomic_open(path, "wb", perms=perms, fsync=fsync) as fh:
        fh.write(data)


def atomic_write_text(path: Path | str, text: str, *, perms: int = 0o666,
                      fsync: bool = False) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically, never through a symlink."""
    atomic_write_bytes(path, text.encode("utf-8"), perms=perms, fsync=fsync)


def atomic_write_json(path: Path | str, data: Any, *, indent: int | None = 2,
                      default: Callable[[Any], Any] | None = str, fsync: bool = False) -> None:
    """``json.dumps(data, indent=indent, default=default)`` and a newline, written atomically."""
    atomic_write_text(path, json.dumps(data, indent=indent, default=default) + "\n",
                      fsync=fsync)


# --- reading -----------------------------------------------------------------------------------

def _inside(root: Path, relative: Path | str, error: ErrorType) -> tuple[Path, Path]:
    """(the path as given, the real directory it must stay in)."""
    root = Path(root)
    rel = Path(relative)
    if rel.is_absolute() or ".." in rel.parts or not rel.parts:
        raise error(f"{root / rel}: expected a file inside {root}, got {str(relative)!r}")
    return root / rel, Path(os.path.realpath(root))


def _refuse(path: Path, what: str, error: ErrorType) -> VflinkError:
    return error(f"{path}: {what}")


def _check(path: Path, real_root: Path, st: os.stat_result, error: ErrorType) -> None:
    if stat.S_ISLNK(st.st_mode):
        raise _refuse(path, "is a symbolic link; a file in a run directory must be a regular "
                      "file inside it (copy the file itself into the run directory)", error)
    if not stat.S_ISREG(st.st_mode):
        raise _refuse(path, "is not a regular file (a directory, FIFO, socket or device); "
                      "expected a regular file", error)
    real = Path(os.path.realpath(path))
    if real != real_root and real_root not in real.parents:
        raise _refuse(path, f"lies outside the directory {real_root} (through a linked "
                      "folder); a file in a run directory must be inside it", error)


def check_directory(path: Path | str, what: str, *, error: ErrorType = DataError) -> Path:
    """``path`` if it is a folder; otherwise ``error`` saying that it does not exist (with the
    folders beside it whose names come closest, and the working folder for a relative path)
    or that it is a file. ``what`` names what was expected, e.g. ``"a run directory"``."""
    import difflib

    path = Path(path)
    if path.is_dir():
        return path
    if path.exists() or path.is_symlink():
        raise error(f"{path}: is a file, not a folder; expected {what}")
    parent = path.parent if str(path.parent) else Path(".")
    where = "" if path.is_absolute() else f" (from the working folder {Path.cwd()})"
    hint = ""
    try:
        beside = sorted(p.name for p in parent.iterdir() if p.is_dir()) if parent.is_dir() \
            else []
    except OSError:
        beside = []
    close = difflib.get_close_matches(path.name, beside, n=3, cutoff=0.5)
    if close:
        hint = f"; did you mean {', '.join(str(parent / c) for c in close)}?"
    elif beside:
        shown = ", ".join(beside[:8]) + (", ..." if len(beside) > 8 else "")
        hint = f"; {parent} holds: {shown}"
    elif not parent.is_dir():
        hint = f"; its folder {parent} does not exist either"
    raise error(f"{path}: no such folder{where}; expected {what}{hint}")


def check_regular_file(root: Path | str, relative: Path | str, *,
                       error: ErrorType = DataError) -> Path:
    """``root/relative`` if it is a regular file inside ``root`` (not a link, not reached
    through a linked folder); raises ``error`` naming it otherwise, also when it is missing."""
    path, real_root = _inside(Path(root), relative, error)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise _refuse(path, "missing", error) from None
    except OSError as exc:
        raise _refuse(path, f"cannot be read ({exc.strerror or exc})", error) from None
    _check(path, real_root, st, error)
    return path


def read_data_file(root: Path | str, relative: Path | str, *, max_bytes: int = MAX_FILE_BYTES,
                   error: ErrorType = DataError) -> bytes:
    """The bytes of ``root/relative``, a regular file inside ``root`` of at most ``max_bytes``.

    The file is opened with ``O_NOFOLLOW`` and checked again once open (``fstat``), so a link
    swapped in after the first check is refused too.
    """
    path = check_regular_file(root, relative, error=error)
    try:
        fd = os.open(path, os.O_RDONLY | _O_NOFOLLOW | _O_NONBLOCK | _O_BINARY)
    except OSError as exc:
        raise _refuse(path, f"cannot be read ({exc.strerror or exc}); expected a regular "
                      "file", error) from None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise _refuse(path, "is not a regular file", error)
        if st.st_size > max_bytes:
            raise _refuse(path, f"is {st.st_size:,} bytes; at most {max_bytes:,} bytes are "
                          "read from a file of a run directory", error)
        data = fh.read(max_bytes + 1)
    if len(data) > max_bytes:  # grew while being read
        raise _refuse(path, f"is larger than {max_bytes:,} bytes", error)
    return data


def json_depth(value: Any) -> int:
    """Nesting depth of a parsed JSON value (a scalar is 0, ``[]`` is 1), without recursion."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            item = list(item.values())
        elif not isinstance(item, list):
            continue
        depth += 1
        deepest = max(deepest, depth)
        stack.extend((v, depth) for v in item if isinstance(v, (dict, list)))
    return deepest


def loads_json(data: bytes | str, *, source: str, max_depth: int = MAX_JSON_DEPTH,
               error: ErrorType = DataError) -> Any:
    """Parse JSON text from ``source`` (named in errors), refusing nesting beyond
    ``max_depth``.

    The C parser turns nesting deeper than the interpreter's recursion limit into a
    ``RecursionError`` (it never crashes); that and anything deeper than ``max_depth`` become
    ``error``, so a hostile file can neither crash a command nor make later code recurse
    without bound.
    """
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
        value = json.loads(text)
    except RecursionError:
        raise error(f"{source}: JSON nested more than {max_depth} levels deep") from None
    except UnicodeDecodeError as exc:
        raise error(f"{source}: not UTF-8 text ({exc.reason} at byte {exc.start}); "
                    "expected JSON") from None
    except ValueError as exc:
        raise error(f"{source}: not valid JSON ({exc})") from None
    if json_depth(value) > max_depth:
        raise error(f"{source}: JSON nested more than {max_depth} levels deep")
    return value


def read_json_file(root: Path | str, relative: Path | str, *,
                   max_bytes: int = MAX_JSON_BYTES, max_depth: int = MAX_JSON_DEPTH,
                   error: ErrorType = DataError) -> Any:
    """Parse ``root/relative`` as JSON: a regular file inside ``root``, within the limits."""
    data = read_data_file(root, relative, max_bytes=max_bytes, error=error)
    return loads_json(data, source=str(Path(root) / relative), max_depth=max_depth,
                      error=error)


def open_data_bytes(root: Path | str, relative: Path | str, *,
                    max_bytes: int = MAX_FILE_BYTES, error: ErrorType = DataError
                    ) -> io.BytesIO:
    """:func:`read_data_file` as a binary stream (for ``numpy.load``)."""
    return io.BytesIO(read_data_file(root, relative, max_bytes=max_bytes, error=error))


# --- what a table file holds -------------------------------------------------------------------

#: Formats vflink reads a table from; "csv" and "tsv" may be gzip-compressed (``.gz``).
TABLE_FORMATS = ("csv", "tsv", "parquet")
#: The format each name promises (a ``.gz`` name promises gzip-compressed CSV or TSV).
_BY_SUFFIX = {".csv": "csv", ".tsv": "tsv", ".txt": "csv", ".parquet": "parquet",
              ".pq": "parquet"}
#: Files that are not tables vflink reads, by their first bytes: what they are, and the fix.
_NOT_TABLES = (
    (b"PK\x03\x04", "a ZIP archive (an Excel .xlsx workbook, or a zipped file)",
     "export the sheet as CSV (File > Save as > CSV UTF-8), or unzip the file"),
    (b"\xd0\xcf\x11\xe0", "an Excel 97-2003 (.xls) workbook",
     "export the sheet as CSV (File > Save as > CSV UTF-8)"),
    (b"ARROW1", "an Arrow IPC / Feather file", "write it as Parquet (pyarrow.parquet."
     "write_table, or DataFrame.to_parquet)"),
    (b"\x89HDF", "an HDF5 file", "write the table as Parquet or CSV"),
    (b"SQLite format 3\x00", "an SQLite database", "export the table as CSV"),
    (b"%PDF", "a PDF document", "export the table as CSV"),
    (b"BZh", "a bzip2-compressed file", "decompress it (bunzip2), or compress it with gzip "
     "as .csv.gz"),
    (b"\xfd7zXZ\x00", "an xz-compressed file", "decompress it (unxz), or compress it with "
     "gzip as .csv.gz"),
    (b"(\xb5/\xfd", "a zstd-compressed file", "decompress it (unzstd), or compress it with "
     "gzip as .csv.gz"),
)
#: Bytes read to tell text from binary content.
_SNIFF_BYTES = 64 * 1024


def _promised(path: Path) -> tuple[str | None, bool]:
    """(format, gzip) that the file's name promises; format None for a name vflink does not
    know (``.dat``...)."""
    name = path.name.lower()
    gz = name.endswith(".gz")
    inner = Path(name[:-3]) if gz else Path(name)
    fmt = _BY_SUFFIX.get(inner.suffix)
    if gz and fmt is None:
        fmt = "csv"  # "x.gz": gzip-compressed CSV, as before
    return fmt, gz


def table_format(path: Path | str) -> str:
    """What the table file ``path`` holds, from its first bytes: ``"parquet"`` (a Parquet
    file, or a directory of Parquet parts), ``"csv"`` or ``"tsv"`` (text, gzip-compressed
    when its name ends in ``.gz``).

    The content decides, not the name: a CSV saved as ``people.parquet`` is read as CSV and
    a Parquet file named ``.csv`` as Parquet, each with a warning naming the mismatch. A file
    that is no table vflink reads (an Excel workbook, a ZIP archive, Feather, a PDF, binary
    bytes) or whose compression contradicts its name raises :class:`DataError` naming the
    file, what it holds and the fix.
    """
    path = Path(path)
    if path.is_dir():
        return "parquet"
    promised, gz = _promised(path)
    try:
        with open(path, "rb") as fh:
            head = fh.read(_SNIFF_BYTES)
    except FileNotFoundError:
        raise DataError(f"{path.absolute()}: file not found") from None
    except OSError as exc:
        raise DataError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    expected = {"parquet": "Parquet", "csv": "CSV text", "tsv": "tab-separated text"}
    what = f"its name promises {expected[promised]}" if promised else (
        f"vflink reads .csv, .tsv, .csv.gz and .parquet files; {path.suffix or 'no suffix'!s}"
        " is none of them")
    if head.startswith(b"\x1f\x8b"):
        if not gz:
            raise DataError(f"{path}: the file is gzip-compressed, but {what}: name it "
                            f"{path.name}.gz (vflink reads gzip-compressed CSV as .csv.gz), or "
                            "decompress it")
        return "tsv" if promised == "tsv" else "csv"
    if gz and head:
        raise DataError(f"{path}: the name ends in .gz but the file is not gzip-compressed: "
                        f"name it {path.name[:-3]} (or compress it with gzip)")
    if head.startswith(b"PAR1"):
        found = "parquet"
    else:
        for magic, kind, fix in _NOT_TABLES:
            if head.startswith(magic):
                raise DataError(f"{path}: the file is {kind}, not a table vflink reads (CSV, "
                                f"TSV, .csv.gz or Parquet): {fix}")
        utf16 = head.startswith((b"\xff\xfe", b"\xfe\xff"))
        if b"\x00" in head and not utf16:
            raise DataError(f"{path}: the file holds binary data (its first bytes are "
                            f"{head[:8].hex(' ')}), not a table vflink reads: give a CSV, "
                            "TSV, .csv.gz or Parquet file")
        text = head.lstrip(b"\xef\xbb\xbf \t\r\n")
        if text[:1] in (b"{", b"[") and b'":' in text:
            raise DataError(f"{path}: the file holds JSON, not a table vflink reads: write "
                            "it as CSV or Parquet (e.g. pandas.read_json(...).to_csv(...))")
        found = "tsv" if promised == "tsv" else "csv"
    mismatch = promised is None or (found == "parquet") != (promised == "parquet")
    if mismatch and _first_time(path):
        if promised is None:
            log.warning("%s: read as %s (from its content; %s)", path, expected[found], what)
        else:
            log.warning("%s: the file holds %s although %s: read as %s (rename it to end in "
                        ".%s)", path, expected[found], what, expected[found],
                        "parquet" if found == "parquet" else "csv")
    return found


_WARNED: set[tuple[str, int, int]] = set()


def _first_time(path: Path) -> bool:
    """Whether this version of ``path`` gets its mismatch warning now (a table is opened by
    several readers: header, batches, row count; one warning is enough)."""
    try:
        st = path.stat()
    except OSError:
        return True
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if key in _WARNED:
        return False
    _WARNED.add(key)
    return True
