"""Experiments: many runs of the pipeline and the papers' evaluation harnesses.

What it holds:

* ``grid``: an experiment file's algorithms × seeds (× swept values), each one run of the
  pipeline (:func:`vflink.runner.train.run_training`), and its tables and plot;
* ``afe``: the VFL-AFE evaluation harness (train, then attack the released embeddings).

(The reproductions' table builders still live in ``scripts/reproduce_afe.py`` and
``scripts/florist_report.py``; they belong here next.)

Experiments RUN pipelines: they call ``run_training`` / ``prepare`` with a config and read the
results; they never reach into a stage. It may import the orchestration (``vflink.runner``),
reporting and the run files; only the API and the CLI import it.
"""
