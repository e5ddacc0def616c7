"""The built-in sinks, each declared once: the one place that knows which sinks exist.

A ``SinkSpec`` names where each part of a sink lives, as ``module:Name`` text so that reading
the registry imports nothing: the Spark binding (the data source class), the reader that
``twophase verify`` uses, the inspector that ``twophase doctor`` uses, the packages its errors
come from and its error class, which holds its system's name and the fixes an operator reads.
The Spark binding's built-in list, ``twophase.multi``'s target kinds, verify's and doctor's
dispatch and the command line's advice all come from here; a sink added to ``SINKS`` is known
to all of them.
"""

from __future__ import annotations

import importlib
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Protocol

import pyarrow as pa

from twophase.loading import importQualified
from twophase.options import SinkOption
from twophase.protocol.errors import SinkSystemError
from twophase.settings import TwoPhaseConfigError, optionErrors


class SinkReader(Protocol):
    """What ``twophase verify`` calls to read what a sink holds, and a description of it.

    ``options`` are the sink's own options, ``columns`` the identity columns to read (``None``:
    all), ``hints`` their types on the source's side (to read text formats with).
    """

    def __call__(
        self, options: Any, columns: Sequence[str] | None, hints: pa.Schema | None
    ) -> tuple[pa.Table, str]: ...


@dataclass(frozen=True)
class SinkParts:
    """Where a sink's Spark-free parts live, as ``module:name``: all the generic binding
    (``twophase.spark.declared``) needs to make the sink a PySpark data source.

    ``settings`` parses the options (``FilesSettings.fromOptions``: a ``TwoPhaseConfigError``
    or ``ValueError`` names a bad one); ``writer`` and ``committer`` are built from the parsed
    settings; ``validate(settings, schema, sinkId)`` checks, on the driver before each batch,
    that the target can take the stream's Arrow schema; ``publicValue(key, value)``, when
    given, is the form ``sink.json`` keeps of an allowed option (a URL without its password).
    """

    settings: str
    writer: str
    committer: str
    validate: str
    publicValue: str | None = None

    def parse(self, options: Any) -> Any:
        with optionErrors():
            return importQualified(self.settings)(options)

    def newWriter(self, settings: Any) -> Any:
        return importQualified(self.writer)(settings)

    def newCommitter(self, settings: Any) -> Any:
        return importQualified(self.committer)(settings)

    def check(self, settings: Any, schema: pa.Schema, sinkId: str) -> None:
        importQualified(self.validate)(settings, schema, sinkId)

    def publicOptionValue(self, key: str, value: str) -> str | None:
        if self.publicValue is None:
            return value
        shown: str | None = importQualified(self.publicValue)(key, value)
        return shown


@dataclass(frozen=True)
class SinkSpec:
    """One built-in sink: its names and where each of its parts lives.

    ``kind`` is the short name (``postgres``) that ``twophase verify --sink``, ``twophase.multi``'s
    ``targets`` and ``twophase doctor`` use; ``name()`` the format name Spark knows.
    """

    kind: str
    reader: str | None
    """``module:function`` of the ``SinkReader`` that verify uses; ``None``: verify cannot read
    it."""
    inspector: str | None
    """The module ``twophase doctor`` asks what the system holds (``inspect`` and
    ``handleKey``); ``None``: doctor checks the log only."""
    errorModules: tuple[str, ...]
    """Module prefixes whose exceptions are this system's (its client library, its package)."""
    errors: str
    """``module:Class`` of the sink's ``SinkSystemError``: its system's name, the fixes for a
    server that does not answer and for refused credentials, and how its client library's
    errors read (``classify``), for one that reaches the command line unwrapped."""
    parts: SinkParts | None = None
    """The sink's Spark-free parts, bound by the generic binding; ``None`` with ``binding``."""
    binding: str | None = None
    """``module:Class`` of a binding of the sink's own, for a sink the generic binding cannot
    make (a source as well, a driver step before the tasks); ``None`` with ``parts``."""
    options: str | None = None
    """``module:NAME`` of the sink's declared options (a tuple of ``SinkOption``): the
    allow-list of ``sink.json`` and the table of its docs page come from it."""
    page: str | None = None
    """The docs page (``docs/<kind>.md``) whose option table is written from ``options``."""
    multiTarget: bool = True
    """Whether ``twophase.multi`` takes it as a target kind."""

    def __post_init__(self) -> None:
        if (self.parts is None) == (self.binding is None):
            raise ValueError(f"sink {self.kind}: declare either its parts or its own binding")

    def name(self) -> str:
        """The format name: ``twophase.<kind>``."""
        return f"twophase.{self.kind}"

    @property
    def className(self) -> str:
        """The name of its data source class: ``FilesSink`` for ``files``."""
        return f"{self.kind.capitalize()}Sink"

    @property
    def package(self) -> str:
        """The Spark-free package of the sink's writer and committer."""
        return f"twophase.sinks.{self.kind}"

    @property
    def bindingPath(self) -> str:
        """``module:Class`` of its data source: the sink's own binding, or the one
        ``twophase.spark.declared`` makes from its parts."""
        return self.binding or f"twophase.spark.declared:{self.className}"

    def bindingClass(self) -> Any:
        """The Spark data source class (imports pyspark)."""
        return importQualified(self.bindingPath)

    def namedBy(self, className: str) -> bool:
        """Whether ``module:Class`` text from a ``sink.json`` names this sink's data source, as
        this version or an earlier one placed it (its package, ``twophase.spark.<kind>``)."""
        module, _, name = className.partition(":")
        places = (self.package, f"twophase.spark.{self.kind}", "twophase.spark.declared")
        return name == self.className and module in places

    def readerFunction(self) -> SinkReader:
        """The reader verify uses; ``TwoPhaseConfigError`` when verify cannot read this sink."""
        if self.reader is None:
            raise TwoPhaseConfigError(f"twophase verify cannot read a {self.name()} sink")
        found: SinkReader = importQualified(self.reader)
        return found

    def declaredOptions(self) -> tuple[SinkOption, ...]:
        """The sink's declared options (empty for ``multi``: its options are its targets')."""
        if self.options is None:
            return ()
        found: tuple[SinkOption, ...] = importQualified(self.options)
        return found

    def errorClass(self) -> type[SinkSystemError]:
        """The sink's error class (imports its module)."""
        found: type[SinkSystemError] = importQualified(self.errors)
        return found

    def inspectorModule(self) -> ModuleType | None:
        """The inspect module doctor asks, or ``None``."""
        return None if self.inspector is None else importlib.import_module(self.inspector)


