"""A real HTTP server on 127.0.0.1 that speaks OpenAI chat completions.

Tests point the real ``openai.AsyncOpenAI`` client at it, so the whole path
(HTTP, status codes, headers, JSON parsing, client timeouts) is exercised, not
a mock of it. Failures are programmable, and every request is recorded with
timing and the session it belongs to, so tests can assert on concurrency.

    async with FakeOpenAIServer() as server:
        server.fail("429", "500")          # next two requests fail, then succeed
        client = openai.AsyncOpenAI(base_url=server.base_url, api_key="test")
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from tests.fakes.loopback import LoopbackServer

__all__ = ["FAILURE_MODES", "FakeOpenAIServer", "RecordedRequest", "default_reply"]

# Any HTTP status (as a string, e.g. "500", "503", "401") is also accepted.
FAILURE_MODES = ("500", "429", "timeout", "empty")


@dataclass
class RecordedRequest:
    prompt: str  # content of the last user message
    session: str | None
    arrived: float  # time.monotonic()
    body: dict[str, Any]
    authorization: str | None
    mode: str = "ok"  # "ok" or the failure mode applied
    status: int | None = None
    completed: float | None = None  # None while in flight, or if the client left


def default_reply(prompt: str, n: int) -> str:
    """Deterministic, prompt-dependent: "Summary #n: k actions (digest)"."""
    actions = [line.strip() for line in prompt.splitlines() if line.lstrip().startswith("-")]
    digest = hashlib.sha256("\n".join(actions or [prompt]).encode()).hexdigest()[:10]
    return f"Summary #{n}: {len(actions)} actions ({digest})"


class FakeOpenAIServer(LoopbackServer):
    """OpenAI-compatible ``POST /v1/chat/completions`` with programmable failures.

    Failure plan, first match wins per request: the queue from ``fail(...)``,
    then a mode set by ``fail_for(mode, seconds)`` / ``fail_always(mode)``.
    ``hold()`` parks successful requests until ``release()``, to observe
    concurrency without relying on timing.
    """

    def __init__(
        self,
        *,
        reply: Callable[[str], str] | None = None,
        latency_s: float = 0.0,
        retry_after_s: float = 1.0,
        timeout_hold_s: float = 30.0,
        session_pattern: str = r"Session (\S+)",
        model: str = "fake-gpt",
    ) -> None:
        super().__init__()
        self.reply = reply
        self.latency_s = latency_s
        self.retry_after_s = retry_after_s
        self.timeout_hold_s = timeout_hold_s
        self.session_pattern = re.compile(session_pattern)
        self.model = model
        self.requests: list[RecordedRequest] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.in_flight_by_session: Counter[str] = Counter()
        self.max_in_flight_by_session: Counter[str] = Counter()
        self._replies_by_session: Counter[str | None] = Counter()
        self._plan: deque[str] = deque()
        self._mode: str | None = None
        self._mode_until: float | None = None
        self._released = asyncio.Event()
        self._released.set()

    # -- lifecycle ---------------------------------------------------------

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/chat/completions", self._handle)

    async def stop(self) -> None:
        self._released.set()  # held requests answer, so the server can close
        await super().stop()

    @property
    def url(self) -> str:
        return self.origin

    @property
    def base_url(self) -> str:
        """What to pass as ``base_url`` to the OpenAI client."""
        return f"{self.url}/v1"

    # -- programming failures ----------------------------------------------

    def fail(self, *modes: str) -> None:
        """The next requests fail with these modes, in order."""
        for mode in modes:
            self._check_mode(mode)
        self._plan.extend(modes)

    def fail_for(self, mode: str, seconds: float) -> None:
        """Every request fails with ``mode`` for the next ``seconds``."""
        self._check_mode(mode)
        self._mode, self._mode_until = mode, time.monotonic() + seconds

    def fail_always(self, mode: str) -> None:
        self._check_mode(mode)
        self._mode, self._mode_until = mode, None

    def recover(self) -> None:
        """Clear every planned failure."""
        self._plan.clear()
        self._mode = self._mode_until = None

    def hold(self) -> None:
        """Park successful requests (after arrival) until ``release()``."""
        self._released.clear()

    def release(self) -> None:
        self._released.set()

    @staticmethod
    def _check_mode(mode: str) -> None:
        if mode not in FAILURE_MODES and not (mode.isdigit() and 400 <= int(mode) <= 599):
            raise ValueError(f"unknown failure mode {mode!r}")

    def _next_mode(self) -> str:
        if self._plan:
            return self._plan.popleft()
        if self._mode is not None:
            if self._mode_until is None or time.monotonic() < self._mode_until:
                return self._mode
            self._mode = self._mode_until = None
        return "ok"

    # -- observations --------------------------------------------------------

    @property
    def prompts(self) -> list[str]:
        return [r.prompt for r in self.requests]

    def completed(self, mode: str | None = "ok") -> list[RecordedRequest]:
        """Requests answered (with ``mode``, or any if None)."""
        return [
            r for r in self.requests if r.completed is not None and (mode is None or r.mode == mode)
        ]

    # -- the endpoint ------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        messages = body.get("messages") or []
        users = [m for m in messages if m.get("role") == "user"]
        prompt = str(users[-1].get("content", "")) if users else ""
        match = self.session_pattern.search(prompt)
        session = match.group(1) if match else None
        record = RecordedRequest(
            prompt=prompt,
            session=session,
            arrived=time.monotonic(),
            body=body,
            authorization=request.headers.get("Authorization"),
        )
        self.requests.append(record)
        self._enter(session)
        try:
            record.mode = self._next_mode()
            response = await self._respond(record, request)
            record.status = response.status
            record.completed = time.monotonic()
            return response
        finally:
            self._leave(session)

    async def _respond(self, record: RecordedRequest, request: web.Request) -> web.Response:
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        mode = record.mode
        if mode == "timeout":
            # Hold longer than the client waits; released early only on shutdown.
            try:
                async with asyncio.timeout(self.timeout_hold_s):
                    await self._closing.wait()
            except TimeoutError:
                pass
            return self._error(504, "gateway timeout", "server_error")
        if mode == "429":
            return self._error(
                429,
                "Rate limit reached, please retry later.",
                "rate_limit_exceeded",
                headers={"Retry-After": f"{self.retry_after_s:g}"},
            )
        if mode.isdigit():
            status = int(mode)
            message = f"fake failure {status}"
            if status == 401:
                # Echo the key in full, as a careless proxy might: callers must redact it.
                auth = request.headers.get("Authorization", "")
                message = f"Incorrect API key provided: {auth.removeprefix('Bearer ')}."
            return self._error(status, message, "server_error" if status >= 500 else "invalid")
        await self._released.wait()
        if mode == "empty":
            content = ""
        else:
            self._replies_by_session[record.session] += 1
            n = self._replies_by_session[record.session]
            content = self.reply(record.prompt) if self.reply else default_reply(record.prompt, n)
        return web.json_response(self._completion(record, content))

    def _completion(self, record: RecordedRequest, content: str) -> dict[str, Any]:
        prompt_tokens = sum(len(str(m.get("content", "")).split()) for m in record.body["messages"])
        completion_tokens = len(content.split())
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": record.body.get("model", self.model),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": content, "refusal": None},
                    "logprobs": None,
                    "finish_reason": "stop",
                }
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }

    @staticmethod
    def _error(
        status: int, message: str, code: str, headers: dict[str, str] | None = None
    ) -> web.Response:
        payload = {"error": {"message": message, "type": code, "param": None, "code": code}}
        return web.Response(
            status=status,
            text=json.dumps(payload),
            content_type="application/json",
            headers=headers,
        )

    def _enter(self, session: str | None) -> None:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        if session is not None:
            self.in_flight_by_session[session] += 1
            self.max_in_flight_by_session[session] = max(
                self.max_in_flight_by_session[session], self.in_flight_by_session[session]
            )

    def _leave(self, session: str | None) -> None:
        self.in_flight -= 1
        if session is not None:
            self.in_flight_by_session[session] -= 1
