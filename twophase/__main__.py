"""``python -m twophase``: the same as the ``twophase`` command."""

from twophase.cli import main

raise SystemExit(main())