_OPTION_WAYS = "--sink-option KEY=VALUE or --sink-option-file PATH"

SINKS: tuple[SinkSpec, ...] = (
    SinkSpec(
        kind="files",
        options="twophase.sinks.files.settings:OPTIONS",
        page="docs/files.md",
        parts=SinkParts(
            settings="twophase.sinks.files:FilesSettings.fromOptions",
            writer="twophase.sinks.files:FilesWriter",
            committer="twophase.sinks.files:FilesCommitter",
            validate="twophase.sinks.files:validateTarget",
        ),
        reader="twophase.verify.held:readFilesSink",
        inspector="twophase.sinks.files.inspect",
        errorModules=("twophase.sinks.files",),
        errors="twophase.sinks.files.errors:FilesSinkError",
    ),
    SinkSpec(
        kind="postgres",
        options="twophase.sinks.postgres.settings:OPTIONS",
        page="docs/postgres.md",
        parts=SinkParts(
            settings="twophase.sinks.postgres:PostgresSettings.fromOptions",
            writer="twophase.sinks.postgres:PostgresWriter",
            committer="twophase.sinks.postgres:PostgresCommitter",
            validate="twophase.sinks.postgres:validateTarget",
            publicValue="twophase.sinks.postgres:publicOptionValue",
        ),
        reader="twophase.verify.held:readPostgresSink",
        inspector="twophase.sinks.postgres.inspect",
        errorModules=("twophase.sinks.postgres", "twophase.clients.postgres", "psycopg"),
        errors="twophase.clients.postgres:PostgresSinkError",
    ),
    SinkSpec(
        kind="sql",
        options="twophase.sinks.sql.settings:OPTIONS",
        page="docs/sql.md",
        parts=SinkParts(
            settings="twophase.sinks.sql:SqlSettings.fromOptions",
            writer="twophase.sinks.sql:SqlWriter",
            committer="twophase.sinks.sql:SqlCommitter",
            validate="twophase.sinks.sql:validateTarget",
            publicValue="twophase.sinks.sql:publicOptionValue",
        ),
        reader="twophase.verify.sql:readSql",
        inspector="twophase.sinks.sql.inspect",
        errorModules=("twophase.sinks.sql", "sqlalchemy", "pymysql", "MySQLdb", "mariadb"),
        errors="twophase.sinks.sql.errors:SqlSinkError",
        multiTarget=False,
    ),
    SinkSpec(
        kind="kafka",
        options="twophase.sinks.kafka.settings:OPTIONS",
        page="docs/kafka.md",
        binding="twophase.spark.kafka:KafkaSink",
        reader="twophase.verify.kafka:readKafkaSink",
        inspector="twophase.sinks.kafka.inspect",
        errorModules=(
            "twophase.sinks.kafka",
            "twophase.clients.kafka",
            "confluent_kafka",
            "cimpl",  # confluent_kafka's C classes (KafkaException, KafkaError)
            "kafka",
        ),
        errors="twophase.clients.kafka.errors:KafkaSystemError",
    ),
    SinkSpec(
        kind="delta",
        options="twophase.sinks.delta.settings:OPTIONS",
        page="docs/delta.md",
        parts=SinkParts(
            settings="twophase.sinks.delta:DeltaSettings.fromOptions",
            writer="twophase.sinks.delta:DeltaWriter",
            committer="twophase.sinks.delta:DeltaCommitter",
            validate="twophase.sinks.delta:validateTarget",
        ),
        reader="twophase.verify.delta:readDeltaSink",
        inspector="twophase.sinks.delta.inspect",
        errorModules=("twophase.sinks.delta", "deltalake"),
        errors="twophase.sinks.delta.table:DeltaTableError",
    ),
    SinkSpec(
        kind="iceberg",
        options="twophase.sinks.iceberg.settings:OPTIONS",
        page="docs/iceberg.md",
        binding="twophase.spark.iceberg:IcebergSink",
        reader="twophase.verify.iceberg:readIcebergSink",
        inspector="twophase.sinks.iceberg.inspect",
        errorModules=("twophase.sinks.iceberg", "pyiceberg"),
        errors="twophase.sinks.iceberg.table:IcebergTableError",
    ),
    SinkSpec(
        kind="multi",
        binding="twophase.spark.multi:MultiSink",
        reader=None,  # verify reads each target with the target's reader (verify.multi)
        inspector="twophase.sinks.multi.inspect",
        errorModules=("twophase.sinks.multi",),
        errors="twophase.sinks.multi.errors:MultiSinkError",
        multiTarget=False,
    ),
)
"""Every built-in sink, in the order the docs list them."""

