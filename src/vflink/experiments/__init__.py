"""Experiments: many runs of the pipeline and the papers' evaluation harnesses.

What it holds:

* ``grid``: an experiment file's algorithms × seeds (× swept values), each one run of the
  pipeline (:func:`vflink.runner.train.run_training`), and its tables and plot;
* ``afe``: the VFL-AFE evaluation harness (train, then attack the released embeddings);
* ``florist``: FLORIST's Tables 1-3 and Figure 2 from three experiments' results;
* ``afe_report``: VFL-AFE's reproduction (Table 3 / Figures 3-4) over an experiment grid.

Experiments RUN pipelines: they call ``run_training`` / ``prepare`` with a config and read the
results; they never reach into a stage. The ``scripts/`` of the repository are thin entry
points over this package. It may import the orchestration (``vflink.runner``), reporting and
the run files; only the API and the CLI import it.
"""
