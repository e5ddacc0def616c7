"""The files sink's pipelines: sequence -> twophase.files (Parquet), locally and on S3.

``files`` renames staged files into a local directory and has no server to kill; ``s3``
writes the same sink to ``s3://`` by multipart uploads, each completed at the commit, and its
schedule kills the S3 server. Both are read back as a reader that skips ``_``- and
``.``-prefixed paths sees them.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from integration_tests.chaos.pipelines.base import Pipeline, need
from integration_tests.chaos.spec import PipelineSpec

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.streaming import DataStreamWriter

    from integration_tests.chaos.servers import Services


S3_TIMEOUTS = '{"connect_timeout": 5, "read_timeout": 10, "retries": {"max_attempts": 2}}'
"""botocore's bounds of the ``s3`` pipeline's requests."""


class FilesPipeline(Pipeline):
    """sequence -> twophase.files into ``<workdir>/output``."""

    name = "files"

    def path(self, spec: PipelineSpec) -> str:
        return spec.output

    def sink(self, stream: DataFrame, spec: PipelineSpec) -> DataStreamWriter:
        return stream.writeStream.format("twophase.files").option("path", self.path(spec))

    def actual(self, spec: PipelineSpec) -> Any:
        from twophase import verify

        return verify.actualFromFiles(self.path(spec), "parquet", options=spec.sinkOptions)


def newS3Output(spec: PipelineSpec, services: Services, folder: str, prefix: str = "") -> None:
    """A fresh ``folder`` of the S3 server's bucket as ``spec.s3Path``, and the sink options
    (each under ``prefix``) that reach it."""
    s3 = need(services.s3, "S3")
    spec.s3Path = s3.url(f"chaos/{uuid.uuid4().hex[:10]}/{folder}")
    spec.sinkOptions.update({prefix + k: v for k, v in s3.options().items()})
    # a partition or a lost reply fails a request in seconds, and s3fs tries it again
    spec.sinkOptions[f"{prefix}fs.config_kwargs"] = S3_TIMEOUTS


class S3Pipeline(FilesPipeline):
    """sequence -> twophase.files on the S3 server, a fresh prefix of its bucket per run."""

    name = "s3"
    servers = ("s3",)

    def prepare(self, spec: PipelineSpec, services: Services) -> None:
        newS3Output(spec, services, "output")

    def path(self, spec: PipelineSpec) -> str:
        return spec.s3Path


FILES = FilesPipeline()
S3 = S3Pipeline()
