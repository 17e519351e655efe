"""Experiments: many runs of the pipeline and the papers' reproductions.

What it holds:

* ``grid``: an experiment file's algorithms × seeds (× swept values), each one run of the
  pipeline (:func:`vflink.runner.train.run_training`); its table and plot are
  :mod:`vflink.reporting.experiment`'s;
* ``afe``: the VFL-AFE evaluation harness (train, then attack the released embeddings);
* the papers' reproductions, whose entry points are the ``scripts/``: ``afe_reproduction``
  (VFL-AFE Tables 1-2, Figures 9-10), ``afe_diagnostics`` (what rescaling and distribution
  adjusting work on), ``florist_report`` (FLORIST Tables 1-3, Figure 2, from three experiments'
  results), ``fedsim_reference`` (the FedSim reference grid point by point, and its table next
  to the authors' logs), ``imdb_gap`` (FedSim against Exact on IMDb titles).

Experiments RUN pipelines: they call the runner's entry points (``run_training``, ``prepare``,
building a pipeline, and the in-process federation a run may be given) with a config and read
the results; they never reach into a stage. An import-linter contract forbids any other
``vflink.runner`` module here. It may import reporting and the run files; only the API and the
CLI import it.
"""
