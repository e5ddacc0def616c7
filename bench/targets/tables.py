"""Delta and Iceberg tables on the local disk: twophase.delta and twophase.iceberg against the
append users write today in ``foreachBatch`` (delta-rs, pyiceberg), at least once."""

from __future__ import annotations

import shutil
from typing import Any

from bench.targets.base import Target

# bench.delta and bench.iceberg import bench.shapes, which imports the targets: their
# functions are imported where they are used.


class DeltaTarget(Target):
    name = "delta"
    title = "Delta table"
    sparkOwn = "write_deltalake in foreachBatch"
    twophaseFormat = "twophase.delta"

    def options(self, label: str) -> dict[str, str]:
        from bench.delta import options

        return options(self.ctx.work, f"delta-{label}")

    def sparkWriter(self, frame: Any, label: str) -> Any:
        from bench.delta import appendWithWriteDeltalake

        return frame.writeStream.foreachBatch(appendWithWriteDeltalake(self.options(label)))

    def twophaseOptions(self, label: str) -> dict[str, str]:
        return self.options(label)

    def cleanup(self) -> None:
        for path in self.ctx.work.glob("delta-*-out"):
            shutil.rmtree(path, ignore_errors=True)


class IcebergTarget(Target):
    name = "iceberg"
    title = "Iceberg table"
    sparkOwn = "pyiceberg append in foreachBatch"
    twophaseFormat = "twophase.iceberg"

    def options(self, label: str) -> dict[str, str]:
        from bench.iceberg import options

        return options(self.ctx.work / "iceberg", f"iceberg_{label}")

    def prepare(self, label: str) -> None:
        (self.ctx.work / "iceberg").mkdir(exist_ok=True)

    def sparkWriter(self, frame: Any, label: str) -> Any:
        from bench.iceberg import appendWithPyiceberg

        return frame.writeStream.foreachBatch(appendWithPyiceberg(self.options(label)))

    def twophaseOptions(self, label: str) -> dict[str, str]:
        return self.options(label)

    def cleanup(self) -> None:
        shutil.rmtree(self.ctx.work / "iceberg", ignore_errors=True)
