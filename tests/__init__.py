"""The test suite: unit/ (no broker), integration/ (real broker and workers),
cluster/ (3 brokers)."""
