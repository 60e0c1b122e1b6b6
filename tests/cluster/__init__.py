"""Tests against the 3-broker cluster (``make test-cluster``; marker ``cluster``)."""
