"""The release's version, in a leaf module that any layer may import without the package's
``__init__``.

``pyproject.toml`` reads it without importing twophase, ``twophase.__version__`` re-exports it,
and the Spark binding compares a Connect server's to it.
"""

__version__ = "0.2.0"
