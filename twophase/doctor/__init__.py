"""``twophase doctor``: the decision log held against what each system holds for its sink.

``twophase status`` reads the log; doctor also asks the systems (PostgreSQL's
``pg_prepared_xacts`` and staging table, Kafka's transactions and last stable offsets, the
files sink's staging), read-only, and reports each thing to settle with the one command that
settles it. Modules by role: ``findings`` (the model and exit status), ``classify`` (the
comparison with the log), ``render`` (table and JSON), ``run`` (the command), ``nextstart``
(what the next start does with a decided, unfinished batch: the sentences status, doctor and
recover share). Each system's
questions live beside its sink: ``twophase.sinks.<kind>.inspect``. See docs/operations.md.
"""

from twophase.doctor.findings import (
    EXIT_CANNOT_CHECK,
    EXIT_CLEAN,
    EXIT_FINDINGS,
    CannotCheck,
    Finding,
    Held,
    Inspection,
    Kind,
    SinkReport,
    Stall,
)
from twophase.doctor.run import doctor

__all__ = [
    "EXIT_CANNOT_CHECK",
    "EXIT_CLEAN",
    "EXIT_FINDINGS",
    "CannotCheck",
    "Finding",
    "Held",
    "Inspection",
    "Kind",
    "SinkReport",
    "Stall",
    "doctor",
]
