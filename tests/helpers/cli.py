"""Running the CLI in-process in tests and reading what it said."""

from __future__ import annotations

import pytest

from vflink.cli.main import main


def clean(text: str) -> str:
    """``text`` with every run of whitespace as one space (rich wraps long messages)."""
    return " ".join(text.split())


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """``vflink args``: the exit code and stderr (whitespace cleaned), never a traceback."""
    capsys.readouterr()
    code = main(args)
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return code, clean(err)
