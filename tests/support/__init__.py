"""Test helpers: a Kafka broker, worker processes, and waiting for conditions."""
