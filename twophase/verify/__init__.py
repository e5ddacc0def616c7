"""``twophase verify``: did a pipeline deliver what its source offered exactly once?

Reads what a source offered (a ``twophase.sequence`` range, or the committed records of Kafka
topics in an offset range) and what a sink holds (a ``twophase.files`` directory, a PostgreSQL
table, a Delta or Iceberg table, Kafka topics read ``read_committed``, every target of a
``twophase.multi`` sink), and compares the two as multisets of identity tuples: missing,
duplicated and unexpected records, with the first examples of each.

Modules by role: ``offered`` (what a source offered), ``held`` (what a sink holds), ``kafka``
(committed Kafka records in an offset range, for either side), ``sql``, ``delta`` and
``iceberg`` (those sinks' tables), ``compare`` (the comparison), ``report`` (its outcome),
``run`` (one verification by kind and options, as the command runs it), ``multi`` (a
``twophase.multi`` sink: each target, then the targets joined on the identity) and ``errors``
(why a verification cannot start).
"""

from twophase.verify.compare import (
    EXAMPLES,
    KAFKA_COLUMNS,
    SEQUENCE_COLUMNS,
    compare,
    defaultColumns,
)
from twophase.verify.delta import actualFromDelta
from twophase.verify.errors import VerifyInputError
from twophase.verify.held import actualFromFiles, actualFromKafka, actualFromPostgres
from twophase.verify.iceberg import actualFromIceberg
from twophase.verify.multi import MULTI_HELP, MultiVerifyReport, TargetReport, verifyMulti
from twophase.verify.offered import asKafkaRecords, expectedFromKafka, expectedFromSequence
from twophase.verify.report import Example, VerifyReport
from twophase.verify.run import SINKS, SOURCES, verify
from twophase.verify.sql import actualFromSql

__all__ = [
    "EXAMPLES",
    "KAFKA_COLUMNS",
    "MULTI_HELP",
    "SEQUENCE_COLUMNS",
    "SINKS",
    "SOURCES",
    "Example",
    "MultiVerifyReport",
    "TargetReport",
    "VerifyInputError",
    "VerifyReport",
    "actualFromDelta",
    "actualFromIceberg",
    "actualFromFiles",
    "actualFromKafka",
    "actualFromPostgres",
    "actualFromSql",
    "asKafkaRecords",
    "compare",
    "defaultColumns",
    "expectedFromKafka",
    "expectedFromSequence",
    "verify",
    "verifyMulti",
]
