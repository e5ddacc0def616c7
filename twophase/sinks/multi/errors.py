"""The fixes the command line gives for ``twophase.multi`` itself: its targets' own errors say
their system and fix, so these apply only to a failure no target's error claims."""

from __future__ import annotations

from types import MappingProxyType

from twophase.protocol.errors import SinkFailure, SinkSystemError


class MultiSinkError(SinkSystemError):
    """A failure of ``twophase.multi`` that none of its targets' errors names."""

    system = "twophase.multi"
    fixes = MappingProxyType(
        {
            SinkFailure.UNREACHABLE: (
                "Fix: make every target's system reachable with the options the query used "
                "(prefixed with the target's name), as --sink-option KEY=VALUE or "
                "--sink-option-file PATH."
            ),
            SinkFailure.CREDENTIALS: (
                "Fix: give each target's credentials the query used, prefixed with the "
                "target's name, in a --sink-option-file only you can read."
            ),
        }
    )


__all__ = ["MultiSinkError"]
