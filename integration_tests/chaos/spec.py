"""What one start of a chaos pipeline runs: the spec the runner writes and the child reads.

The fields past ``rowsPerBatch`` say where the pipeline's systems are; each pipeline's module
(``pipelines/``) fills the ones it uses in its ``prepare`` and reads them in its ``sink``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass
class PipelineSpec:
    """What one start runs. ``rows`` and ``rowsPerBatch`` shape the sequence source;
    ``maxOffsetsPerTrigger`` the Kafka source's batches."""

    pipeline: str
    workdir: str
    rows: int
    rowsPerBatch: int
    partitions: int = 2
    master: str = "local-cluster[2,1,1024]"
    pgUrl: str = ""
    table: str = ""
    bootstrap: str = ""
    inputTopic: str = ""
    outputTopic: str = ""
    registryUrl: str = ""
    """The schema registry of ``kafka-avro``."""
    sparkInputTopic: str = ""
    """``kafka-avro``'s second input, which Spark's own Kafka source reads."""
    s3Path: str = ""
    """The ``s3`` pipeline's output URL (its ``fs.*`` options are in ``sinkOptions``)."""
    sqlUrl: str = ""
    """The ``mariadb`` pipeline's SQLAlchemy URL (``table`` names its table)."""
    sparkConf: dict[str, str] = field(default_factory=dict)
    sinkOptions: dict[str, str] = field(default_factory=dict)
    """Extra options of the sink, beside the ones the pipeline sets."""
    checkpointUrl: str = ""
    """Spark's checkpoint when it is not on the pipeline's disk (on the compose cluster: an
    ``s3a://`` URL, the decision log beside it)."""
    storeUrl: str = ""
    """Where a cluster run's file outputs go (``s3://``): executors on other hosts write them."""
    storeOptions: dict[str, str] = field(default_factory=dict)
    """The ``fs.*`` options of ``storeUrl``."""

    @property
    def disk(self) -> Path:
        """What a ``disk full`` fills: the checkpoint and the files sink's output."""
        return Path(self.workdir) / "disk"

    @property
    def checkpoint(self) -> str:
        return str(self.disk / "checkpoint")

    @property
    def output(self) -> str:
        return str(self.disk / "output")

    @property
    def checkpointLocation(self) -> str:
        """The query's ``checkpointLocation``."""
        return self.checkpointUrl or self.checkpoint

    @property
    def outputLocation(self) -> str:
        """Where a file sink writes: ``storeUrl``'s output, else the pipeline's disk."""
        return f"{self.storeUrl}/output" if self.storeUrl else self.output

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=1))

    @classmethod
    def load(cls, path: Path) -> PipelineSpec:
        return cls(**json.loads(path.read_text()))
