"""What ``vflink link`` loads: only what linking needs. No torch, scikit-learn or gRPC; no
matplotlib unless the charts are asked for; neither scipy.optimize nor scipy.special (nor the
rest of scipy.spatial beside the k-d tree, nor scipy.sparse and the array-API layer of
scipy._lib._util that its extension imports, nor numpy.ma); faiss only for a search that
uses it; no pandas for numeric identifiers read from Parquet or CSV (pyarrow reads them);
neither rapidfuzz (string distances) nor randomgen (the secret noise's cipher) for
numbers whose noise is seeded or absent; numpy's f2py and testing registered but never run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]
WATCHED = ("torch", "sklearn", "grpc", "matplotlib", "scipy.optimize", "scipy.special",
           "scipy.spatial", "scipy.linalg", "scipy.sparse", "scipy._lib._util", "numpy.ma",
           "faiss", "PIL", "pandas", "rapidfuzz", "randomgen")


#: numpy's extras that scipy's array-API layer would load (``from numpy import *``): a link
#: leaves them registered but not run (vflink.cli._imports), unless something uses them.
EXTRAS = ("numpy.f2py", "numpy.testing")


def _loaded(argv: list[str]) -> tuple[int, list[str]]:
    code = ("import sys, json\nfrom vflink.cli.main import main\ntry:\n"
            f"    code = main({argv!r})\nexcept SystemExit as e:\n    code = e.code\n"
            f"ran = sorted(m for m in {EXTRAS!r} if m in sys.modules\n"
            "             and type(sys.modules[m]).__name__ != '_LazyModule')\n"
            f"print(json.dumps([code, sorted(m for m in {WATCHED!r} if m in sys.modules) + ran]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin",
                              "VFLINK_SECRET": "a-secret-of-at-least-16-bytes"},
                         timeout=300, check=True).stdout
    exit_code, loaded = json.loads(out.strip().splitlines()[-1])
    return int(exit_code), list(loaded)


@pytest.fixture(scope="module")
def tables(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("imports")
    rng = np.random.default_rng(0)
    p, s = tmp / "p.parquet", tmp / "s.parquet"
    pd.DataFrame({"lat": rng.uniform(39, 40, 300), "lon": rng.uniform(116, 117, 300)}
                 ).to_parquet(p)
    pd.DataFrame({"lat": rng.uniform(39, 40, 200), "lon": rng.uniform(116, 117, 200)}
                 ).to_parquet(s)
    return p, s


@pytest.mark.parametrize(("flags", "allowed"), [
    (["--privacy", "off"], set()),  # the k-d tree alone, from its own module
    # the grouped search (K ≥ 16): neither scipy.sparse nor numpy.ma either
    (["--privacy", "off", "--top-k", "20"], set()),
    ([], {"faiss"}),  # keyed Bloom filters, searched by faiss
    (["--privacy", "off", "--charts"], {"matplotlib", "PIL", "pandas", "numpy.ma", *EXTRAS}),
    (["--privacy", "off", "csv"], set()),  # numbers from a CSV: pyarrow's reader
], ids=["off", "off-grouped", "private", "charts", "csv"])
def test_vflink_link_loads_only_what_linking_needs(tables: tuple[Path, Path],
                                                   tmp_path: Path, flags: list[str],
                                                   allowed: set[str]) -> None:
    p, s = tables
    if "csv" in flags:
        flags = [f for f in flags if f != "csv"]
        p = tmp_path / "p.csv"
        pd.read_parquet(tables[0]).to_csv(p, index=False)
    out = tmp_path / "links.parquet"
    code, loaded = _loaded(["link", "--primary", str(p), "--secondary", str(s), "--on",
                            "lat,lon", "--metric", "euclidean", "--top-k", "5", "--seed", "0",
                            "--out", str(out), *flags])
    assert code == 0
    assert set(loaded) <= allowed, set(loaded) - allowed
    assert pq_rows(out) == 300 * (20 if "20" in flags else 5)
    assert (tmp_path / "links.parquet.similarity.png").exists() == ("--charts" in flags)


def pq_rows(path: Path) -> int:
    import pyarrow.parquet as pq

    return int(pq.ParquetFile(path).metadata.num_rows)


def _entry(argv: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """``vflink`` as its console script runs it (``entry``), in a process of its own, with an
    atexit handler of the caller's that writes a marker file."""
    marker = tmp_path / "atexit-ran"
    code = ("import atexit, pathlib, sys\n"
            f"atexit.register(pathlib.Path({str(marker)!r}).write_text, 'yes')\n"
            f"sys.argv = ['vflink', *{argv!r}]\n"
            "from vflink.cli.main import entry\nentry()\n")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin",
                               "VFLINK_SECRET": "a-secret-of-at-least-16-bytes"},
                          timeout=300, check=False)


