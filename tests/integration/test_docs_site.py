"""The documentation site: its reference blocks are generated from the code
(docs/gen_ref.py), every page is in the navigation, and `mkdocs build --strict` passes."""

from __future__ import annotations

import dataclasses
import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def gen_ref() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_ref", DOCS / "gen_ref.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_marker_has_a_generator_and_every_page_renders() -> None:
    gen = gen_ref()
    used = set()
    for page in DOCS.rglob("*.md"):
        text = page.read_text(encoding="utf-8")
        used.update(gen.MARKER.findall(text))
        rendered = gen.render(text, str(page))
        assert "<!-- vflink:" not in rendered, page
    assert used == set(gen.GENERATORS)  # every generator is shown somewhere
    with pytest.raises(KeyError, match="no generator 'nope'"):
        gen.render("<!-- vflink:nope -->")


def test_cli_reference_names_every_command_and_option() -> None:
    import argparse

    from vflink.cli.main import build_parser

    text = gen_ref().cli()
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    for name, parser in sub.choices.items():
        assert f"## `vflink {name}`" in text, name
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue  # every command has --help
            for option in action.option_strings:
                assert f"`{option}`" in text, (name, option)


def test_run_file_reference_lists_every_key_with_its_default() -> None:
    from vflink.runfiles.config import AlignmentConfig, TrainingConfig

    text = gen_ref().run_file()
    for cls in (AlignmentConfig, TrainingConfig):
        for f in dataclasses.fields(cls):
            assert re.search(rf"^\| `{f.name}` \|", text, flags=re.M), f.name
    # defaults and checks come from the dataclasses themselves
    assert "| `top_k` | `int` | `10` | an integer ≥ 1 |" in text
    assert "| `epochs` | `int` | `30` | an integer ≥ 1 |" in text
    assert "one of `exact`, `soft`, `psi`, `psu`" in text


def test_security_page_holds_the_declared_state_tables() -> None:
    from vflink.protocol.sessions import describe

    text = gen_ref().render((DOCS / "security.md").read_text(encoding="utf-8"))
    for line in describe().splitlines():
        if line.startswith("| `"):
            assert line in text, line


def test_every_page_is_in_the_navigation() -> None:
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    for page in DOCS.rglob("*.md"):
        assert f" {page.relative_to(DOCS).as_posix()}\n" in nav, page


def test_mkdocs_build_strict(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs", reason="the `docs` extra builds the site")
    pytest.importorskip("mkdocstrings", reason="the `docs` extra builds the site")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={"PATH": "/usr/bin:/bin", "NO_MKDOCS_2_WARNING": "1",
             "PYTHONPATH": str(ROOT / "src")})
    assert done.returncode == 0, done.stderr[-3000:]
    page = (tmp_path / "reference" / "python-api" / "index.html").read_text(encoding="utf-8")
    assert "vflink.api.link" in page and "Parameters" in page
    # offline: no web fonts or scripts from elsewhere
    for html in tmp_path.rglob("*.html"):
        assert "fonts.googleapis" not in html.read_text(encoding="utf-8"), html
