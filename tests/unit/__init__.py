"""Tests that need no broker: models, pure state, plug-ins, loopback HTTP fakes."""
