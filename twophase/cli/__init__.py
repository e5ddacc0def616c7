"""The ``twophase`` command line: one package on the top floor, above everything it runs.

It imports the rest of twophase and nothing below imports it: ``twophase/__main__.py`` and
the ``twophase`` script (``twophase.cli:main``) only call ``main``. Modules: ``dispatch``
(the parser, ``main``, ``status`` and ``recover``), ``verify`` and ``demo`` (a command each),
``errors`` (a failure as one paragraph and an exit status) and ``options`` (the sink options
given again).
"""

from twophase.cli.dispatch import main

__all__ = ["main"]
