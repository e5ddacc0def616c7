"""Every chaos pipeline by name, in the order the soak runs them and splits its kills.

Each module says what its sink writes, which servers its schedule may kill and how its output
is verified (``base.Pipeline``); a new sink adds a module and its line here.
"""

from __future__ import annotations

from integration_tests.chaos.pipelines.base import Pipeline
from integration_tests.chaos.pipelines.delta import DELTA
from integration_tests.chaos.pipelines.files import FILES, S3
from integration_tests.chaos.pipelines.iceberg import ICEBERG
from integration_tests.chaos.pipelines.kafka import KAFKA, KAFKA_AVRO, KAFKA_KAFKA
from integration_tests.chaos.pipelines.multi import MULTI
from integration_tests.chaos.pipelines.postgres import POSTGRES
from integration_tests.chaos.pipelines.sql import MARIADB

PIPELINES: dict[str, Pipeline] = {
    p.name: p
    for p in (FILES, POSTGRES, KAFKA, KAFKA_KAFKA, KAFKA_AVRO, MULTI, S3, MARIADB, DELTA, ICEBERG)
}

__all__ = ["PIPELINES", "Pipeline"]
