"""Kafka records in the schema registry's wire format: Avro and JSON Schema for Spark's rows,
and the registry client. Shared by the Kafka sink and the Kafka source; see docs/kafka.md."""
