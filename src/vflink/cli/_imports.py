"""Process-level import settings of commands: numpy's unused extras deferred in a link.

numpy loads a few of its submodules only when they are first asked for (``numpy.f2py``,
``numpy.testing``, ``numpy.ma``, ..., through numpy's module ``__getattr__``). scipy's
array-API layer, which cKDTree's extension module loads by way of ``scipy.sparse``, copies
every public name of numpy (``from numpy import *``) and so loads them all: f2py 25-30 ms (with
its Fortran parser and charset_normalizer) and testing 17-20 ms (unittest,
importlib.metadata) of the 90 ms that loading cKDTree took in ``vflink link`` at FedSim's house
scale, on one core while the other waits; a link uses neither. (cKDTree's load now stands in
for ``scipy.sparse`` and ``scipy._lib._util``, :func:`vflink.linkage.search.kdtree_class`, so
a link loads that layer only where the stand-ins cannot be used: before numpy 2, or in
another layout of scipy. The deferral stays for those.)

A link's process (:func:`defer_numpy_extras`, before scipy is loaded) registers those two as
the standard library's lazy modules (:class:`importlib.util.LazyLoader`): the name is bound
and the module object is in ``sys.modules``, and the module runs when something first reads
one of its attributes (a test's helpers, a Fortran wrapper), whole, as an ordinary import
would have made it. Python 3.11's lazy modules are not safe to load from two threads at once,
so only modules that nothing in a link reads are deferred (not ``numpy.ma``, which numpy's own
``unique`` reads, on any thread), and only where nothing else runs beside the link that might
(no charts: matplotlib loads in a thread of its own).
"""

from __future__ import annotations

import importlib.util
import sys

__all__ = ["NUMPY_EXTRAS", "defer_numpy_extras"]

#: numpy's submodules deferred in a link's process (each loaded by numpy on first access).
NUMPY_EXTRAS = ("f2py", "testing")


def defer_numpy_extras() -> tuple[str, ...]:
    """Register numpy's :data:`NUMPY_EXTRAS` not loaded yet as lazy modules; the names of
    those deferred. A numpy that loads them itself, or whose layout differs, is left as is."""
    import numpy as np

    deferred = []
    for short in NUMPY_EXTRAS:
        name = f"{np.__name__}.{short}"
        if name in sys.modules or short in vars(np):
            continue  # loaded already (or loaded eagerly by this numpy)
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            continue
        loader = importlib.util.LazyLoader(spec.loader)
        spec.loader = loader
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        loader.exec_module(module)  # runs nothing yet: marks the module lazy
        # bound on the package as an import binds a submodule, so numpy's __getattr__ (which
        # would import it again under the same name) is not asked for it
        setattr(np, short, module)
        deferred.append(name)
    return tuple(deferred)
