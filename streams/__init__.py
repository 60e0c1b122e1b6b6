"""The Faust application, settings, topics and the stream utilities."""
