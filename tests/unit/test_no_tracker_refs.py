"""No text in the repository cites the project's own issue tracker.

A reader of a clone cannot open the tracker, so a comment, docstring, docs page, message or
config comment that gives an issue number as its reason explains nothing. Say the reason in the
code's own terms (what the code guarantees, what attack or failure it prevents, what was
measured) or point at the docs page that explains it.

Every text file git knows of (tracked, or new and not ignored) is scanned for an issue number:
the word "issue" or "issues" followed by a number (with or without ``#``), and "issue's" after
"the". Another project's issue stays citable as its repository and number, e.g.
``owner/repo#123``.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: the word issue(s) and a number, with or without "#", or "issue's" after "the"
CITATION = re.compile(r"\bissues?\s*#?\s*\d+|\bthe\s+issue's\b", re.IGNORECASE)
#: another project's tracker, named by its repository just before the citation
OTHER_PROJECT = re.compile(r"[\w.-]+/[\w.-]+\s*$")
#: folders never scanned when git is not available (virtual environments, caches, outputs)
SKIPPED_DIRS = {".git", ".venv", "venv", "__pycache__", ".mypy_cache", ".ruff_cache",
                ".pytest_cache", "site", "build", "dist", "runs", "node_modules"}


def repository_files(root: Path) -> list[Path]:
    """The files git knows of under ``root`` (tracked, or untracked and not ignored); without
    git (an unpacked sdist), every file outside :data:`SKIPPED_DIRS`."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                              "--exclude-standard"], cwd=root, capture_output=True, check=True,
                             timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return sorted(p for p in root.rglob("*") if p.is_file()
                      and not SKIPPED_DIRS.intersection(p.relative_to(root).parts))
    names = sorted({n for n in out.decode("utf-8", "surrogateescape").split("\0") if n})
    return [root / n for n in names if (root / n).is_file()]  # a deleted file is listed too


def citations(path: Path) -> list[tuple[int, str]]:
    """(line number, line) of every tracker citation in a text file; a binary file (a NUL
    byte, or not UTF-8) has none."""
    data = path.read_bytes()
    if b"\0" in data:
        return []
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return []
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        for match in CITATION.finditer(line):
            if not OTHER_PROJECT.search(line[:match.start()]):
                found.append((number, line.strip()))
                break
    return found


def test_no_file_cites_the_project_tracker() -> None:
    files = repository_files(ROOT)
    assert len(files) > 100, f"found only {len(files)} files under {ROOT}"
    found = [f"{path.relative_to(ROOT)}:{number}: {line}" for path in files
             for number, line in citations(path)]
    assert not found, ("tracker citations (say the reason in the code's own terms, or point at "
                       "the docs page that explains it):\n" + "\n".join(found))


# The planted citations below are built from pieces so that this file itself stays clean.
ISSUE = "iss" + "ue"


@pytest.mark.parametrize("line", [
    f"# checked here ({ISSUE} 19)",
    f'"""Bounded memory ({ISSUE.capitalize()} 22, item 2)."""',
    f"see {ISSUE}s 21 and 22",
    f"fixed in {ISSUE} #7",
    f"as {ISSUE}12 asked",
    f"# the {ISSUE}'s table",
])
def test_a_planted_citation_is_found(line: str, tmp_path: Path) -> None:
    path = tmp_path / "planted.py"
    path.write_text(f"x = 1\n{line}\ny = 2\n", encoding="utf-8")
    assert citations(path) == [(2, line.strip())]


@pytest.mark.parametrize("line", [
    f"# fixed upstream: python-hyper/h11 {ISSUE} 12",
    "# anonlink's lesson: packages capped by comparison count (data61/anonlink#181)",
    "# the certificate was issued 2 days ago by the CA",
    f"# an {ISSUE} with the data: row 3 holds NaN",
    "if len(items) > 3:",
])
def test_other_projects_and_plain_words_are_not_citations(line: str, tmp_path: Path) -> None:
    path = tmp_path / "clean.py"
    path.write_text(line + "\n", encoding="utf-8")
    assert citations(path) == []


def test_binary_files_are_skipped(tmp_path: Path) -> None:
    path = tmp_path / "blob.bin"
    path.write_bytes(b"\0\x01" + f"{ISSUE} 19".encode())
    assert citations(path) == []
