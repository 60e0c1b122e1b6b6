"""The test suite: unit/ (no broker), integration/ (a real broker), cluster/ (3 brokers)."""
