"""The sink registry: every built-in sink declared once, and every dispatch reading it."""

from __future__ import annotations

import inspect
from types import ModuleType

import psycopg
import pyarrow as pa
import pytest
from confluent_kafka import KafkaError, KafkaException

import twophase
from twophase.cli import errors
from twophase.doctor.run import inspectorOf
from twophase.protocol import Committer, Handle, RecoveryScope, SinkFailure, SinkSystemError
from twophase.settings import TwoPhaseConfigError
from twophase.sinks.files import FilesCommitter, FilesSettings
from twophase.sinks.multi import parseTargets
from twophase.sinks.registry import (
    GENERIC_FIX,
    SINKS,
    multiTargetKinds,
    readableKinds,
    specOf,
    specOfError,
    specOfModule,
)
from twophase.spark.builtins import builtinDataSources, builtinSink
from twophase.spark.multi import targetClass
from twophase.verify import run as verifyRun
from twophase.verify.errors import VerifyInputError
from twophase.verify.held import readSink


@pytest.mark.parametrize("spec", SINKS, ids=lambda s: s.kind)
def test_each_spec_names_parts_that_exist_and_agree(spec: object) -> None:
    from twophase.sinks.registry import SinkSpec

    assert isinstance(spec, SinkSpec)
    binding = spec.bindingClass()
    assert binding.name() == spec.name() == f"twophase.{spec.kind}"
    assert binding.__module__.startswith("twophase.spark.")
    assert specOfModule(f"{spec.package}.committer") is spec
    module = spec.inspectorModule()
    assert isinstance(module, ModuleType)
    assert callable(module.inspect) and callable(module.handleKey)
    if spec.reader is not None:
        parameters = list(inspect.signature(spec.readerFunction()).parameters)
        assert parameters == ["options", "columns", "hints"]
    errorClass = spec.errorClass()
    assert issubclass(errorClass, SinkSystemError) and errorClass.system
    for reason in (SinkFailure.UNREACHABLE, SinkFailure.CREDENTIALS):
        assert errorClass.fixFor(reason).startswith("Fix: ")


def test_the_binding_lists_every_registered_sink_and_the_sequence_source() -> None:
    names = sorted(cls.name() for cls in builtinDataSources())
    assert names == sorted([*(s.name() for s in SINKS), "twophase.sequence"])
    assert set(twophase.builtinDataSources()) == set(builtinDataSources())
    assert builtinSink("twophase.files").name() == "twophase.files"


def test_a_name_no_spec_declares_is_refused_with_the_list() -> None:
    with pytest.raises(TwoPhaseConfigError) as refused:
        builtinSink("twophase.mysink")
    said = str(refused.value)
    assert "'twophase.mysink' is not a built-in twophase sink" in said
    assert all(s.name() in said for s in SINKS) and "pass its class" in said
    with pytest.raises(TwoPhaseConfigError):
        specOf("kafka2")


def test_verify_reads_only_what_the_registry_declares_never_kafka_by_default() -> None:
    assert set(verifyRun.SINKS) == {s.kind for s in SINKS}
    # options a Kafka reader would take: an unknown kind must not be read as Kafka
    options = {"kafka.bootstrap.servers": "127.0.0.1:1", "topic": "t"}
    for kind in ("mysink", "multi"):
        with pytest.raises(VerifyInputError) as refused:
            readSink(kind, options, ["id"], pa.schema([("id", pa.int64())]))
        assert f"cannot read a sink of kind {kind!r}" in str(refused.value)
        assert "files, postgres, sql, kafka, delta, iceberg" in str(refused.value)


def test_multi_takes_the_kinds_the_registry_marks_as_targets() -> None:
    assert set(multiTargetKinds()) == {"files", "postgres", "kafka", "delta", "iceberg"}
    assert set(multiTargetKinds()) <= set(readableKinds())
    assert targetClass("delta") is specOf("delta").bindingClass()
    with pytest.raises(TwoPhaseConfigError, match="target 'b' has kind 'sql'; use one of files"):
        parseTargets({"targets": "a=files,b=sql"}, "s1")


