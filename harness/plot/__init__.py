"""Figures of runs and benchmarks, for ``harness plot``: the ``plot`` extra's, outside the core.

:mod:`harness.plot.curves` reads run directories into grouped learning curves (numpy only);
:mod:`harness.plot.figures` draws them, and benchmark JSON, with matplotlib, which only the
``plot`` extra installs (``pip install -e '.[plot]'``), so that nothing else imports it.
"""
