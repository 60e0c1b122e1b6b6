"""Ingest: the connector's frames into Kafka over HTTP, SSE or code (``ActionsProducer``)."""
