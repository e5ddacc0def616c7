"""Spark schemas as the Arrow schemas PySpark hands the tasks, for Spark-free checks."""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql.types import StructType

from twophase.settings import TwoPhaseConfigError


def arrowSchemaOf(schema: StructType, sinkName: str = "this sink") -> pa.Schema:
    """The Arrow schema PySpark hands the tasks for a Spark schema; errors name the column."""
    from pyspark.sql.pandas.types import to_arrow_type

    fields = []
    for f in schema.fields:
        try:
            arrowType = to_arrow_type(f.dataType, timezone="UTC")
            fields.append(pa.field(f.name, arrowType, nullable=f.nullable))
        except Exception:
            raise TwoPhaseConfigError(
                f"column {f.name!r} has type {f.dataType.simpleString()}, which {sinkName} "
                "cannot write; cast it to a primitive type (e.g. to_json(col) or a string)"
            ) from None
    return pa.schema(fields)
