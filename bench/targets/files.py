"""Parquet files on the local disk and on the S3 server: Spark's file sink and twophase.files."""

from __future__ import annotations

import json
import shutil
from functools import partial
from typing import Any

import fsspec

from bench import bare
from bench import s3 as s3b
from bench.targets.base import Context, Target


def visibleParquet(fs: Any, root: str) -> list[str]:
    """Parquet files under ``root`` a reader sees: none under a ``_`` or ``.`` name."""
    if not fs.exists(root):
        return []
    found = []
    for path in fs.find(root):
        rest = path[len(root.rstrip("/")) :].strip("/").split("/")
        if path.endswith(".parquet") and not any(p.startswith(("_", ".")) for p in rest):
            found.append(path)
    return found


def sparkSinkFiles(fs: Any, root: str) -> int:
    """Files Spark's file sink committed: the entries of its ``_spark_metadata`` log."""
    meta = f"{root.rstrip('/')}/_spark_metadata"
    if not fs.exists(meta):
        return 0
    count = 0
    for path in fs.find(meta):
        name = path.rsplit("/", 1)[-1]
        if name.split(".")[0].isdigit():
            with fs.open(path, "r") as f:
                count += sum(1 for line in f if line.startswith("{") and "path" in json.loads(line))
    return count


class FilesTarget(Target):
    name = "files"
    title = "files (Parquet)"
    sparkOwn = "Spark Parquet file sink"
    twophaseFormat = "twophase.files"

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self.fs: Any = fsspec.filesystem("file")

    def root(self, label: str) -> str:
        return str(self.ctx.work / f"files-{label}")

    def sparkWriter(self, frame: Any, label: str) -> Any:
        return frame.writeStream.format("parquet").option("path", self.root(label))

    def twophaseOptions(self, label: str) -> dict[str, str]:
        return {"path": self.root(label)}

    def filesWritten(self, label: str, own: bool) -> int | None:
        root = self.root(label)
        return sparkSinkFiles(self.fs, root) if own else len(visibleParquet(self.fs, root))

    def cleanup(self) -> None:
        for path in self.ctx.work.glob("files-*"):
            shutil.rmtree(path, ignore_errors=True)


class S3Target(FilesTarget):
    """The same Parquet rows on the S3 server: Spark's sink on ``s3a://`` against twophase's
    multipart uploads on ``s3://``."""

    name = "s3"
    title = "files on S3"
    sparkOwn = "Spark Parquet file sink on s3a"
    bareTitle = "s3fs PUT of a Parquet file"

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self.s3 = s3b.s3Service()
        self.base = f"{self.s3['bucket']}/bench-shapes/{ctx.work.name}"
        self.fs = fsspec.filesystem(
            "s3",
            key=self.s3["key"],
            secret=self.s3["secret"],
            client_kwargs={"endpoint_url": self.s3["endpoint"]},
            use_listings_cache=False,
        )

    @classmethod
    def sessionConf(cls) -> dict[str, str]:
        return s3b.s3aConf(s3b.s3Service())

    @classmethod
    def sessionPackages(cls) -> tuple[str, ...]:
        return (s3b.s3aPackage(),)

    def root(self, label: str) -> str:
        return f"{self.base}/{label}"

    def sparkWriter(self, frame: Any, label: str) -> Any:
        return frame.writeStream.format("parquet").option("path", f"s3a://{self.root(label)}")

    def twophaseOptions(self, label: str) -> dict[str, str]:
        return {"path": f"s3://{self.root(label)}", **s3b.filesOptions(self.s3)}

    def bareTask(self, label: str) -> Any:
        options = {
            "key": self.s3["key"],
            "secret": self.s3["secret"],
            "client_kwargs": {"endpoint_url": self.s3["endpoint"]},
        }
        return partial(bare.s3Rows, root=self.root(label), options=options)

    def server(self) -> str | None:
        return str(self.s3["endpoint"])

    def cleanup(self) -> None:
        s3b.removePrefix(self.s3, self.base)
