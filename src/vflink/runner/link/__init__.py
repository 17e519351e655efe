"""``vflink link`` as a pipeline of stages (read → encode → candidates → compare → model →
decide → write → charts), one module a stage, each stage's entry chosen from its registry by
the link's settings (:mod:`.pipeline`). ``vflink.link``, the command and a ``[link]`` file all
build :class:`~.settings.LinkSettings` and run :func:`~.pipeline.run_link`.

Also here: the link's context (:mod:`.context`), the parties of a link held in memory
(:mod:`.parties`) and what a link gives (:mod:`.outcome`).
"""
