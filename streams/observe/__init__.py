"""Observability: Prometheus metrics, consumer lag, health, event-loop stalls and web pages."""
