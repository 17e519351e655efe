"""The quickstart notebook runs from top to bottom: it cannot rot."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "examples" / "quickstart.ipynb"

nbformat = pytest.importorskip("nbformat", reason="the `docs` extra runs the notebook")
nbclient = pytest.importorskip("nbclient", reason="the `docs` extra runs the notebook")
pytest.importorskip("ipykernel", reason="the `docs` extra runs the notebook")


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # jupyter_client/zmq internals
def test_quickstart_notebook_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    # the kernel imports this checkout's vflink, and draws no window
    src = str(ROOT / "src")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        p for p in (src, os.environ.get("PYTHONPATH")) if p))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.delenv("VFLINK_SECRET", raising=False)
    start = time.perf_counter()
    client = nbclient.NotebookClient(notebook, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    seconds = time.perf_counter() - start
    errors = [o for cell in notebook.cells if cell.cell_type == "code"
              for o in cell.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
    # it trained both runs where it was run, and FedSim beat Solo (the secondary's features
    # carry most of the signal)
    for name in ("quickstart-fedsim", "quickstart-solo"):
        assert (tmp_path / "runs" / name / "metrics.json").exists(), name
    results = [o for o in notebook.cells[6].outputs if o.get("output_type") == "execute_result"]
    table = results[0]["data"]["text/plain"]
    accuracy = next(line.split() for line in table.splitlines() if line.startswith("accuracy"))
    assert float(accuracy[1]) > float(accuracy[2]), table
    assert seconds < 300