GENERIC_FIX = (
    f"Fix: make the sink's system reachable with the options the query used ({_OPTION_WAYS})."
)
"""The fix for a system no spec claims (a user's sink)."""


def kinds() -> tuple[str, ...]:
    """Every built-in sink's kind."""
    return tuple(s.kind for s in SINKS)


def multiTargetKinds() -> tuple[str, ...]:
    """The built-in kinds ``twophase.multi`` takes as targets."""
    return tuple(s.kind for s in SINKS if s.multiTarget)


def readableKinds() -> tuple[str, ...]:
    """The kinds ``twophase verify`` can read (``multi`` through its targets' readers)."""
    return tuple(s.kind for s in SINKS if s.reader is not None or s.kind == "multi")


def specOf(kindOrName: str) -> SinkSpec:
    """The spec of ``postgres`` or ``twophase.postgres``; a clear error naming the built-in
    sinks for any other name."""
    wanted = kindOrName.strip()
    for spec in SINKS:
        if wanted in (spec.kind, spec.name()):
            return spec
    raise TwoPhaseConfigError(
        f"{kindOrName!r} is not a built-in twophase sink; the built-in sinks are "
        f"{', '.join(sorted(s.name() for s in SINKS))} (or by kind: "
        f"{', '.join(sorted(kinds()))}). For a sink "
        "of your own, pass its class (or an instance) instead of a name"
    )


def bindingNamed(className: str) -> str:
    """Where the data source that a ``sink.json`` names lives now: a built-in sink's binding
    however an earlier version placed it; any other class as named."""
    for spec in SINKS:
        if spec.namedBy(className):
            return spec.bindingPath
    return className


def specOfModule(module: str) -> SinkSpec | None:
    """The built-in sink whose package ``module`` belongs to, or ``None`` (a user's code)."""
    for spec in SINKS:
        if module == spec.package or module.startswith(spec.package + "."):
            return spec
    return None


def _claims(spec: SinkSpec, module: str) -> bool:
    return any(module == m or module.startswith(m + ".") for m in spec.errorModules)


def specOfError(exc: BaseException) -> SinkSpec | None:
    """The built-in sink whose system raised ``exc``, by type and origin, never by its text.

    For ``exc`` and then each error it was raised from: the first class of its MRO whose module
    a spec's ``errorModules`` claims, else the innermost frame of its traceback that such a
    module ran. ``None`` when nothing is claimed (a user's sink, a plain ``OSError``).
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        modules = [cls.__module__ for cls in type(current).__mro__]
        frames = traceback.walk_tb(current.__traceback__)
        modules += reversed([str(f.f_globals.get("__name__", "")) for f, _ in frames])
        for module in modules:
            for spec in SINKS:
                if _claims(spec, module):
                    return spec
        current = current.__cause__ or current.__context__
    return None


__all__ = [
    "GENERIC_FIX",
    "bindingNamed",
    "SINKS",
    "SinkParts",
    "SinkReader",
    "SinkSpec",
    "kinds",
    "multiTargetKinds",
    "readableKinds",
    "specOf",
    "specOfError",
    "specOfModule",
]
