"""``defer_numpy_extras`` (a link's process): numpy's f2py and testing, which scipy's array-API
layer would load through ``from numpy import *`` as cKDTree's extension loads, stay unexecuted
through that load and become whole modules on their first use. In a fresh process each time
(the deferral is process-wide)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = r"""
import json, sys
import numpy
from vflink.cli._imports import defer_numpy_extras
lazy = lambda: sorted(m for m in ("numpy.f2py", "numpy.testing")
                      if type(sys.modules.get(m)).__name__ == "_LazyModule")
out = {"deferred": list(defer_numpy_extras()), "again": list(defer_numpy_extras())}
from vflink.linkage.search import kdtree_class
tree = kdtree_class()(numpy.arange(10.0).reshape(5, 2))
out["after_kdtree"] = lazy()
out["query"] = tree.query([[0.0, 0.0]], k=2)[1].tolist()
numpy.testing.assert_allclose(1.0, 1.0)  # first use: the module runs, whole
import numpy.f2py
out["f2py_main"] = callable(numpy.f2py.run_main)
from numpy.testing import assert_array_equal
assert_array_equal([1], [1])
out["after_use"] = lazy()
out["types"] = [type(sys.modules[m]).__name__ for m in ("numpy.f2py", "numpy.testing")]
print(json.dumps(out))
"""


def _run(code: str) -> dict[str, object]:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"},
                          timeout=120, check=True)
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def test_f2py_and_testing_wait_for_their_first_use() -> None:
    out = _run(PROBE)
    assert out["deferred"] == ["numpy.f2py", "numpy.testing"]
    assert out["again"] == []  # registered once: a second call finds them
    assert out["after_kdtree"] == ["numpy.f2py", "numpy.testing"]  # scipy's star import
    assert out["query"] == [[0, 1]]
    assert out["f2py_main"] is True
    assert out["after_use"] == []
    assert out["types"] == ["module", "module"]


def test_modules_loaded_already_are_left_as_they_are() -> None:
    out = _run("import json, numpy.testing\nfrom vflink.cli._imports import defer_numpy_extras\n"
               "print(json.dumps({'deferred': list(defer_numpy_extras())}))")
    assert out["deferred"] == ["numpy.f2py"]
