"""Spark schemas as the Arrow schemas PySpark hands the tasks, for Spark-free checks."""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql.types import StructType

from twophase.settings import TwoPhaseConfigError
from twophase.spark.versions import arrowTypeOf


def arrowSchemaOf(schema: StructType, sinkName: str = "this sink") -> pa.Schema:
    """The Arrow schema PySpark hands the tasks for a Spark schema; a column whose type has no
    Arrow form is named in a ``TwoPhaseConfigError``. Any other error propagates as it is."""
    fields = []
    for f in schema.fields:
        arrowType = arrowTypeOf(f.dataType)
        if arrowType is None:
            raise TwoPhaseConfigError(
                f"column {f.name!r} has type {f.dataType.simpleString()}, which {sinkName} "
                "cannot write; cast it to a primitive type (e.g. to_json(col) or a string)"
            )
        fields.append(pa.field(f.name, arrowType, nullable=f.nullable))
    return pa.schema(fields)
