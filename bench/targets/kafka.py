"""A Kafka topic per path: Spark's Kafka sink against twophase.kafka."""

from __future__ import annotations

from functools import partial
from typing import Any

from bench import bare
from bench import kafka as kb
from bench.targets.base import Context, Target


class KafkaTarget(Target):
    name = "kafka"
    title = "Kafka"
    sparkOwn = "Spark Kafka sink"
    bareTitle = "confluent-kafka produce_batch"
    twophaseFormat = "twophase.kafka"
    columns = ("CAST(id AS STRING) AS key", "payload AS value")

    def __init__(self, ctx: Context, partitions: int = 8) -> None:
        super().__init__(ctx)
        self.topics: dict[str, str] = {}
        self.partitions = partitions

    def prepare(self, label: str) -> None:
        self.topics[label] = kb.createTopic(self.ctx.bootstrap, self.partitions, label)

    def sparkWriter(self, frame: Any, label: str) -> Any:
        return (
            frame.writeStream.format("kafka")
            .option("kafka.bootstrap.servers", self.ctx.bootstrap)
            .option("topic", self.topics[label])
        )

    def twophaseOptions(self, label: str) -> dict[str, str]:
        return {"kafka.bootstrap.servers": self.ctx.bootstrap, "topic": self.topics[label]}

    def bareTask(self, label: str) -> Any:
        return partial(bare.kafkaRows, bootstrap=self.ctx.bootstrap, topic=self.topics[label])

    def server(self) -> str | None:
        return self.ctx.bootstrap.split(",")[0]

    def cleanup(self) -> None:
        if self.topics:
            kb.deleteTopics(self.ctx.bootstrap, list(self.topics.values()))
