"""Run, party and experiment files: their schemas, loading and validation, and the records a run
directory holds.

What it holds:

* ``config``: the run file (``RunConfig`` and its sections: frozen keyword-only dataclasses,
  validated at construction; ``parse_config`` reports every error of a file at once);
* ``party``: the party file of ``vflink serve`` / ``vflink train --party`` (``PartyConfig``);
* ``experiment``: the experiment file (a run file plus ``[experiment]``);
* ``inputs``: loading the tables a run file names (``Inputs``);
* ``algorithms``: the algorithm names a run file may give (a registry of plain descriptions);
* ``results``: ``RunResult`` / ``EpochRecord``, the ``metrics.json`` of a run directory;
* ``rundir``: creating and checking run directories atomically.

What it may import: the algorithms and data layers, ``vflink.engine``'s and
``vflink.parties.policy``'s configuration classes (a run file carries them), never the
orchestration (``vflink.runner``), reporting, experiments, the API or the CLI. Importing it
stays light: no torch at import time (``vflink --help`` reads the algorithm names).
"""