def test_a_link_process_exits_with_its_code_its_output_and_atexit_handlers(
        tables: tuple[Path, Path], tmp_path: Path) -> None:
    """The link command's process skips the interpreter's teardown (``exit_now``), but not
    what an exit owes: the exit code, everything printed, the atexit handlers, the files."""
    p, s = tables
    out = tmp_path / "links.parquet"
    args = ["link", "--primary", str(p), "--secondary", str(s), "--on", "lat,lon",
            "--metric", "euclidean", "--top-k", "5", "--privacy", "off", "--out", str(out)]
    done = _entry(args, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "vflink link" in done.stdout and str(out) in done.stdout  # the summary, flushed
    assert (tmp_path / "atexit-ran").read_text() == "yes"
    assert pq_rows(out) == 1500
    assert json.loads(Path(f"{out}.summary.json").read_text())["sizes"]["links"] == 1500
    (tmp_path / "atexit-ran").unlink()
    again = _entry(args, tmp_path)  # the output exists: a usage error, its message, code 2
    assert again.returncode == 2 and "already exists" in again.stderr
    assert (tmp_path / "atexit-ran").read_text() == "yes"


def test_a_link_over_an_old_dataset_exits_once_the_old_one_is_deleted(
        tables: tuple[Path, Path], tmp_path: Path) -> None:
    """``--overwrite`` over a partitioned dataset: the old one, moved aside and deleted in a
    thread of its own, is gone when the fast exit has ended the process."""
    p, s = tables
    out = tmp_path / "links.parquet"
    base = ["link", "--primary", str(p), "--secondary", str(s), "--on", "lat,lon",
            "--metric", "euclidean", "--top-k", "5", "--privacy", "off", "--out", str(out),
            "--parts"]
    for _ in range(2):
        done = _entry([*base, "--overwrite"], tmp_path)
        assert done.returncode == 0, done.stderr
        assert (tmp_path / "atexit-ran").read_text() == "yes"
        (tmp_path / "atexit-ran").unlink()
    from vflink.data.parts import read_parts

    assert out.is_dir() and read_parts(out).num_rows == 1500
    assert sorted(x.name for x in tmp_path.iterdir() if x.name.startswith(".")) == []


@pytest.mark.parametrize(("exported", "want"), [(None, False), ("1", True)],
                         ids=["default", "exported"])
def test_a_command_turns_numpys_huge_page_advice_off_unless_exported(
        exported: str | None, want: bool) -> None:
    """numpy's madvise(MADV_HUGEPAGE) on every large array makes each first touch of 2 MB
    wait for the kernel's compaction where THP defrag is `madvise`: a command's process sets
    NUMPY_MADVISE_HUGEPAGE=0 before numpy loads, and keeps a value the user exported."""
    code = ("import json\nfrom vflink.cli.main import main\ntry:\n    main(['--version'])\n"
            "except SystemExit:\n    pass\nfrom numpy._core import multiarray\n"
            "print(json.dumps(multiarray._get_madvise_hugepage()))")
    env = {"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"}
    if exported is not None:
        env["NUMPY_MADVISE_HUGEPAGE"] = exported
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=120, check=True).stdout
    assert json.loads(out.strip().splitlines()[-1]) is want


def _blas_threads(code: str, env: dict[str, str]) -> int:
    """numpy's OpenBLAS threads in a fresh process that runs ``code`` first (threadpoolctl)."""
    code += ("\nimport json, numpy, threadpoolctl\nprint(json.dumps([i['num_threads'] for i in "
             "threadpoolctl.threadpool_info() if i['internal_api'] == 'openblas']))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin", **env},
                         timeout=120, check=True).stdout
    found = json.loads(out.strip().splitlines()[-1])
    if not found:
        pytest.skip("this numpy has no OpenBLAS")
    return int(found[0])


@pytest.mark.parametrize(("argv", "exported", "want"),
                         [(["link", "--help"], None, "one"), (["link", "--help"], "2", "2"),
                          (["--version"], None, "numpy's own")],
                         ids=["link", "link-exported", "other-command"])
def test_a_link_loads_numpys_blas_with_one_thread(argv: list[str], exported: str | None,
                                                  want: str) -> None:
    """numpy's OpenBLAS pool spins as numpy loads, beside the link's imports: the link
    command's process loads it with one thread, a value the user exported wins, and other
    commands keep numpy's own number."""
    code = (f"from vflink.cli.main import main\ntry:\n    main({argv!r})\n"
            "except SystemExit:\n    pass")
    env = {} if exported is None else {"OPENBLAS_NUM_THREADS": exported}
    got = _blas_threads(code, env)
    expected = {"one": 1, "2": 2, "numpy's own": _blas_threads("", {})}[want]
    assert got == expected


@pytest.mark.parametrize("exit_after", [False, True])
def test_the_collector_comes_back_unless_the_process_ends_next(
        tables: tuple[Path, Path], tmp_path: Path, exit_after: bool) -> None:
    """A link runs with the cyclic collector off; a caller that lives on gets it back, while
    the console script, whose process ends next, skips the collection that turning it on
    would set off."""
    p, s = tables
    argv = ["link", "--primary", str(p), "--secondary", str(s), "--on", "lat,lon", "--metric",
            "euclidean", "--top-k", "5", "--privacy", "off", "--out",
            str(tmp_path / "links.parquet")]
    code = (f"import gc, json\nfrom vflink.cli.main import main\n"
            f"code = main({argv!r}, exit_after={exit_after!r})\n"
            "print(json.dumps([code, gc.isenabled()]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin",
                              "VFLINK_SECRET": "a-secret-of-at-least-16-bytes"},
                         timeout=300, check=True).stdout
    assert json.loads(out.strip().splitlines()[-1]) == [0, not exit_after]
