"""In-process fakes of external services, reachable over loopback only."""

from tests.fakes.openai_server import FakeOpenAIServer, RecordedRequest

__all__ = ["FakeOpenAIServer", "RecordedRequest"]
