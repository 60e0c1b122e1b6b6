"""Sink workers: the sink contract (base.py), the runner, and the built-in sinks."""