class UserCommitter(Committer):
    """A sink of a user's own: doctor has nothing to ask."""

    def commit(self, handle: Handle) -> None:
        pass

    def abort(self, handle: Handle) -> None:
        pass

    def recoverAndAbort(self, scope: RecoveryScope) -> list[Handle] | None:
        return None


def test_doctor_asks_the_inspector_the_registry_names(tmp_path: object) -> None:
    committer = FilesCommitter(FilesSettings.fromOptions({"path": str(tmp_path)}))
    found = inspectorOf(committer)
    assert found is not None and found.__name__ == "twophase.sinks.files.inspect"
    assert inspectorOf(UserCommitter()) is None


def _raisedIn(module: str) -> BaseException:
    """An error raised by code of ``module`` (as a sink's own code raises it)."""
    namespace: dict[str, object] = {"__name__": module}
    exec("def fail():\n    raise RuntimeError('cannot reach it')\n", namespace)  # noqa: S102
    try:
        namespace["fail"]()  # type: ignore[operator]
    except RuntimeError as exc:
        return exc
    raise AssertionError("unreachable")


def test_an_error_is_mapped_to_its_system_by_type_and_origin_not_text() -> None:
    assert specOfError(psycopg.OperationalError("kafka is mentioned")) is specOf("postgres")
    kafka = KafkaException(KafkaError(KafkaError._TRANSPORT, "postgres is mentioned"))
    assert specOfError(kafka) is specOf("kafka")
    assert specOfError(_raisedIn("twophase.sinks.sql.committer")) is specOf("sql")
    wrapped = ValueError("wrapped")
    wrapped.__cause__ = psycopg.OperationalError("down")
    assert specOfError(wrapped) is specOf("postgres")
    assert specOfError(OSError("postgres kafka psycopg")) is None
    kafkaFixes = specOf("kafka").errorClass().fixes
    unreachable = errors.systemFailure(kafka)
    assert unreachable is not None and unreachable.system == "Kafka"
    assert unreachable.fix == kafkaFixes[SinkFailure.UNREACHABLE]
    refused = KafkaException(KafkaError(KafkaError.SASL_AUTHENTICATION_FAILED, "timed out"))
    credentials = errors.systemFailure(refused)
    assert credentials is not None and credentials.fix == kafkaFixes[SinkFailure.CREDENTIALS]
    plain = errors.systemFailure(ConnectionRefusedError("postgres"))
    assert plain is not None and plain.system is None and plain.fix == GENERIC_FIX


def test_a_sink_declared_by_its_parts_is_bound_once_and_pickles_by_reference() -> None:
    import pickle

    from pyspark import cloudpickle

    from twophase.spark.declared import DeclaredSink, FilesSink

    assert issubclass(FilesSink, DeclaredSink) and FilesSink.__module__ == "twophase.spark.declared"
    assert FilesSink is specOf("files").bindingClass()
    assert FilesSink.safeOptions == FilesSettingsSafe()
    assert pickle.loads(pickle.dumps(FilesSink)) is FilesSink
    assert len(cloudpickle.dumps(FilesSink)) < 200, "by reference, not by value"
    with pytest.raises(AttributeError, match="has no attribute 'NoSuchSink'"):
        from twophase.spark import declared

        declared.NoSuchSink  # noqa: B018


def FilesSettingsSafe() -> frozenset[str]:
    from twophase.sinks.files import SAFE_OPTIONS

    return SAFE_OPTIONS


@pytest.mark.parametrize(
    "named",
    [
        "twophase.sinks.files:FilesSink",  # before the Spark binding had a package of its own
        "twophase.spark.files:FilesSink",  # before the binding came from the registry
        "twophase.spark.declared:FilesSink",
    ],
)
def test_a_sink_json_of_an_earlier_version_names_the_binding_of_today(named: str) -> None:
    from twophase.sinks.registry import bindingNamed

    assert bindingNamed(named) == "twophase.spark.declared:FilesSink"
    assert bindingNamed("twophase.spark.kafka:KafkaSink") == "twophase.spark.kafka:KafkaSink"
    assert bindingNamed("my.module:FilesSink") == "my.module:FilesSink"
