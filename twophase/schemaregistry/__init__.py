"""Kafka records in the schema registry's wire format: Avro, JSON Schema and Protobuf for Spark's
rows, and the registry client. Shared by the Kafka sink and the Kafka source; see docs/kafka.md."""
