"""The pipeline worker (accumulate, summarize), the summarizer, ingest and the CLI."""
