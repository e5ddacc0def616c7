"""Importing a class a user or a checkpoint names as ``module:QualName``."""

from __future__ import annotations

import importlib
from typing import Any


def importQualified(spec: str) -> Any:
    """The object ``module:Qual.Name`` names; ``ImportError``/``AttributeError`` if it is not."""
    moduleName, _, qualName = spec.partition(":")
    found: Any = importlib.import_module(moduleName)
    for part in qualName.split("."):
        found = getattr(found, part)
    return found
