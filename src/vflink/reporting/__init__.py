"""Reporting: what is read back from run directories and drawn for people.

What it holds:

* ``report``: the self-contained HTML report page of a run, an experiment or a demo
  (``vflink report``);
* ``ledger``: the privacy ledger a run directory carries (``privacy.json``), written from a
  run's plain :class:`~vflink.runfiles.results.RunResult`;
* ``plots``: the learning curve of a run;
* ``link_quality``: the link-quality file of a training run (read back by ``vflink predict``).
* ``experiment``: an experiment's table and plot, from its ``results.json``.

It reads run directories and plain records (``vflink.runfiles.results``, ``vflink.runfiles.
rundir``, ``vflink.privacy.ledger``) and imports no party, protocol or transport code: an
import-linter contract forbids it (indirect imports included). matplotlib is imported only when
a figure is drawn.
"""
