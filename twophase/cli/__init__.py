"""The ``twophase`` command line: a module per command, and the errors and options they share.

The top floor: it imports the rest of twophase and nothing below imports it;
``twophase/__main__.py`` and the ``twophase`` script (``twophase.cli:main``) only call ``main``.
``dispatch`` builds the parser and runs a command; the commands are ``demo``, ``status``,
``recover``, ``doctor`` and ``verify``; beside them ``checkpoint`` (a query's sinks and their
logs, for status, recover and doctor), ``options`` (the sink options given again), ``errors``
(a failure as one paragraph and an exit status), ``console`` (the log lines a command
shows, and a long run's live progress on a terminal), and status's parts: ``batchtable`` (the
newest batches' figures and where their time went), ``sparkbatches`` (Spark's own dates of
each batch) and ``doubt`` (what is in doubt, and only what is known of it).
"""

from twophase.cli.dispatch import main

__all__ = ["main"]
