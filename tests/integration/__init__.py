"""Tests against a real Kafka broker and real worker processes (marker ``kafka``)."""
